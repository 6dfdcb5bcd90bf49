/*
 * sdpa_fused_backward_avx2.c - the fused backward of attention
 * (src/kernels/fused_backward.h) built for AVX2 + FMA (8 floats a vector).
 * CMake compiles this file alone with the ISA flags; src/runtime/dispatch.c chooses
 * it only when cpuid and xgetbv say the CPU and the OS support those registers.
 */
#define ATTN_SIMD_AVX2 1
#include "fused_backward.h"

const attn__fused_bwd_kernel attn__fused_bwd_kernel_avx2 = {
    ATTN_ARCH_AVX2, SIMD_W, FB_NV * SIMD_W, fb_delta_item, fb_kv_item, fb_q_item, fb_head_item,
};
