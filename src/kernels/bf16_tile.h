/*
 * bf16_tile.h - one work item of the bfloat16 tile path (sdpa_bf16.h says the
 * plan and the packed layouts). Included once per bfloat16 kernel, by
 * src/kernels/sdpa_bf16_amx.c, sdpa_bf16_dp.c and sdpa_bf16_avx512.c, each of which
 * first defines the two products and their set-up:
 *
 *   b16_begin(cfg)   before an item's first product (AMX: load the tile
 *                    configuration into the 64 bytes at cfg); b16_end() after its last
 *   b16_scores(kp, ldk, qp, ST, ldst, nkp, nr, dp, cmax, seen)
 *                    ST[c][r] = sum_d Kp[c][d] Q[r][d] for keys c < nkp (rows of kp,
 *                    ldk elements apart) and query rows r < nr, from Qp's pairs;
 *                    with cmax, it may also gather cmax[r] = max_c ST[c][r] and
 *                    then returns 1 (else 0); with seen, it may leave out the keys
 *                    c >= seen[g] for the rows r < 16 (g + 1) (hidden from them)
 *   b16_pv(vt, pp, OT, ldo, nkp, nr, dvp, alpha, seen)
 *                    OT[e][r] = OT[e][r] * alpha[r] + sum_c Vt[e][c] P[r][c] for
 *                    e < dvp, c < nkp, r < nr, from Pp's pairs; vt is the key
 *                    tile's first block of Vt, the blocks [dvp][32] one after
 *                    another; with seen, it may leave out the same keys (their
 *                    weights are 0). A kernel that defines B16_PV_SCALES 1 applies
 *                    alpha so (alpha NULL: 1, no multiplies); any other is handed
 *                    alpha NULL and the item scales O^T by alpha in a pass of its
 *                    own first (b16_rescale)
 *
 * A kernel that defines B16_FUSED_WEIGHTS 1 (its scores in b16_block44's registers)
 * lets the item take a full tile's weights from them (b16_scores_weights), and a
 * causal diagonal tile's (b16_diag_weights, with its b16_pv_diag).
 *
 * B16_NATIVE_CVT when it has AVX512-BF16's vcvtne2ps2bf16 (the weights are
 * then rounded to bfloat16 by it, else by integer steps that round the same way:
 * to nearest even, a NaN kept a NaN), and B16_OVERLAP 1 when the next key tile's
 * score product should be issued before this tile's softmax (AMX: the tile unit
 * then works beside the vector units; where the vector units do the products too,
 * it only doubles the scores' share of L1, so the plain order is the default). nkp and nr are multiples of 32, dp and dvp
 * too. Everything between the products is the float32 tile path's own code
 * (fused_tile.h), built here for AVX-512.
 */
#ifndef ATTN_BF16_TILE_H
#define ATTN_BF16_TILE_H

/* The float32 tile path's steps, built for AVX-512 with the avx512 build's
 * micro-tile sizes (sdpa_fused_avx512.c); this file uses the tile steps only, so
 * the rest of the kernel body is compiled here unused. */
#define ATTN_SIMD_AVX512 1
#define FK_MR 8
#define FK_NV 2
#define FK_MK 8
#define FK_NQV 2
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include "fused_kernel.h"
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "half.h"
#include "sdpa_bf16.h"

#include <immintrin.h>

/* Q rows i0 .. i0+nr-1 of (b, h), as bfloat16 pairs along D in B-operand layout:
 * qp[((c * (nr/16) + g) * 16 + p) * 32 + 2 q + u] = Q[i0 + 16 g + q][32 c + 2 p + u];
 * rows past Tq and columns past D are zeros. */
static void b16_pack_q(const attn__bf16_job *job, const uint16_t *qb, int64_t i0, int64_t nr,
                       uint16_t *qp)
{
    const attn__sdpa_shapes *s0 = job->s0;
    const int64_t D = s0->D, groups = nr / 16, rows = fk_min(nr, s0->Tq - i0);
    if (s0->q_s[3] == 1 && D % 32 == 0) {
        /* Whole blocks of 32 along D, unit stride: each pair is one 32-bit word, so a
         * (c, g) block is a 16 x 16 transpose of words. */
        for (int64_t g = 0; g < groups; g++) {
            if (16 * g + 16 <= rows && s0->q_s[2] % 2 == 0) {
                /* 16 whole rows, 32-bit words in each row: the (c, g) block is the
                 * words' transpose, in registers (bit copies of the floats' lanes). */
                const float *src = (const float *)(const void *)(qb + (i0 + 16 * g) * s0->q_s[2]);
                for (int64_t c = 0; c < D / 32; c++)
                    simd_transpose_block((float *)(void *)(qp + (c * groups + g) * 512), 16,
                                         src + 16 * c, s0->q_s[2] / 2);
                continue;
            }
            for (int64_t q = 0; q < 16; q++) {
                const int64_t r = 16 * g + q;
                /* Rows past Tq are zeros, and are never addressed. */
                const uint16_t *src = r < rows ? qb + (i0 + r) * s0->q_s[2] : NULL;
                for (int64_t c = 0; c < D / 32; c++) {
                    uint32_t *dst = (uint32_t *)(void *)(qp + (c * groups + g) * 512) + q;
                    for (int64_t p = 0; p < 16; p++) {
                        uint32_t w = 0;
                        if (src)
                            memcpy(&w, src + 32 * c + 2 * p, sizeof w);
                        dst[16 * p] = w;
                    }
                }
            }
        }
        return;
    }
    for (int64_t c = 0; c < job->dp / 32; c++)
        for (int64_t g = 0; g < groups; g++) {
            uint16_t *dst = qp + (c * groups + g) * 512;
            for (int64_t q = 0; q < 16; q++) {
                const int64_t r = 16 * g + q;
                const uint16_t *src = r < rows ? qb + (i0 + r) * s0->q_s[2] : NULL;
                for (int64_t d2 = 0; d2 < 32; d2++) {
                    const int64_t d = 32 * c + d2;
                    dst[(d2 / 2) * 32 + 2 * q + (d2 & 1)] = src && d < D ? src[d * s0->q_s[3]] : 0;
                }
            }
        }
}

/* Two keys' weights for 16 query rows, rounded to bfloat16 as the pairs of one
 * row of Pp: lane q holds (a[q], b[q]), a in the low word. */
