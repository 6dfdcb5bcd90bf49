/*
 * fused_common.h - what the fused kernel's tile path (fused_tile.h) and row path
 * (fused_row.h) share: index helpers, where a query head finds its key/value head,
 * and which keys a query may see. Included by src/kernels/fused_kernel.h only, once
 * per instruction set, after that build has defined ATTN_SIMD_<ISA> and the
 * micro-tile sizes FK_MR, FK_NV, FK_MK and FK_NQV (see the contract there).
 */
#ifndef ATTN_FUSED_COMMON_H
#define ATTN_FUSED_COMMON_H

#include "sdpa_fused.h"
#include "simd.h"

#include <float.h>
#include <math.h>

#if !defined(FK_MR) || !defined(FK_NV) || !defined(FK_MK) || !defined(FK_NQV)
#error "define FK_MR, FK_NV, FK_MK and FK_NQV before including fused_kernel.h"
#endif

/* Query rows per micro-tile of the score product, along the vector lanes. */
#define FK_QW (FK_NQV * SIMD_W)

#if defined(__GNUC__) || defined(__clang__)
#define FK_INLINE static inline __attribute__((always_inline))
#else
#define FK_INLINE static inline
#endif

static int64_t fk_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t fk_min(int64_t a, int64_t b) { return a < b ? a : b; }
/* Scratch sub-buffers start on 64-byte boundaries relative to the worker's base. */
static int64_t fk_align(int64_t n) { return fk_round_up(n, 16); }

/* The key/value head that query head (b, h) reads: h / (H / Hkv) (grouped-query
 * attention; MQA when Hkv = 1), read in place. */
static void fk_kv_head(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t *kb,
                       int64_t *kh)
{
    *kb = b;
    *kh = h / s->group;
}

/* The last key query i may see under the causal flag, plus one (top-left aligned,
 * as SPEC says: position t sees 0..t). */
static int64_t fk_causal_limit(const attn__sdpa_shapes *s, int64_t i)
{
    return fk_min(s->Tk, i + 1);
}

/* 1 when query i of (b, h) may attend to key j: j is a key (j < Tk), the causal
 * flag lets it through and so does the mask. The per-element form of what the tile
 * classification (fused_tile.h) decides for whole tiles; used where the kernel
 * must tell a masked key from one whose weight is merely 0. */
static int fk_key_visible(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i,
                          int64_t j)
{
    if (j >= s->Tk || (s->causal && j >= fk_causal_limit(s, i)))
        return 0;
    return !s->mask.data || s->mask.data[attn__off4(s->mask.stride, b, h, i, j)] != 0;
}

/* 1 when query i of (b, h) may attend to at least one key. */
static int fk_row_sees_a_key(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i)
{
    const int64_t je = s->causal ? fk_causal_limit(s, i) : s->Tk;
    for (int64_t j = 0; j < je; j++)
        if (fk_key_visible(s, b, h, i, j))
            return 1;
    return 0;
}

#endif /* ATTN_FUSED_COMMON_H */
