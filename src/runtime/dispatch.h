/*
 * dispatch.h - which instruction set the fast kernels run (src/runtime/dispatch.c):
 * decided once per process from cpuid and xgetbv, forced by ATTN_ARCH, or chosen per
 * call by ctx->arch. Internal; names start with attn__.
 */
#ifndef ATTN_DISPATCH_H
#define ATTN_DISPATCH_H

#include "attn_internal.h"

/* The arch a call with ctx runs (never AUTO): ctx->arch when set, else the
 * process-wide choice (ATTN_ARCH or cpuid/xgetbv, decided once). Fails with
 * UNSUPPORTED when ctx->arch names a path this build or CPU cannot run. */
int attn__arch_resolve(attn_ctx *ctx, attn_arch *arch);

/* The fused kernel's query and key tile sizes for this machine: chosen once per
 * process from cpuid (the microarchitecture and its cache sizes) or forced by
 * ATTN_TILE=BRxBC; br is a multiple of 32 and bc of 8. Never depends on the thread
 * count. */
void attn__fused_tiles(int64_t *br, int64_t *bc);

/* The bfloat16 path's tile sizes on the amx arch (sdpa_bf16.h): 128 x 128, or what
 * ATTN_TILE forced for both paths. */
void attn__amx_tiles(int64_t *br, int64_t *bc);

/* The AVX-512 build's micro-tile shapes (keys x vectors of query rows for the
 * scores, rows x vectors of value columns for the weighted sum): two bodies of
 * src/kernels/fused_kernel.h, chosen once per process for the microarchitecture or
 * forced by ATTN_MICROTILE=8x2|4x4. The fused backward's two AVX-512 bodies
 * (src/kernels/fused_backward.h's register tiles, sdpa_fused_backward_avx512.c and
 * sdpa_fused_backward_4x4_avx512.c) follow the same choice. Both shapes give the
 * same bits (tests/test_fused_microtile.c, tests/test_fused_backward_microtile.c);
 * only their speed differs. */
typedef enum attn__microtile {
    ATTN__MICROTILE_8X2, /* src/kernels/sdpa_fused_avx512.c */
    ATTN__MICROTILE_4X4  /* src/kernels/sdpa_fused_4x4_avx512.c */
} attn__microtile;
attn__microtile attn__fused_microtile(void);
/* The instruction-set build that runs arch's float32 kernels, GEMM and converters:
 * avx512bf16 and amx are the avx512 build plus a bfloat16 attention kernel of
 * their own (src/kernels/half_dot.h), so they map to ATTN_ARCH_AVX512; every other
 * arch is its own build. Weights packed under any of the three fit the others. */
static inline attn_arch attn__arch_isa(attn_arch arch)
{
    return arch == ATTN_ARCH_AVX512_BF16 || arch == ATTN_ARCH_AMX ? ATTN_ARCH_AVX512 : arch;
}

/* The microarchitecture's class (as the fused tiles name it) and its L1d and L2
 * sizes per core from cpuid, 0 when unknown; decided once. The GEMM sizes its work
 * items from them (src/kernels/gemm.c). */
void attn__cpu_caches(const char **uarch, int64_t *l1d_kib, int64_t *l2_kib);

/* attn_cpu_features for the library's own use (decided once). */
unsigned attn__cpu_features(void);

/* 1 when ATTN_BF16_EMULATE=always: the avx512bf16 path runs its emulated kernel even
 * on a CPU with vdpbf16ps (for the tests that compare the two). */
int attn__bf16_emulate_always(void);

#endif /* ATTN_DISPATCH_H */
