/*
 * gemm_avx512.c - the projection GEMM (src/kernels/gemm_kernel.h) built for AVX-512 (F, DQ, BW and VL).
 * CMake compiles this file alone with the ISA flags; src/kernels/gemm.c calls it only
 * when src/runtime/dispatch.c has found the instructions and their OS support.
 *
 * Micro-tile: 12 rows of x x 2 vectors of output features (24 accumulators).
 */
#define ATTN_SIMD_AVX512 1
#define GK_MR 12
#define GK_NRV 2
#include "gemm_kernel.h"

const attn__gemm_kernel attn__gemm_kernel_avx512 = {
    ATTN_ARCH_AVX512, GK_MR, GK_NR, gk_tile_item,
};