#ifdef B16_NATIVE_CVT
FK_INLINE __m512i b16_pairs(__m512 a, __m512 b, __m512i vidx)
{
    /* vcvtne2ps2bf16 puts a's 16 words in 0-15 and b's in 16-31; vpermw
     * interleaves them. */
    return _mm512_permutexvar_epi16(vidx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}
#endif

FK_INLINE __m512i b16_round(__m512 x)
{
    /* As attn__f32_to_bf16: + 0x7fff + the lowest kept bit; a NaN gets its quiet
     * bit instead, so that it stays a NaN. The result is in the top 16 bits. */
    const __m512i u = _mm512_castps_si512(x);
    const __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                            _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), u,
                                _mm512_set1_epi32(0x00400000));
}

#ifndef B16_NATIVE_CVT
FK_INLINE __m512i b16_pairs(__m512 a, __m512 b, __m512i vidx)
{
    (void)vidx;
    return _mm512_or_si512(_mm512_and_si512(b16_round(b), _mm512_set1_epi32((int)0xffff0000u)),
                           _mm512_srli_epi32(b16_round(a), 16));
}
#endif

/* e^x for x <= 0 as the weights of the bfloat16 path need it: a NaN stays NaN and
 * below SIMD_EXP_MIN (-inf included) it is exactly 0, as simd_exp_nonpos, but with
 * a degree-5 Taylor polynomial on |r| <= ln 2 / 2 (first dropped term below 2.5e-6
 * relative) and one-constant reduction: 11 instructions instead of 17. The weights
 * are rounded to bfloat16 (2^-9 relative) before they multiply V; the sum l keeps
 * float32 weights, so the output and the log-sum-exp move by a few 1e-6 relative
 * (tests/test_bf16_paths.c holds the log-sum-exp to 1e-4). */
FK_INLINE __m512 b16_exp(__m512 x)
{
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SIMD_EXP_MIN), _CMP_NLT_UQ);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SIMD_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945f), x);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(SIMD_C5), r, _mm512_set1_ps(SIMD_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SIMD_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

/* 2^x for x <= 0 (a few 1e-7 above 0 too) on the full tiles of raw products: r = x -
 * floor(x) in [0, 1] by vreduceps (rounding down; exact), a degree-4 polynomial of
 * 2^r (fitted at Chebyshev nodes of [0, 1]: 3.5e-6 relative at most, beside the
 * 2.5e-6 of b16_exp's and bfloat16's 2^-9), and vscalefps by x itself, which scales
 * by 2^floor(x): no subtraction of the integer part and no mask. A NaN stays NaN, and
 * -inf gives exactly 0 (r = 0, 1 * 2^-inf); below 2^-126 the weight is a denormal
 * or 0 rather than exactly 0 (vcvtne2ps2bf16 rounds it to 0 for the products, and
 * next to the max's weight, near 1, it is below l's last place). 8 instructions
 * where b16_exp takes 11. */
FK_INLINE __m512 b16_exp2(__m512 x)
{
    const __m512 r = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.367030945e-2f), r, _mm512_set1_ps(5.174499776e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.416043573e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.929729222e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.000003493f));
    return _mm512_scalef_ps(p, x);
}

/* 2^x as b16_exp2 with a degree-3 polynomial, one FMA fewer: 7.5e-5 relative at
 * most (fitted on [0, 1]), against bfloat16's 2^-9 on the rounded weights. Enough
 * for the outputs, which are divided by the sum of the weights as rounded (l2), not
 * for the log-sum-exp (l: tests/test_bf16_paths.c holds it to 1e-4, and this polynomial
 * would move it by up to 7e-5), so calls that ask for that keep b16_exp2. */
FK_INLINE __m512 b16_exp2_3(__m512 x)
{
    const __m512 r = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(7.802367210e-2f), r, _mm512_set1_ps(2.260686308e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.958328485e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.999253154e-1f));
    return _mm512_scalef_ps(p, x);
}

/* acc plus the two weights of a row of Pp's pairs (b16_pairs' words), as rounded:
 * the high one, then the low one, as vdpbf16ps adds a pair's products; by that
 * instruction (times a pair of ones) where the kernel has it, which takes one FMA
 * unit's slot rather than four of the units the weights' steps already keep busy. */
FK_INLINE __m512 b16_pair_sum(__m512 acc, __m512i w)
{
#ifdef B16_DP
    return B16_DP(acc, w, _mm512_set1_epi32(0x3f803f80));
#else
    acc = _mm512_add_ps(
        acc, _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u))));
    return _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
#endif
}

/* The weights of 16 rows of a key tile (b16_softmax): p = e^(sc * vmul - vsub)
 * (base2: 2^(sc * vmul - vsub), by b16_exp2_3 with coarse) for the nkp keys from sc
 * (br floats apart), rounded
 * to bfloat16 pairs into dst's blocks (groups KiB apart), kept in sc too with
 * keep_p; returns their sum, in key order, and *rsum the sum of the rounded ones. By
 * blocks of 32 keys, pointers stepped. */
FK_INLINE __m512 b16_weights(float *sc0, int64_t br, uint16_t *dst0, int64_t nkp, int64_t groups,
                             __m512 vmul, __m512 vsub, int keep_p, __m512i vidx, const int base2,
                             const int coarse, __m512 *rsum)
{
    simd_f32 vsum = simd_zero(), vrsum = simd_zero();
    for (int64_t kc = 0; kc < nkp / 32; kc++) {
        float *sc = sc0 + kc * 32 * br;
        uint16_t *dst = dst0 + kc * groups * 512;
        for (int p = 0; p < 16; p++, sc += 2 * br, dst += 32) {
            const __m512 x0 = _mm512_fmsub_ps(simd_load(sc), vmul, vsub);
            const __m512 x1 = _mm512_fmsub_ps(simd_load(sc + br), vmul, vsub);
            const simd_f32 p0 = base2 ? (coarse ? b16_exp2_3(x0) : b16_exp2(x0)) : b16_exp(x0);
            const simd_f32 p1 = base2 ? (coarse ? b16_exp2_3(x1) : b16_exp2(x1)) : b16_exp(x1);
            vsum = simd_add(simd_add(vsum, p0), p1);
            if (keep_p) {
                simd_store(sc, p0);
                simd_store(sc + br, p1);
            }
            const __m512i w = b16_pairs(p0, p1, vidx);
            vrsum = b16_pair_sum(vrsum, w);
            _mm512_storeu_si512(dst, w);
        }
    }
    *rsum = vrsum;
    return vsum;
}

