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
#include "half_stage.h"

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

/* q, k, v and out: all float32, all bfloat16 or all float16 (SPEC section 10). A
 * mix would need a rule for which precision wins; none is asked for, so it is
 * refused with every dtype named. */
static int check_storage(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                         const attn_tensor *v, const attn_tensor *out, int cache)
{
    int rc;
    if ((rc = attn_tensor_check(ctx, q, "q")) || (rc = attn_tensor_check(ctx, k, "k")) ||
        (rc = attn_tensor_check(ctx, v, "v")) || (rc = attn_tensor_check(ctx, out, "out")))
        return rc;
    /* The KV cache's call: 16-bit k and v with a float32 q or out (or both). The
     * cache checks these dtypes itself, with its own messages; here a float32 q
     * or out only has to be accepted as such. */
    if (cache && (k->dtype == ATTN_DTYPE_BF16 || k->dtype == ATTN_DTYPE_F16) &&
        v->dtype == k->dtype && (q->dtype == k->dtype || q->dtype == ATTN_DTYPE_F32) &&
        (out->dtype == k->dtype || out->dtype == ATTN_DTYPE_F32))
        return ATTN_OK;
    const attn_dtype dt = q->dtype;
    if (dt != ATTN_DTYPE_BF16 && dt != ATTN_DTYPE_F16) {
        if ((rc = check_f32(ctx, q, "q")) || (rc = check_f32(ctx, k, "k")) ||
            (rc = check_f32(ctx, v, "v")) || (rc = check_f32(ctx, out, "out")))
            return rc;
        return ATTN_OK;
    }
    if (k->dtype != dt || v->dtype != dt || out->dtype != dt)
        return attn__fail(ctx, ATTN_STATUS_DTYPE,
                          "q, k, v and out must share one dtype (float32, bfloat16 or "
                          "float16), not q %s, k %s, v %s, out %s",
                          attn_dtype_name(q->dtype), attn_dtype_name(k->dtype),
                          attn_dtype_name(v->dtype), attn_dtype_name(out->dtype));
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
    if (ks[1] != vs[1])
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "k and v head counts differ: k %s has %lld heads, v %s has %lld",
                          b, (long long)ks[1], c, (long long)vs[1]);
    if (qs[1] % ks[1] != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "q's %lld heads are not a multiple of k and v's %lld heads "
                          "(grouped-query attention needs H %% Hkv == 0): q %s, k %s",
                          (long long)qs[1], (long long)ks[1], a, b);
    return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                      "q %s, k %s and v %s must have the same batch size", a, b, c);
}

/* A float32 per-head vector [H] (sinks, ALiBi slopes): checks it and returns its
 * stride in *stride. */
static int check_per_head(attn_ctx *ctx, const attn_tensor *t, const char *name, int64_t H,
                          int64_t *stride)
{
    int rc = check_f32(ctx, t, name);
    if (rc)
        return rc;
    if (t->ndim != 1 || t->shape[0] != H) {
        char a[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "%s has shape %s; expected (%lld,), one per query head", name,
                          attn__shape_str(t, a, sizeof a), (long long)H);
    }
    *stride = t->stride[0];
    return ATTN_OK;
}

/* The additive bias: float32, broadcasting to [B, H, Tq, Tk]; broadcast axes get
 * stride 0 in s->bias_s. */
static int check_bias(attn_ctx *ctx, const attn_tensor *bias, attn__sdpa_shapes *s)
{
    int rc = check_f32(ctx, bias, "bias");
    if (rc)
        return rc;
    const int64_t target[4] = {s->B, s->H, s->Tq, s->Tk};
    int64_t sh[4];
    attn__as4d(bias, sh, s->bias_s);
    for (int i = 0; i < 4; i++) {
        if (sh[i] == 1) {
            s->bias_s[i] = 0;
        } else if (sh[i] != target[i]) {
            char a[128], b[128];
            attn_shape_format(b, sizeof b, 4, target);
            return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                              "bias shape %s does not broadcast to %s",
                              attn__shape_str(bias, a, sizeof a), b);
        }
    }
    s->bias = bias->data;
    return ATTN_OK;
}

