/*
 * fused_split.h - the row path's split-key form (flash-decoding), for a handful of
 * query rows against many keys when there are too few (batch, key/value head)
 * pairs to keep every core busy: one decoding step of one sequence (S5), a GQA
 * step with 8 key/value heads (S7), each sequence of a batched decode (S9).
 *
 * The keys of each (b, key/value head) are cut into job->n_chunks chunks of
 * job->chunk keys (the planner in sdpa_fused.c picks both from the shapes alone,
 * never from the thread count). One work item is one (b, key/value head, chunk),
 * and it serves every query row that reads that key/value head - the group's
 * H / Hkv query heads times Tq rows - so K and V are read from memory once per
 * group, not once per query head (a quarter of the bytes for S7's 32 / 8 heads).
 * Within the chunk it works key block by key block (FK_SPLIT_KB keys, which stay
 * in L1 while every row uses them), and it leaves, per query row and chunk, a
 * partial result in the plan's scratch:
 *
 *     seen   1 when the row may see at least one key of the chunk
 *     m      the largest visible score of the chunk (may be -inf, or NaN)
 *     l      sum over the chunk's visible keys of exp(s_j - m')
 *     O      sum over them of exp(s_j - m') v_j  (not normalised)
 *
 * with m' = m, or 0 when m = -inf (every visible score -inf), so that the weights
 * are exactly 0 but still multiply their values: a NaN or inf value reaches the row
 * as on the other paths (0 * NaN = NaN).
 *
 * The merge (fk_split_merge, one item per (b, h), run after every chunk is done)
 * combines the partials of each row by their log-sum-exp in chunk order 0, 1, ...:
 *
 *     M = max(sink, m_c over seen chunks)        (NaN if any m_c is NaN)
 *     l = exp(sink - M) + sum_c exp(m_c - M) l_c  (the sink's term once, here)
 *     O = sum_c exp(m_c - M) O_c
 *     out = O / l, lse = M + log(l)
 *
 * which is the online softmax of fused_kernel.h's contract taken one chunk at a
 * time. Each partial depends on its chunk alone and the merge's order is fixed, so
 * the result has the same bits for any thread count. A row with no seen chunk is
 * empty (zeros, lse = the sink or -inf, the EMPTY_ROW error without a sink); a row
 * whose every visible score is -inf and that has no sink gets M = -inf and
 * exp(-inf - -inf) = NaN, as in the reference. The weights are not written here:
 * a call that asks for them is planned on the unsplit row path.
 *
 * Included by src/kernels/fused_kernel.h once per instruction set, after
 * fused_row.h, whose dot products and weighted sum it reuses.
 */
#ifndef ATTN_FUSED_SPLIT_H
#define ATTN_FUSED_SPLIT_H

#include "fused_common.h"
#include "fused_row.h"

#include <string.h>

/* Keys per block inside a chunk: 64 keys of D = 128 are 32 KiB of K, which the
 * group's rows reuse from L1. */
#define FK_SPLIT_KB 64

/* Software prefetch on the split path. The item streams its chunk's K in phase 1
 * and its V in phase 3, each from memory, and between the loads it computes: the
 * group's dot products, which for S7's four query heads a key take about as long
 * as the key's bytes take to arrive. The hardware's prefetchers follow a stream
 * only a little ahead of the demand loads, so the reads and the arithmetic take
 * turns instead of overlapping. Phase 1 therefore asks for K FK_SPLIT_PF_K bytes
 * ahead of the keys it scores (into L1) and for V of the same keys (into L2,
 * which holds a chunk's V: 1024 keys of D = 128 are 512 KiB), so that phase 3
 * finds V in L2 and memory is busy all through phase 1. A prefetch never faults
 * and changes no value; without the GCC/Clang builtin there is none. */
#define FK_SPLIT_PF_K 4096
#if defined(__GNUC__) || defined(__clang__)
#define FK_PREFETCH_L1(p) __builtin_prefetch((p), 0, 3)
#define FK_PREFETCH_L2(p) __builtin_prefetch((p), 0, 2)
#else
#define FK_PREFETCH_L1(p) ((void)(p))
#define FK_PREFETCH_L2(p) ((void)(p))
#endif

/* What a split item reads K and V as (job->kv_dtype): float32, or, on the
 * AVX-512 and AVX2 builds, the caller's bfloat16 or float16 rows themselves,
 * widened in registers as they are loaded (a 16- or 8-lane load of 16-bit
 * elements, then a shift by 16 for bfloat16, vcvtph2ps for float16: the AVX2
 * files are built with F16C, which dispatch requires of the AVX2 path). The
 * scalar build keeps the float32 copy. Widening is exact, so each product
 * and sum sees the values a float32 copy would hold, in the same order: the bits
 * are those of the copy. A float32 item compiles to the loads it always had. The
 * kind is a constant in each of fk_split_item's instances, so its tests fold. */
#define FK_KV_F32 0
#define FK_KV_BF16 1
#define FK_KV_F16 2

/* Bytes of one element of K or V of a kind. */
#define FK_KV_ES(kind) ((kind) == FK_KV_F32 ? (int64_t)sizeof(float) : (int64_t)sizeof(uint16_t))

/* SIMD_W elements of kind from element i of p, as float32. */
FK_INLINE simd_f32 fk_kv_load(const void *p, int64_t i, const int kind)
{
    (void)kind; /* float32 only below AVX-512 */
#if SIMD_W >= 16
    if (kind != FK_KV_F32) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
        return kind == FK_KV_BF16
                   ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                   : _mm512_cvtph_ps(h);
    }
#elif SIMD_W == 8
    if (kind != FK_KV_F32) {
        const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return kind == FK_KV_BF16
                   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                   : _mm256_cvtph_ps(h);
    }
#endif
    return simd_load((const float *)p + i);
}

/* The first n < SIMD_W elements of kind from element i of p, as float32; the
 * other lanes 0 (simd_load_n's fill of 0: both 16-bit zeros widen to 0.0f). The
 * masked load reads only the n elements. */