#ifndef B16_FUSED_WEIGHTS
#define B16_FUSED_WEIGHTS 0
#endif

/* How far above a row's running max, in base-2 units, a full tile's score may be
 * and still take its weight against that max (b16_scores_weights): weights up to
 * 2^8, and O^T, l and l2 at most that much larger than against the max itself. */
#define B16_LAZY_MAX 8.0f

/* The largest |m log2 e| for which a weight's exponent may be taken by one FMA, S
 * (scale log2 e) - m log2 e: both factors are rounded, so the exponent of a score
 * equal to the max comes out off by units in the last place of m log2 e rather than
 * 0, a factor common to the tile's weights (up to 2^(2^-6) here) but not to other
 * tiles'; at 2^38 it is 2^13 and more, and the weights inf or 0. Beyond, the scores
 * are scaled (rounded) first and the max subtracted from them, as the float32 path
 * does, and full tiles take the plain steps. */
#define B16_BASE2_MAX 65536.0f

/* After this many tiles of an item whose scores went beyond (the row maxes still
 * climbing: wide, peaked scores), its other tiles take the plain steps at once. */
#define B16_LAZY_MISSES 2

/* dispatch's tiles have at most 512 rows (b16_seen, b16_scores_weights). */
#define B16_SEEN_MAX 512

#if B16_FUSED_WEIGHTS
/* One step of b16_scores_weights: the scores of keys c0 .. c0 + 3 for the query
 * vectors y0 .. 3 of the four from group g (b16_block4t), straight to their weights
 * against the max (m2, base 2), rounded into Pp's pairs; vsum and vrsum gather the
 * weights' sums. With masked (a tile at the causal diagonal, b16_diag_weights),
 * group g + y0 holds the diagonal: its lane q (row 16 (g + y0) + q) sees key c0 + x
 * only when c0 % 16 + x <= q, and a hidden key's weight is 0, whatever its score.
 * Returns the lanes whose exponent is above B16_LAZY_MAX (or NaN). */
FK_INLINE __mmask16 b16_lazy_step(const uint16_t *kp, int64_t ldk, const uint16_t *qp,
                                  int64_t groups, int64_t dp, int64_t c0, int64_t g, const int y0,
                                  const int masked, const __m512 *m2, __m512 vmul, __m512 vlim,
                                  __m512i vidx, __m512 *vsum, __m512 *vrsum, uint16_t *pp,
                                  const int coarse)
{
    __m512 acc[4][4];
    for (int x = 0; x < 4; x++)
        for (int y = y0; y < 4; y++)
            acc[x][y] = _mm512_setzero_ps();
    b16_block4t(acc, y0, kp + c0 * ldk, ldk, 32, qp + g * 512, groups * 512, dp / 32, 16);
    /* Keys c0 .. c0 + 3 are pairs c0 / 2 and c0 / 2 + 1 of Pp's block c0 / 32. */
    uint16_t *dst = pp + ((c0 / 32 * groups + g) * 16 + (c0 % 32) / 2) * 32;
    __mmask16 over = 0;
    for (int y = y0; y < 4; y++) {
        __m512 p[4];
        for (int x = 0; x < 4; x++) {
            const __m512 xv = _mm512_fmsub_ps(acc[x][y], vmul, m2[g + y]);
            const __m512 e = coarse ? b16_exp2_3(xv) : b16_exp2(xv);
            if (masked && y == y0) {
                const __mmask16 vis = (__mmask16)(0xffffu << (c0 % 16 + x));
                over |= _mm512_mask_cmp_ps_mask(vis, xv, vlim, _CMP_NLE_UQ);
                p[x] = _mm512_maskz_mov_ps(vis, e);
            } else {
                over |= _mm512_cmp_ps_mask(xv, vlim, _CMP_NLE_UQ);
                p[x] = e;
            }
            vsum[y] = _mm512_add_ps(vsum[y], p[x]);
        }
        const __m512i w01 = b16_pairs(p[0], p[1], vidx), w23 = b16_pairs(p[2], p[3], vidx);
        vrsum[y] = b16_pair_sum(b16_pair_sum(vrsum[y], w01), w23);
        _mm512_storeu_si512(dst + y * 512, w01);
        _mm512_storeu_si512(dst + y * 512 + 32, w23);
    }
    return over;
}

/* b16_scores_weights' body, with coarse: b16_exp2_3 rather than b16_exp2; with diag,
 * b16_diag_weights'. */
FK_INLINE int b16_scores_weights_body(const uint16_t *kp, int64_t ldk, const uint16_t *qp,
                                      int64_t nkp, int64_t nr, int64_t dp, const float *m,
                                      float scale, float *tsum, uint16_t *pp, const int coarse,
                                      const int diag)
{
    const int64_t groups = nr / 16;
    __m512 m2[B16_SEEN_MAX / 16];
    for (int64_t g = 0; g < groups; g++) {
        m2[g] = _mm512_mul_ps(_mm512_loadu_ps(m + 16 * g), _mm512_set1_ps(SIMD_LOG2E));
        if (_mm512_cmp_ps_mask(_mm512_abs_ps(m2[g]), _mm512_set1_ps(B16_BASE2_MAX),
                               _CMP_LT_OQ) != 0xffff)
            return 0;
    }
    uint16_t idx[32];
    for (int q = 0; q < 16; q++) {
        idx[2 * q] = (uint16_t)q;
        idx[2 * q + 1] = (uint16_t)(16 + q);
    }
    const __m512i vidx = _mm512_loadu_si512(idx);
    const __m512 vmul = _mm512_set1_ps(scale * SIMD_LOG2E), vlim = _mm512_set1_ps(B16_LAZY_MAX);
    __mmask16 over = 0;
    for (int64_t g = 0; g < groups; g += 4) {
        __m512 vsum[4], vrsum[4];
        for (int y = 0; y < 4; y++)
            vsum[y] = vrsum[y] = _mm512_setzero_ps();
        /* At the diagonal, the keys from 16 (g + 4) on are hidden from these rows. */
        const int64_t cend = diag ? fk_min(nkp, 16 * (g + 4)) : nkp;
        for (int64_t c0 = 0; c0 < cend; c0 += 4) {
#define B16_STEP(y0, masked)                                                                   \
    b16_lazy_step(kp, ldk, qp, groups, dp, c0, g, y0, masked, m2, vmul, vlim, vidx, vsum, vrsum, \
                  pp, coarse)
            if (!diag || c0 < 16 * g)
                over |= B16_STEP(0, 0);
            else
                /* Keys c0 .. c0 + 3 are in group g + y0's 16 x 16 diagonal block; the
                 * groups before it see none of them. */
                switch (c0 / 16 - g) {
                case 0: over |= B16_STEP(0, 1); break;
                case 1: over |= B16_STEP(1, 1); break;
                case 2: over |= B16_STEP(2, 1); break;
                default: over |= B16_STEP(3, 1); break;
                }
#undef B16_STEP
            if (over)
                return 0; /* the plain steps redo the tile: stop wasting work on it */
        }
        for (int y = 0; y < 4; y++) {
            _mm512_storeu_ps(tsum + 16 * (g + y), vsum[y]);
            _mm512_storeu_ps(tsum + B16_SEEN_MAX + 16 * (g + y), vrsum[y]);
        }
    }
    return 1;
}

