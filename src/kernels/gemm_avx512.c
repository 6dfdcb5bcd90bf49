/*
 * gemm_avx512.c - the projection GEMM (src/kernels/gemm_kernel.h) built for AVX-512 (F, DQ, BW and VL).
 * CMake compiles this file alone with the ISA flags; src/kernels/gemm.c calls it only
 * when src/runtime/dispatch.c has found the instructions and their OS support.
 *
 * Micro-tile: 8 rows of x x 3 vectors of output features (24 accumulators). Per
 * step of k that is 3 loads of w and 8 broadcasts of x for 24 FMAs, and 8 row
 * pointers, which leave the compiler enough general registers to keep every one
 * of them out of memory; 12 x 2 needed 12 row pointers and 14 loads, spilled row
 * pointers inside the loop, and measured 4-9% slower at 2048^3 and 1-8% at 768^3
 * (1 thread, thread CPU time, docs/performance.md).
 */
#define ATTN_SIMD_AVX512 1
#define GK_MR 8
#define GK_NRV 3

#include <immintrin.h>
#include <stdint.h>

/* d[c * ld + r] = s[r * ls + c] for r, c < 16: a 16 x 16 block transposed in
 * registers, for packing w. Three rounds: 32-bit interleaves of row pairs, 64-bit
 * interleaves of those pairs, then two rounds of 128-bit lane shuffles that bring
 * each column's four groups of four rows together. */
static inline void gk_transpose16(const float *s, int64_t ls, float *d, int64_t ld)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(s + i * ls);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* a0 b0 a1 b1 per lane */
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 1]), e = _mm512_castps_pd(t[4 * i + 3]);
        /* r[4i + j], lane L: rows 4i .. 4i+3 of column j + 4L. */
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, e));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, e));
    }
    for (int j = 0; j < 4; j++) {
        const __m512 t1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);  /* columns j, j + 8 */
        const __m512 t2 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);  /* j + 4, j + 12 */
        const __m512 t3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        const __m512 t4 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
        _mm512_storeu_ps(d + j * ld, _mm512_shuffle_f32x4(t1, t3, 0x88));
        _mm512_storeu_ps(d + (j + 8) * ld, _mm512_shuffle_f32x4(t1, t3, 0xdd));
        _mm512_storeu_ps(d + (j + 4) * ld, _mm512_shuffle_f32x4(t2, t4, 0x88));
        _mm512_storeu_ps(d + (j + 12) * ld, _mm512_shuffle_f32x4(t2, t4, 0xdd));
    }
}
#define GK_TRANSPOSE gk_transpose16



#include "gemm_kernel.h"

const attn__gemm_kernel attn__gemm_kernel_avx512 = {
    ATTN_ARCH_AVX512, GK_MR, GK_NR, gk_tile_item, GK_PACK_BODY,
};
