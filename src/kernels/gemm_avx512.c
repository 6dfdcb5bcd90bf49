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
#include "gemm_kernel.h"

const attn__gemm_kernel attn__gemm_kernel_avx512 = {
    ATTN_ARCH_AVX512, GK_MR, GK_NR, gk_tile_item, GK_PACK_BODY,
};