/* Steps 1-3 of a full key tile of raw products at once, where every row's running
 * max m is below B16_BASE2_MAX in base 2: each 4 x 4 block of scores (b16_block44) goes from the
 * registers straight to its weights P = 2^(S scale log2 e - m log2 e) against the
 * max as it stands (no new max and no correction of O^T: alpha = 1), rounded to
 * bfloat16 pairs into Pp; tsum[r] = their sum and tsum[B16_SEEN_MAX + r] that of the
 * rounded ones, in key order. No ST is written nor read, and the weights' shuffles,
 * conversions and adds run beside the products' FMAs. Returns 1 when P and tsum are
 * the tile's; 0, with nothing to keep, when an exponent is above B16_LAZY_MAX (or
 * NaN) or a max is not below B16_BASE2_MAX in base 2: the item then takes the tile's plain
 * steps, a new max and its correction. nr a multiple of 64, at most B16_SEEN_MAX.
 * Not inlined: in b16_item, the compiler's registers for the 4 x 4 block spill. */
static __attribute__((noinline)) int b16_scores_weights(const uint16_t *kp, int64_t ldk,
                                                        const uint16_t *qp, int64_t nkp,
                                                        int64_t nr, int64_t dp, const float *m,
                                                        float scale, float *tsum, uint16_t *pp,
                                                        int coarse)
{
    return coarse ? b16_scores_weights_body(kp, ldk, qp, nkp, nr, dp, m, scale, tsum, pp, 1, 0)
                  : b16_scores_weights_body(kp, ldk, qp, nkp, nr, dp, m, scale, tsum, pp, 0, 0);
}

/* b16_scores_weights for a tile at the causal diagonal where key c of the tile is
 * visible to row r exactly when c <= r (b16_diag_lazy; nkp = nr, a multiple of 64,
 * at most B16_SEEN_MAX): the blocks of 4 keys x 16 rows that no row sees are left
 * out (5/8 of the tile's products are made), the hidden keys of the 16 x 16 blocks
 * on the diagonal get weight 0, and their scores are not held to B16_LAZY_MAX. The
 * pairs of Pp that b16_pv_diag reads are written; the others are not. */
static __attribute__((noinline)) int b16_diag_weights(const uint16_t *kp, int64_t ldk,
                                                      const uint16_t *qp, int64_t nr, int64_t dp,
                                                      const float *m, float scale, float *tsum,
                                                      uint16_t *pp, int coarse)
{
    return coarse ? b16_scores_weights_body(kp, ldk, qp, nr, nr, dp, m, scale, tsum, pp, 1, 1)
                  : b16_scores_weights_body(kp, ldk, qp, nr, nr, dp, m, scale, tsum, pp, 0, 1);
}

/* l += tsum and l2 += tsum + B16_SEEN_MAX, the sums of a tile's weights against the
 * running max (b16_scores_weights, b16_diag_weights), nr rows. */
static void b16_add_sums(float *l, float *l2, const float *tsum, int64_t nr)
{
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {
        _mm512_storeu_ps(l + r0,
                         _mm512_add_ps(_mm512_loadu_ps(l + r0), _mm512_loadu_ps(tsum + r0)));
        _mm512_storeu_ps(l2 + r0, _mm512_add_ps(_mm512_loadu_ps(l2 + r0),
                                                _mm512_loadu_ps(tsum + B16_SEEN_MAX + r0)));
    }
}

/* 1 when the key tile j0 .. j0 + nkp - 1 of t is at the causal diagonal so that key
 * j0 + c is visible to row i0 + r exactly when c <= r, and its weights may go by
 * b16_diag_weights: causal alone hides keys (no window, mask nor bias), no option
 * changes the scores, every row and key of the tile is real, and nkp = nr. */
static int b16_diag_lazy(const fk_tile *t, int64_t j0, int64_t nkp)
{
    const attn__sdpa_shapes *s = t->s;
    const int64_t off = s->causal == ATTN_CAUSAL_TOP_LEFT ? 0 : s->offset;
    return s->causal && !s->has_window && !s->mask.data && !fk_has_score_mod(s) &&
           s->scale > 0.0f && nkp == t->nr && t->nr % 64 == 0 && t->nr <= B16_SEEN_MAX &&
           t->i1 - t->i0 == t->nr && j0 + nkp <= s->Tk && j0 == t->i0 + off;
}
#endif

#ifndef B16_STALE_MAX
#define B16_STALE_MAX 0
#endif
#ifndef B16_PLAIN_COARSE
#define B16_PLAIN_COARSE 0
#endif

/* Steps 2-3 of a key tile, fused for the bfloat16 products: with the raw products
 * in ST ([nkp][br], key-major; hidden ones -inf; `scaled` when they are already
 * scaled and modified), m_new = max(m, max_j S_ij), alpha = exp(m - m_new), P = exp(S - m_new),
 * l = l * alpha + sum_j P, as fk_softmax_stats computes them, with P rounded to
 * bfloat16 straight into Pp's pairs, and l2 = l2 * alpha + the sum of those rounded:
 * pp[((kc * (nr/16) + g) * 16 + p) * 32 + 2 q + u] = P[16 g + q][32 kc + 2 p + u].
 * With keep_p, P is also left in ST in float32 (for b16_accumulate_visible). cmax,
 * where the product gathered it, is the max of the products per row (else NULL:
 * the max is read from ST).
 *
 * A kernel that defines B16_STALE_MAX 1 (AMX, whose products leave the weights to
 * this pass) keeps a row's running max as it stands when the tile's raw scores stay
 * within B16_LAZY_MAX (base 2) of it, as b16_scores_weights does on the vdpbf16ps
 * kernels: weights up to 2^8, alpha exactly 1, and b16_rescale's pass over O^T
 * skipped for those rows; not with `stale` 0 (the head's values hold big ones,
 * ATTN__BF16_VBIG). With B16_PLAIN_COARSE 1, calls without the log-sum-exp
 * take 2^x by b16_exp2_3, as that path does. */
