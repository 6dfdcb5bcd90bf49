/*
 * gemm_avx2.c - the projection GEMM (src/kernels/gemm_kernel.h) built for AVX2 + FMA.
 * CMake compiles this file alone with the ISA flags; src/kernels/gemm.c calls it only
 * when src/runtime/dispatch.c has found the instructions and their OS support.
 *
 * Micro-tile: 6 rows of x x 2 vectors of output features (12 accumulators).
 */
#define ATTN_SIMD_AVX2 1
#define GK_MR 6
#define GK_NRV 2

#include <immintrin.h>
#include <stdint.h>

/* d[c * ld + r] = s[r * ls + c] for r, c < 8: an 8 x 8 block transposed in
 * registers, for packing w: 32-bit interleaves of row pairs, 64-bit interleaves
 * of those, then the 128-bit halves of rows 0-3 and 4-7 put together. */
static inline void gk_transpose8(const float *s, int64_t ls, float *d, int64_t ld)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(s + i * ls);
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* a0 b0 a1 b1 per half */
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 2; i++) {
        const __m256d a = _mm256_castps_pd(t[4 * i]), b = _mm256_castps_pd(t[4 * i + 2]);
        const __m256d c = _mm256_castps_pd(t[4 * i + 1]), e = _mm256_castps_pd(t[4 * i + 3]);
        /* r[4i + j], half H: rows 4i .. 4i+3 of column j + 4H. */
        r[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(c, e));
        r[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(c, e));
    }
    for (int j = 0; j < 4; j++) {
        _mm256_storeu_ps(d + j * ld, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
        _mm256_storeu_ps(d + (j + 4) * ld, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
    }
}
#define GK_TRANSPOSE gk_transpose8

#include "gemm_kernel.h"

const attn__gemm_kernel attn__gemm_kernel_avx2 = {
    ATTN_ARCH_AVX2, GK_MR, GK_NR, gk_tile_item, GK_PACK_BODY,
};
