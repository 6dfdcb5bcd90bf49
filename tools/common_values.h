/*
 * common_values.h - the chapter's multi-head self-attention step by step, with
 * every intermediate array kept, for inspect_self_attention's --values, --dump and
 * --mistake; and the printer of --values.
 *
 * The projections are the library's (attn_linear); the head split and merge are
 * plain copies; the scores are plain loops (tools/common_mistakes.c). Without a
 * mistake, the weights and the context are the library's own (attn_sdpa on the
 * head-split q, k, v), so the numbers printed are the numbers the experiment used.
 */
#ifndef TOOLS_COMMON_VALUES_H
#define TOOLS_COMMON_VALUES_H

#include "attn.h"
#include "common_mistakes.h"

#include <stdio.h>

typedef struct steps {
    int64_t B, T, E, H, D;
    mistake mistake;
    attn_tensor qkv;     /* [B, T, 3E]  x W_qkv^T + b_qkv */
    attn_tensor q, k, v; /* [B, H, T, D] each, after the head split (contiguous) */
    attn_tensor scores;  /* [B, H, T, T] q k^T, before the scale */
    attn_tensor scaled;  /* [B, H, T, T] q k^T / sqrt(D) */
    attn_tensor masked;  /* [B, H, T, T] the scaled scores, -inf where hidden */
    attn_tensor weights; /* [B, H, T, T] softmax over the keys */
    attn_tensor context; /* [B, H, T, D] weights v */
    attn_tensor merged;  /* [B, T, E]    the heads merged back */
    attn_tensor output;  /* [B, T, E]    merged W_o^T + b_o */
} steps;

/* Runs every step on x [B, T, E] with weights w and H heads, the padding mask
 * [B, 1, 1, T] and the combined mask [B, 1, T, T] (bool), under mistake m. Returns
 * ATTN_OK or the library's status (ctx->message says why); free with steps_free
 * either way. */
int steps_run(attn_ctx *ctx, const attn_tensor *x, const attn_mha_weights *w, int64_t H,
              const attn_tensor *padding_mask, const attn_tensor *combined_mask, mistake m,
              steps *s);
void steps_free(attn_ctx *ctx, steps *s);

/* Prints --values: for sample `b` and head `h`, x, q, k, v, the raw, scaled and
 * masked scores, the weights, the context, the merged heads and the output, each
 * titled with its formula and its shape, rows (and, for [T, T] arrays, columns)
 * labelled "pos P (id I)" by position and token id, numbers rounded to 4 decimals
 * and right-aligned per column (-inf and nan as such). ids [B, T]. Returns 0, or
 * -1 if writing failed. */
int values_print(FILE *f, const steps *s, const attn_tensor *x, const int64_t *ids,
                 int64_t b, int64_t h);

#endif /* TOOLS_COMMON_VALUES_H */