static void b16_softmax(const fk_tile *t, int64_t nkp, int scaled, int keep_p, int stale,
                        const float *cmax, uint16_t *pp, float *l2)
{
    const int64_t br = t->br, nr = t->nr, groups = nr / 16;
    float *ST = t->ST, *m = t->m, *l = t->l, *alpha = t->alpha;
    /* Unscaled scores (scale > 0, see b16_item): the max of the products times the
     * scale is the max of the scaled products (rounding is monotone), and each
     * exponent is one FMA, scale * S - m. */
    const __m512 vscale = _mm512_set1_ps(scaled ? 1.0f : t->s->scale);
    uint16_t idx[32];
    for (int q = 0; q < 16; q++) {
        idx[2 * q] = (uint16_t)q;
        idx[2 * q + 1] = (uint16_t)(16 + q);
    }
    const __m512i vidx = _mm512_loadu_si512(idx);
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {
        const simd_f32 vmax = cmax ? simd_load(cmax + r0) : fk_col_max(ST + r0, br, nkp);
        const simd_f32 mold = simd_load(m + r0);
        const __m512 tmax = _mm512_mul_ps(vmax, vscale);
        simd_f32 mnew = simd_max(mold, tmax);
        if (B16_STALE_MAX && !scaled && stale)
            /* (tmax - mold) log2 e <= 2^3: false for a NaN, and for -inf - -inf */
            mnew = _mm512_mask_mov_ps(
                mnew,
                _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_sub_ps(tmax, mold), _mm512_set1_ps(SIMD_LOG2E)),
                                   _mm512_set1_ps(B16_LAZY_MAX), _CMP_LE_OQ),
                mold);
        const simd_f32 msafe = fk_max_for_exp(mnew);
        simd_store(alpha + r0, b16_exp(simd_sub(mold, msafe)));
        simd_store(m + r0, mnew);
        /* Raw products: the exponent in base 2 straight from the product, S *
         * (scale log2 e) - m log2 e, one FMA, and 2^x needs no reduction by ln 2
         * (b16_exp2; two FMAs fewer a score). Both factors are rounded, so x is
         * off by a few units in the last place of S scale log2 e, as on the
         * float32 path, whose scores are rounded in base-2 units: weights off by
         * ~1e-7 times |S scale|, beside bfloat16's 2^-9. A max of B16_BASE2_MAX
         * and more in base 2 (or not finite) would put units in the last place of
         * m log2 e into every exponent: these rows' raw products are scaled (and
         * rounded) in ST first, and the max subtracted from them, as the scores
         * the max came from. */
        const __m512 m2 = _mm512_mul_ps(msafe, _mm512_set1_ps(SIMD_LOG2E));
        const int base2 = !scaled && _mm512_cmp_ps_mask(_mm512_abs_ps(m2),
                                                        _mm512_set1_ps(B16_BASE2_MAX),
                                                        _CMP_LT_OQ) == 0xffff;
        if (!scaled && !base2)
            for (int64_t c = 0; c < nkp; c++)
                simd_store(ST + c * br + r0, _mm512_mul_ps(simd_load(ST + c * br + r0), vscale));
        __m512 rsum;
        const simd_f32 vsum =
            base2 ? b16_weights(ST + r0, br, pp + (r0 / 16) * 512, nkp, groups,
                                _mm512_set1_ps(t->s->scale * SIMD_LOG2E), m2, keep_p, vidx, 1,
                                B16_PLAIN_COARSE && !t->s->lse, &rsum)
                  : b16_weights(ST + r0, br, pp + (r0 / 16) * 512, nkp, groups,
                                _mm512_set1_ps(1.0f), msafe, keep_p, vidx, 0, 0, &rsum);
        simd_store(l + r0, simd_fma(simd_load(l + r0), simd_load(alpha + r0), vsum));
        simd_store(l2 + r0, simd_fma(simd_load(l2 + r0), simd_load(alpha + r0), rsum));
    }
}

/* O^T's columns are query rows: each scaled by its row's correction (the vdpbf16ps
 * kernels' b16_pv does it as it loads O^T, B16_PV_SCALES; this pass is for AMX's
 * and for b16_accumulate_visible). */
static void b16_rescale(const fk_tile *t, float *OT)
{
    for (int64_t r0 = 0; r0 < t->nr; r0 += 16) {
        const __m512 va = _mm512_loadu_ps(t->alpha + r0);
        if (_mm512_cmp_ps_mask(va, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) == 0)
            continue;
        for (int64_t e = 0; e < t->dvp; e++)
            _mm512_storeu_ps(OT + e * t->br + r0,
                             _mm512_mul_ps(_mm512_loadu_ps(OT + e * t->br + r0), va));
    }
}

/* O^T += P V for a PARTIAL tile whose values hold an inf or a NaN: a plain loop over
 * the visible (i, j) only, so that a masked key's value never reaches a row (its
 * weight is 0, but 0 * inf is NaN), with the weights rounded to bfloat16 as the
 * products see them. Such tiles are rare, so speed does not matter. */
static void b16_accumulate_visible(const fk_tile *t, const uint16_t *vt, int64_t dvp,
                                   int64_t j0, int64_t nkp, float *OT)
{
    const attn__sdpa_shapes *s = t->s;
    for (int64_t r = 0; r < t->i1 - t->i0; r++)
        for (int64_t c = 0; c < nkp; c++) {
            if (!fk_key_visible(s, t->b, t->h, t->i0 + r, j0 + c))
                continue;
            const float p = attn__bf16_to_f32(attn__f32_to_bf16(t->ST[c * t->br + r]));
            for (int64_t e = 0; e < s->Dv; e++)
                OT[e * t->br + r] +=
                    p * attn__bf16_to_f32(vt[(j0 + c) / 32 * dvp * 32 + e * 32 + (j0 + c) % 32]);
        }
}

