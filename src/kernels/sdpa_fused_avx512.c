/*
 * sdpa_fused_avx512.c - the fused attention kernel (src/kernels/fused_kernel.h) built for
 * AVX-512 F + DQ + BW + VL (16 floats a vector; 32 registers).
 * CMake compiles this file alone with the ISA flags; src/runtime/dispatch.c calls it only
 * when cpuid and xgetbv say the CPU and the OS support those registers.
 *
 * Micro-tiles: 8 keys x 2x16 query rows for the scores (16 accumulators),
 * 8 query rows x 2 vectors of value columns for the weighted sum.
 */
#define ATTN_SIMD_AVX512 1
#define FK_MR 8
#define FK_NV 2
#define FK_MK 8
#define FK_NQV 2
#include "fused_kernel.h"

const attn__fused_kernel attn__fused_kernel_avx512 = {
    ATTN_ARCH_AVX512, SIMD_W, FK_QW, FK_MK, fk_ws_floats, fk_item, fk_split_merge, fk_exp_nonpos, fk_tanh,
    fk_hsum4, fk_exp2_nonpos,
};