FK_INLINE simd_f32 fk_kv_load_n(const void *p, int64_t i, int64_t n, const int kind)
{
    (void)kind;
#if SIMD_W >= 16
    if (kind != FK_KV_F32) {
        const __m256i h =
            _mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1u), (const uint16_t *)p + i);
        return kind == FK_KV_BF16
                   ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                   : _mm512_cvtph_ps(h);
    }
#elif SIMD_W == 8
    if (kind != FK_KV_F32) {
        uint16_t b[8] = {0};
        memcpy(b, (const uint16_t *)p + i, (size_t)n * sizeof(uint16_t));
        const __m128i h = _mm_loadu_si128((const __m128i *)b);
        return kind == FK_KV_BF16
                   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                   : _mm256_cvtph_ps(h);
    }
#endif
    return simd_load_n((const float *)p + i, n, 0.0f);
}

/* Element i of p, an array of kind. */
FK_INLINE const void *fk_kv_at(const void *p, int64_t i, const int kind)
{
    return (const char *)p + i * FK_KV_ES(kind);
}

/* Prefetches rows [j, j1) of K FK_SPLIT_PF_K bytes ahead (when still inside the
 * chunk, which ends at row c1) and rows [j, j1) of V, every 64-byte line. The rows
 * count from kb and vb, the chunk's first key; ldk and ldv are row strides in
 * bytes, kbytes and vbytes a row's bytes (float32 or 16-bit). */
FK_INLINE void fk_split_prefetch(const char *kb, int64_t ldk, int64_t kbytes, const char *vb,
                                 int64_t ldv, int64_t vbytes, int64_t j, int64_t j1, int64_t c1)
{
    const int64_t ahead = FK_SPLIT_PF_K / ldk + 1;
    for (int64_t r = j; r < j1; r++) {
        if (r + ahead < c1) {
            const char *kr = kb + (r + ahead) * ldk;
            for (int64_t x = 0; x < kbytes; x += 64)
                FK_PREFETCH_L1(kr + x);
        }
        const char *vr = vb + r * ldv;
        for (int64_t x = 0; x < vbytes; x += 64)
            FK_PREFETCH_L2(vr + x);
    }
}

/* Vectors of value columns the two-row weighted sum keeps in registers: two rows of
 * them plus a value vector must fit the register file (32 vectors with AVX-512, 16
 * with AVX2). */
#if SIMD_W >= 16
#define FK_SPLIT_NV2 8
#else
#define FK_SPLIT_NV2 4
#endif

/* Four dot products of q0 and four of q1 with the same consecutive rows of k (row
 * stride ldk), times the scale, into o0[0..3] and o1[0..3]: each key row is loaded
 * once for both query rows, which halves the loads per multiply-add of fk_dot4
 * (two query heads of a GQA group share their key/value head). Each sum is one
 * accumulator over the head dim reduced by simd_hsum4_scaled, whose order is not
 * fk_dot's: a row paired here and the same row scored alone (an odd group's last
 * row, the keys after the last four) may differ in the last bit, but the pairing
 * depends on the shapes alone, never on the thread count. */
FK_INLINE void fk_dot4x2(const float *q0, const float *q1, const void *k, int64_t ldk,
                         int64_t n, float scale, float *o0, float *o1, const int kind)
{
    simd_f32 a0 = simd_zero(), a1 = simd_zero(), a2 = simd_zero(), a3 = simd_zero();
    simd_f32 b0 = simd_zero(), b1 = simd_zero(), b2 = simd_zero(), b3 = simd_zero();
    int64_t d = 0;
    for (; d + SIMD_W <= n; d += SIMD_W) {
        const simd_f32 x = simd_load(q0 + d), y = simd_load(q1 + d);
        const simd_f32 k0 = fk_kv_load(k, d, kind), k1 = fk_kv_load(k, ldk + d, kind);
        const simd_f32 k2 = fk_kv_load(k, 2 * ldk + d, kind);
        const simd_f32 k3 = fk_kv_load(k, 3 * ldk + d, kind);
        a0 = simd_fma(x, k0, a0), b0 = simd_fma(y, k0, b0);
        a1 = simd_fma(x, k1, a1), b1 = simd_fma(y, k1, b1);
        a2 = simd_fma(x, k2, a2), b2 = simd_fma(y, k2, b2);
        a3 = simd_fma(x, k3, a3), b3 = simd_fma(y, k3, b3);
    }
    if (d < n) {
        const int64_t r = n - d;
        const simd_f32 x = simd_load_n(q0 + d, r, 0.0f), y = simd_load_n(q1 + d, r, 0.0f);
        const simd_f32 k0 = fk_kv_load_n(k, d, r, kind), k1 = fk_kv_load_n(k, ldk + d, r, kind);
        const simd_f32 k2 = fk_kv_load_n(k, 2 * ldk + d, r, kind);
        const simd_f32 k3 = fk_kv_load_n(k, 3 * ldk + d, r, kind);
        a0 = simd_fma(x, k0, a0), b0 = simd_fma(y, k0, b0);
        a1 = simd_fma(x, k1, a1), b1 = simd_fma(y, k1, b1);
        a2 = simd_fma(x, k2, a2), b2 = simd_fma(y, k2, b2);
        a3 = simd_fma(x, k3, a3), b3 = simd_fma(y, k3, b3);
    }
    /* The eight sums reduced four at a time (one horizontal sum each took about a
     * third of the phase's instructions on S7). */
    simd_hsum4_scaled(o0, a0, a1, a2, a3, scale);
    simd_hsum4_scaled(o1, b0, b1, b2, b3, scale);
}

#if SIMD_W >= 16
/* Four dot products of each of the four query rows q, q + ldq, q + 2 ldq, q + 3 ldq
 * with the same consecutive rows of k, times the scale, into o + r * ldo for row r:
 * fk_dot4x2 for a GQA group of four query heads, each key vector loaded once for the
 * four (16 accumulators, 4 query and 4 key vectors: 24 of AVX-512's 32 registers).
 * Each sum takes fk_dot4x2's steps, so its bits are the same. Besides the loads,
 * this puts the group's four rows in one pass over a block of keys, so that the
 * block's prefetches spread over all of the phase's arithmetic, where two passes
 * of fk_dot4x2 left the second one without any. */
