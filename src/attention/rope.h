/*
 * rope.h - rotary position embedding inside the library: the parameter check and
 * the unchecked rotation that attn_rope_apply, attn_rope_backward, the KV cache
 * (kv_cache.c) and the attention backward (mha_backward.c) share.
 * Internal; names start with attn__.
 */
#ifndef ATTN_ROPE_H
#define ATTN_ROPE_H

#include "attn_internal.h"

#include <stdint.h>

/* Checks p (pairing, base) against head dim D (even, at least 2); the offset is
 * checked only when check_offset is nonzero (the cache supplies its own). */
int attn__rope_check(attn_ctx *ctx, const attn_rope_params *p, int64_t D, int check_offset);

/* Rotates H x T rows of D features: row t of head h at position pos0 + t.
 * x and out are read and written through 3-D strides (head, row, feature) in
 * elements; out may be x itself (same strides). Unchecked; allocates nothing. */
void attn__rope_run(const attn_rope_params *p, int64_t H, int64_t T, int64_t D,
                    const float *x, const int64_t xs[3], float *out, const int64_t os[3],
                    int64_t pos0);

/* attn__rope_run when inverse is 0; with inverse 1 the rotation by the opposite
 * angles, R^T, which is RoPE's backward: the gradient with respect to the rows
 * before the rotation, from the gradient with respect to the rotated rows. */
void attn__rope_rotate(const attn_rope_params *p, int inverse, int64_t H, int64_t T, int64_t D,
                       const float *x, const int64_t xs[3], float *out, const int64_t os[3],
                       int64_t pos0);

#endif /* ATTN_ROPE_H */
