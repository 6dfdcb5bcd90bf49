/*
 * sdpa_bf16_dp.c - the bfloat16 tile path (sdpa_bf16.h) with its products by
 * AVX512-BF16's vdpbf16ps and its weights rounded by vcvtne2ps2bf16: the
 * "avx512bf16" arch (Zen 4, Zen 5, Sapphire Rapids and later). CMake compiles this
 * file alone with -mavx512bf16; src/runtime/dispatch.c runs it only where cpuid
 * lists AVX512-BF16 and the OS saves the ZMM state.
 */
#include <immintrin.h>

#define B16_DP(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#define B16_NATIVE_CVT 1

#include "bf16_dot.h"
#include "bf16_tile.h"

const attn__bf16_kernel attn__bf16_kernel_dp = {
    ATTN_ARCH_AVX512_BF16, "vdpbf16ps", b16_item, b16_vblock,
};