FK_INLINE void fk_dot4x4(const float *q, int64_t ldq, const void *k, int64_t ldk, int64_t n,
                         float scale, float *o, int64_t ldo, const int kind)
{
    simd_f32 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++)
            acc[r][j] = simd_zero();
    int64_t d = 0;
    for (; d + SIMD_W <= n; d += SIMD_W) {
        simd_f32 kv[4];
        for (int j = 0; j < 4; j++)
            kv[j] = fk_kv_load(k, j * ldk + d, kind);
        for (int r = 0; r < 4; r++) {
            const simd_f32 x = simd_load(q + r * ldq + d);
            for (int j = 0; j < 4; j++)
                acc[r][j] = simd_fma(x, kv[j], acc[r][j]);
        }
    }
    if (d < n) {
        const int64_t rest = n - d;
        simd_f32 kv[4];
        for (int j = 0; j < 4; j++)
            kv[j] = fk_kv_load_n(k, j * ldk + d, rest, kind);
        for (int r = 0; r < 4; r++) {
            const simd_f32 x = simd_load_n(q + r * ldq + d, rest, 0.0f);
            for (int j = 0; j < 4; j++)
                acc[r][j] = simd_fma(x, kv[j], acc[r][j]);
        }
    }
    for (int r = 0; r < 4; r++)
        simd_hsum4_scaled(o + r * ldo, acc[r][0], acc[r][1], acc[r][2], acc[r][3], scale);
}
#endif

/* fused_row.h's fk_dot, fk_dot4 and fk_row_pv(_rest) on K or V of a kind: the
 * float32 kind calls them, the 16-bit kinds take the same steps with widening
 * loads, so each sum has the same order and the same bits. */
FK_INLINE float fk_kv_dot(const float *a, const void *x, int64_t n, const int kind)
{
    if (kind == FK_KV_F32)
        return fk_dot(a, (const float *)x, n);
    simd_f32 acc0 = simd_zero(), acc1 = simd_zero();
    int64_t d = 0;
    for (; d + 2 * SIMD_W <= n; d += 2 * SIMD_W) {
        acc0 = simd_fma(simd_load(a + d), fk_kv_load(x, d, kind), acc0);
        acc1 = simd_fma(simd_load(a + d + SIMD_W), fk_kv_load(x, d + SIMD_W, kind), acc1);
    }
    for (; d + SIMD_W <= n; d += SIMD_W)
        acc0 = simd_fma(simd_load(a + d), fk_kv_load(x, d, kind), acc0);
    if (d < n)
        acc1 = simd_fma(simd_load_n(a + d, n - d, 0.0f), fk_kv_load_n(x, d, n - d, kind), acc1);
    return simd_hsum(simd_add(acc0, acc1));
}

FK_INLINE void fk_kv_dot4(const float *q, const void *k, int64_t ldk, int64_t n, float scale,
                          float *out, const int kind)
{
    if (kind == FK_KV_F32) {
        fk_dot4(q, (const float *)k, ldk, n, scale, out);
        return;
    }
    simd_f32 a0 = simd_zero(), a1 = simd_zero(), a2 = simd_zero(), a3 = simd_zero();
    simd_f32 b0 = simd_zero(), b1 = simd_zero(), b2 = simd_zero(), b3 = simd_zero();
    int64_t d = 0;
    for (; d + 2 * SIMD_W <= n; d += 2 * SIMD_W) {
        const simd_f32 x = simd_load(q + d), y = simd_load(q + d + SIMD_W);
        a0 = simd_fma(x, fk_kv_load(k, d, kind), a0);
        b0 = simd_fma(y, fk_kv_load(k, d + SIMD_W, kind), b0);
        a1 = simd_fma(x, fk_kv_load(k, ldk + d, kind), a1);
        b1 = simd_fma(y, fk_kv_load(k, ldk + d + SIMD_W, kind), b1);
        a2 = simd_fma(x, fk_kv_load(k, 2 * ldk + d, kind), a2);
        b2 = simd_fma(y, fk_kv_load(k, 2 * ldk + d + SIMD_W, kind), b2);
        a3 = simd_fma(x, fk_kv_load(k, 3 * ldk + d, kind), a3);
        b3 = simd_fma(y, fk_kv_load(k, 3 * ldk + d + SIMD_W, kind), b3);
    }
    for (; d + SIMD_W <= n; d += SIMD_W) {
        const simd_f32 x = simd_load(q + d);
        a0 = simd_fma(x, fk_kv_load(k, d, kind), a0);
        a1 = simd_fma(x, fk_kv_load(k, ldk + d, kind), a1);
        a2 = simd_fma(x, fk_kv_load(k, 2 * ldk + d, kind), a2);
        a3 = simd_fma(x, fk_kv_load(k, 3 * ldk + d, kind), a3);
    }
    if (d < n) {
        const int64_t t = n - d;
        const simd_f32 y = simd_load_n(q + d, t, 0.0f);
        b0 = simd_fma(y, fk_kv_load_n(k, d, t, kind), b0);
        b1 = simd_fma(y, fk_kv_load_n(k, ldk + d, t, kind), b1);
        b2 = simd_fma(y, fk_kv_load_n(k, 2 * ldk + d, t, kind), b2);
        b3 = simd_fma(y, fk_kv_load_n(k, 3 * ldk + d, t, kind), b3);
    }
    out[0] = simd_hsum(simd_add(a0, b0)) * scale;
    out[1] = simd_hsum(simd_add(a1, b1)) * scale;
    out[2] = simd_hsum(simd_add(a2, b2)) * scale;
    out[3] = simd_hsum(simd_add(a3, b3)) * scale;
}

