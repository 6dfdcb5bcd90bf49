/*
 * sdpa_backward.c - the public entry points of the backward of scaled dot-product
 * attention: attn_sdpa_backward, attn_sdpa_backward_ref and
 * attn_sdpa_backward_workspace_size (SPEC section 8, docs/gradients.md).
 *
 * Each one checks its arguments once (attn__sdpa_backward_prepare in
 * sdpa_contract.c), plans once (which kernel, how much scratch), takes its scratch
 * as attn_ctx says and runs the unchecked kernel. attn_sdpa_backward runs the fused
 * backward (src/kernels/fused_backward.h) chosen as the forward's kernel is, by
 * ctx->impl and the selected arch (attn__sdpa_backward_plan_for_ctx);
 * attn_sdpa_backward_ref always runs the reference (sdpa_ref_backward.c).
 */
#include "sdpa_contract.h"

#include <stdalign.h>

/* Scratch up to this many bytes lives on the stack, as in sdpa.c. */
#define SDPA_BACKWARD_STACK_SCRATCH 4096

int attn__sdpa_backward_run(attn_ctx *ctx, const attn__sdpa_bwd_plan *plan, const float *q,
                            const float *k, const float *v, const float *out,
                            const float *lse, const float *dout, float *dq, float *dk,
                            float *dv, void *scratch)
{
    if (!plan->use_ref)
        return attn__sdpa_fused_backward_run(ctx, plan, q, k, v, out, lse, dout, dq, dk, dv,
                                             scratch);
    return attn__sdpa_ref_backward_run(ctx, &plan->bs, q, k, v, out, lse, dout, dq, dk, dv,
                                       (float *)scratch);
}

/* Checks, plans and runs one backward: the kernel ctx selects, or the reference
 * when use_ref is 1. */
static int sdpa_backward_entry(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                               const attn_tensor *v, const attn_sdpa_params *p,
                               const attn_tensor *out, const attn_tensor *lse,
                               const attn_tensor *dout, const attn_sdpa_grads *grads,
                               int use_ref)
{
    attn__sdpa_bwd_shapes bs;
    attn__sdpa_bwd_plan plan;
    int rc = attn__sdpa_backward_prepare(ctx, q, k, v, p, out, lse, dout, grads, &bs);
    if (rc == ATTN_OK)
        rc = use_ref ? attn__sdpa_backward_plan_make(ctx, &bs, &plan)
                     : attn__sdpa_backward_plan_for_ctx(ctx, &bs, &plan);
    if (rc != ATTN_OK)
        return rc;
    alignas(64) unsigned char small[SDPA_BACKWARD_STACK_SCRATCH];
    void *scratch = small;
    if (plan.scratch_bytes > sizeof small &&
        !(scratch = attn__scratch_get(ctx, plan.scratch_bytes, "backward scratch")))
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    rc = attn__sdpa_backward_run(ctx, &plan, q->data, k->data, v->data, out->data, lse->data,
                           dout->data, grads->dq->data, grads->dk->data, grads->dv->data,
                           scratch);
    if (scratch != small)
        attn__scratch_put(ctx, scratch);
    return rc;
}

int attn_sdpa_backward(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                       const attn_tensor *v, const attn_sdpa_params *p, const attn_tensor *out,
                       const attn_tensor *lse, const attn_tensor *dout,
                       const attn_sdpa_grads *grads)
{
    return sdpa_backward_entry(ctx, q, k, v, p, out, lse, dout, grads, 0);
}

int attn_sdpa_backward_ref(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                           const attn_tensor *v, const attn_sdpa_params *p,
                           const attn_tensor *out, const attn_tensor *lse,
                           const attn_tensor *dout, const attn_sdpa_grads *grads)
{
    return sdpa_backward_entry(ctx, q, k, v, p, out, lse, dout, grads, 1);
}

int attn_sdpa_backward_workspace_size(attn_ctx *ctx, const attn_tensor *q,
                                      const attn_tensor *k, const attn_tensor *v,
                                      const attn_sdpa_params *p, const attn_tensor *out,
                                      const attn_tensor *lse, const attn_tensor *dout,
                                      const attn_sdpa_grads *grads, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    attn__sdpa_bwd_shapes bs;
    attn__sdpa_bwd_plan plan;
    int rc = attn__sdpa_backward_prepare(ctx, q, k, v, p, out, lse, dout, grads, &bs);
    if (rc == ATTN_OK)
        rc = attn__sdpa_backward_plan_for_ctx(ctx, &bs, &plan);
    if (rc == ATTN_OK)
        *bytes = plan.scratch_bytes;
    return rc;
}
