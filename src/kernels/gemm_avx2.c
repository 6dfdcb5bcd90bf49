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
#include "gemm_kernel.h"

const attn__gemm_kernel attn__gemm_kernel_avx2 = {
    ATTN_ARCH_AVX2, GK_MR, GK_NR, gk_tile_item, GK_PACK_BODY,
};