FK_INLINE void fk_kv_row_pv(const float *p, int64_t nkeys, const uint8_t *mrow, int64_t ms3,
                            const float *brow, int64_t bs3, const void *v, int64_t ldv,
                            float *acc, const int nv, int64_t last, const int kind)
{
    if (kind == FK_KV_F32) {
        fk_row_pv(p, nkeys, mrow, ms3, brow, bs3, (const float *)v, ldv, acc, nv, last, 1);
        return;
    }
    simd_f32 a[FK_ROW_NV];
    for (int c = 0; c < nv; c++)
        a[c] = simd_load(acc + c * SIMD_W);
    for (int64_t j = 0; j < nkeys; j++) {
        if ((mrow && !mrow[j * ms3]) || (brow && brow[j * bs3] == -INFINITY))
            continue;
        const simd_f32 pj = simd_set1(p[j]);
        const int64_t vrow = j * ldv;
        for (int c = 0; c < nv - 1; c++)
            a[c] = simd_fma(pj, fk_kv_load(v, vrow + c * SIMD_W, kind), a[c]);
        const int64_t vlast = vrow + (nv - 1) * SIMD_W;
        a[nv - 1] = simd_fma(pj,
                             last == SIMD_W ? fk_kv_load(v, vlast, kind)
                                            : fk_kv_load_n(v, vlast, last, kind),
                             a[nv - 1]);
    }
    for (int c = 0; c < nv; c++)
        simd_store(acc + c * SIMD_W, a[c]);
}

FK_INLINE void fk_kv_row_pv_rest(const float *p, int64_t nkeys, const uint8_t *mrow,
                                 int64_t ms3, const float *brow, int64_t bs3, const void *v,
                                 int64_t ldv, float *acc, int64_t cols, const int kind)
{
    if (kind == FK_KV_F32) {
        fk_row_pv_rest(p, nkeys, mrow, ms3, brow, bs3, (const float *)v, ldv, acc, cols, 1);
        return;
    }
    const int nv = (int)((cols + SIMD_W - 1) / SIMD_W);
    const int64_t last = cols - (int64_t)(nv - 1) * SIMD_W;
    switch (nv) {
#define FK_KV_PV_CASE(N)                                                                    \
    case N:                                                                                 \
        fk_kv_row_pv(p, nkeys, mrow, ms3, brow, bs3, v, ldv, acc, N, last, kind);          \
        break;
        FK_KV_PV_CASE(1)
        FK_KV_PV_CASE(2)
        FK_KV_PV_CASE(3)
        FK_KV_PV_CASE(4)
        FK_KV_PV_CASE(5)
        FK_KV_PV_CASE(6)
        FK_KV_PV_CASE(7)
        FK_KV_PV_CASE(8)
#undef FK_KV_PV_CASE
    default:
        break; /* cols is at most FK_ROW_NV vectors */
    }
}

/* acc0[c] += sum_j p0[j] v[j][c] and acc1[c] += sum_j p1[j] v[j][c] over nkeys keys,
 * for nv vectors of columns (the last holding `last` columns): fk_row_pv for two
 * rows that see the same keys (no mask, no bias), each value vector loaded once for
 * both. Each row's sums run in fk_row_pv's order, so its bits are the same. */
FK_INLINE void fk_row_pv2(const float *p0, const float *p1, int64_t nkeys, const void *v,
                          int64_t ldv, float *acc0, float *acc1, const int nv, int64_t last,
                          const int kind)
{
    simd_f32 a[FK_SPLIT_NV2], b[FK_SPLIT_NV2];
    for (int c = 0; c < nv; c++)
        a[c] = simd_load(acc0 + c * SIMD_W), b[c] = simd_load(acc1 + c * SIMD_W);
    for (int64_t j = 0; j < nkeys; j++) {
        const simd_f32 x = simd_set1(p0[j]), y = simd_set1(p1[j]);
        const int64_t vrow = j * ldv;
        for (int c = 0; c < nv - 1; c++) {
            const simd_f32 vv = fk_kv_load(v, vrow + c * SIMD_W, kind);
            a[c] = simd_fma(x, vv, a[c]);
            b[c] = simd_fma(y, vv, b[c]);
        }
        const int64_t vlast = vrow + (nv - 1) * SIMD_W;
        const simd_f32 vv = last == SIMD_W ? fk_kv_load(v, vlast, kind)
                                           : fk_kv_load_n(v, vlast, last, kind);
        a[nv - 1] = simd_fma(x, vv, a[nv - 1]);
        b[nv - 1] = simd_fma(y, vv, b[nv - 1]);
    }
    for (int c = 0; c < nv; c++) {
        simd_store(acc0 + c * SIMD_W, a[c]);
        simd_store(acc1 + c * SIMD_W, b[c]);
    }
}

/* Vectors of value columns the four-row weighted sum keeps in registers: four rows
 * of them, the four rows' weights broadcast and a value vector, 4 * 4 + 4 + 1 = 21
 * of AVX-512's 32 vectors, 4 * 2 + 4 + 1 = 13 of AVX2's 16. */
#if SIMD_W >= 16
#define FK_SPLIT_NV4 4
#else
#define FK_SPLIT_NV4 2
#endif

/* acc_r[c] += sum_j p_r[j] v[j][c] for the four rows r = 0..3 (p[r], acc[r]) over
 * nkeys keys, nv vectors of columns (the last holding `last`): fk_row_pv2 for four
 * rows, each value vector loaded once for the four (a GQA group of four query heads
 * reads its value rows once instead of twice). Each row's sums run in fk_row_pv's
 * order, so its bits are the same. */