/* The log-sum-exp output: float32 [B, H, Tq] (leading sizes of 1 may be left out). */
static int check_lse(attn_ctx *ctx, attn_tensor *lse, attn__sdpa_shapes *s)
{
    int rc = check_f32(ctx, lse, "lse");
    if (rc)
        return rc;
    int64_t sh[4], st[4];
    attn__as4d(lse, sh, st);
    const int64_t want[4] = {1, s->B, s->H, s->Tq};
    if (lse->ndim > 3 || memcmp(sh, want, sizeof sh) != 0) {
        char a[128], b[128];
        attn_shape_format(b, sizeof b, 3, want + 1);
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "lse has shape %s; expected %s",
                          attn__shape_str(lse, a, sizeof a), b);
    }
    memcpy(s->lse_s, st + 1, sizeof s->lse_s);
    s->lse = lse->data;
    return ATTN_OK;
}

/* The options of SPEC section 6 beyond the mask and the scale. */
static int check_options(attn_ctx *ctx, const attn_sdpa_params *p, attn__sdpa_shapes *s)
{
    int rc;
    if (p->causal != ATTN_CAUSAL_NONE && p->causal != ATTN_CAUSAL_TOP_LEFT &&
        p->causal != ATTN_CAUSAL_BOTTOM_RIGHT)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "unknown causal value %d (0 none, 1 top-left, 2 bottom-right)",
                          p->causal);
    s->causal = p->causal;
    if (p->has_window) {
        if (p->window_left < -1 || p->window_right < -1)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "window (%lld, %lld): each side must be -1 (unbounded) or at "
                              "least 0",
                              (long long)p->window_left, (long long)p->window_right);
        s->has_window = 1;
        s->window_left = p->window_left;
        s->window_right = p->window_right;
    }
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "softcap %g must be a finite number > 0 (or 0 for none)",
                          (double)p->softcap);
    s->softcap = p->softcap;
    if (p->alibi || p->alibi_slopes) {
        s->alibi = 1;
        if (p->alibi_slopes) {
            if ((rc = check_per_head(ctx, p->alibi_slopes, "alibi_slopes", s->H, &s->alibi_s)))
                return rc;
            s->alibi_slopes = p->alibi_slopes->data;
        }
    }
    if (p->bias && (rc = check_bias(ctx, p->bias, s)))
        return rc;
    if (p->sinks) {
        if ((rc = check_per_head(ctx, p->sinks, "sinks", s->H, &s->sinks_s)))
            return rc;
        s->sinks = p->sinks->data;
    }
    if (p->lse && (rc = check_lse(ctx, p->lse, s)))
        return rc;
    return ATTN_OK;
}

/* No output may share memory with an argument; out may be q itself. */
static int check_aliasing(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                          const attn_tensor *v, const attn_sdpa_params *p,
                          const attn_tensor *out, const attn_tensor *weights)
{
    const attn_tensor *ins[7] = {q, k, v, p->mask, p->bias, p->sinks, p->alibi_slopes};
    const char *in_names[7] = {"q", "k", "v", "mask", "bias", "sinks", "alibi_slopes"};
    const attn_tensor *const outs[3] = {out, weights, p->lse};
    static const char *const out_names[3] = {"out", "weights", "lse"};
    return attn__outputs_apart(ctx, "attn_sdpa", outs, out_names, ins, in_names, 7);
}

int attn__sdpa_prepare(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                       const attn_tensor *v, const attn_sdpa_params *p,
                       const attn_tensor *out, const attn_tensor *weights,
                       attn__sdpa_shapes *s)
{
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    int rc = attn__sdpa_prepare_shapes(ctx, q, k, v, p, out, weights, s);
    return rc != ATTN_OK ? rc : check_aliasing(ctx, q, k, v, p, out, weights);
}

static int prepare_shapes(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                          const attn_tensor *v, const attn_sdpa_params *p,
                          const attn_tensor *out, const attn_tensor *weights, int cache,
                          attn__sdpa_shapes *s);

int attn__sdpa_prepare_cache(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                             const attn_tensor *v, const attn_sdpa_params *p,
                             const attn_tensor *out, const attn_tensor *weights,
                             attn__sdpa_shapes *s)
{
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    int rc = prepare_shapes(ctx, q, k, v, p, out, weights, 1, s);
    return rc != ATTN_OK ? rc : check_aliasing(ctx, q, k, v, p, out, weights);
}

int attn__sdpa_prepare_shapes(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                              const attn_tensor *v, const attn_sdpa_params *p,
                              const attn_tensor *out, const attn_tensor *weights,
                              attn__sdpa_shapes *s)
{
    return prepare_shapes(ctx, q, k, v, p, out, weights, 0, s);
}

