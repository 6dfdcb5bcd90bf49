/*
 * half.h - 16-bit floating point storage: bfloat16 and IEEE binary16 (float16)
 * converted to and from float32. Internal; names start with attn__.
 *
 * Both formats only store numbers: attn computes in float32 (SPEC section 10), so
 * every 16-bit array is widened as it is read and rounded once as it is written.
 *
 *   bfloat16  the top 16 bits of a float32 (1 sign, 8 exponent, 7 mantissa bits).
 *             Widening is a shift and exact. Narrowing rounds to nearest, ties to
 *             even, on the 16 dropped bits; a NaN stays a NaN (its quiet bit is set
 *             so that truncating a payload can never give an infinity).
 *   float16   IEEE 754 binary16 (1 sign, 5 exponent, 10 mantissa bits; largest
 *             finite 65504, subnormals down to 2^-24). Widening is exact. Narrowing
 *             rounds to nearest even, overflows to infinity from 65520 up, keeps
 *             subnormals, and turns a NaN into a quiet NaN that keeps the top of
 *             its payload - what the F16C instruction vcvtps2ph does, so that every
 *             path gives the same bits (tests/test_half.c checks all 2^16 halves
 *             and a sweep of floats on each path).
 *
 * The array converters come in one build per instruction set (half.c portable,
 * half_avx2.c with F16C, half_avx512.c) and attn__half_for picks one for an arch.
 */
#ifndef ATTN_HALF_H
#define ATTN_HALF_H

#include "attn_internal.h"

#include <stdint.h>
#include <string.h>

static inline uint32_t attn__f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float attn__bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float attn__bf16_to_f32(uint16_t h) { return attn__bits_f32((uint32_t)h << 16); }

static inline uint16_t attn__f32_to_bf16(float x)
{
    const uint32_t u = attn__f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit carries into the kept bits exactly when
     * the dropped half is above one half, or is one half and the kept bits are odd. */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float attn__f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        /* Zero or subnormal: m units of 2^-24, exact in float32. */
        const float v = (float)m * 5.9604644775390625e-8f;
        return attn__bits_f32(attn__f32_bits(v) | sign);
    }
    if (e == 31) /* infinity, or a NaN made quiet as vcvtph2ps does */
        return attn__bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
    return attn__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t attn__f32_to_f16(float x)
{
    const uint32_t u = attn__f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, with the top 9 bits of the payload */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and above (halfway past 65504) round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* Below 2^-14, the result is a subnormal in units of 2^-24. Adding 0.5 puts
         * |x| where a float32 ulp is 2^-24, so the addition itself rounds to nearest
         * even, and the low bits of the sum are the subnormal's bits (0x400 when it
         * rounds up to the smallest normal, which is also right). */
        const float t = attn__bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (attn__f32_bits(t) - 0x3f000000u));
    }
    /* Normal: rebias the exponent (127 - 15 = 112), then round the 13 dropped
     * mantissa bits to nearest even as for bfloat16. */
    const uint32_t r = a - 0x38000000u + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* Array converters of one instruction set; n elements, unit stride, any alignment. */
typedef struct attn__half_kernels {
    attn_arch arch;
    void (*bf16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*f32_to_bf16)(const float *src, uint16_t *dst, int64_t n);
    void (*f16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
} attn__half_kernels;

extern const attn__half_kernels attn__half_scalar;
#ifdef ATTN_HAVE_X86
extern const attn__half_kernels attn__half_avx2;
extern const attn__half_kernels attn__half_avx512;
#endif

/* The converters for arch (AVX2 needs F16C too, else the portable ones). */
const attn__half_kernels *attn__half_for(attn_arch arch);

/* n elements of a 16-bit dtype (ATTN_DTYPE_BF16 or ATTN_DTYPE_F16) to float32 and
 * back, with the converters hk. */
static inline void attn__half_widen(const attn__half_kernels *hk, attn_dtype dt,
                                    const uint16_t *src, float *dst, int64_t n)
{
    if (dt == ATTN_DTYPE_BF16)
        hk->bf16_to_f32(src, dst, n);
    else
        hk->f16_to_f32(src, dst, n);
}

static inline void attn__half_narrow(const attn__half_kernels *hk, attn_dtype dt,
                                     const float *src, uint16_t *dst, int64_t n)
{
    if (dt == ATTN_DTYPE_BF16)
        hk->f32_to_bf16(src, dst, n);
    else
        hk->f32_to_f16(src, dst, n);
}

#endif /* ATTN_HALF_H */