FK_INLINE void fk_row_pv4(const float *const *p, int64_t nkeys, const void *v, int64_t ldv,
                          float *const *acc, const int nv, int64_t last, const int kind)
{
    simd_f32 a[FK_SPLIT_NV4], b[FK_SPLIT_NV4], c2[FK_SPLIT_NV4], d[FK_SPLIT_NV4];
    const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    for (int c = 0; c < nv; c++) {
        a[c] = simd_load(acc[0] + c * SIMD_W), b[c] = simd_load(acc[1] + c * SIMD_W);
        c2[c] = simd_load(acc[2] + c * SIMD_W), d[c] = simd_load(acc[3] + c * SIMD_W);
    }
    for (int64_t j = 0; j < nkeys; j++) {
        const simd_f32 x0 = simd_set1(p0[j]), x1 = simd_set1(p1[j]);
        const simd_f32 x2 = simd_set1(p2[j]), x3 = simd_set1(p3[j]);
        const int64_t vrow = j * ldv;
        for (int c = 0; c < nv - 1; c++) {
            const simd_f32 vv = fk_kv_load(v, vrow + c * SIMD_W, kind);
            a[c] = simd_fma(x0, vv, a[c]), b[c] = simd_fma(x1, vv, b[c]);
            c2[c] = simd_fma(x2, vv, c2[c]), d[c] = simd_fma(x3, vv, d[c]);
        }
        const int64_t vlast = vrow + (nv - 1) * SIMD_W;
        const simd_f32 vv = last == SIMD_W ? fk_kv_load(v, vlast, kind)
                                           : fk_kv_load_n(v, vlast, last, kind);
        a[nv - 1] = simd_fma(x0, vv, a[nv - 1]), b[nv - 1] = simd_fma(x1, vv, b[nv - 1]);
        c2[nv - 1] = simd_fma(x2, vv, c2[nv - 1]), d[nv - 1] = simd_fma(x3, vv, d[nv - 1]);
    }
    for (int c = 0; c < nv; c++) {
        simd_store(acc[0] + c * SIMD_W, a[c]), simd_store(acc[1] + c * SIMD_W, b[c]);
        simd_store(acc[2] + c * SIMD_W, c2[c]), simd_store(acc[3] + c * SIMD_W, d[c]);
    }
}

/* fk_row_pv4 over all Dv columns: blocks of FK_SPLIT_NV4 vectors, then the rest in
 * one pass with a constant vector count for the registers. */
FK_INLINE void fk_split_pv4(const float *const *p, int64_t nkeys, const void *v, int64_t ldv,
                            float *const *acc, int64_t Dv, const int kind)
{
    int64_t e0 = 0;
    for (; e0 + FK_SPLIT_NV4 * SIMD_W <= Dv; e0 += FK_SPLIT_NV4 * SIMD_W) {
        float *const a[4] = {acc[0] + e0, acc[1] + e0, acc[2] + e0, acc[3] + e0};
        fk_row_pv4(p, nkeys, fk_kv_at(v, e0, kind), ldv, a, FK_SPLIT_NV4, SIMD_W, kind);
    }
    if (e0 < Dv) {
        const int64_t cols = Dv - e0;
        const int nv = (int)((cols + SIMD_W - 1) / SIMD_W);
        const int64_t last = cols - (int64_t)(nv - 1) * SIMD_W;
        float *const a[4] = {acc[0] + e0, acc[1] + e0, acc[2] + e0, acc[3] + e0};
        /* The rest has fewer than FK_SPLIT_NV4 vectors' columns, so 1 to
         * FK_SPLIT_NV4 vectors, the last of them partial. */
        switch (nv) {
        case 1:
            fk_row_pv4(p, nkeys, fk_kv_at(v, e0, kind), ldv, a, 1, last, kind);
            break;
        case 2:
            fk_row_pv4(p, nkeys, fk_kv_at(v, e0, kind), ldv, a, 2, last, kind);
            break;
#if FK_SPLIT_NV4 > 2
        case 3:
            fk_row_pv4(p, nkeys, fk_kv_at(v, e0, kind), ldv, a, 3, last, kind);
            break;
        case 4:
            fk_row_pv4(p, nkeys, fk_kv_at(v, e0, kind), ldv, a, 4, last, kind);
            break;
#endif
        default:
            break; /* more than FK_SPLIT_NV4 vectors never remain */
        }
    }
}

/* Scratch floats one worker needs on the split path: the group's query rows
 * [R][align(D)] and their scores over one chunk [R][align(chunk)], R = group * Tq,
 * and a row of dvp for the merge. The scores are sized for at least
 * ATTN__SPLIT_MIN_TK keys, so that the scratch planned for a longer key axis
 * always covers the unsplit row path's for a shorter one (the KV cache plans for
 * its capacity and relies on that). */
static int64_t fk_split_ws_floats(const attn__fused_job *job)
{
    const attn__sdpa_shapes *s = job->s;
    const int64_t R = s->group * s->Tq;
    const int64_t keys = job->chunk > ATTN__SPLIT_MIN_TK ? job->chunk : ATTN__SPLIT_MIN_TK;
    return R * (fk_align(s->D) + fk_align(keys)) + fk_align(job->dvp);
}

/* The keys [*lo, *hi) of [j0, j1) that query i may see by position (fk_row_range
 * clipped to the block); *lo >= *hi when none. */
static void fk_split_range(const attn__sdpa_shapes *s, int64_t i, int64_t j0, int64_t j1,
                           int64_t *lo, int64_t *hi)
{
    fk_row_range(s, i, lo, hi);
    if (*lo < j0)
        *lo = j0;
    if (*hi > j1)
        *hi = j1;
}

/* The partial result of query i of (b, h) for chunk c. */
static float *fk_split_part(const attn__fused_job *job, int64_t b, int64_t h, int64_t i,
                            int64_t c)
{
    const attn__sdpa_shapes *s = job->s;
    return job->part + (((b * s->H + h) * s->Tq + i) * job->n_chunks + c) * job->pst;
}

/* One (b, key/value head, chunk) on the split path: the partials of every query
 * row of the group for the chunk's keys, K and V read as `kind`. */
