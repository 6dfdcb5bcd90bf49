/*
 * mha_backward.c - the backward of the chapter's multi-head self-attention
 * (attn_mha_backward, SPEC section 8, docs/gradients.md "Multi-head attention").
 *
 * The forward keeps nothing, so the backward first runs it again up to the
 * context: qkv = x W_qkv^T + b_qkv, then the attention with its log-sum-exp. Then
 * it walks the module backwards, each product through the projection GEMM
 * (gemm.h), whose only operation is y = x W^T: the other two products are the
 * same operation on transposed views, which packing reads through strides.
 *
 *   dmerged = dout W_o          x = dout,  W = W_o^T  (W_o read column by column)
 *   dW_o    = dout^T merged     x = dout^T (dout read column by column), W = merged^T
 *   dq, dk, dv                  the attention's backward, into dqkv [B, T, 3E]
 *   dx      = dqkv W_qkv        x = dqkv,  W = W_qkv^T
 *   dW_qkv  = dqkv^T x          x = dqkv^T, W = x^T
 *   db_o, db_qkv                column sums, over b then t in increasing order
 *
 * A transposed x must have its B*T rows at one stride, so x and dout are first
 * copied into the scratch, contiguous. The GEMM sums each output element over k
 * in increasing order whatever the thread count, and the bias sums are plain
 * loops, so the result has the same bits for 1 or more threads.
 *
 * The scratch block (each part 64-byte aligned):
 *
 *   xc      [B, T, E]    x, contiguous
 *   dyc     [B, T, E]    dout, contiguous
 *   qkv     [B, T, 3E]   the recomputed projection
 *   merged  [B, T, E]    the recomputed context
 *   lse     [B, H, T]    its log-sum-exp
 *   dmerged [B, T, E]
 *   dqkv    [B, T, 3E]
 *   region  the largest of: the attention's forward scratch, its backward
 *           scratch, and each weight packed for the GEMM (used one after another)
 *
 * The attention's backward is planned here from the forward's checked shapes
 * rather than through attn__sdpa_backward_prepare: its inputs and gradients are
 * views of this block, laid out by this file, so the only checks left to make
 * are those of the caller's own tensors. It runs the backward ctx selects, as
 * attn_sdpa_backward does (the fused kernel by default, the reference with
 * ATTN_IMPL_REF or the ref arch).
 */
#include "linear.h"
#include "heads.h"
#include "sdpa_contract.h"

#include <string.h>

/* One checked call: sizes, the attention's forward and backward plans, and the
 * offsets of the scratch block's parts. */
typedef struct bwd_plan {
    int64_t B, T, E, H, D;
    attn_arch arch;
    attn__sdpa_plan fwd;
    attn__sdpa_bwd_plan bwd;
    size_t off_dyc, off_qkv, off_merged, off_lse, off_dmerged, off_dqkv, off_region;
    size_t bytes;
} bwd_plan;

/* Checks one gradient tensor: float32 with the given shape. */
static int grad_shape(attn_ctx *ctx, const attn_tensor *t, const char *name, int ndim,
                      const int64_t *want)
{
    if (!t)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "grads->%s is NULL; every gradient of attn_mha_backward is computed",
                          name);
    int rc = attn_tensor_check(ctx, t, name);
    if (rc != ATTN_OK)
        return rc;
    if (t->dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "grads->%s must be float32", name);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == want[i];
    if (same)
        return ATTN_OK;
    char got[128], exp[128];
    attn__shape_str(t, got, sizeof got);
    attn_shape_format(exp, sizeof exp, ndim, want);
    return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "grads->%s has shape %s; expected %s",
                      name, got, exp);
}

/* No gradient may overlap an input (x, dout, the weights, p's tensors) or another
 * gradient. */
