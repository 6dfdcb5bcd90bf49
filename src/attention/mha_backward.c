/*
 * mha_backward.c - the backward of multi-head self-attention: the chapter's module
 * (attn_mha_backward) and grouped-query attention with separate projections and
 * optional RoPE (attn_gqa_backward); SPEC section 8, docs/gradients.md "Multi-head
 * attention" and "Grouped-query attention and RoPE".
 *
 * Both entry points check their own arguments and then run one engine on the same
 * description: four projections W_q [Q, E], W_k and W_v [KV, E], W_o [E, Q] (Q = H*D,
 * KV = Hkv*D) with their biases. The chapter's W_qkv is seen as three row blocks (views,
 * no copy), so its module is the case H = Hkv, D = E / H.
 *
 * The forward keeps nothing, so the backward first runs it again up to the context:
 * qkv = x W_cat^T + b_cat with W_cat = [W_q; W_k; W_v] [R, E] (R = Q + 2 KV), RoPE on
 * q and k when asked, then the attention with its log-sum-exp. Then it walks the
 * module backwards, each product through the projection GEMM (gemm.h), whose only
 * operation is y = x W^T: the other products are the same operation on transposed
 * views, which packing reads through strides.
 *
 *   dmerged = dout W_o          x = dout,  W = W_o^T  (W_o read column by column)
 *   dW_o    = dout^T merged     x = dout^T (dout read column by column), W = merged^T
 *   dq, dk, dv                  the attention's backward, into dqkv [B, T, R]; with
 *                               GQA it sums dk, dv over each group of query heads
 *   RoPE                        dq and dk turned back by the inverse rotation (the
 *                               rotation's transpose), in place in dqkv
 *   dx      = dqkv W_cat        x = dqkv,  W = W_cat^T
 *   dW_q    = dq^T x            x = dq^T (dqkv's first Q columns), W = x^T; the
 *   dW_k, dW_v                  same for k and v on their column blocks
 *   db_o, db_q, db_k, db_v      column sums, over b then t in increasing order
 *
 * W_q, W_k and W_v are copied into one [R, E] matrix (W_cat) because packing reads
 * one matrix with one row stride, and dx is one GEMM over all R columns of dqkv.
 * A transposed x must have its B*T rows at one stride, so x and dout are first
 * copied into the scratch, contiguous. The GEMM sums each output element over k
 * in increasing order whatever the thread count or the block of rows it is computed
 * in, and the bias sums are plain loops, so the result has the same bits for 1 or
 * more threads, and attn_gqa_backward on W_qkv's row blocks gives attn_mha_backward's
 * bits.
 *
 * The scratch block (each part 64-byte aligned):
 *
 *   xc      [B, T, E]    x, contiguous
 *   dyc     [B, T, E]    dout, contiguous
 *   qkv     [B, T, R]    the recomputed projection (q and k rotated with RoPE)
 *   merged  [B, T, Q]    the recomputed context
 *   lse     [B, H, T]    its log-sum-exp
 *   dmerged [B, T, Q]
 *   dqkv    [B, T, R]
 *   wcat    [R, E]       W_q, W_k, W_v one above the other
 *   bcat    [R]          their biases (zeros for a bias not given)
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
#include "rope.h"
#include "sdpa_contract.h"

#include <string.h>

/* The projections as the engine reads them: q, k, v (0, 1, 2) and o. A bias whose
 * data is NULL is none. */
typedef struct bwd_weights {
    attn_tensor w[3], b[3], w_o, b_o;
} bwd_weights;

/* The gradients the engine writes: dx, dW for q, k, v and o (all given), db for each
 * (NULL: not computed). */
typedef struct bwd_grads {
    attn_tensor *dx, *dw[3], *dw_o, *db[3], *db_o;
} bwd_grads;

/* One checked call: sizes, RoPE, the attention's forward and backward plans, and the
 * offsets of the scratch block's parts. */
typedef struct bwd_plan {
    int64_t B, T, E, H, Hkv, D, Q, KV, R;
    attn_arch arch;
    int use_rope;
    attn_rope_params rope;
    attn__sdpa_plan fwd;
    attn__sdpa_bwd_plan bwd;
    size_t off_dyc, off_qkv, off_merged, off_lse, off_dmerged, off_dqkv, off_wcat, off_bcat,
        off_region;
    size_t bytes;
} bwd_plan;

