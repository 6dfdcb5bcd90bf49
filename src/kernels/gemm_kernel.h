/*
 * gemm_kernel.h - the body of the projection GEMM, written once over src/kernels/simd.h
 * and compiled per instruction set by src/kernels/gemm.c (portable C), src/kernels/gemm_avx2.c and
 * src/kernels/gemm_avx512.c, each of which defines ATTN_SIMD_<ISA>, GK_MR (rows of x per
 * micro-tile) and GK_NRV (vectors of output columns per micro-tile) first.
 *
 * THE CONTRACT
 *
 * It computes y[m, n] = sum_k x[m, k] w[n, k] + bias[n] (nn.Linear, W [N, K]).
 * Both x and w are contiguous along k only, so one side must be repacked for
 * vector loads along n: w is packed beforehand (attn__gemm_pack in gemm.c, once for
 * a packed weight or per call into scratch) into panels [ceil(N / NR)][K][NR] with
 * NR = GK_NRV * SIMD_W, zero-padded past N. x is never copied: the micro-kernel
 * broadcasts x[m, k] straight from the caller's rows (any strides), so a
 * micro-tile reads GK_MR rows of x and one panel of w and keeps its GK_MR x NR sums
 * in registers over the whole of k, in increasing k.
 *
 * Rows are found from their index (up to three leading axes with their own
 * strides): a work item counts its block's row offsets once, on its stack
 * (attn__gemm_row_offsets), so a call needs no table of row offsets and no scratch.
 *
 * Tails: rows past M are served by repeating row M-1 (valid memory) and their sums
 * are dropped; columns past N are zeros in the packed panel and are dropped. Full
 * micro-tiles with a unit column stride whose rows are evenly spaced, and whose
 * vectors each fall inside one of y's column blocks (gemm.h's cb), store straight
 * into y, one vector at a time; others go through a small stack tile.
 *
 * Work items: one item is a block of job->mb rows (up to ATTN_GEMM_MB_TILES_MAX
 * micro-tiles; gemm.c chooses) x job->nb panels; items write disjoint parts of y
 * and each sum has one order, so the result does not depend on the thread count.
 * The panel of w an item reads (K x NR floats) stays in L2 while it walks the
 * block's rows.
 */
#ifndef ATTN_GEMM_KERNEL_H
#define ATTN_GEMM_KERNEL_H

#include "gemm.h"
#include "simd.h"

#if !defined(GK_MR) || !defined(GK_NRV)
#error "define GK_MR and GK_NRV before including gemm_kernel.h"
#endif

#define GK_NR (GK_NRV * SIMD_W)

#if defined(__GNUC__) || defined(__clang__)
#define GK_INLINE static inline __attribute__((always_inline))
#define GK_PREFETCH(p) __builtin_prefetch(p)
#else
#define GK_INLINE static inline
#define GK_PREFETCH(p) ((void)(p))
#endif

/* How far ahead the micro-kernel asks for the panel of w (in steps of k), and how
 * many 64-byte lines one step of the panel spans (NR floats, at least one line). */
#define GK_PREFETCH_K 32
#define GK_LINES_PER_K (GK_NR >= 16 ? GK_NR / 16 : 1)

/* The micro-kernel: out[r][c] = bias[c] + sum_k x_r[k * xcs] * wp[k][c], where
 * vector v of a row (columns v * SIMD_W ..) is stored at out + r * ldo + vo[v]. */
GK_INLINE void gk_ukr(int64_t K, const float *const *xr, int64_t xcs, const float *wp,
                      const float *bias, float *out, int64_t ldo, const int64_t *vo)
{
    simd_f32 acc[GK_MR][GK_NRV];
    for (int r = 0; r < GK_MR; r++)
        for (int c = 0; c < GK_NRV; c++)
            acc[r][c] = simd_zero();
    for (int64_t k = 0; k < K; k++) {
        /* The panel streams from L2 (K x NR floats: 96 KiB at K = 512 with AVX-512's
         * 48 columns, more than L1 holds), and the hardware prefetcher alone left
         * the FMAs waiting for it: asking for the lines GK_PREFETCH_K steps ahead
         * made a 2048^3 GEMM 5-8% faster on the Sapphire Rapids class
         * (docs/performance.md). A prefetch never faults, so running past the
         * panel's end near the last k is harmless. */
        for (int l = 0; l < GK_LINES_PER_K; l++)
            GK_PREFETCH(wp + (k + GK_PREFETCH_K) * GK_NR + l * 16);
        simd_f32 wv[GK_NRV];
        for (int c = 0; c < GK_NRV; c++)
            wv[c] = simd_load(wp + k * GK_NR + c * SIMD_W);
        for (int r = 0; r < GK_MR; r++) {
            simd_f32 xv = simd_set1(xr[r][k * xcs]);
            for (int c = 0; c < GK_NRV; c++)
                acc[r][c] = simd_fma(xv, wv[c], acc[r][c]);
        }
    }
    for (int c = 0; c < GK_NRV; c++) {
        simd_f32 bv = simd_load(bias + c * SIMD_W);
        for (int r = 0; r < GK_MR; r++)
            simd_store(out + r * ldo + vo[c], simd_add(acc[r][c], bv));
    }
}

