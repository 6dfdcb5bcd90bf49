/*
 * sdpa_fused_avx2.c - the fused attention kernel (src/kernels/fused_kernel.h) built for
 * AVX2 + FMA (8 floats a vector; 16 registers).
 * CMake compiles this file alone with the ISA flags; src/runtime/dispatch.c calls it only
 * when cpuid and xgetbv say the CPU and the OS support those registers.
 *
 * Micro-tiles: 4 keys x 2x8 query rows for the scores (8 accumulators),
 * 4 query rows x 2 vectors of value columns for the weighted sum.
 */
#define ATTN_SIMD_AVX2 1
#define FK_MR 4
#define FK_NV 2
#define FK_MK 4
#define FK_NQV 2
#include "fused_kernel.h"

const attn__fused_kernel attn__fused_kernel_avx2 = {
    ATTN_ARCH_AVX2, SIMD_W, FK_QW, FK_MK, fk_ws_floats, fk_item, fk_split_merge, fk_exp_nonpos, fk_tanh,
    fk_hsum4,
};
