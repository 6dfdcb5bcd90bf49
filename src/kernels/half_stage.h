/*
 * half_stage.h - how a 16-bit attention call (SPEC section 10) reaches the float32
 * kernels: its arrays are widened to float32 in the plan's scratch and the output
 * rounded back, in parallel blocks of rows (src/kernels/half_stage.c). Internal.
 *
 * The fused kernel's tile path runs one parallel pass of items that each widen
 * one (batch, key/value head)'s K and V into a worker's own copy and run that
 * group's query tiles on it, widening each tile's query rows into the worker's
 * own [Tq][D] just before the tile and rounding its output rows from the
 * worker's [Tq][Dv] just after (src/kernels/sdpa_fused.c, half_head_item), so
 * that neither q nor out is ever whole in float32; its row path (decoding)
 * widens q whole (a few rows), then each chunk of keys of one (batch, key/value
 * head) inside the work item that uses it (on AVX-512, and on AVX2, in
 * registers as the split item loads it, src/kernels/fused_split.h), so K and V
 * are read from the caller once, in 16 bits, and rounds its output once
 * to nearest even at the end (src/kernels/sdpa_fused.c). The reference widens
 * everything up front: it is the proof, not the fast path.
 */
#ifndef ATTN_HALF_STAGE_H
#define ATTN_HALF_STAGE_H

#include "half.h"
#include "sdpa_contract.h"

/* Shapes for the float32 kernel on staged copies: q [Tq][D] and out [Tq][Dv] of
 * one query head, so their batch and head strides are 0 (qo_per_head: every head
 * reads and writes one worker's rows), or contiguous [B][H][Tq][.] (qo_per_head
 * 0); k [Tk][D] and v [Tk][Dv] of one key/value head, batch and head strides 0
 * (per_head), or contiguous [B][Hkv][Tk][.] (per_head 0). Everything else
 * (masks, bias, options, lse) is s's, and a kernel's item still carries the
 * true (b, h) for them. */
void attn__half_staged_shapes(const attn__sdpa_shapes *s, int per_head, int qo_per_head,
                              attn__sdpa_shapes *st);

/* Rows of a 4-D array [n0][n1][n2][n3] at src strides ss (elements) to or from a
 * contiguous float32 array, in blocks of rows over `threads` workers. dt F32 is a
 * plain copy: the KV cache's float32 q or out beside 16-bit k and v
 * (attn__sdpa_shapes' q_f32, out_f32). */
typedef struct attn__half_rows {
    const attn__half_kernels *hk;
    attn_dtype dt;
    int narrow;       /* 0: 16-bit (strided) -> float32 (contiguous); 1: the reverse */
    void *half;       /* the 16-bit (or, dt F32, float32) array's first element */
    float *f32;       /* the contiguous float32 array */
    int64_t n[4];     /* sizes */
    int64_t hs[4];    /* the 16-bit array's strides */
} attn__half_rows;

void attn__half_rows_run(const attn__half_rows *r, int threads);
/* Rows [r0, r1) of r (rows counted over n[0] n[1] n[2]) on the calling thread: a
 * worker's own rows inside its work item. attn__half_rows_run's blocks are these,
 * so the values are the same bits. */
void attn__half_rows_block(const attn__half_rows *r, int64_t r0, int64_t r1);

/* Bytes of scratch the reference needs beyond its score block to run s in 16 bits;
 * 0 on overflow. */
size_t attn__half_ref_bytes(const attn__sdpa_shapes *s);
/* Runs the reference on 16-bit q, k, v, writing 16-bit out: widens into `stage`
 * (attn__half_ref_bytes of it), runs, rounds. */
int attn__half_ref_run(attn_ctx *ctx, const attn__sdpa_shapes *s, const void *q,
                       const void *k, const void *v, void *out, float *weights,
                       float *scores, void *stage);

#endif /* ATTN_HALF_STAGE_H */