static int bwd_aliasing(attn_ctx *ctx, const attn_mha_weights *w, const attn_tensor *x,
                        const attn_sdpa_params *p, const attn_tensor *dout,
                        const attn_mha_grads *g)
{
    const attn_tensor *ins[10] = {x, dout, &w->w_qkv, &w->b_qkv, &w->w_o, &w->b_o,
                                  p ? p->mask : NULL, p ? p->bias : NULL,
                                  p ? p->sinks : NULL, p ? p->alibi_slopes : NULL};
    static const char *const in_names[10] = {"x", "dout", "qkv weight", "qkv bias",
                                             "output weight", "output bias", "mask",
                                             "bias", "sinks", "alibi_slopes"};
    const attn_tensor *outs[5] = {g->dx, g->dw_qkv, g->db_qkv, g->dw_o, g->db_o};
    static const char *const out_names[5] = {"grads->dx", "grads->dw_qkv", "grads->db_qkv",
                                             "grads->dw_o", "grads->db_o"};
    int rc;
    for (int o = 0; o < 5; o++)
        for (int i = 0; i < 10; i++)
            if (ins[i] && (rc = attn__no_overlap(ctx, "attn_mha_backward", outs[o],
                                                 out_names[o], ins[i], in_names[i], 0)))
                return rc;
    for (int o = 0; o < 5; o++)
        for (int o2 = o + 1; o2 < 5; o2++)
            if ((rc = attn__no_overlap(ctx, "attn_mha_backward", outs[o2], out_names[o2],
                                       outs[o], out_names[o], 0)))
                return rc;
    return ATTN_OK;
}

/* Adds part `bytes` (64-byte aligned) to a block of *total bytes; its offset in
 * *off. 0 on overflow. */
static int take(size_t *total, int64_t floats, size_t *off)
{
    size_t b;
    if (!attn__bytes(floats, sizeof(float), &b) || !(b = attn__align64(b)) ||
        *total > SIZE_MAX - b)
        return 0;
    *off = *total;
    *total += b;
    return 1;
}

static size_t max_sz(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* Checks every argument and plans the call. */
static int bwd_prepare(attn_ctx *ctx, const attn_mha_weights *w, int64_t H,
                       const attn_tensor *x, const attn_sdpa_params *p,
                       const attn_tensor *dout, const attn_mha_grads *g, bwd_plan *bp)
{
    int64_t E;
    int rc = attn_mha_weights_check(ctx, w, H, &E);
    if (rc == ATTN_OK)
        rc = attn__arch_resolve(ctx, &bp->arch);
    if (rc != ATTN_OK)
        return rc;
    if (p && p->lse)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "p->lse must be NULL in attn_mha_backward: the log-sum-exp is "
                          "recomputed in its scratch");
    if (!g)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if ((rc = attn_tensor_check(ctx, x, "x")) || (rc = attn_tensor_check(ctx, dout, "dout")))
        return rc;
    if (x->dtype != ATTN_DTYPE_F32 || dout->dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "x and dout must be float32");
    char sx[128], sd[128];
    if (x->ndim != 3 || x->shape[2] != E)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "x has shape %s; expected [B, T, %lld] (embed_dim from the weights)",
                          attn__shape_str(x, sx, sizeof sx), (long long)E);
    if (dout->ndim != 3 || memcmp(dout->shape, x->shape, 3 * sizeof x->shape[0]) != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "dout has shape %s; expected %s",
                          attn__shape_str(dout, sd, sizeof sd),
                          attn__shape_str(x, sx, sizeof sx));
    const int64_t B = x->shape[0], T = x->shape[1], D = E / H;
    const int64_t want_qkv[2] = {3 * E, E}, want_o[2] = {E, E};
    if ((rc = grad_shape(ctx, g->dx, "dx", 3, x->shape)) ||
        (rc = grad_shape(ctx, g->dw_qkv, "dw_qkv", 2, want_qkv)) ||
        (rc = grad_shape(ctx, g->db_qkv, "db_qkv", 1, want_qkv)) ||
        (rc = grad_shape(ctx, g->dw_o, "dw_o", 2, want_o)) ||
        (rc = grad_shape(ctx, g->db_o, "db_o", 1, want_o)))
        return rc;

    /* The block's parts; the attention is planned on views of them, whose
     * strides are all that matter until the call runs (x->data stands in for the
     * block's base). */
    int64_t bt, bte, bht;
    size_t total = 0, off_xc;
    if (!attn__mul_i64(B, T, &bt) || !attn__mul_i64(bt, E, &bte) ||
        !attn__mul_i64(bt, H, &bht) || bte > INT64_MAX / 3 || !take(&total, bte, &off_xc) ||
        !take(&total, bte, &bp->off_dyc) || !take(&total, 3 * bte, &bp->off_qkv) ||
        !take(&total, bte, &bp->off_merged) || !take(&total, bht, &bp->off_lse) ||
        !take(&total, bte, &bp->off_dmerged) || !take(&total, 3 * bte, &bp->off_dqkv))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "the backward's workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));

    float *base = (float *)x->data;
    attn_tensor q, k, v, context, lse;
    attn__head_view(&q, base, B, T, H, D, 3 * E, 0);
    attn__head_view(&k, base, B, T, H, D, 3 * E, E);
    attn__head_view(&v, base, B, T, H, D, 3 * E, 2 * E);
    attn__head_view(&context, base, B, T, H, D, E, 0);
    const int64_t lse_shape[3] = {B, H, T};
    if ((rc = attn_tensor_init(ctx, &lse, ATTN_DTYPE_F32, base, 3, lse_shape)))
        return rc;
    attn_sdpa_params pf;
    if (p)
        pf = *p;
    else
        attn_sdpa_params_init(&pf);
    pf.lse = &lse;
    attn__sdpa_shapes s;
    if ((rc = attn__sdpa_prepare_shapes(ctx, &q, &k, &v, &pf, &context, NULL, &s)) ||
        (rc = attn__sdpa_plan_for_ctx(ctx, &s, &bp->fwd)))
        return rc;

    /* The backward's shapes: the forward's, reading the log-sum-exp instead of
     * writing it; dout and dq, dk, dv are laid out like out and q, k, v. */
    attn__sdpa_bwd_shapes bs;
    memset(&bs, 0, sizeof bs);
    bs.s = s;
    bs.s.lse = NULL;
    memcpy(bs.lse_s, s.lse_s, sizeof bs.lse_s);
    memcpy(bs.do_s, s.o_s, sizeof bs.do_s);
    memcpy(bs.dq_s, s.q_s, sizeof bs.dq_s);
    memcpy(bs.dk_s, s.k_s, sizeof bs.dk_s);
    memcpy(bs.dv_s, s.v_s, sizeof bs.dv_s);
    if ((rc = attn__sdpa_backward_plan_for_ctx(ctx, &bs, &bp->bwd)))
        return rc;

    /* The region: the attention's scratch either way, and the largest packed
     * weight: W_qkv [3E, E], W_o and W_o^T [E, E], W_qkv^T [E, 3E], and merged^T
     * and x^T [E, B*T]. */
    const size_t pk[3] = {attn__gemm_pack_bytes(bp->arch, 3 * E, E),
                          attn__gemm_pack_bytes(bp->arch, E, 3 * E),
                          attn__gemm_pack_bytes(bp->arch, E, bt)};
    if (!pk[0] || !pk[1] || !pk[2])
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "a packed weight for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));
    size_t region = max_sz(max_sz(bp->fwd.scratch_bytes, bp->bwd.scratch_bytes),
                           max_sz(pk[0], max_sz(pk[1], pk[2])));
    if (!(region = attn__align64(region)) || total > SIZE_MAX - region)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "the backward's workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));
    bp->off_region = total;
    bp->bytes = total + region;
    bp->B = B, bp->T = T, bp->E = E, bp->H = H, bp->D = D;
    return bwd_aliasing(ctx, w, x, p, dout, g);
}