/* Checks one gradient tensor: float32 with the given shape. fn names the call in the
 * message for a missing one. */
static int grad_shape(attn_ctx *ctx, const char *fn, const attn_tensor *t, const char *name,
                      int ndim, const int64_t *want)
{
    if (!t)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "grads->%s is NULL; every gradient of %s is computed", name, fn);
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

/* No output may overlap an input or another output; NULL entries and tensors
 * without data (a bias not given) are skipped. */
static int no_overlaps(attn_ctx *ctx, const char *fn, const attn_tensor *const *outs,
                       const char *const *out_names, int n_out, const attn_tensor *const *ins,
                       const char *const *in_names, int n_in)
{
    int rc;
    for (int o = 0; o < n_out; o++) {
        if (!outs[o])
            continue;
        for (int i = 0; i < n_in; i++)
            if (ins[i] && ins[i]->data &&
                (rc = attn__no_overlap(ctx, fn, outs[o], out_names[o], ins[i], in_names[i], 0)))
                return rc;
        for (int o2 = o + 1; o2 < n_out; o2++)
            if (outs[o2] && (rc = attn__no_overlap(ctx, fn, outs[o2], out_names[o2], outs[o],
                                                   out_names[o], 0)))
                return rc;
    }
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

/* Checks what both entry points share (the arch, p, x, dout and RoPE, for embed_dim
 * E and H query heads of D features reading Hkv key/value heads, already checked)
 * and plans the engine's call. */
static int plan_make(attn_ctx *ctx, const char *fn, int64_t E, int64_t H, int64_t Hkv,
                     int64_t D, const attn_tensor *x, const attn_sdpa_params *p,
                     const attn_rope_params *rope, const attn_tensor *dout, bwd_plan *bp)
{
    memset(bp, 0, sizeof *bp);
    int rc = attn__arch_resolve(ctx, &bp->arch);
    if (rc != ATTN_OK)
        return rc;
    if (p && p->lse)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "p->lse must be NULL in %s: the log-sum-exp is recomputed in its "
                          "scratch", fn);
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
    const int64_t B = x->shape[0], T = x->shape[1];
    if (rope) {
        /* The checks attn_mha_forward_packed_rope makes, with its messages. */
        if ((rc = attn__rope_check(ctx, rope, D, 1)))
            return rc;
        if (rope->offset > INT64_MAX - (T - 1)) /* the last row at offset + T - 1 */
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "RoPE offset %lld plus %lld positions overflows",
                              (long long)rope->offset, (long long)T);
        bp->use_rope = 1;
        bp->rope = *rope;
    }

    /* The block's parts; the attention is planned on views of them, whose
     * strides are all that matter until the call runs (x->data stands in for the
     * block's base). The weights' checks bound Q, KV and R well below INT64_MAX. */
    const int64_t Q = H * D, KV = Hkv * D, R = Q + 2 * KV;
    int64_t bt, bte, btq, btr, bht, re;
    size_t total = 0, off_xc;
    if (!attn__mul_i64(B, T, &bt) || !attn__mul_i64(bt, E, &bte) ||
        !attn__mul_i64(bt, Q, &btq) || !attn__mul_i64(bt, R, &btr) ||
        !attn__mul_i64(bt, H, &bht) || !attn__mul_i64(R, E, &re) ||
        !take(&total, bte, &off_xc) || !take(&total, bte, &bp->off_dyc) ||
        !take(&total, btr, &bp->off_qkv) || !take(&total, btq, &bp->off_merged) ||
        !take(&total, bht, &bp->off_lse) || !take(&total, btq, &bp->off_dmerged) ||
        !take(&total, btr, &bp->off_dqkv) || !take(&total, re, &bp->off_wcat) ||
        !take(&total, R, &bp->off_bcat))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "the backward's workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));

    float *base = (float *)x->data;
    attn_tensor q, k, v, context, lse;
    attn__head_view(&q, base, B, T, H, D, R, 0);
    attn__head_view(&k, base, B, T, Hkv, D, R, Q);
    attn__head_view(&v, base, B, T, Hkv, D, R, Q + KV);
    attn__head_view(&context, base, B, T, H, D, Q, 0);
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
     * weight: W_cat [R, E], W_o^T [Q, E], merged^T [Q, B*T], W_cat^T [E, R] and
     * x^T [E, B*T]. */
    const size_t pk[5] = {
        attn__gemm_pack_bytes(bp->arch, R, E), attn__gemm_pack_bytes(bp->arch, Q, E),
        attn__gemm_pack_bytes(bp->arch, Q, bt), attn__gemm_pack_bytes(bp->arch, E, R),
        attn__gemm_pack_bytes(bp->arch, E, bt)};
    size_t region = max_sz(bp->fwd.scratch_bytes, bp->bwd.scratch_bytes);
    for (int i = 0; i < 5; i++) {
        if (!pk[i])
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "a packed weight for x %s does not fit in memory",
                              attn__shape_str(x, sx, sizeof sx));
        region = max_sz(region, pk[i]);
    }
    if (!(region = attn__align64(region)) || total > SIZE_MAX - region)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "the backward's workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));
    bp->off_region = total;
    bp->bytes = total + region;
    bp->B = B, bp->T = T, bp->E = E, bp->H = H, bp->Hkv = Hkv, bp->D = D;
    bp->Q = Q, bp->KV = KV, bp->R = R;
    return ATTN_OK;
}