FK_INLINE void fk_split_body(void *arg, int64_t item, int worker, const int kind)
{
    const attn__fused_job *job = (const attn__fused_job *)arg;
    const attn__sdpa_shapes *s = job->s;
    const int64_t nc = job->n_chunks, c = item % nc, kvh = (item / nc) % s->Hkv,
                  b = item / (nc * s->Hkv);
    const int64_t D = s->D, Dv = s->Dv, Tq = s->Tq, R = s->group * Tq;
    const int64_t c0 = c * job->chunk, c1 = fk_min(c0 + job->chunk, s->Tk);
    const int64_t ldq = fk_align(D), ldsc = fk_align(job->chunk), ms3 = s->mask.stride[3];
    const int64_t bs3 = s->bias_s[3], ldk = s->k_s[2], ldv = s->v_s[2];
    float *ws = job->ws + (int64_t)worker * job->ws_floats;
    float *qrows = ws;               /* [R][ldq] */
    float *scores = qrows + R * ldq; /* [R][ldsc], key j of the chunk at j - c0 */
    /* kb and vb point at the chunk's first key, c0: key j is row j - c0. job->k
     * and job->v hold key kv_first at their row 0 (0, or the chunk's own start on
     * the 16-bit path's chunk-sized copy), and c0 >= kv_first, so no pointer here
     * is ever formed before the start of its array. A 16-bit kind reads the
     * caller's rows, job->k16 and job->v16, with kv_first 0. */
    const void *kb = fk_kv_at(kind == FK_KV_F32 ? (const void *)job->k : (const void *)job->k16,
                              b * s->k_s[0] + kvh * s->k_s[1] + (c0 - job->kv_first) * ldk, kind);
    const void *vb = fk_kv_at(kind == FK_KV_F32 ? (const void *)job->v : (const void *)job->v16,
                              b * s->v_s[0] + kvh * s->v_s[1] + (c0 - job->kv_first) * ldv, kind);

    /* Row r is query i = r % Tq of query head h = kvh * group + r / Tq. */
    for (int64_t r = 0; r < R; r++) {
        const int64_t h = kvh * s->group + r / Tq, i = r % Tq;
        const float *qsrc = job->q + attn__off4(s->q_s, b, h, i, 0);
        for (int64_t d = 0; d < D; d++)
            qrows[r * ldq + d] = qsrc[d * s->q_s[3]];
    }

    /* Rows of K and V in bytes, and their strides, for the prefetches. */
    const int64_t es = FK_KV_ES(kind), kbytes = D * es, vbytes = Dv * es;
    const int64_t pk = ldk * es, pv = ldv * es;
    const char *kpf = (const char *)kb, *vpf = (const char *)vb;

    /* Phase 1, over K, a block of keys at a time for every row. */
    for (int64_t j0 = c0; j0 < c1; j0 += FK_SPLIT_KB) {
        const int64_t j1 = fk_min(j0 + FK_SPLIT_KB, c1);
        /* Rows r, r + Tq, ... (the same query of the group's heads) see the same
         * keys: they go four at a time through fk_dot4x4 (AVX-512), then in pairs
         * through fk_dot4x2, then alone. */
        for (int64_t i = 0; i < Tq; i++) {
            int64_t lo, hi;
            fk_split_range(s, i, j0, j1, &lo, &hi);
            for (int64_t g = 0; g < s->group; g += 2) {
                const int64_t r = g * Tq + i;
                const int pair = g + 1 < s->group;
                const float *qrow = qrows + r * ldq, *qrow1 = qrow + Tq * ldq;
                float *sc = scores + r * ldsc - c0, *sc1 = sc + Tq * ldsc;
                int64_t j = lo;
                /* The first row of a block prefetches for every row after it. */
                const int fetch = i == 0 && g == 0;
#if SIMD_W >= 16
                /* Four heads of the group at a time where four remain. */
                if (g + 3 < s->group) {
                    for (; j + 4 <= hi; j += 4) {
                        if (fetch)
                            fk_split_prefetch(kpf, pk, kbytes, vpf, pv, vbytes, j - c0,
                                              j + 4 - c0, c1 - c0);
                        fk_dot4x4(qrow, Tq * ldq, fk_kv_at(kb, (j - c0) * ldk, kind), ldk, D,
                                  s->scale, sc + j, Tq * ldsc, kind);
                    }
                    if (fetch)
                        fk_split_prefetch(kpf, pk, kbytes, vpf, pv, vbytes, j - c0, hi - c0,
                                          c1 - c0);
                    for (; j < hi; j++)
                        for (int64_t u = 0; u < 4; u++)
                            sc[u * Tq * ldsc + j] =
                                fk_kv_dot(qrow + u * Tq * ldq, fk_kv_at(kb, (j - c0) * ldk, kind),
                                          D, kind) *
                                s->scale;
                    g += 2; /* with the loop's own 2: the next four heads */
                    continue;
                }
#endif
                if (pair)
                    for (; j + 4 <= hi; j += 4) {
                        if (fetch)
                            fk_split_prefetch(kpf, pk, kbytes, vpf, pv, vbytes, j - c0,
                                              j + 4 - c0, c1 - c0);
                        fk_dot4x2(qrow, qrow1, fk_kv_at(kb, (j - c0) * ldk, kind), ldk, D,
                                  s->scale, sc + j, sc1 + j, kind);
                    }
                for (; j + 4 <= hi; j += 4) {
                    if (fetch)
                        fk_split_prefetch(kpf, pk, kbytes, vpf, pv, vbytes, j - c0,
                                          j + 4 - c0, c1 - c0);
                    fk_kv_dot4(qrow, fk_kv_at(kb, (j - c0) * ldk, kind), ldk, D, s->scale,
                               sc + j, kind);
                }
                if (fetch)
                    fk_split_prefetch(kpf, pk, kbytes, vpf, pv, vbytes, j - c0, hi - c0,
                                      c1 - c0);
                for (; j < hi; j++) {
                    const void *kj = fk_kv_at(kb, (j - c0) * ldk, kind);
                    sc[j] = fk_kv_dot(qrow, kj, D, kind) * s->scale;
                    if (pair)
                        sc1[j] = fk_kv_dot(qrow1, kj, D, kind) * s->scale;
                }
            }
        }
    }

    /* Phase 2, per row: the score modifications in the contract's order, the keys
     * the mask or a -inf bias hide, the chunk's max and its softmax numerators
     * (fused_row.h's phase 2 without the sink, which the merge adds once). */
    for (int64_t r = 0; r < R; r++) {
        const int64_t h = kvh * s->group + r / Tq, i = r % Tq, ip = i + s->offset;
        float *part = fk_split_part(job, b, h, i, c);
        int64_t lo, hi;
        fk_split_range(s, i, c0, c1, &lo, &hi);
        float *sc = scores + r * ldsc - c0;
        const uint8_t *mrow = fk_row_mask(s, b, h, i);
        const float *brow = fk_row_bias(s, b, h, i);
        const float slope = attn__alibi_slope(s, h);
        if (s->softcap > 0.0f && lo < hi)
            fk_softcap(sc + lo, hi - lo, s->softcap);
        float m = -INFINITY;
        const int64_t visible =
            fk_row_scores(sc, lo, hi, mrow, ms3, brow, bs3, s->alibi, slope, ip, &m);
        part[2] = visible ? 1.0f : 0.0f;
        if (!visible)
            continue;
        const float ref = m == -INFINITY ? 0.0f : m;
        const simd_f32 vm = simd_set1(ref);
        simd_f32 vsum = simd_zero();
        int64_t j = lo;
        for (; j + SIMD_W <= hi; j += SIMD_W) {
            simd_f32 p = simd_exp_nonpos(simd_sub(simd_load(sc + j), vm));
            simd_store(sc + j, p);
            vsum = simd_add(vsum, p);
        }
        if (j < hi) {
            simd_f32 p = simd_exp_nonpos(simd_sub(simd_load_n(sc + j, hi - j, -INFINITY), vm));
            simd_store_n(sc + j, p, hi - j);
            vsum = simd_add(vsum, p);
        }
        part[0] = m;
        part[1] = simd_hsum(vsum);
        memset(part + 16, 0, (size_t)job->dvp * sizeof(float));
    }

    const int pair_pv = !s->mask.data && !s->bias;
    const int64_t quad_heads = s->group / 4 * 4;
    /* Phase 3, over V, a block of keys at a time for every row that saw a key:
     * O_c += p_j v_j in key order (the block boundaries do not change the order of
     * any sum). */
    for (int64_t j0 = c0; j0 < c1; j0 += FK_SPLIT_KB) {
        const int64_t j1 = fk_min(j0 + FK_SPLIT_KB, c1);
        /* The next block's V into L2 while this block is summed, where heads go
         * four at a time: phase 1's prefetch does not keep all of a chunk's V
         * there (S7 read about 5% more of the bandwidth with this one). With
         * fewer heads the phase has little arithmetic per value line for the 8
         * prefetches a key to hide in, and S5 did not gain from them. */
        for (int64_t r = j1; quad_heads > 0 && r < fk_min(j1 + FK_SPLIT_KB, c1); r++) {
            const char *vr = vpf + (r - c0) * pv;
            for (int64_t x = 0; x < vbytes; x += 64)
                FK_PREFETCH_L2(vr + x);
        }
        for (int64_t r = 0; r < R; r++) {
            const int64_t h = kvh * s->group + r / Tq, i = r % Tq;
            float *part = fk_split_part(job, b, h, i, c);
            int64_t lo, hi;
            fk_split_range(s, i, j0, j1, &lo, &hi);
            if (part[2] == 0.0f || lo >= hi)
                continue;
            /* Without a mask or a bias, the same query of the other heads of the
             * group sees exactly these keys: the first quad_heads heads go four at
             * a time through one pass over V, the rest two at a time; a row that
             * another took along is skipped here. A row whose chunk saw no key
             * has part[2] = 0 and then all its group's rows (same keys, no mask,
             * no bias) have it too, so a quad or pair never writes such a row. */
            const int64_t g = r / Tq;
            if (pair_pv && g < quad_heads) {
                if (g % 4 != 0)
                    continue;
                const float *p0 = scores + r * ldsc - c0 + lo;
                const float *const pq[4] = {p0, p0 + Tq * ldsc, p0 + 2 * Tq * ldsc,
                                            p0 + 3 * Tq * ldsc};
                float *const aq[4] = {part + 16, fk_split_part(job, b, h + 1, i, c) + 16,
                                      fk_split_part(job, b, h + 2, i, c) + 16,
                                      fk_split_part(job, b, h + 3, i, c) + 16};
                fk_split_pv4(pq, hi - lo, fk_kv_at(vb, (lo - c0) * ldv, kind), ldv, aq, Dv,
                             kind);
                continue;
            }
            if (pair_pv && (g - quad_heads) % 2 == 1)
                continue;
            if (pair_pv && r / Tq + 1 < s->group) {
                float *part1 = fk_split_part(job, b, h + 1, i, c);
                const float *p0 = scores + r * ldsc - c0 + lo, *p1 = p0 + Tq * ldsc;
                const void *vlo = fk_kv_at(vb, (lo - c0) * ldv, kind);
                int64_t e0 = 0;
                for (; e0 + FK_SPLIT_NV2 * SIMD_W <= Dv; e0 += FK_SPLIT_NV2 * SIMD_W)
                    fk_row_pv2(p0, p1, hi - lo, fk_kv_at(vlo, e0, kind), ldv, part + 16 + e0,
                               part1 + 16 + e0, FK_SPLIT_NV2, SIMD_W, kind);
                if (e0 < Dv) {
                    /* The rest in one pass, a constant count for the registers: 1
                     * to FK_SPLIT_NV2 vectors, the last of them partial (a count
                     * of FK_SPLIT_NV2 itself, Dv 113 to 127 on AVX-512, once had
                     * no case and summed nothing). */
                    const int64_t cols = Dv - e0;
                    const int nv = (int)((cols + SIMD_W - 1) / SIMD_W);
                    const int64_t last = cols - (int64_t)(nv - 1) * SIMD_W;
                    float *a0 = part + 16 + e0, *a1 = part1 + 16 + e0;
                    switch (nv) {
#define FK_PV2_CASE(N)                                                                      \
    case N:                                                                                 \
        fk_row_pv2(p0, p1, hi - lo, fk_kv_at(vlo, e0, kind), ldv, a0, a1, N, last, kind);    \
        break;
                        FK_PV2_CASE(1)
                        FK_PV2_CASE(2)
                        FK_PV2_CASE(3)
                        FK_PV2_CASE(4)
#if FK_SPLIT_NV2 > 4
                        FK_PV2_CASE(5)
                        FK_PV2_CASE(6)
                        FK_PV2_CASE(7)
                        FK_PV2_CASE(8)
#endif
#undef FK_PV2_CASE
                    default:
                        break; /* more than FK_SPLIT_NV2 vectors never remain */
                    }
                }
                continue;
            }
            const uint8_t *mrow = fk_row_mask(s, b, h, i);
            const float *brow = fk_row_bias(s, b, h, i);
            const uint8_t *mr = mrow ? mrow + lo * ms3 : NULL;
            const float *br = brow ? brow + lo * bs3 : NULL;
            const float *p = scores + r * ldsc - c0 + lo;
            const void *vlo = fk_kv_at(vb, (lo - c0) * ldv, kind);
            float *acc = part + 16;
            int64_t e0 = 0;
            for (; e0 + FK_ROW_NV * SIMD_W <= Dv; e0 += FK_ROW_NV * SIMD_W)
                fk_kv_row_pv(p, hi - lo, mr, ms3, br, bs3, fk_kv_at(vlo, e0, kind), ldv, acc + e0,
                             FK_ROW_NV, SIMD_W, kind);
            if (e0 < Dv)
                fk_kv_row_pv_rest(p, hi - lo, mr, ms3, br, bs3, fk_kv_at(vlo, e0, kind), ldv,
                                  acc + e0, Dv - e0, kind);
        }
    }
}