static int prepare_shapes(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                          const attn_tensor *v, const attn_sdpa_params *p,
                          const attn_tensor *out, const attn_tensor *weights, int cache,
                          attn__sdpa_shapes *s)
{
    int rc;
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    if ((rc = check_storage(ctx, q, k, v, out, cache)) ||
        (weights && (rc = check_f32(ctx, weights, "weights"))))
        return rc;
    memset(s, 0, sizeof *s);
    /* The dtype of the call is k's: q and out differ from it only on the cache's
     * mixed call, where they are float32. */
    s->dtype = k->dtype;
    s->q_f32 = q->dtype != k->dtype;
    s->out_f32 = out->dtype != k->dtype;
    int64_t qs[4], ks[4], vs[4], os[4], ws[4];
    attn__as4d(q, qs, s->q_s);
    attn__as4d(k, ks, s->k_s);
    attn__as4d(v, vs, s->v_s);
    attn__as4d(out, os, s->o_s);
    if (qs[3] != ks[3] || ks[2] != vs[2] || ks[1] != vs[1] || qs[1] % ks[1] != 0 ||
        qs[0] != ks[0] || qs[0] != vs[0])
        return qkv_mismatch(ctx, q, k, v, qs, ks, vs);
    s->B = qs[0];
    s->H = qs[1];
    s->Hkv = ks[1];
    s->group = s->H / s->Hkv;
    s->Tq = qs[2];
    s->Tk = ks[2];
    s->offset = s->Tk - s->Tq;
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
        s->weights = 1;
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
    if (p->empty_rows != ATTN_EMPTY_ROWS_ERROR && p->empty_rows != ATTN_EMPTY_ROWS_ZERO)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "unknown empty_rows value %d",
                          (int)p->empty_rows);
    if (p->has_scale && !isfinite(p->scale))
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "scale %g is not a finite number",
                          (double)p->scale);
    if ((rc = attn__mask4_init(ctx, p->mask, s->B, s->H, s->Tq, s->Tk, &s->mask)) ||
        (rc = check_options(ctx, p, s)))
        return rc;
    s->scale = p->has_scale ? p->scale : (float)(1.0 / sqrt((double)s->D));
    s->empty_rows = p->empty_rows;
    return ATTN_OK;
}

float attn__alibi_default_slope(int64_t h, int64_t H)
{
    /* The largest power of two m <= H: heads below m take 2^(-8(h+1)/m); the rest
     * take every other slope of 2m heads, 2^(-8(2(h-m)+1)/(2m)). */
    int64_t m = 1;
    while (m * 2 <= H)
        m *= 2;
    if (h < m)
        return (float)pow(2.0, -8.0 * (double)(h + 1) / (double)m);
    return (float)pow(2.0, -8.0 * (double)(2 * (h - m) + 1) / (double)(2 * m));
}