/* RoPE on the q columns (H heads) and k columns (Hkv heads) of a [B, T, R] block,
 * in place: forward on the recomputed qkv, inverse on dqkv. */
static void rope_block(const bwd_plan *bp, int inverse, float *blk)
{
    const int64_t st[3] = {bp->D, bp->R, 1};
    for (int64_t b = 0; b < bp->B; b++) {
        float *row0 = blk + b * bp->T * bp->R;
        attn__rope_rotate(&bp->rope, inverse, bp->H, bp->T, bp->D, row0, st, row0, st,
                          bp->rope.offset);
        attn__rope_rotate(&bp->rope, inverse, bp->Hkv, bp->T, bp->D, row0 + bp->Q, st,
                          row0 + bp->Q, st, bp->rope.offset);
    }
}

static int bwd_run(attn_ctx *ctx, const bwd_plan *bp, const bwd_weights *w,
                   const attn_tensor *x, const attn_tensor *dout, const bwd_grads *g,
                   char *scratch)
{
    const int64_t B = bp->B, T = bp->T, E = bp->E, BT = B * T, Q = bp->Q, KV = bp->KV,
                  R = bp->R;
    const attn_arch arch = bp->arch;
    float *xc = (float *)scratch, *dyc = (float *)(scratch + bp->off_dyc);
    float *qkv = (float *)(scratch + bp->off_qkv);
    float *merged = (float *)(scratch + bp->off_merged);
    float *lse = (float *)(scratch + bp->off_lse);
    float *dmerged = (float *)(scratch + bp->off_dmerged);
    float *dqkv = (float *)(scratch + bp->off_dqkv);
    float *wcat = (float *)(scratch + bp->off_wcat);
    float *bcat = (float *)(scratch + bp->off_bcat);
    void *region = scratch + bp->off_region;
    attn__gemm_packed pw;
    int rc;

    copy_bte(x, xc);
    copy_bte(dout, dyc);
    /* W_cat = [W_q; W_k; W_v] and b_cat; no bias is a bias of zeros. */
    const int64_t col[3] = {0, Q, Q + KV}, ncol[3] = {Q, KV, KV};
    for (int i = 0; i < 3; i++) {
        const float *wd = w->w[i].data, *bd = w->b[i].data;
        for (int64_t r = 0; r < ncol[i]; r++) {
            for (int64_t c = 0; c < E; c++)
                wcat[(col[i] + r) * E + c] = wd[r * w->w[i].stride[0] + c * w->w[i].stride[1]];
            bcat[col[i] + r] = bd ? bd[r * w->b[i].stride[0]] : 0.0f;
        }
    }
    /* Contiguous [B*T, n] rows, and their transposes: n rows of B*T elements. */
    const attn__gemm_rows rows_e = {{1, 1, BT}, {0, 0, E}, 1, 0, 0};
    const attn__gemm_rows rows_q = {{1, 1, BT}, {0, 0, Q}, 1, 0, 0};
    const attn__gemm_rows rows_r = {{1, 1, BT}, {0, 0, R}, 1, 0, 0};
    const attn__gemm_rows cols_e = {{1, 1, E}, {0, 0, 1}, E, 0, 0};
    attn__gemm_rows dx_rows, dwo_rows;
    rows_of(g->dx, &dx_rows);
    rows_of(g->dw_o, &dwo_rows);

    /* The forward again, up to the context and its log-sum-exp. */
    attn__gemm_pack(ctx, arch, wcat, E, 1, bcat, 1, R, E, region, &pw);
    attn__linear_run(ctx, &pw, xc, &rows_e, qkv, &rows_r);
    if (bp->use_rope)
        rope_block(bp, 0, qkv);
    attn__sdpa_plan fwd = bp->fwd;
    fwd.s.lse = lse;
    if ((rc = attn__sdpa_run(ctx, &fwd, qkv, qkv + Q, qkv + Q + KV, merged, NULL, region)))
        return rc;

    /* The output projection: dmerged = dout W_o, dW_o = dout^T merged, db_o. */
    attn__gemm_pack(ctx, arch, w->w_o.data, w->w_o.stride[1], w->w_o.stride[0], NULL, 0, Q, E,
                    region, &pw);
    attn__linear_run(ctx, &pw, dyc, &rows_e, dmerged, &rows_q);
    attn__gemm_pack(ctx, arch, merged, 1, Q, NULL, 0, Q, BT, region, &pw);
    attn__linear_run(ctx, &pw, dyc, &cols_e, g->dw_o->data, &dwo_rows);
    if (g->db_o)
        column_sums(dyc, BT, E, E, g->db_o);

    /* The attention's backward, into dqkv's q, k and v columns; then the gradients
     * with respect to q and k before their rotation. */
    if ((rc = attn__sdpa_backward_run(ctx, &bp->bwd, qkv, qkv + Q, qkv + Q + KV, merged, lse,
                                      dmerged, dqkv, dqkv + Q, dqkv + Q + KV, region)))
        return rc;
    if (bp->use_rope)
        rope_block(bp, 1, dqkv);

    /* The q, k, v projections: dx = dqkv W_cat, dW = dqkv^T x per block, db. */
    attn__gemm_pack(ctx, arch, wcat, 1, E, NULL, 0, E, R, region, &pw);
    attn__linear_run(ctx, &pw, dqkv, &rows_r, g->dx->data, &dx_rows);
    attn__gemm_pack(ctx, arch, xc, 1, E, NULL, 0, E, BT, region, &pw);
    for (int i = 0; i < 3; i++) {
        const attn__gemm_rows cols_i = {{1, 1, ncol[i]}, {0, 0, 1}, R, 0, 0};
        attn__gemm_rows dw_rows;
        rows_of(g->dw[i], &dw_rows);
        attn__linear_run(ctx, &pw, dqkv + col[i], &cols_i, g->dw[i]->data, &dw_rows);
        if (g->db[i])
            column_sums(dqkv + col[i], BT, ncol[i], R, g->db[i]);
    }
    return ATTN_OK;
}

