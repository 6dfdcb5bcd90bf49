/*
 * sdpa_contract.c - the contract of scaled dot-product attention, shared by every
 * kernel: the default parameters, the argument check with its messages, the
 * empty-row message, and the plan (which kernel, how many threads, how much
 * scratch) that a checked call runs with. See sdpa_contract.h.
 *
 * Every kernel (the reference in sdpa_ref.c, the fused kernel in src/kernels/)
 * runs only on arguments checked here, so all of them accept and refuse exactly
 * the same calls with the same messages.
 */
#include "sdpa_contract.h"
#include "dispatch.h"

#include <math.h>
#include <string.h>

void attn_sdpa_params_init(attn_sdpa_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->empty_rows = ATTN_EMPTY_ROWS_ERROR;
}

static int check_f32(attn_ctx *ctx, const attn_tensor *t, const char *name)
{
    int rc = attn_tensor_check(ctx, t, name);
    if (rc)
        return rc;
    if (t->dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s must be float32, not %s", name,
                          attn_dtype_name(t->dtype));
    return ATTN_OK;
}

/* The message for q, k and v that do not fit together. Shapes are formatted here
 * only, when a check has failed: the check itself runs on every call. */
static int qkv_mismatch(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                        const attn_tensor *v, const int64_t qs[4], const int64_t ks[4],
                        const int64_t vs[4])
{
    char a[128], b[128], c[128];
    attn__shape_str(q, a, sizeof a);
    attn__shape_str(k, b, sizeof b);
    attn__shape_str(v, c, sizeof c);
    if (qs[3] != ks[3])
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "q and k head_dim differ: q %s has D=%lld, k %s has D=%lld", a,
                          (long long)qs[3], b, (long long)ks[3]);
    if (ks[2] != vs[2])
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "k and v lengths differ: k %s has Tk=%lld, v %s has Tk=%lld", b,
                          (long long)ks[2], c, (long long)vs[2]);
    return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                      "q %s, k %s and v %s must have the same batch and head sizes", a, b, c);
}

int attn__sdpa_prepare(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                       const attn_tensor *v, const attn_sdpa_params *p,
                       const attn_tensor *out, const attn_tensor *weights,
                       attn__sdpa_shapes *s)
{
    int rc;
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    if ((rc = check_f32(ctx, q, "q")) || (rc = check_f32(ctx, k, "k")) ||
        (rc = check_f32(ctx, v, "v")) || (rc = check_f32(ctx, out, "out")) ||
        (weights && (rc = check_f32(ctx, weights, "weights"))))
        return rc;
    memset(s, 0, sizeof *s);
    int64_t qs[4], ks[4], vs[4], os[4], ws[4];
    attn__as4d(q, qs, s->q_s);
    attn__as4d(k, ks, s->k_s);
    attn__as4d(v, vs, s->v_s);
    attn__as4d(out, os, s->o_s);
    if (qs[3] != ks[3] || ks[2] != vs[2] || qs[0] != ks[0] || qs[0] != vs[0] ||
        qs[1] != ks[1] || qs[1] != vs[1])
        return qkv_mismatch(ctx, q, k, v, qs, ks, vs);
    s->B = qs[0];
    s->H = qs[1];
    s->Tq = qs[2];
    s->Tk = ks[2];
    s->D = qs[3];
    s->Dv = vs[3];
    const int64_t want_o[4] = {s->B, s->H, s->Tq, s->Dv};
    if (memcmp(os, want_o, sizeof os) != 0) {
        char d[128], e[128];
        attn_shape_format(e, sizeof e, 4, want_o);
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "out has shape %s; expected %s",
                          attn__shape_str(out, d, sizeof d), e);
    }
    if (weights) {
        attn__as4d(weights, ws, s->w_s);
        const int64_t want_w[4] = {s->B, s->H, s->Tq, s->Tk};
        if (memcmp(ws, want_w, sizeof ws) != 0) {
            char d[128], e[128];
            attn_shape_format(e, sizeof e, 4, want_w);
            return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                              "weights has shape %s; expected %s",
                              attn__shape_str(weights, d, sizeof d), e);
        }
    }
    if (p->causal && s->Tq != s->Tk)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "the causal mask needs Tq == Tk, but Tq=%lld and Tk=%lld",
                          (long long)s->Tq, (long long)s->Tk);
    if (p->empty_rows != ATTN_EMPTY_ROWS_ERROR && p->empty_rows != ATTN_EMPTY_ROWS_ZERO)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "unknown empty_rows value %d",
                          (int)p->empty_rows);
    if (p->has_scale && !isfinite(p->scale))
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "scale %g is not a finite number",
                          (double)p->scale);
    if ((rc = attn__mask4_init(ctx, p->mask, s->B, s->H, s->Tq, s->Tk, &s->mask)))
        return rc;
    s->causal = p->causal != 0;
    s->scale = p->has_scale ? p->scale : (float)(1.0 / sqrt((double)s->D));
    s->empty_rows = p->empty_rows;
    return ATTN_OK;
}

int attn__empty_row_fail(attn_ctx *ctx, const attn__sdpa_shapes *s, int64_t b, int64_t h,
                         int64_t i)
{
    return attn__fail(ctx, ATTN_STATUS_EMPTY_ROW,
                      "query %lld of batch %lld, head %lld has all %lld keys masked "
                      "(use empty_rows = zero to give such rows zero output)",
                      (long long)i, (long long)b, (long long)h, (long long)s->Tk);
}

int attn__sdpa_plan_make(attn_ctx *ctx, const attn__sdpa_shapes *s, int use_ref,
                         attn_arch arch, attn__sdpa_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->s = *s;
    plan->use_ref = use_ref;
    plan->arch = arch;
    plan->threads = 1;
    if (!use_ref)
        return attn__sdpa_fused_plan(ctx, plan);
    /* The reference keeps one [Tq, Tk] score block. */
    int64_t n;
    if (!attn__mul_i64(s->Tq, s->Tk, &n) || !attn__bytes(n, sizeof(float), &plan->scratch_bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "a [%lld, %lld] score block does not fit in memory",
                          (long long)s->Tq, (long long)s->Tk);
    return ATTN_OK;
}

int attn__sdpa_plan_for_ctx(attn_ctx *ctx, const attn__sdpa_shapes *s, attn__sdpa_plan *plan)
{
    const attn_impl impl = ctx ? ctx->impl : ATTN_IMPL_AUTO;
    if (impl != ATTN_IMPL_AUTO && impl != ATTN_IMPL_FUSED && impl != ATTN_IMPL_REF)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "ctx->impl = %d is not an attn_impl value", (int)impl);
    attn_arch arch = ATTN_ARCH_REF;
    int rc = attn__arch_resolve(ctx, &arch);
    if (rc != ATTN_OK)
        return rc;
    if (impl == ATTN_IMPL_REF || arch == ATTN_ARCH_REF)
        return attn__sdpa_plan_make(ctx, s, 1, ATTN_ARCH_REF, plan);
    return attn__sdpa_plan_make(ctx, s, 0, arch, plan);
}

int attn__sdpa_run(attn_ctx *ctx, const attn__sdpa_plan *plan, const float *q,
                   const float *k, const float *v, float *out, float *weights, void *scratch)
{
    if (plan->use_ref)
        return attn__sdpa_ref_run(ctx, &plan->s, q, k, v, out, weights, (float *)scratch);
    return attn__sdpa_fused_run(ctx, plan, q, k, v, out, weights, scratch);
}