/* V^T of one whole block of 32 keys x 32 columns (attn__bf16_kernel.vblock): each
 * pair of key rows interleaved into 32-bit words (vpermw: word e of both rows side
 * by side), then the 16 x 16 words transposed, so that row e of the result holds
 * keys 0..31 of column e in order. Returns the block's flags (ATTN__BF16_VBAD,
 * ATTN__BF16_VBIG). */
static unsigned b16_vblock(const uint16_t *src, int64_t ld, uint16_t *dst, uint16_t vbig)
{
    uint16_t il[32], ih[32];
    for (int e = 0; e < 16; e++) {
        il[2 * e] = (uint16_t)e;
        il[2 * e + 1] = (uint16_t)(32 + e);
        ih[2 * e] = (uint16_t)(16 + e);
        ih[2 * e + 1] = (uint16_t)(48 + e);
    }
    const __m512i vil = _mm512_loadu_si512(il), vih = _mm512_loadu_si512(ih);
    const __m512i expo = _mm512_set1_epi16(0x7f80), vb = _mm512_set1_epi16((short)vbig);
    uint32_t words[2][16][16]; /* [half][key pair a][column e within the half] */
    __mmask32 bad = 0, big = 0;
    for (int a = 0; a < 16; a++) {
        const __m512i r0 = _mm512_loadu_si512(src + 2 * a * ld);
        const __m512i r1 = _mm512_loadu_si512(src + (2 * a + 1) * ld);
        const __m512i x0 = _mm512_and_si512(r0, expo), x1 = _mm512_and_si512(r1, expo);
        bad |= _mm512_cmpeq_epi16_mask(x0, expo) | _mm512_cmpeq_epi16_mask(x1, expo);
        big |= _mm512_cmpge_epu16_mask(x0, vb) | _mm512_cmpge_epu16_mask(x1, vb);
        _mm512_storeu_si512(words[0][a], _mm512_permutex2var_epi16(r0, vil, r1));
        _mm512_storeu_si512(words[1][a], _mm512_permutex2var_epi16(r0, vih, r1));
    }
    /* Row e of the result, as 16 words, is column e of words[half]: a transpose in
     * registers (bit copies; 32 gathers took ~2% of S2's samples on Zen 4). */
    for (int half = 0; half < 2; half++)
        simd_transpose_block((float *)(void *)(dst + 16 * half * 32), 16,
                             (const float *)(const void *)&words[half][0][0], 16);
    return (bad ? ATTN__BF16_VBAD : 0u) | (big ? ATTN__BF16_VBIG : 0u);
}

/* A key tile the item visits: keys j0 .. j0 + nkp - 1 (nkp rounded up to 32), and
 * its kind (fk_tile_kind); nkp = 0 when there is none left. */
typedef struct b16_ktile {
    int64_t j0, nkp;
    int kind;
} b16_ktile;

/* The first key tile from j0 on, before j_end, that the tile's rows do not skip. */
static b16_ktile b16_next_tile(const fk_tile *t, int64_t j0, int64_t j_end)
{
    const attn__sdpa_shapes *s = t->s;
    b16_ktile k = {0, 0, FK_SKIP};
    for (; j0 < j_end; j0 += t->bc) {
        const int64_t j1 = fk_min(j0 + t->bc, s->Tk), nkp = fk_round_up(j1 - j0, 32);
        const int kind = fk_tile_kind(s, t->b, t->h, t->i0, t->i1, j0, j1, nkp);
        if (kind != FK_SKIP) {
            k.j0 = j0;
            k.nkp = nkp;
            k.kind = kind;
            return k;
        }
    }
    return k;
}

/* Step 5 for the bfloat16 path: out = O / l2 rounded to bfloat16 straight into the
 * caller's out (as attn__f32_to_bf16 rounds: to nearest even, a NaN kept a NaN), with
 * the log-sum-exp and the empty rows decided as on the float32 path, from l. */
static void b16_finish(const attn__bf16_job *job, const fk_tile *t, const float *l2, int worker)
{
    const attn__sdpa_shapes *s0 = job->s0;
    const int64_t Dv = s0->Dv, dvp = t->dvp;
    fk_finish_rows(&job->f, t, worker);
    /* O is a sum of the weights as rounded to bfloat16 times V: divided by the sum of
     * those same weights (l2), a weight's rounding error counts only as far as it
     * differs from the others' (the sum of the unrounded ones, l, gives the
     * log-sum-exp, and with a row that sees no key 1 / l is 0 or NaN as decided). */
    for (int64_t r = 0; r < t->nr; r++)
        if (t->l[r] != 0.0f)
            t->inv[r] = 1.0f / l2[r];
    uint16_t *ob = (uint16_t *)job->out + t->b * s0->o_s[0] + t->h * s0->o_s[1];
    for (int64_t r = 0; r < t->i1 - t->i0; r++) {
        uint16_t *orow = ob + (t->i0 + r) * s0->o_s[2];
        const float *acc = t->O + r * dvp;
        const __m512 vinv = _mm512_set1_ps(t->inv[r]);
        int64_t e = 0;
        if (s0->o_s[3] == 1)
            for (; e + 16 <= Dv; e += 16)
                _mm256_storeu_si256(
                    (__m256i *)(void *)(orow + e),
                    _mm512_cvtepi32_epi16(_mm512_srli_epi32(
                        b16_round(_mm512_mul_ps(_mm512_loadu_ps(acc + e), vinv)), 16)));
        for (; e < Dv; e++)
            orow[e * s0->o_s[3]] = attn__f32_to_bf16(acc[e] * t->inv[r]);
    }
}

#ifndef B16_OVERLAP
#define B16_OVERLAP 0
#endif
#ifndef B16_PV_SCALES
#define B16_PV_SCALES 0
#endif

/* 1 when a key tile's scores need work before the softmax (the options that change
 * or hide them, or a scale the softmax cannot apply as it reads them). */
static int b16_needs_mod(const attn__sdpa_shapes *s, int kind)
{
    return fk_has_score_mod(s) || kind == FK_PARTIAL || !(s->scale > 0.0f);
}