/* The split item's instances, one per kind, each a function of its own: inlined
 * into one, the three copies made the float32 one measurably slower on S7 (4-5%,
 * AVX-512). */
#if defined(__GNUC__) || defined(__clang__)
#define FK_NOINLINE __attribute__((noinline))
#else
#define FK_NOINLINE
#endif

static FK_NOINLINE void fk_split_item_f32(void *arg, int64_t item, int worker)
{
    fk_split_body(arg, item, worker, FK_KV_F32);
}

#if SIMD_W >= 8
static FK_NOINLINE void fk_split_item_bf16(void *arg, int64_t item, int worker)
{
    fk_split_body(arg, item, worker, FK_KV_BF16);
}
#endif

#if SIMD_W >= 8
static FK_NOINLINE void fk_split_item_f16(void *arg, int64_t item, int worker)
{
    fk_split_body(arg, item, worker, FK_KV_F16);
}
#endif

/* One (b, key/value head, chunk) on the split path, K and V as job->kv_dtype says
 * (16-bit where the planner asks for it: on AVX-512 and AVX2). */
static void fk_split_item(void *arg, int64_t item, int worker)
{
#if SIMD_W >= 8
    const attn__fused_job *job = (const attn__fused_job *)arg;
    if (job->kv_dtype == ATTN_DTYPE_BF16) {
        fk_split_item_bf16(arg, item, worker);
        return;
    }
    if (job->kv_dtype == ATTN_DTYPE_F16) {
        fk_split_item_f16(arg, item, worker);
        return;
    }
#endif
    fk_split_item_f32(arg, item, worker);
}

