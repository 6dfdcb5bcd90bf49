/*
 * bf16_dot.h - the two products of the bfloat16 tile path (bf16_tile.h) by
 * vdpbf16ps, which multiplies 16 pairs of bfloat16 by 16 pairs and adds each pair's
 * two products to a float32 lane: a key (or value column) broadcast as one pair,
 * times a row of Qp's (or Pp's) pairs, 16 query rows along the lanes. Included by
 * src/kernels/sdpa_bf16_dp.c, with the instruction, and by sdpa_bf16_avx512.c, with
 * B16_DP defined as its emulation by AVX-512F FMAs.
 *
 * Register blocking: 4 keys (or value columns) x 4 vectors of 16 query rows, or 8 x 2,
 * 16 accumulators (b16_block44, b16_block82).
 */
#ifndef ATTN_BF16_DOT_H
#define ATTN_BF16_DOT_H

#include <immintrin.h>
#include <math.h>
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

/* acc[x][y] += sum over pairs of a[x] (MX rows of A, lda apart, from a0) times the B
 * pairs of NY vectors of 16 query rows (NY 512-element groups from b0), over n32
 * blocks of 32 elements of the reduction axis; A's block kb starts at a0 + kb *
 * astride and B's at b0 + kb * bstride. Each lane sums its pairs in the same
 * order whatever the shape, so the shapes give the same bits. */