int attn_alibi_slopes(attn_ctx *ctx, int64_t num_heads, float *slopes)
{
    if (!slopes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "slopes is NULL");
    if (num_heads < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "num_heads is %lld; it must be at least 1", (long long)num_heads);
    for (int64_t h = 0; h < num_heads; h++)
        slopes[h] = attn__alibi_default_slope(h, num_heads);
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
    /* The reference keeps one [Tq, Tk] score block, and in 16 bits float32 copies
     * of q, k, v and out after it (src/kernels/half_stage.h). */
    int64_t n;
    if (!attn__mul_i64(s->Tq, s->Tk, &n) || !attn__bytes(n, sizeof(float), &plan->scratch_bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "a [%lld, %lld] score block does not fit in memory",
                          (long long)s->Tq, (long long)s->Tk);
    if (s->dtype != ATTN_DTYPE_F32) {
        const size_t scores = attn__align64(plan->scratch_bytes), stage = attn__half_ref_bytes(s);
        if (!stage || scores > SIZE_MAX - stage)
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "float32 copies of %s q, k and v for the reference do not fit "
                              "in memory",
                              attn_dtype_name(s->dtype));
        plan->scratch_bytes = scores + stage;
    }
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

int attn__sdpa_run(attn_ctx *ctx, const attn__sdpa_plan *plan, const void *q,
                   const void *k, const void *v, void *out, float *weights, void *scratch)
{
    if (plan->use_ref && plan->s.dtype != ATTN_DTYPE_F32) {
        const size_t scores = attn__align64((size_t)plan->s.Tq * (size_t)plan->s.Tk * sizeof(float));
        return attn__half_ref_run(ctx, &plan->s, q, k, v, out, weights, (float *)scratch,
                                  (unsigned char *)scratch + scores);
    }
    if (plan->use_ref)
        return attn__sdpa_ref_run(ctx, &plan->s, q, k, v, out, weights, (float *)scratch);
    return attn__sdpa_fused_run(ctx, plan, q, k, v, out, weights, scratch);
}

/* ---- the backward ------------------------------------------------------------- */

/* A float32 tensor whose shape, read as 4-D with leading sizes of 1, is `want`,
 * with at most max_ndim dimensions; its 4-D strides go to `stride`. */
static int check_shape4(attn_ctx *ctx, const attn_tensor *t, const char *name,
                        const int64_t want[4], int max_ndim, int64_t stride[4])
{
    int rc = check_f32(ctx, t, name);
    if (rc)
        return rc;
    int64_t sh[4];
    attn__as4d(t, sh, stride);
    if (t->ndim > max_ndim || memcmp(sh, want, sizeof sh) != 0) {
        char a[128], b[128];
        attn_shape_format(b, sizeof b, max_ndim, want + (4 - max_ndim));
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "%s has shape %s; expected %s",
                          name, attn__shape_str(t, a, sizeof a), b);
    }
    return ATTN_OK;
}

/* dbias: the bias's own shape, exactly (the gradient is summed over the axes the
 * bias was broadcast along, so it has the shape the caller's bias has). */
static int check_dbias(attn_ctx *ctx, const attn_tensor *dbias, const attn_tensor *bias,
                       attn__sdpa_bwd_shapes *bs)
{
    int rc = check_f32(ctx, dbias, "grads->dbias");
    if (rc)
        return rc;
    if (!bias)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "grads->dbias is given but p->bias is NULL: there is no bias to "
                          "differentiate");
    int same = dbias->ndim == bias->ndim;
    for (int i = 0; same && i < bias->ndim; i++)
        same = dbias->shape[i] == bias->shape[i];
    if (!same) {
        char a[128], b[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "grads->dbias has shape %s; expected the bias's shape %s",
                          attn__shape_str(dbias, a, sizeof a), attn__shape_str(bias, b, sizeof b));
    }
    int64_t sh[4];
    attn__as4d(dbias, sh, bs->dbias_s);
    /* A broadcast axis is one where the bias has size 1: every index lands on
     * element 0. The bias's stride is no guide: an expanded view (np.broadcast_to,
     * torch's expand) has stride 0 on axes of full size, and each of those elements
     * gets its own gradient, as in a contiguous copy (tests/test_port_bias_view.c). */
    for (int i = 0; i < 4; i++)
        if (sh[i] == 1)
            bs->dbias_s[i] = 0;
    bs->dbias = dbias->data;
    return ATTN_OK;
}

/* No gradient may share memory with an argument or with another gradient. */
static int check_backward_aliasing(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                                   const attn_tensor *v, const attn_sdpa_params *p,
                                   const attn_tensor *out, const attn_tensor *lse,
                                   const attn_tensor *dout, const attn_sdpa_grads *g)
{
    const attn_tensor *ins[10] = {q, k, v, out, lse, dout, p->mask, p->bias, p->sinks,
                                  p->alibi_slopes};
    const char *in_names[10] = {"q", "k", "v", "out", "lse", "dout", "mask", "bias", "sinks",
                                "alibi_slopes"};
    const attn_tensor *outs[5] = {g->dq, g->dk, g->dv, g->dbias, g->dsinks};
    const char *out_names[5] = {"dq", "dk", "dv", "dbias", "dsinks"};
    int rc;
    for (int o = 0; o < 5; o++)
        for (int i = 0; i < 10 && outs[o]; i++)
            if (ins[i] && (rc = attn__no_overlap(ctx, "attn_sdpa_backward", outs[o], out_names[o],
                                                 ins[i], in_names[i], 0)))
                return rc;
    for (int o = 0; o < 5; o++)
        for (int o2 = o + 1; o2 < 5 && outs[o]; o2++)
            if (outs[o2] && (rc = attn__no_overlap(ctx, "attn_sdpa_backward", outs[o2],
                                                   out_names[o2], outs[o], out_names[o], 0)))
                return rc;
    return ATTN_OK;
}

