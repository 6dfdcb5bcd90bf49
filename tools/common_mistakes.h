/*
 * common_mistakes.h - the chapter's attention with one classic mistake switched on,
 * for inspect_self_attention --mistake NAME.
 *
 * Not part of libattn, and deliberately not the library's reference: this is the
 * code a learner might write in PyTorch (masked_fill, softmax, matmul), with one
 * line wrong at a time, computed in plain float32 loops on PyTorch's semantics (a
 * softmax over nothing but -inf is NaN; a NaN weight reaches every output it
 * multiplies). The correct steps live in src/attention/sdpa_ref.c.
 */
#ifndef TOOLS_COMMON_MISTAKES_H
#define TOOLS_COMMON_MISTAKES_H

#include <stdint.h>

typedef enum mistake {
    MISTAKE_NONE = 0,
    MISTAKE_NO_SCALE,           /* scores = q k^T, no 1/sqrt(D) */
    MISTAKE_INVERTED_MASK,      /* true read as "hide" (nn.MultiheadAttention's bool
                                   attn_mask) where the mask means "may attend" */
    MISTAKE_MASK_QUERIES,       /* the padding mask hides pad queries (rows), not keys */
    MISTAKE_SOFTMAX_WRONG_AXIS, /* softmax over the queries (dim=-2), not the keys */
    MISTAKE_MASK_ZERO,          /* hidden scores set to 0 instead of -inf */
    MISTAKE_COUNT
} mistake;

/* "none", "no-scale", "inverted-mask", "mask-queries", "softmax-wrong-axis",
 * "mask-zero", then NULL: the --mistake choices, indexed by the enum. */
extern const char *const mistake_names[MISTAKE_COUNT + 1];

/* One or two sentences: what the mistaken line does and what it changes. */
const char *mistake_explain(mistake m);

/* The line a learner would have written, in PyTorch, e.g.
 * "scores = q @ k.transpose(-2, -1)   # no / math.sqrt(D)". */
const char *mistake_code(mistake m);

/* Whether query i of sample b may attend to key j under mistake m, given the
 * padding mask pad [B, T] (1 = real token) and the combined mask comb [B, T, T]
 * (1 = may attend). MISTAKE_NONE gives comb itself. */
int mistake_may_attend(mistake m, const uint8_t *pad, const uint8_t *comb, int64_t T,
                       int64_t b, int64_t i, int64_t j);

/* The chapter's steps for every (b, h), from q, k, v [B, H, T, D] (contiguous):
 *   raw     [B, H, T, T] = q k^T                (dot products in d order)
 *   scaled  [B, H, T, T] = raw * scale          (scale 1 under no-scale)
 *   masked  [B, H, T, T] = scaled, or -inf (0 under mask-zero) where hidden
 *   weights [B, H, T, T] = softmax(masked) over the keys (the queries under
 *                          softmax-wrong-axis)
 *   context [B, H, T, D] = weights v            (every key, as a matmul would)
 * `scale` is the correct 1/sqrt(D) as float. weights and context may be NULL to
 * stop after the masked scores. */
void mistake_attention(mistake m, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                       const float *q, const float *k, const float *v, const uint8_t *pad,
                       const uint8_t *comb, float *raw, float *scaled, float *masked,
                       float *weights, float *context);

#endif /* TOOLS_COMMON_MISTAKES_H */
