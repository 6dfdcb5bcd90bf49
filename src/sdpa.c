/*
 * sdpa.c - attn_sdpa(): picks the attention kernel.
 *
 * ctx->impl chooses: ATTN_IMPL_REF runs the reference (sdpa_ref.c). ATTN_IMPL_AUTO
 * and ATTN_IMPL_FUSED run the fused kernel once it is built; until then they run
 * the reference too, so every caller gets the same contract from either.
 */
#include "attn_internal.h"

int attn_sdpa(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
              const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
              attn_tensor *weights)
{
    return attn_sdpa_ref(ctx, q, k, v, p, out, weights);
}