/* For a PARTIAL key tile, seen[g] = how many of its keys the rows up to 16 (g + 1)
 * see at most (fk_keys_seen: on the causal diagonal the later keys are hidden from
 * a whole block of rows), and seen is returned; NULL for any other tile, and for
 * more than B16_SEEN_MAX rows (dispatch's tiles have at most 512: everything is then
 * computed, as without seen). */
static const int64_t *b16_seen(const fk_tile *t, const b16_ktile *k, int64_t *seen)
{
    if (k->kind != FK_PARTIAL || t->nr > B16_SEEN_MAX)
        return NULL;
    for (int64_t g = 0; g < t->nr / 16; g++)
        seen[g] = fk_keys_seen(t, k->j0, k->nkp, k->kind, 16 * (g + 1));
    return seen;
}

/* The flags (ATTN__BF16_VBAD, ATTN__BF16_VBIG) of the blocks of values of keys j0 ..
 * j0 + nkp - 1, ORed. */
static unsigned b16_vflags(const uint8_t *vbad, int64_t j0, int64_t nkp)
{
    unsigned f = 0;
    for (int64_t blk = j0 / 32; blk < (j0 + nkp) / 32; blk++)
        f |= vbad[blk];
    return f;
}

/* One (b, h, query tile) in the steps of sdpa_bf16.h. */
static void b16_item(void *arg, int64_t item, int worker)
{
    const attn__bf16_job *job = (const attn__bf16_job *)arg;
    const attn__sdpa_shapes *s = job->f.s, *s0 = job->s0;
    attn__bf16_ws w;
    attn__bf16_ws_layout(job, &w);
    /* Items go head by head, the heaviest query tiles of a causal head first, as on
     * the float32 path (fk_tile_begin). */
    const int64_t n_qt = job->f.n_qt, bh = item / n_qt, qt_index = n_qt - 1 - item % n_qt;
    fk_tile t;
    memset(&t, 0, sizeof t);
    t.s = s;
    t.b = bh / s->H;
    t.h = bh % s->H;
    t.br = job->f.br;
    t.bc = job->f.bc;
    t.dvp = job->dvp;
    t.i0 = qt_index * t.br;
    t.i1 = fk_min(t.i0 + t.br, s->Tq);
    t.nr = fk_round_up(t.i1 - t.i0, 32);
    float *ws = job->f.ws + (int64_t)worker * job->f.ws_floats;
    t.ST = ws + w.st;
    t.O = ws + w.o;
    t.m = ws + w.m;
    t.l = ws + w.l;
    t.alpha = ws + w.alpha;
    t.inv = ws + w.inv;
    float *OT = ws + w.ot, *l2 = ws + w.l2;
    uint16_t *qp = (uint16_t *)(ws + w.qp), *pp = (uint16_t *)(ws + w.pp);
    t.slope = attn__alibi_slope(s, t.h);
    t.sink = attn__sink(s, t.h);

    const int64_t br = t.br, nr = t.nr, dvp = job->dvp, tkp = job->tkp, dp = job->dp;
    for (int64_t r = 0; r < nr; r++) {
        t.m[r] = t.sink;
        t.l[r] = l2[r] = t.sink > -INFINITY ? 1.0f : 0.0f;
    }
    memset(OT, 0, (size_t)(dvp * br) * sizeof(float));
    b16_pack_q(job, job->q + t.b * s0->q_s[0] + t.h * s0->q_s[1], t.i0, nr, qp);
    const int64_t hk = t.b * s->Hkv + t.h / s->group;
    const uint16_t *kp = job->k_inplace
                             ? job->k + t.b * s0->k_s[0] + (t.h / s->group) * s0->k_s[1]
                             : job->kp + hk * tkp * dp;
    const uint16_t *vt = job->vt + hk * dvp * tkp;
    const uint8_t *vbad = job->vbad + hk * (tkp / 32);
    const __m512 vscale = _mm512_set1_ps(s->scale);
    /* A big value anywhere in the head's V (ATTN__BF16_VBIG): O^T, with weights of
     * up to 2^8 against a stale max, might overflow where weights of at most 1 (the
     * max kept current) leave it finite, even from tiles whose own values are not
     * big, as it may hold a big value's product already; so no weight of the item
     * is taken against a stale max. */
    const int v_big = (b16_vflags(vbad, 0, tkp) & ATTN__BF16_VBIG) != 0;

    b16_begin(ws + w.cfg);
    int64_t j_begin, j_end, lo, hi;
    fk_row_range(s, t.i0, &j_begin, &hi);
    fk_row_range(s, t.i1 - 1, &lo, &j_end);
    /* With B16_OVERLAP, software pipelining: the product of the next key tile is
     * issued into the other score buffer before this tile's softmax; the sums are
     * those of the plain order, tile by tile, either way. */
    float *stbuf[2] = {ws + w.st, ws + w.st2}, *cmaxbuf[2] = {ws + w.cmax, ws + w.cmax + br};
    int has_max[2] = {0, 0};
    int cur = 0;
    int64_t seen_buf[2][B16_SEEN_MAX / 16];
#if B16_FUSED_WEIGHTS
    float tsum[2 * B16_SEEN_MAX];
    int lazy_misses = 0;
    /* Keys pend_j0 .. pend_j0 + pend_nkp - 1: full tiles whose weights are in Pp but
     * not yet in O^T (see below). */
    int64_t pend_j0 = 0, pend_nkp = 0;
#endif
    b16_ktile next = b16_next_tile(&t, j_begin / t.bc * t.bc, j_end);
    if (B16_OVERLAP && next.nkp)
        has_max[cur] = b16_scores(kp + next.j0 * dp, dp, qp, stbuf[cur], br, next.nkp, nr, dp,
                                  b16_needs_mod(s, next.kind) ? NULL : cmaxbuf[cur],
                                  b16_seen(&t, &next, seen_buf[cur]));
    while (next.nkp) {
        const b16_ktile this_tile = next;
        const int64_t j0 = this_tile.j0, nkp = this_tile.nkp;
        const int kind = this_tile.kind;
        /* The scale is applied as the softmax reads the scores, unless the options
         * that change them (or a scale the softmax cannot apply) must see them scaled
         * first; the hiding writes -inf, which any scale keeps, so a tile at the
         * causal diagonal or a window's edge keeps its raw products (and the
         * softmax's base-2 steps). The max gathered by the product serves only the
         * raw scores left as they are. */
        const int mod = b16_needs_mod(s, kind);
        const int scaled = fk_has_score_mod(s) || !(s->scale > 0.0f);
        const int64_t *seen = b16_seen(&t, &this_tile, seen_buf[cur]);
        /* This tile's values with an inf or a NaN, or big ones. */
        const unsigned vflags = b16_vflags(vbad, j0, nkp);
        next = b16_next_tile(&t, j0 + t.bc, j_end);
#if B16_FUSED_WEIGHTS
        /* A full tile of raw products whose weights fit under the running max: its
         * weights straight from the product's registers and no correction of O^T
         * (b16_scores_weights); else its plain steps below. */
        if (!B16_OVERLAP && kind == FK_FULL && !mod && B16_MT44 && nr % 64 == 0 &&
            nr <= B16_SEEN_MAX && lazy_misses < B16_LAZY_MISSES && !v_big) {
            /* Right after pending tiles, the weights go to Pp's next blocks, so that
             * one pass of b16_pv over O^T sums them all (the same sums in the same
             * order as a pass a tile: alpha is 1 for each). */
            const int64_t at = pend_nkp && pend_j0 + pend_nkp == j0 &&
                                       pend_nkp + nkp <= ATTN__BF16_PP_TILES * t.bc
                                   ? pend_nkp
                                   : 0;
            if (pend_nkp && !at) {
                b16_pv(vt + pend_j0 / 32 * dvp * 32, pp, OT, br, pend_nkp, nr, dvp, NULL, NULL);
                pend_nkp = 0;
            }
            if (!b16_scores_weights(kp + j0 * dp, dp, qp, nkp, nr, dp, t.m, s->scale, tsum,
                                    pp + at / 32 * (nr / 16) * 512, !s->lse))
                lazy_misses++;
            else {
                b16_add_sums(t.l, l2, tsum, nr);
                if (at) {
                    pend_nkp += nkp;
                } else {
                    pend_j0 = j0;
                    pend_nkp = nkp;
                }
                continue;
            }
        }
        /* A tile at the causal diagonal likewise, with its hidden keys' weights 0 and the
         * blocks no row sees left out (b16_diag_weights); right after pending tiles,
         * its weights go to Pp's next blocks and b16_pv_diag sums them all in one
         * pass. Values with an inf or a NaN keep the plain steps (0 times inf is
         * NaN). */
        if (!B16_OVERLAP && kind == FK_PARTIAL && B16_MT44 && lazy_misses < B16_LAZY_MISSES &&
            !v_big && b16_diag_lazy(&t, j0, nkp)) {
            if (!vflags) {
                const int64_t at = pend_nkp && pend_j0 + pend_nkp == j0 &&
                                           pend_nkp + nkp <= ATTN__BF16_PP_TILES * t.bc
                                       ? pend_nkp
                                       : 0;
                if (pend_nkp && !at) {
                    b16_pv(vt + pend_j0 / 32 * dvp * 32, pp, OT, br, pend_nkp, nr, dvp, NULL,
                           NULL);
                    pend_nkp = 0;
                }
                if (b16_diag_weights(kp + j0 * dp, dp, qp, nr, dp, t.m, s->scale, tsum,
                                     pp + at / 32 * (nr / 16) * 512, !s->lse)) {
                    b16_add_sums(t.l, l2, tsum, nr);
                    b16_pv_diag(vt + (j0 - at) / 32 * dvp * 32, pp, OT, br, at, nr, dvp);
                    pend_nkp = 0;
                    continue;
                }
                lazy_misses++; /* the plain steps below sum the pending tiles first */
            }
        }
        /* The plain steps below write Pp and correct O^T: the pending tiles' sum first. */
        if (pend_nkp) {
            b16_pv(vt + pend_j0 / 32 * dvp * 32, pp, OT, br, pend_nkp, nr, dvp, NULL, NULL);
            pend_nkp = 0;
        }
#endif
        if (!B16_OVERLAP)
            has_max[cur] = b16_scores(kp + j0 * dp, dp, qp, stbuf[cur], br, nkp, nr, dp,
                                      mod ? NULL : cmaxbuf[cur], seen);
        if (B16_OVERLAP && next.nkp)
            has_max[cur ^ 1] =
                b16_scores(kp + next.j0 * dp, dp, qp, stbuf[cur ^ 1], br, next.nkp, nr, dp,
                           b16_needs_mod(s, next.kind) ? NULL : cmaxbuf[cur ^ 1],
                           b16_seen(&t, &next, seen_buf[cur ^ 1]));
        t.ST = stbuf[cur];
        const float *cmax = has_max[cur] && !mod ? cmaxbuf[cur] : NULL;
        if (B16_OVERLAP)
            cur ^= 1;
        if (scaled) {
            for (int64_t c = 0; c < nkp; c++)
                for (int64_t r0 = 0; r0 < nr; r0 += 16)
                    _mm512_storeu_ps(t.ST + c * br + r0,
                                     _mm512_mul_ps(_mm512_loadu_ps(t.ST + c * br + r0), vscale));
            if (fk_has_score_mod(s))
                fk_score_mod(&t, j0, nkp);
        }
        if (kind == FK_PARTIAL)
            fk_hide(&t, j0, nkp);
        const int bad = kind == FK_PARTIAL && (vflags & ATTN__BF16_VBAD);
        b16_softmax(&t, nkp, scaled, bad, !v_big, cmax, pp, l2);
        if (bad || !B16_PV_SCALES)
            b16_rescale(&t, OT);
        if (bad)
            b16_accumulate_visible(&t, vt, dvp, j0, nkp, OT);
        else
            b16_pv(vt + j0 / 32 * dvp * 32, pp, OT, br, nkp, nr, dvp,
                   B16_PV_SCALES ? t.alpha : NULL, seen);
    }
#if B16_FUSED_WEIGHTS
    if (pend_nkp)
        b16_pv(vt + pend_j0 / 32 * dvp * 32, pp, OT, br, pend_nkp, nr, dvp, NULL, NULL);
#endif
    b16_end();
    /* O = (O^T)^T by 16 x 16 blocks in registers (nr and dvp are multiples of 32). */
    for (int64_t e0 = 0; e0 < dvp; e0 += 16)
        for (int64_t r0 = 0; r0 < nr; r0 += 16)
            simd_transpose_block(t.O + r0 * dvp + e0, dvp, OT + e0 * br + r0, br);
    b16_finish(job, &t, l2, worker);
}

#endif /* ATTN_BF16_TILE_H */