/* Takes the block, runs, gives the block back. */
static int bwd_call(attn_ctx *ctx, const bwd_plan *bp, const bwd_weights *w,
                    const attn_tensor *x, const attn_tensor *dout, const bwd_grads *g)
{
    char *scratch = attn__scratch_get(ctx, bp->bytes,
                                      "the multi-head attention backward's workspace");
    if (!scratch)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    int rc = bwd_run(ctx, bp, w, x, dout, g, scratch);
    attn__scratch_put(ctx, scratch);
    return rc;
}

/* Rows r0 .. r0 + n - 1 of t (a 1-D or 2-D tensor) as a view. */
static attn_tensor rows_view(const attn_tensor *t, int64_t r0, int64_t n)
{
    attn_tensor v = *t;
    v.data = (float *)t->data + r0 * t->stride[0];
    v.shape[0] = n;
    return v;
}

/* ---- the chapter's module ---------------------------------------------------- */

/* The chapter's weights and gradients as the engine's: W_qkv's row blocks (and
 * dW_qkv's) are q's, k's and v's. The views live in *wv and gv[6]. */
static void mha_as_engine(const attn_mha_weights *w, const attn_mha_grads *g, int64_t E,
                          bwd_weights *wv, attn_tensor gv[6], bwd_grads *gg)
{
    for (int i = 0; i < 3; i++) {
        wv->w[i] = rows_view(&w->w_qkv, i * E, E);
        wv->b[i] = rows_view(&w->b_qkv, i * E, E);
        gv[i] = rows_view(g->dw_qkv, i * E, E);
        gv[3 + i] = rows_view(g->db_qkv, i * E, E);
        gg->dw[i] = &gv[i];
        gg->db[i] = &gv[3 + i];
    }
    wv->w_o = w->w_o;
    wv->b_o = w->b_o;
    gg->dx = g->dx;
    gg->dw_o = g->dw_o;
    gg->db_o = g->db_o;
}

