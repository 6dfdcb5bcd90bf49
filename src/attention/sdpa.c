/*
 * sdpa.c - the public entry points of scaled dot-product attention: attn_sdpa,
 * attn_sdpa_ref, attn_sdpa_fused and attn_sdpa_workspace_size.
 *
 * Each one checks its arguments once (sdpa_contract.c), plans once (which kernel,
 * how many threads, how much scratch), takes its scratch as attn_ctx says (the
 * caller's workspace, the context's kept buffer, or one allocation) and runs the
 * unchecked kernel. ctx->impl chooses the kernel, ctx->arch (or the ATTN_ARCH
 * variable, see src/runtime/dispatch.c) the instruction set:
 *
 *   ATTN_IMPL_REF                 the reference (sdpa_ref.c), always;
 *   ATTN_IMPL_AUTO (the default)  the fused kernel (src/kernels/sdpa_fused*.c) on
 *   ATTN_IMPL_FUSED               the selected instruction set, or the reference
 *                                 when the selected arch is "ref".
 */
#include "dispatch.h"
#include "sdpa_contract.h"

#include <stdalign.h>

/* Scratch up to this many bytes lives on the stack, so that a problem as small
 * as the chapter's pays for no allocation at all. */
#define SDPA_STACK_SCRATCH 4096

/* Checks, plans and runs one call; `how` is 0 for ctx's choice, 1 for the
 * reference, 2 for the fused kernel. */
static int sdpa_entry(attn_ctx *ctx, int how, const attn_tensor *q, const attn_tensor *k,
                      const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                      attn_tensor *weights)
{
    attn__sdpa_shapes s;
    attn__sdpa_plan plan;
    int rc = attn__sdpa_prepare(ctx, q, k, v, p, out, weights, &s);
    if (rc != ATTN_OK)
        return rc;
    if (how == 0) {
        rc = attn__sdpa_plan_for_ctx(ctx, &s, &plan);
    } else if (how == 1) {
        rc = attn__sdpa_plan_make(ctx, &s, 1, ATTN_ARCH_REF, &plan);
    } else {
        attn_arch arch = ATTN_ARCH_SCALAR;
        rc = attn__arch_resolve(ctx, &arch);
        if (rc == ATTN_OK && arch == ATTN_ARCH_REF)
            arch = ATTN_ARCH_SCALAR; /* the fused kernel asked for by name: portable C */
        if (rc == ATTN_OK)
            rc = attn__sdpa_plan_make(ctx, &s, 0, arch, &plan);
    }
    if (rc != ATTN_OK)
        return rc;
    alignas(64) unsigned char small[SDPA_STACK_SCRATCH];
    void *scratch = small;
    if (plan.scratch_bytes > sizeof small &&
        !(scratch = attn__scratch_get(ctx, plan.scratch_bytes, "attention scratch")))
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    rc = attn__sdpa_run(ctx, &plan, q->data, k->data, v->data, out->data,
                        weights ? weights->data : NULL, scratch);
    if (scratch != small)
        attn__scratch_put(ctx, scratch);
    return rc;
}

int attn_sdpa(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
              const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
              attn_tensor *weights)
{
    return sdpa_entry(ctx, 0, q, k, v, p, out, weights);
}

int attn_sdpa_ref(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                  const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                  attn_tensor *weights)
{
    return sdpa_entry(ctx, 1, q, k, v, p, out, weights);
}

int attn_sdpa_fused(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                    const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                    attn_tensor *weights)
{
    return sdpa_entry(ctx, 2, q, k, v, p, out, weights);
}

int attn_sdpa_workspace_size(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                             const attn_tensor *v, const attn_sdpa_params *p,
                             const attn_tensor *out, const attn_tensor *weights,
                             size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    attn__sdpa_shapes s;
    attn__sdpa_plan plan;
    int rc = attn__sdpa_prepare(ctx, q, k, v, p, out, weights, &s);
    if (rc == ATTN_OK)
        rc = attn__sdpa_plan_for_ctx(ctx, &s, &plan);
    if (rc == ATTN_OK)
        *bytes = plan.scratch_bytes;
    return rc;
}
