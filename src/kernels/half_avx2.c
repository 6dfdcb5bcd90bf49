/*
 * half_avx2.c - bfloat16 and float16 converters with AVX2 and F16C (8 floats a
 * vector): vcvtph2ps / vcvtps2ph for float16, shifts and integer rounding for
 * bfloat16. CMake gives every AVX2 file -mf16c besides the AVX2 flags, and the
 * avx2 path runs only when cpuid reports F16C (src/runtime/dispatch.c; half.c
 * checks again before it hands this file out). Tails go through the portable
 * converters of half.h, which give the same bits.
 */
#include "half.h"

#include <immintrin.h>

static void bf16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
    }
    for (; i < n; i++)
        dst[i] = attn__bf16_to_f32(src[i]);
}

static void f32_to_bf16_avx2(const float *src, uint16_t *dst, int64_t n)
{
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i quiet = _mm256_set1_epi32(0x0040);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        const __m256i u = _mm256_castps_si256(x);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
        const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), odd), 16);
        const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
        const __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        const __m256i v = _mm256_blendv_epi8(r, nan, isnan);
        /* Each lane holds a value below 2^16, so the unsigned saturating pack is exact. */
        const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storeu_si128((__m128i *)(dst + i), p);
    }
    for (; i < n; i++)
        dst[i] = attn__f32_to_bf16(src[i]);
}

static void f16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = attn__f16_to_f32(src[i]);
}

static void f32_to_f16_avx2(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = attn__f32_to_f16(src[i]);
}

const attn__half_kernels attn__half_avx2 = {
    ATTN_ARCH_AVX2, bf16_to_f32_avx2, f32_to_bf16_avx2, f16_to_f32_avx2, f32_to_f16_avx2,
};