/* Checks every argument of attn_mha_backward and plans the call. */
static int mha_prepare(attn_ctx *ctx, const attn_mha_weights *w, int64_t H,
                       const attn_tensor *x, const attn_sdpa_params *p,
                       const attn_tensor *dout, const attn_mha_grads *g, bwd_plan *bp)
{
    static const char fn[] = "attn_mha_backward";
    int64_t E;
    int rc = attn_mha_weights_check(ctx, w, H, &E);
    if (rc != ATTN_OK)
        return rc;
    if (!g)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if ((rc = plan_make(ctx, fn, E, H, H, E / H, x, p, NULL, dout, bp)))
        return rc;
    const int64_t want_qkv[2] = {3 * E, E}, want_o[2] = {E, E};
    if ((rc = grad_shape(ctx, fn, g->dx, "dx", 3, x->shape)) ||
        (rc = grad_shape(ctx, fn, g->dw_qkv, "dw_qkv", 2, want_qkv)) ||
        (rc = grad_shape(ctx, fn, g->db_qkv, "db_qkv", 1, want_qkv)) ||
        (rc = grad_shape(ctx, fn, g->dw_o, "dw_o", 2, want_o)) ||
        (rc = grad_shape(ctx, fn, g->db_o, "db_o", 1, want_o)))
        return rc;
    const attn_tensor *ins[10] = {x, dout, &w->w_qkv, &w->b_qkv, &w->w_o, &w->b_o,
                                  p ? p->mask : NULL, p ? p->bias : NULL,
                                  p ? p->sinks : NULL, p ? p->alibi_slopes : NULL};
    static const char *const in_names[10] = {"x", "dout", "qkv weight", "qkv bias",
                                             "output weight", "output bias", "mask",
                                             "bias", "sinks", "alibi_slopes"};
    const attn_tensor *outs[5] = {g->dx, g->dw_qkv, g->db_qkv, g->dw_o, g->db_o};
    static const char *const out_names[5] = {"grads->dx", "grads->dw_qkv", "grads->db_qkv",
                                             "grads->dw_o", "grads->db_o"};
    return no_overlaps(ctx, fn, outs, out_names, 5, ins, in_names, 10);
}

int attn_mha_backward(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                      const attn_tensor *x, const attn_sdpa_params *p, const attn_tensor *dout,
                      const attn_mha_grads *grads)
{
    bwd_plan bp;
    int rc = mha_prepare(ctx, w, num_heads, x, p, dout, grads, &bp);
    if (rc != ATTN_OK)
        return rc;
    bwd_weights wv;
    attn_tensor gv[6];
    bwd_grads gg;
    mha_as_engine(w, grads, bp.E, &wv, gv, &gg);
    return bwd_call(ctx, &bp, &wv, x, dout, &gg);
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
    int rc = mha_prepare(ctx, w, num_heads, x, p, dout, grads, &bp);
    if (rc == ATTN_OK)
        *bytes = bp.bytes;
    return rc;
}

/* ---- grouped-query attention --------------------------------------------------- */

