/*
 * sdpa_bf16_avx512.c - the bfloat16 tile path (sdpa_bf16.h) with vdpbf16ps's
 * products emulated by AVX-512F: each bfloat16 of a pair widened to float32 by a
 * shift or a mask (exact), then two FMAs, the odd element's first, as the
 * instruction's definition adds them (Intel SDM, VDPBF16PS: each accumulation
 * rounded to nearest even). A product of two bfloat16 is exact in float32, so each
 * FMA rounds only its sum. One difference is left: the instruction treats denormal
 * inputs and results as zero, the emulation keeps them. It runs the
 * avx512bf16 path on a CPU without AVX512-BF16 when ATTN_BF16_EMULATE=1
 * (src/runtime/dispatch.c), so that the tests check the path's packing, masking and
 * softmax on any AVX-512 machine; it is never chosen otherwise.
 */
#include <immintrin.h>

static inline __m512 b16_dp_emulated(__m512 acc, __m512i a, __m512i b)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, hi)),
                          _mm512_castsi512_ps(_mm512_and_si512(b, hi)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
}
#define B16_DP(acc, a, b) b16_dp_emulated(acc, a, b)

#include "bf16_dot.h"
#include "bf16_tile.h"

const attn__bf16_kernel attn__bf16_kernel_emulated = {
    ATTN_ARCH_AVX512_BF16, "vdpbf16ps emulated by AVX-512F", b16_item, b16_vblock,
};