static void gk_tile_item(void *arg, int64_t item, int worker)
{
    (void)worker;
    const attn__gemm_job *job = (const attn__gemm_job *)arg;
    const attn__gemm_packed *pw = job->pw;
    const int64_t M = job->M, N = pw->N, K = pw->K;
    const int64_t n_panels = (N + GK_NR - 1) / GK_NR;
    const int64_t n_pblocks = (n_panels + job->nb - 1) / job->nb;
    const int64_t mb = item / n_pblocks, pb = item % n_pblocks;
    const int64_t m0 = mb * job->mb, m1 = m0 + job->mb < M ? m0 + job->mb : M;
    const int64_t p0 = pb * job->nb, p1 = p0 + job->nb < n_panels ? p0 + job->nb : n_panels;
    const int64_t x_cs = job->xr->cs;
    const attn__gemm_rows *yr = job->yr;
    /* A full tile stores straight into y when y's columns are unit-strided and no
     * vector straddles one of its column blocks (cb, a multiple of the width). */
    const int vec_fits = yr->cs == 1 && (yr->cb <= 0 || yr->cb % SIMD_W == 0);
    float tile[GK_MR * GK_NR];
    int64_t tile_vo[GK_NRV];
    for (int c = 0; c < GK_NRV; c++)
        tile_vo[c] = c * SIMD_W;
    /* The block's row offsets, found once for all its panels. */
    int64_t xoff[GK_MR * ATTN_GEMM_MB_TILES_MAX], yoff_all[GK_MR * ATTN_GEMM_MB_TILES_MAX];
    attn__gemm_row_offsets(job->xr, m0, m1 - m0, xoff);
    attn__gemm_row_offsets(yr, m0, m1 - m0, yoff_all);
    for (int64_t p = p0; p < p1; p++) {
        const float *wp = pw->wp + p * K * GK_NR;
        const float *bp = pw->bp + p * GK_NR;
        const int64_t n0 = p * GK_NR;
        const int64_t nc = N - n0 < GK_NR ? N - n0 : GK_NR;
        /* Where the panel's columns, and its vectors, start within a row of y. The
         * columns past a partial panel's nc are set too (never used), so that no
         * compiler can read vo's loop as using an unset element. */
        int64_t coff[GK_NR], vo[GK_NRV];
        for (int64_t c = 0; c < GK_NR; c++)
            coff[c] = c < nc ? attn__gemm_col(yr, n0 + c) : 0;
        for (int c = 0; c < GK_NRV; c++)
            vo[c] = nc == GK_NR ? coff[c * SIMD_W] - coff[0] : 0;
        for (int64_t m = m0; m < m1; m += GK_MR) {
            const int64_t mr = m1 - m < GK_MR ? m1 - m : GK_MR;
            const float *xr[GK_MR];
            const int64_t *yoff = yoff_all + (m - m0);
            for (int r = 0; r < GK_MR; r++)
                xr[r] = job->x + xoff[m - m0 + (r < mr ? r : mr - 1)];
            if (mr == GK_MR && nc == GK_NR && vec_fits) {
                /* Straight into y when the tile's rows are evenly spaced. */
                const int64_t ldo = yoff[1] - yoff[0];
                int even = 1;
                for (int r = 2; r < GK_MR; r++)
                    even &= yoff[r] - yoff[0] == r * ldo;
                if (even) {
                    gk_ukr(K, xr, x_cs, wp, bp, job->y + yoff[0] + coff[0], ldo, vo);
                    continue;
                }
            }
            gk_ukr(K, xr, x_cs, wp, bp, tile, GK_NR, tile_vo);
            for (int64_t r = 0; r < mr; r++) {
                float *yrow = job->y + yoff[r];
                for (int64_t c = 0; c < nc; c++)
                    yrow[coff[c]] = tile[r * GK_NR + c];
            }
        }
    }
}

#if SIMD_HAS_TRANSPOSE
/* Packing's fast part (attn__gemm_kernel.pack_body): SIMD_W x SIMD_W blocks of
 * the panel's features and k, each read as SIMD_W row segments of w and written,
 * transposed in registers (simd_transpose_block), as SIMD_W rows of
 * the panel. The portable loop moved one float at a time, about four cycles each
 * (1.3 ns a float for a 2048 x 2048 weight, a twentieth of the GEMM's time). */
static int64_t gk_pack_body(const float *w, int64_t w_rs, int64_t K, float *dst)
{
    int64_t k = 0;
    for (; k + SIMD_W <= K; k += SIMD_W)
        for (int g = 0; g < GK_NRV; g++)
            simd_transpose_block(dst + k * GK_NR + g * SIMD_W, GK_NR, w + g * SIMD_W * w_rs + k, w_rs);
    return k;
}
#define GK_PACK_BODY gk_pack_body
#else
#define GK_PACK_BODY NULL
#endif

#endif /* ATTN_GEMM_KERNEL_H */