int attn__sdpa_backward_prepare(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                                const attn_tensor *v, const attn_sdpa_params *p,
                                const attn_tensor *out, const attn_tensor *lse,
                                const attn_tensor *dout, const attn_sdpa_grads *grads,
                                attn__sdpa_bwd_shapes *bs)
{
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    memset(bs, 0, sizeof *bs);
    if (p->lse)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "p->lse must be NULL in the backward: it is the forward's output; "
                          "pass the forward's log-sum-exp as the lse argument");
    if (!grads)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if (!grads->dq || !grads->dk || !grads->dv)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "grads->%s is NULL; dq, dk and dv are always computed",
                          !grads->dq ? "dq" : !grads->dk ? "dk" : "dv");
    int rc = attn__sdpa_prepare_shapes(ctx, q, k, v, p, out, NULL, &bs->s);
    if (rc != ATTN_OK)
        return rc;
    /* The forward takes 16-bit storage (SPEC section 10); the backward does not. */
    if (bs->s.dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE,
                          "the attention backward takes float32 q, k, v and out, not %s",
                          attn_dtype_name(bs->s.dtype));
    const attn__sdpa_shapes *s = &bs->s;
    const int64_t want_lse[4] = {1, s->B, s->H, s->Tq};
    const int64_t want_do[4] = {s->B, s->H, s->Tq, s->Dv};
    const int64_t want_dq[4] = {s->B, s->H, s->Tq, s->D};
    const int64_t want_dk[4] = {s->B, s->Hkv, s->Tk, s->D};
    const int64_t want_dv[4] = {s->B, s->Hkv, s->Tk, s->Dv};
    int64_t lse_s4[4];
    if (!lse)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "lse is NULL; the backward needs the forward's log-sum-exp");
    if (!dout)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "dout is NULL");
    if ((rc = check_shape4(ctx, lse, "lse", want_lse, 3, lse_s4)) ||
        (rc = check_shape4(ctx, dout, "dout", want_do, 4, bs->do_s)) ||
        (rc = check_shape4(ctx, grads->dq, "grads->dq", want_dq, 4, bs->dq_s)) ||
        (rc = check_shape4(ctx, grads->dk, "grads->dk", want_dk, 4, bs->dk_s)) ||
        (rc = check_shape4(ctx, grads->dv, "grads->dv", want_dv, 4, bs->dv_s)))
        return rc;
    memcpy(bs->lse_s, lse_s4 + 1, sizeof bs->lse_s);
    if (grads->dbias && (rc = check_dbias(ctx, grads->dbias, p->bias, bs)))
        return rc;
    if (grads->dsinks) {
        if (!p->sinks)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "grads->dsinks is given but p->sinks is NULL: there are no "
                              "sinks to differentiate");
        if ((rc = check_per_head(ctx, grads->dsinks, "grads->dsinks", s->H, &bs->dsinks_s)))
            return rc;
        bs->dsinks = grads->dsinks->data;
    }
    return check_backward_aliasing(ctx, q, k, v, p, out, lse, dout, grads);
}

int attn__sdpa_backward_plan_make(attn_ctx *ctx, const attn__sdpa_bwd_shapes *bs,
                                  attn__sdpa_bwd_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->bs = *bs;
    plan->use_ref = 1;
    plan->threads = 1;
    /* The reference keeps the weights P and their gradient dS, [Tq, Tk] each, and
     * Delta [Tq]. */
    int64_t n;
    if (!attn__mul_i64(bs->s.Tq, bs->s.Tk, &n) || n > (INT64_MAX - bs->s.Tq) / 2 ||
        !attn__bytes(2 * n + bs->s.Tq, sizeof(float), &plan->scratch_bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "two [%lld, %lld] blocks for the backward do not fit in memory",
                          (long long)bs->s.Tq, (long long)bs->s.Tk);
    return ATTN_OK;
}

int attn__sdpa_backward_plan_for_ctx(attn_ctx *ctx, const attn__sdpa_bwd_shapes *bs,
                                     attn__sdpa_bwd_plan *plan)
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
        return attn__sdpa_backward_plan_make(ctx, bs, plan);
    memset(plan, 0, sizeof *plan);
    plan->bs = *bs;
    plan->arch = arch;
    return attn__sdpa_fused_backward_plan(ctx, plan);
}
