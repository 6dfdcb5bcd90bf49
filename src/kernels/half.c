/*
 * half.c - the portable bfloat16 and float16 converters (the ATTN_ARCH=scalar and
 * ref path), and the choice of converters per instruction set. The formats and the rounding are described in
 * src/kernels/half.h.
 */
#include "half.h"
#include "dispatch.h"

static void bf16_to_f32_scalar(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = attn__bf16_to_f32(src[i]);
}

static void f32_to_bf16_scalar(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = attn__f32_to_bf16(src[i]);
}

static void f16_to_f32_scalar(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = attn__f16_to_f32(src[i]);
}

static void f32_to_f16_scalar(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = attn__f32_to_f16(src[i]);
}

const attn__half_kernels attn__half_scalar = {
    ATTN_ARCH_SCALAR, bf16_to_f32_scalar, f32_to_bf16_scalar, f16_to_f32_scalar, f32_to_f16_scalar,
};

const attn__half_kernels *attn__half_for(attn_arch arch)
{
    arch = attn__arch_isa(arch);
#ifdef ATTN_HAVE_X86
    if (arch == ATTN_ARCH_AVX512)
        return &attn__half_avx512;
    /* Dispatch runs the avx2 path only where cpuid reports F16C
     * (src/runtime/dispatch.c); the check keeps a direct caller safe too. */
    if (arch == ATTN_ARCH_AVX2 && (attn__cpu_features() & ATTN_CPU_F16C))
        return &attn__half_avx2;
#else
    (void)arch;
#endif
    return &attn__half_scalar;
}