#define B16_DEFINE_BLOCK(name, MX, NY)                                                         \
    static inline __attribute__((always_inline)) void name(                                    \
        __m512 acc[MX][NY], const uint16_t *a0, int64_t lda, int64_t astride,                  \
        const uint16_t *b0, int64_t bstride, int64_t n32)                                      \
    {                                                                                          \
        for (int64_t kb = 0; kb < n32; kb++) {                                                 \
            const uint16_t *a = a0 + kb * astride, *b = b0 + kb * bstride;                     \
            for (int p = 0; p < 16; p++) {                                                     \
                __m512i q[NY];                                                                 \
                for (int y = 0; y < NY; y++)                                                   \
                    q[y] = _mm512_loadu_si512(b + y * 512 + p * 32);                           \
                for (int x = 0; x < MX; x++) {                                                 \
                    const __m512i kw = b16_pair(a + x * lda + 2 * p);                          \
                    for (int y = 0; y < NY; y++)                                               \
                        acc[x][y] = B16_DP(acc[x][y], kw, q[y]);                               \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

/* Two register blockings: 8 keys (or value columns) x 2 vectors of query rows, as
 * the float32 path's 8x2 micro-kernel, and 4 x 4, which needs half the broadcasts
 * per product (on Zen 4 the faster, as for the float32 path's 4x4). 4 x 4 takes 64
 * query rows at a time; a tile's last 32 go by 8 x 2. */
B16_DEFINE_BLOCK(b16_block82, 8, 2)
B16_DEFINE_BLOCK(b16_block44, 4, 4)

/* b16_block44 for the query vectors y0 .. 3 only (y0 a constant at each call site)
 * and the first np pairs of each block of 32: the blocks of a tile at the causal
 * diagonal that some of their rows see (bf16_tile.h's b16_diag_weights,
 * b16_pv_diag). Each lane sums its pairs in the same order as b16_block44. */
static inline __attribute__((always_inline)) void b16_block4t(__m512 acc[4][4], const int y0,
                                                              const uint16_t *a0, int64_t lda,
                                                              int64_t astride, const uint16_t *b0,
                                                              int64_t bstride, int64_t n32,
                                                              const int np)
{
    for (int64_t kb = 0; kb < n32; kb++) {
        const uint16_t *a = a0 + kb * astride, *b = b0 + kb * bstride;
        for (int p = 0; p < np; p++) {
            __m512i q[4];
            for (int y = y0; y < 4; y++)
                q[y] = _mm512_loadu_si512(b + y * 512 + p * 32);
            for (int x = 0; x < 4; x++) {
                const __m512i kw = b16_pair(a + x * lda + 2 * p);
                for (int y = y0; y < 4; y++)
                    acc[x][y] = B16_DP(acc[x][y], kw, q[y]);
            }
        }
    }
}

/* b16_pv applies the key tile's correction alpha itself (bf16_tile.h then runs no
 * pass of its own over O^T for it); alpha NULL means a correction of 1 (no
 * multiplies: x * 1 is x). */
#define B16_PV_SCALES 1

/* The 4 x 4 score blocks are in registers here: bf16_tile.h may turn them into
 * weights on the spot (b16_scores_weights). */
#define B16_FUSED_WEIGHTS 1

#ifndef B16_MT44
#define B16_MT44 1
#endif

/* n rounded up to a multiple of 32. */
static inline int64_t b16_round32(int64_t n) { return (n + 31) / 32 * 32; }

static void b16_begin(float *cfg) { (void)cfg; }
static void b16_end(void) {}

/* ST[c][r] = sum_d Kp[c][d] Q[r][d] for the MX keys from c0 and NY vectors of rows
 * from group g; with cmax, also cmax[r] = max(cmax[r], ST[c][r]) over these keys,
 * from the registers. */
#define B16_DEFINE_SCORES(name, block, MX, NY)                                                 \
    static inline __attribute__((always_inline)) void name(                                    \
        const uint16_t *kp, int64_t ldk, const uint16_t *qp, float *ST, int64_t ldst,          \
        int64_t c0, int64_t g, int64_t groups, int64_t dp, float *cmax)                        \
    {                                                                                          \
        __m512 acc[MX][NY];                                                                    \
        for (int x = 0; x < MX; x++)                                                           \
            for (int y = 0; y < NY; y++)                                                       \
                acc[x][y] = _mm512_setzero_ps();                                               \
        block(acc, kp + c0 * ldk, ldk, 32, qp + g * 512, groups * 512, dp / 32);               \
        for (int x = 0; x < MX; x++)                                                           \
            for (int y = 0; y < NY; y++)                                                       \
                _mm512_storeu_ps(ST + (c0 + x) * ldst + 16 * (g + y), acc[x][y]);              \
        if (cmax)                                                                              \
            for (int y = 0; y < NY; y++) {                                                     \
                __m512 mx = _mm512_loadu_ps(cmax + 16 * (g + y));                              \
                for (int x = 0; x < MX; x++)                                                   \
                    mx = _mm512_max_ps(mx, acc[x][y]);                                         \
                _mm512_storeu_ps(cmax + 16 * (g + y), mx);                                     \
            }                                                                                  \
    }
B16_DEFINE_SCORES(b16_scores82, b16_block82, 8, 2)
B16_DEFINE_SCORES(b16_scores44, b16_block44, 4, 4)

/* ST[c][r] = sum_d Kp[c][d] Q[r][d]; with cmax (nr floats), also cmax[r] = the max
 * over the nkp keys of ST[c][r], gathered from the registers so that the softmax
 * need not read ST for it (a max is exact in any order: fk_col_max's value).
 * With seen (a tile on the causal diagonal or a window's edge), the rows of group g
 * and those before it see only keys c < seen[g]: later keys are hidden from every
 * row of a block, so their scores are left unwritten (the hiding writes -inf over
 * them). Returns 1 when it filled cmax. */
static int b16_scores(const uint16_t *kp, int64_t ldk, const uint16_t *qp, float *ST,
                      int64_t ldst, int64_t nkp, int64_t nr, int64_t dp, float *cmax,
                      const int64_t *seen)
{
    const int64_t groups = nr / 16;
    if (cmax)
        for (int64_t r0 = 0; r0 < nr; r0 += 16)
            _mm512_storeu_ps(cmax + r0, _mm512_set1_ps(-INFINITY));
    int64_t g = 0;
    /* A tile with seen goes by 32 rows (8 x 2), so that the first 32 rows of a
     * diagonal tile leave out the keys only the next 32 see. */
    if (B16_MT44 && !seen)
        for (; g + 4 <= groups; g += 4)
            for (int64_t c0 = 0; c0 < nkp; c0 += 4)
                b16_scores44(kp, ldk, qp, ST, ldst, c0, g, groups, dp, cmax);
    for (; g < groups; g += 2)
        for (int64_t c0 = 0; c0 < (seen ? seen[g + 1] : nkp); c0 += 8)
            b16_scores82(kp, ldk, qp, ST, ldst, c0, g, groups, dp, cmax);
    return cmax != NULL;
}

/* OT[e][r] = OT[e][r] * alpha[r] + sum_c Vt[e][c] P[r][c] for the MX value columns
 * from e0 and NY vectors of rows from group g: the key tile's correction rides on
 * the loads of the accumulators (the same product, x * alpha, as a pass of its own
 * over OT would make). */
#define B16_DEFINE_PV(name, block, MX, NY)                                                     \
    static inline __attribute__((always_inline)) void name(                                    \
        const uint16_t *vt, const uint16_t *pp, float *OT, int64_t ldo, int64_t e0, int64_t g, \
        int64_t groups, int64_t nkp, int64_t dvp, const float *alpha)                          \
    {                                                                                          \
        __m512 acc[MX][NY];                                                                    \
        for (int y = 0; y < NY; y++) {                                                         \
            const __m512 va =                                                                  \
                alpha ? _mm512_loadu_ps(alpha + 16 * (g + y)) : _mm512_setzero_ps();           \
            for (int x = 0; x < MX; x++) {                                                     \
                acc[x][y] = _mm512_loadu_ps(OT + (e0 + x) * ldo + 16 * (g + y));               \
                if (alpha)                                                                     \
                    acc[x][y] = _mm512_mul_ps(acc[x][y], va);                                  \
            }                                                                                  \
        }                                                                                      \
        block(acc, vt + e0 * 32, 32, dvp * 32, pp + g * 512, groups * 512, nkp / 32);          \
        for (int x = 0; x < MX; x++)                                                           \
            for (int y = 0; y < NY; y++)                                                       \
                _mm512_storeu_ps(OT + (e0 + x) * ldo + 16 * (g + y), acc[x][y]);               \
    }
B16_DEFINE_PV(b16_pv82, b16_block82, 8, 2)
B16_DEFINE_PV(b16_pv44, b16_block44, 4, 4)

/* OT[e][r] = OT[e][r] * alpha[r] + sum_c Vt[e][c] P[r][c]; with seen (as for
 * b16_scores), a block of rows sums only the blocks of 32 keys its rows see: the
 * others' weights are 0 for each of its rows, and a sum of exact zeros added
 * changes no bits. */
static void b16_pv(const uint16_t *vt, const uint16_t *pp, float *OT, int64_t ldo,
                   int64_t nkp, int64_t nr, int64_t dvp, const float *alpha, const int64_t *seen)
{
    const int64_t groups = nr / 16;
    int64_t g = 0;
    if (B16_MT44 && !seen) /* as in b16_scores */
        for (; g + 4 <= groups; g += 4)
            for (int64_t e0 = 0; e0 < dvp; e0 += 4)
                b16_pv44(vt, pp, OT, ldo, e0, g, groups, nkp, dvp, alpha);
    for (; g < groups; g += 2)
        for (int64_t e0 = 0; e0 < dvp; e0 += 8)
            b16_pv82(vt, pp, OT, ldo, e0, g, groups, seen ? b16_round32(seen[g + 1]) : nkp, dvp, alpha);
}

/* b16_pv (alpha 1, no seen) for `pre` keys of full tiles (a multiple of 32) and then a
 * tile at the causal diagonal where key c of the tile is visible to row r exactly
 * when c <= r (nkp = nr, a multiple of 64), from Pp's blocks in that order and vt at
 * the first key: one pass over O^T for both. The 16 rows of group g see the diagonal
 * tile's keys below 16 (g + 1) only, so each block of 64 rows sums the keys before its
 * own 64 whole (b16_block44), then its 64 by quarters of 16, each for the groups that
 * see some of it: 5/8 of the diagonal tile's products, where the 32-row blocks of
 * seen make 3/4. The pairs it reads of hidden keys are 0 (b16_diag_weights writes
 * them so); the others it does not read. Each lane sums its keys in order, as
 * b16_pv does, a pass for the full tiles and one for the diagonal tile included. */
static void b16_pv_diag(const uint16_t *vt, const uint16_t *pp, float *OT, int64_t ldo,
                        int64_t pre, int64_t nr, int64_t dvp)
{
    const int64_t groups = nr / 16;
    for (int64_t g0 = 0; g0 < groups; g0 += 4)
        for (int64_t e0 = 0; e0 < dvp; e0 += 4) {
            __m512 acc[4][4];
            for (int x = 0; x < 4; x++)
                for (int y = 0; y < 4; y++)
                    acc[x][y] = _mm512_loadu_ps(OT + (e0 + x) * ldo + 16 * (g0 + y));
            b16_block44(acc, vt + e0 * 32, 32, dvp * 32, pp + g0 * 512, groups * 512,
                        pre / 32 + g0 / 2);
            /* Quarter k = g0 + y0 of the diagonal tile's keys: pairs 8 (k % 2) ..
             * 8 (k % 2) + 7 of its block k / 2, block pre / 32 + k / 2 from vt and pp. */
#define B16_PV_QUARTER(y0)                                                                     \
    b16_block4t(acc, y0,                                                                       \
                vt + (pre / 32 + (g0 + y0) / 2) * dvp * 32 + e0 * 32 + 16 * ((g0 + y0) % 2),   \
                32, 0,                                                                         \
                pp + ((pre / 32 + (g0 + y0) / 2) * groups + g0) * 512 + 256 * ((g0 + y0) % 2), \
                0, 1, 8)
            B16_PV_QUARTER(0);
            B16_PV_QUARTER(1);
            B16_PV_QUARTER(2);
            B16_PV_QUARTER(3);
#undef B16_PV_QUARTER
            for (int x = 0; x < 4; x++)
                for (int y = 0; y < 4; y++)
                    _mm512_storeu_ps(OT + (e0 + x) * ldo + 16 * (g0 + y), acc[x][y]);
        }
}

#endif /* ATTN_BF16_DOT_H */