/* One (b, h): merges each query row's partials in chunk order into out and lse. */
static void fk_split_merge(void *arg, int64_t item, int worker)
{
    const attn__fused_job *job = (const attn__fused_job *)arg;
    const attn__sdpa_shapes *s = job->s;
    const int64_t b = item / s->H, h = item % s->H, Dv = s->Dv, dvp = job->dvp;
    const float sink = attn__sink(s, h);
    float *acc = job->ws + (int64_t)worker * job->ws_floats; /* [dvp] */
    for (int64_t i = 0; i < s->Tq; i++) {
        float *orow = job->out + attn__off4(s->o_s, b, h, i, 0);
        float M = sink;
        int seen = 0;
        for (int64_t c = 0; c < job->n_chunks; c++) {
            const float *part = fk_split_part(job, b, h, i, c);
            if (part[2] == 0.0f)
                continue;
            seen = 1;
            if (part[0] != part[0] || part[0] > M)
                M = M != M ? M : part[0];
        }
        if (!seen) {
            const int64_t flat = (b * s->H + h) * s->Tq + i;
            if (!s->sinks && flat < job->empty_first[worker])
                job->empty_first[worker] = flat;
            for (int64_t e = 0; e < Dv; e++)
                orow[e * s->o_s[3]] = 0.0f;
            if (s->lse)
                s->lse[b * s->lse_s[0] + h * s->lse_s[1] + i * s->lse_s[2]] = sink;
            continue;
        }
        float l = s->sinks ? simd_exp_nonpos_1(sink - M) : 0.0f;
        for (int64_t e = 0; e < dvp; e += SIMD_W)
            simd_store(acc + e, simd_zero());
        for (int64_t c = 0; c < job->n_chunks; c++) {
            const float *part = fk_split_part(job, b, h, i, c);
            if (part[2] == 0.0f)
                continue;
            const float w = simd_exp_nonpos_1(part[0] - M);
            l += w * part[1];
            const simd_f32 vw = simd_set1(w);
            for (int64_t e = 0; e < dvp; e += SIMD_W)
                simd_store(acc + e, simd_fma(vw, simd_load(part + 16 + e), simd_load(acc + e)));
        }
        const float inv = 1.0f / l;
        if (s->o_s[3] == 1) {
            const simd_f32 vinv = simd_set1(inv);
            int64_t e = 0;
            for (; e + SIMD_W <= Dv; e += SIMD_W)
                simd_store(orow + e, simd_mul(simd_load(acc + e), vinv));
            if (e < Dv)
                simd_store_n(orow + e, simd_mul(simd_load(acc + e), vinv), Dv - e);
        } else {
            for (int64_t e = 0; e < Dv; e++)
                orow[e * s->o_s[3]] = acc[e] * inv;
        }
        if (s->lse)
            s->lse[b * s->lse_s[0] + h * s->lse_s[1] + i * s->lse_s[2]] = M + logf(l);
    }
}

#endif /* ATTN_FUSED_SPLIT_H */