/* Checks every argument of attn_gqa_backward and plans the call. */
static int gqa_prepare(attn_ctx *ctx, const attn_gqa_weights *w, int64_t H, int64_t Hkv,
                       const attn_tensor *x, const attn_sdpa_params *p,
                       const attn_rope_params *rope, const attn_tensor *dout,
                       const attn_gqa_grads *g, bwd_plan *bp)
{
    static const char fn[] = "attn_gqa_backward";
    int64_t E, D;
    int rc = attn_gqa_weights_check(ctx, w, H, Hkv, &E, &D);
    if (rc != ATTN_OK)
        return rc;
    if (!g)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if ((rc = plan_make(ctx, fn, E, H, Hkv, D, x, p, rope, dout, bp)))
        return rc;
    const int64_t wq[2] = {bp->Q, E}, wkv[2] = {bp->KV, E}, wo[2] = {E, bp->Q};
    if ((rc = grad_shape(ctx, fn, g->dx, "dx", 3, x->shape)) ||
        (rc = grad_shape(ctx, fn, g->dw_q, "dw_q", 2, wq)) ||
        (rc = grad_shape(ctx, fn, g->dw_k, "dw_k", 2, wkv)) ||
        (rc = grad_shape(ctx, fn, g->dw_v, "dw_v", 2, wkv)) ||
        (rc = grad_shape(ctx, fn, g->dw_o, "dw_o", 2, wo)) ||
        (g->db_q && (rc = grad_shape(ctx, fn, g->db_q, "db_q", 1, wq))) ||
        (g->db_k && (rc = grad_shape(ctx, fn, g->db_k, "db_k", 1, wkv))) ||
        (g->db_v && (rc = grad_shape(ctx, fn, g->db_v, "db_v", 1, wkv))) ||
        (g->db_o && (rc = grad_shape(ctx, fn, g->db_o, "db_o", 1, wo))))
        return rc;
    const attn_tensor *ins[14] = {x, dout, &w->w_q, &w->w_k, &w->w_v, &w->w_o,
                                  &w->b_q, &w->b_k, &w->b_v, &w->b_o,
                                  p ? p->mask : NULL, p ? p->bias : NULL,
                                  p ? p->sinks : NULL, p ? p->alibi_slopes : NULL};
    static const char *const in_names[14] = {"x", "dout", "q weight", "k weight", "v weight",
                                             "o weight", "q bias", "k bias", "v bias",
                                             "o bias", "mask", "bias", "sinks",
                                             "alibi_slopes"};
    const attn_tensor *outs[9] = {g->dx, g->dw_q, g->dw_k, g->dw_v, g->dw_o,
                                  g->db_q, g->db_k, g->db_v, g->db_o};
    static const char *const out_names[9] = {"grads->dx", "grads->dw_q", "grads->dw_k",
                                             "grads->dw_v", "grads->dw_o", "grads->db_q",
                                             "grads->db_k", "grads->db_v", "grads->db_o"};
    return no_overlaps(ctx, fn, outs, out_names, 9, ins, in_names, 14);
}

int attn_gqa_backward(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                      int64_t num_kv_heads, const attn_tensor *x, const attn_sdpa_params *p,
                      const attn_rope_params *rope, const attn_tensor *dout,
                      const attn_gqa_grads *grads)
{
    bwd_plan bp;
    int rc = gqa_prepare(ctx, w, num_heads, num_kv_heads, x, p, rope, dout, grads, &bp);
    if (rc != ATTN_OK)
        return rc;
    const bwd_weights wv = {{w->w_q, w->w_k, w->w_v}, {w->b_q, w->b_k, w->b_v}, w->w_o, w->b_o};
    const bwd_grads gg = {grads->dx,   {grads->dw_q, grads->dw_k, grads->dw_v},
                          grads->dw_o, {grads->db_q, grads->db_k, grads->db_v},
                          grads->db_o};
    return bwd_call(ctx, &bp, &wv, x, dout, &gg);
}

int attn_gqa_backward_workspace_size(attn_ctx *ctx, const attn_gqa_weights *w,
                                     int64_t num_heads, int64_t num_kv_heads,
                                     const attn_tensor *x, const attn_sdpa_params *p,
                                     const attn_rope_params *rope, const attn_tensor *dout,
                                     const attn_gqa_grads *grads, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    bwd_plan bp;
    int rc = gqa_prepare(ctx, w, num_heads, num_kv_heads, x, p, rope, dout, grads, &bp);
    if (rc == ATTN_OK)
        *bytes = bp.bytes;
    return rc;
}