/* Copies a [B, T, E] tensor into contiguous floats. */
static void copy_bte(const attn_tensor *t, float *dst)
{
    const float *src = t->data;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t i = 0; i < t->shape[1]; i++)
            for (int64_t e = 0; e < t->shape[2]; e++)
                *dst++ = src[b * t->stride[0] + i * t->stride[1] + e * t->stride[2]];
}

/* db[n] = sum over the rows of src [rows, n_cols] (row stride rs), rows in
 * increasing order: the same bits whatever the thread count. */
static void column_sums(const float *src, int64_t rows, int64_t n_cols, int64_t rs,
                        const attn_tensor *db)
{
    float *out = db->data;
    for (int64_t n = 0; n < n_cols; n++)
        out[n * db->stride[0]] = 0.0f;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t n = 0; n < n_cols; n++)
            out[n * db->stride[0]] += src[r * rs + n];
}

/* The GEMM's rows for a whole 2-D or 3-D tensor t. */
static void rows_of(const attn_tensor *t, attn__gemm_rows *r)
{
    int64_t sh[4], st[4];
    attn__as4d(t, sh, st);
    attn__gemm_rows_from4d(sh, st, r);
}

static int bwd_run(attn_ctx *ctx, const bwd_plan *bp, const attn_mha_weights *w,
                   const attn_tensor *x, const attn_tensor *dout, const attn_mha_grads *g,
                   char *scratch)
{
    const int64_t B = bp->B, T = bp->T, E = bp->E, BT = B * T, R = 3 * E;
    const attn_arch arch = bp->arch;
    float *xc = (float *)scratch, *dyc = (float *)(scratch + bp->off_dyc);
    float *qkv = (float *)(scratch + bp->off_qkv);
    float *merged = (float *)(scratch + bp->off_merged);
    float *lse = (float *)(scratch + bp->off_lse);
    float *dmerged = (float *)(scratch + bp->off_dmerged);
    float *dqkv = (float *)(scratch + bp->off_dqkv);
    void *region = scratch + bp->off_region;
    attn__gemm_packed pw;
    int rc;

    copy_bte(x, xc);
    copy_bte(dout, dyc);
    /* Contiguous [B*T, n] rows, and their transposes: n rows of B*T elements. */
    const attn__gemm_rows rows_e = {{1, 1, BT}, {0, 0, E}, 1};
    const attn__gemm_rows rows_r = {{1, 1, BT}, {0, 0, R}, 1};
    const attn__gemm_rows cols_e = {{1, 1, E}, {0, 0, 1}, E};
    const attn__gemm_rows cols_r = {{1, 1, R}, {0, 0, 1}, R};
    attn__gemm_rows dx_rows, dwqkv_rows, dwo_rows;
    rows_of(g->dx, &dx_rows);
    rows_of(g->dw_qkv, &dwqkv_rows);
    rows_of(g->dw_o, &dwo_rows);

    /* The forward again, up to the context and its log-sum-exp. */
    attn__gemm_pack(ctx, arch, w->w_qkv.data, w->w_qkv.stride[0], w->w_qkv.stride[1],
                    w->b_qkv.data, w->b_qkv.stride[0], R, E, region, &pw);
    attn__linear_run(ctx, &pw, xc, &rows_e, qkv, &rows_r);
    attn__sdpa_plan fwd = bp->fwd;
    fwd.s.lse = lse;
    if ((rc = attn__sdpa_run(ctx, &fwd, qkv, qkv + E, qkv + 2 * E, merged, NULL, region)))
        return rc;

    /* The output projection: dmerged = dout W_o, dW_o = dout^T merged, db_o. */
    attn__gemm_pack(ctx, arch, w->w_o.data, w->w_o.stride[1], w->w_o.stride[0], NULL, 0, E, E,
                    region, &pw);
    attn__linear_run(ctx, &pw, dyc, &rows_e, dmerged, &rows_e);
    attn__gemm_pack(ctx, arch, merged, 1, E, NULL, 0, E, BT, region, &pw);
    attn__linear_run(ctx, &pw, dyc, &cols_e, g->dw_o->data, &dwo_rows);
    column_sums(dyc, BT, E, E, g->db_o);

    /* The attention's backward, into dqkv's q, k and v columns. */
    if ((rc = attn__sdpa_backward_run(ctx, &bp->bwd, qkv, qkv + E, qkv + 2 * E, merged, lse,
                                      dmerged, dqkv, dqkv + E, dqkv + 2 * E, region)))
        return rc;

    /* The qkv projection: dx = dqkv W_qkv, dW_qkv = dqkv^T x, db_qkv. */
    attn__gemm_pack(ctx, arch, w->w_qkv.data, w->w_qkv.stride[1], w->w_qkv.stride[0], NULL, 0,
                    E, R, region, &pw);
    attn__linear_run(ctx, &pw, dqkv, &rows_r, g->dx->data, &dx_rows);
    attn__gemm_pack(ctx, arch, xc, 1, E, NULL, 0, E, BT, region, &pw);
    attn__linear_run(ctx, &pw, dqkv, &cols_r, g->dw_qkv->data, &dwqkv_rows);
    column_sums(dqkv, BT, R, R, g->db_qkv);
    return ATTN_OK;
}

int attn_mha_backward(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                      const attn_tensor *x, const attn_sdpa_params *p, const attn_tensor *dout,
                      const attn_mha_grads *grads)
{
    bwd_plan bp;
    int rc = bwd_prepare(ctx, w, num_heads, x, p, dout, grads, &bp);
    if (rc != ATTN_OK)
        return rc;
    char *scratch = attn__scratch_get(ctx, bp.bytes, "the multi-head attention backward's workspace");
    if (!scratch)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    rc = bwd_run(ctx, &bp, w, x, dout, grads, scratch);
    attn__scratch_put(ctx, scratch);
    return rc;
}

int attn_mha_backward_workspace_size(attn_ctx *ctx, const attn_mha_weights *w,
                                     int64_t num_heads, const attn_tensor *x,
                                     const attn_sdpa_params *p, const attn_tensor *dout,
                                     const attn_mha_grads *grads, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    bwd_plan bp;
    int rc = bwd_prepare(ctx, w, num_heads, x, p, dout, grads, &bp);
    if (rc == ATTN_OK)
        *bytes = bp.bytes;
    return rc;
}
