/*
 * fused_common.h - what the fused kernel's tile path (fused_tile.h) and row path
 * (fused_row.h) share: index helpers, where a query head finds its key/value head,
 * which keys a query may see, and the softcap. Included by src/kernels/fused_kernel.h only, once
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

/* The keys [*lo, *hi) that query i may see by the causal alignment and the window,
 * the two options that hide keys by position alone (an empty range when lo >= hi).
 * With i' = i + Tk - Tq: top-left causal ends at i, bottom-right at i', the window
 * runs from i' - left to i' + right (sdpa_contract.h, attn__may_attend). Both ends
 * grow with i, never shrink, so a tile of query rows i0 .. i1-1 sees keys in
 * [lo(i0), hi(i1 - 1)) only: the kernel never visits a key tile outside it, which
 * makes a window over a long sequence cost O(T * window), not O(T^2). */
static void fk_row_range(const attn__sdpa_shapes *s, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t ip = i + s->offset;
    int64_t a = 0, e = s->Tk;
    if (s->causal == ATTN_CAUSAL_TOP_LEFT)
        e = fk_min(e, i + 1);
    else if (s->causal == ATTN_CAUSAL_BOTTOM_RIGHT)
        e = fk_min(e, ip + 1);
    if (s->has_window) {
        if (s->window_left >= 0 && ip - s->window_left > a)
            a = ip - s->window_left;
        if (s->window_right >= 0)
            e = fk_min(e, ip + s->window_right + 1);
    }
    if (e < 0)
        e = 0;
    *lo = a < e ? a : e;
    *hi = e;
}

/* 1 when query i of (b, h) may attend to key j: j is a key (j < Tk) and the
 * contract's rule (attn__may_attend: the causal alignment, the window, the mask and
 * a -inf bias) lets it through. The per-element form of what the tile
 * classification (fused_tile.h) decides for whole tiles; used where the kernel must
 * tell a hidden key from one whose weight is merely 0. */
static int fk_key_visible(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i,
                          int64_t j)
{
    return j < s->Tk && attn__may_attend(s, b, h, i, j);
}

/* 1 when query i of (b, h) may attend to at least one key. */
static int fk_row_sees_a_key(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i)
{
    int64_t lo, hi;
    fk_row_range(s, i, &lo, &hi);
    for (int64_t j = lo; j < hi; j++)
        if (fk_key_visible(s, b, h, i, j))
            return 1;
    return 0;
}

/* 1 when the scores need work between the product and the softmax: a softcap, a
 * bias or ALiBi (the options that change a visible key's score). */
static int fk_has_score_mod(const attn__sdpa_shapes *s)
{
    return s->softcap > 0.0f || s->bias != NULL || s->alibi;
}

/* x[0 .. n-1] = c * tanh(x / c), the softcap, with this build's vector tanh; the
 * division (not a product with 1 / c) rounds as the reference's does. */
static void fk_softcap(float *x, int64_t n, float c)
{
    const simd_f32 vc = simd_set1(c);
    int64_t e = 0;
    for (; e + SIMD_W <= n; e += SIMD_W)
        simd_store(x + e, simd_mul(vc, simd_tanh(simd_div(simd_load(x + e), vc))));
    if (e < n)
        simd_store_n(x + e, simd_mul(vc, simd_tanh(simd_div(simd_load_n(x + e, n - e, 0.0f), vc))),
                     n - e);
}

#endif /* ATTN_FUSED_COMMON_H */