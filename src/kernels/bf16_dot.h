/*
 * bf16_dot.h - the two products of the bfloat16 tile path (bf16_tile.h) by
 * vdpbf16ps, which multiplies 16 pairs of bfloat16 by 16 pairs and adds each pair's
 * two products to a float32 lane: a key (or value column) broadcast as one pair,
 * times a row of Qp's (or Pp's) pairs, 16 query rows along the lanes. Included by
 * src/kernels/sdpa_bf16_dp.c, with the instruction, and by sdpa_bf16_avx512.c, with
 * B16_DP defined as its emulation by AVX-512F FMAs.
 *
 * Register blocking: 8 keys (or value columns) x 2 vectors of 16 query rows, 16
 * accumulators, as the float32 path's score micro-kernel.
 */
#ifndef ATTN_BF16_DOT_H
#define ATTN_BF16_DOT_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#ifndef B16_DP
#error "define B16_DP(acc, pair, row) before including bf16_dot.h"
#endif

/* One bfloat16 pair (two adjacent elements) as the 32-bit word to broadcast. */
static inline __m512i b16_pair(const uint16_t *p)
{
    int32_t w;
    memcpy(&w, p, sizeof w);
    return _mm512_set1_epi32(w);
}

/* acc[x][y] += sum over pairs of a[x] (rows of A, lda apart, from a0) times the B
 * pairs of 32 query rows (two 512-element groups from b0), over n32 blocks of 32
 * elements of the reduction axis; A's block kb starts at a0 + kb * astride and B's
 * at b0 + kb * bstride. */
static inline void b16_block(__m512 acc[8][2], const uint16_t *a0, int64_t lda, int64_t astride,
                             const uint16_t *b0, int64_t bstride, int64_t n32)
{
    for (int64_t kb = 0; kb < n32; kb++) {
        const uint16_t *a = a0 + kb * astride, *b = b0 + kb * bstride;
        for (int p = 0; p < 16; p++) {
            const __m512i q0 = _mm512_loadu_si512(b + p * 32);
            const __m512i q1 = _mm512_loadu_si512(b + 512 + p * 32);
            for (int x = 0; x < 8; x++) {
                const __m512i kw = b16_pair(a + x * lda + 2 * p);
                acc[x][0] = B16_DP(acc[x][0], kw, q0);
                acc[x][1] = B16_DP(acc[x][1], kw, q1);
            }
        }
    }
}

static void b16_begin(float *cfg) { (void)cfg; }
static void b16_end(void) {}

/* ST[c][r] = sum_d Kp[c][d] Q[r][d], 8 keys x 32 query rows at a time. */
static void b16_scores(const uint16_t *kp, int64_t ldk, const uint16_t *qp, float *ST,
                       int64_t ldst, int64_t nkp, int64_t nr, int64_t dp)
{
    const int64_t groups = nr / 16;
    for (int64_t c0 = 0; c0 < nkp; c0 += 8)
        for (int64_t g = 0; g < groups; g += 2) {
            __m512 acc[8][2];
            for (int x = 0; x < 8; x++)
                acc[x][0] = acc[x][1] = _mm512_setzero_ps();
            b16_block(acc, kp + c0 * ldk, ldk, 32, qp + g * 512, groups * 512, dp / 32);
            for (int x = 0; x < 8; x++) {
                _mm512_storeu_ps(ST + (c0 + x) * ldst + 16 * g, acc[x][0]);
                _mm512_storeu_ps(ST + (c0 + x) * ldst + 16 * g + 16, acc[x][1]);
            }
        }
}

/* OT[e][r] += sum_c Vt[e][c] P[r][c], 8 value columns x 32 query rows at a time. */
static void b16_pv(const uint16_t *vt, const uint16_t *pp, float *OT, int64_t ldo,
                   int64_t nkp, int64_t nr, int64_t dvp)
{
    const int64_t groups = nr / 16;
    for (int64_t e0 = 0; e0 < dvp; e0 += 8)
        for (int64_t g = 0; g < groups; g += 2) {
            __m512 acc[8][2];
            for (int x = 0; x < 8; x++) {
                acc[x][0] = _mm512_loadu_ps(OT + (e0 + x) * ldo + 16 * g);
                acc[x][1] = _mm512_loadu_ps(OT + (e0 + x) * ldo + 16 * g + 16);
            }
            b16_block(acc, vt + e0 * 32, 32, dvp * 32, pp + g * 512, groups * 512, nkp / 32);
            for (int x = 0; x < 8; x++) {
                _mm512_storeu_ps(OT + (e0 + x) * ldo + 16 * g, acc[x][0]);
                _mm512_storeu_ps(OT + (e0 + x) * ldo + 16 * g + 16, acc[x][1]);
            }
        }
}

#endif /* ATTN_BF16_DOT_H */
