/*
 * half_avx512.c - bfloat16 and float16 converters with AVX-512 F + BW (16 floats
 * a vector): vcvtph2ps / vcvtps2ph on ZMM registers for float16 (part of
 * AVX-512 F), shifts, integer rounding and vpmovdw for bfloat16. This is not the
 * AVX512-BF16 extension (vcvtneps2bf16, vdpbf16ps); see docs/half-precision.md.
 * Tails go through the portable converters of half.h, which give the same bits.
 */
#include "half.h"

#include <immintrin.h>

static void bf16_to_f32_avx512(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
        const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(w));
    }
    for (; i < n; i++)
        dst[i] = attn__bf16_to_f32(src[i]);
}

static void f32_to_bf16_avx512(const float *src, uint16_t *dst, int64_t n)
{
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x0040);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(src + i);
        const __m512i u = _mm512_castps_si512(x);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
        const __mmask16 isnan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        const __m512i v = _mm512_mask_blend_epi32(isnan, r, _mm512_or_si512(hi, quiet));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(v));
    }
    for (; i < n; i++)
        dst[i] = attn__f32_to_bf16(src[i]);
}

static void f16_to_f32_avx512(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = attn__f16_to_f32(src[i]);
}

static void f32_to_f16_avx512(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = attn__f32_to_f16(src[i]);
}

const attn__half_kernels attn__half_avx512 = {
    ATTN_ARCH_AVX512, bf16_to_f32_avx512, f32_to_bf16_avx512, f16_to_f32_avx512, f32_to_f16_avx512,
};
