/*
 * sdpa.c - attn_sdpa(): picks the attention kernel.
 *
 * ctx->impl chooses the kernel, ctx->arch (or the ATTN_ARCH variable, see
 * src/runtime/dispatch.c) the instruction set:
 *
 *   ATTN_IMPL_REF                 the reference (src/attention/sdpa_ref.c), always;
 *   ATTN_IMPL_AUTO (the default)  the fused kernel (src/sdpa_fused*.c) on the
 *   ATTN_IMPL_FUSED               selected instruction set, or the reference when
 *                                 the selected arch is "ref".
 *
 * Both kernels check their arguments with attn__sdpa_prepare(), so the contract,
 * the errors and their messages are the same whichever runs.
 */
#include "sdpa_fused.h"

int attn_sdpa(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
              const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
              attn_tensor *weights)
{
    const attn_impl impl = ctx ? ctx->impl : ATTN_IMPL_AUTO;
    if (impl == ATTN_IMPL_REF)
        return attn_sdpa_ref(ctx, q, k, v, p, out, weights);
    if (impl != ATTN_IMPL_AUTO && impl != ATTN_IMPL_FUSED)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "ctx->impl = %d is not an attn_impl value", (int)impl);
    attn_arch arch;
    int status = attn__arch_resolve(ctx, &arch);
    if (status != ATTN_OK)
        return status;
    if (arch == ATTN_ARCH_REF)
        return attn_sdpa_ref(ctx, q, k, v, p, out, weights);
    return attn__sdpa_fused_arch(ctx, arch, q, k, v, p, out, weights);
}
