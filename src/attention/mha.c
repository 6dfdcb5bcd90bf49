/*
 * mha.c - multi-head self-attention, the chapter's module.
 *
 *   x        [B, T, E]
 *   qkv      [B, T, 3E]     = x W_qkv^T + b_qkv          (one fused projection)
 *   q, k, v  [B, T, E] each = qkv split on the last axis, in that order
 *   q, k, v  [B, H, T, D]   = view [B, T, H, D], swap axes 1 and 2
 *   context  [B, H, T, D]   = attention(q, k, v, mask)   (weights [B, H, T, T])
 *   merged   [B, T, E]      = the inverse of the split
 *   out      [B, T, E]      = merged W_o^T + b_o
 *
 * The split and the merge copy nothing: q, k and v are strided views into the qkv
 * buffer, and the attention writes its context straight into the merged layout, the
 * way PyTorch's view + transpose describes the same memory with other strides.
 */
#include "attn_internal.h"

#include <string.h>

int attn_mha_weights_check(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                           int64_t *embed_dim)
{
    if (!w)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "weights are NULL");
    int rc;
    if ((rc = attn_tensor_check(ctx, &w->w_qkv, "qkv weight")) ||
        (rc = attn_tensor_check(ctx, &w->b_qkv, "qkv bias")) ||
        (rc = attn_tensor_check(ctx, &w->w_o, "output weight")) ||
        (rc = attn_tensor_check(ctx, &w->b_o, "output bias")))
        return rc;
    if (w->w_qkv.dtype != ATTN_DTYPE_F32 || w->b_qkv.dtype != ATTN_DTYPE_F32 ||
        w->w_o.dtype != ATTN_DTYPE_F32 || w->b_o.dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "attention weights must be float32");
    char s1[128], s2[128], s3[128], s4[128];
    const int64_t E0 = w->w_o.shape[0];
    if (E0 > INT64_MAX / 4) /* 3E and 4E below must not overflow */
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "embed_dim %lld is too large",
                          (long long)E0);
    if (w->w_o.ndim != 2 || w->w_o.shape[1] != E0 || w->w_qkv.ndim != 2 ||
        w->w_qkv.shape[1] != E0 || w->w_qkv.shape[0] != 3 * E0 || w->b_qkv.ndim != 1 ||
        w->b_qkv.shape[0] != 3 * E0 || w->b_o.ndim != 1 || w->b_o.shape[0] != E0) {
        /* Only a failing call pays for formatting the shapes. */
        attn__shape_str(&w->w_qkv, s1, sizeof s1);
        attn__shape_str(&w->b_qkv, s2, sizeof s2);
        attn__shape_str(&w->w_o, s3, sizeof s3);
        attn__shape_str(&w->b_o, s4, sizeof s4);
    }
    if (w->w_o.ndim != 2 || w->w_o.shape[0] != w->w_o.shape[1])
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "output weight has shape %s; expected [E, E]", s3);
    int64_t E = w->w_o.shape[0];
    if (w->w_qkv.ndim != 2 || w->w_qkv.shape[1] != E || w->w_qkv.shape[0] != 3 * E)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "qkv weight has shape %s; expected (%lld, %lld) for E=%lld from output weight %s",
                          s1, (long long)(3 * E), (long long)E, (long long)E, s3);
    if (w->b_qkv.ndim != 1 || w->b_qkv.shape[0] != 3 * E)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "qkv bias has shape %s; expected (%lld,)", s2, (long long)(3 * E));
    if (w->b_o.ndim != 1 || w->b_o.shape[0] != E)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "output bias has shape %s; expected (%lld,)", s4, (long long)E);
    if (num_heads < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "num_heads is %lld; it must be at least 1", (long long)num_heads);
    if (E % num_heads != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "embed_dim %lld is not divisible by num_heads %lld", (long long)E,
                          (long long)num_heads);
    if (embed_dim)
        *embed_dim = E;
    return ATTN_OK;
}

/* A [B, H, T, D] view of head-split data that lives in a [B, T, row] buffer at
 * column `col`: element (b, h, t, d) is at b*T*row + t*row + col + h*D + d. */
static void head_view(attn_tensor *t, float *base, int64_t B, int64_t T, int64_t H,
                      int64_t D, int64_t row, int64_t col)
{
    memset(t, 0, sizeof *t);
    t->data = base + col;
    t->dtype = ATTN_DTYPE_F32;
    t->ndim = 4;
    t->shape[0] = B;
    t->shape[1] = H;
    t->shape[2] = T;
    t->shape[3] = D;
    t->stride[0] = T * row;
    t->stride[1] = D;
    t->stride[2] = row;
    t->stride[3] = 1;
}

int attn_mha_forward(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                     const attn_tensor *x, const attn_sdpa_params *p, attn_tensor *out,
                     attn_tensor *weights)
{
    int64_t E;
    int rc = attn_mha_weights_check(ctx, w, num_heads, &E);
    if (rc)
        return rc;
    if ((rc = attn_tensor_check(ctx, x, "x")) || (rc = attn_tensor_check(ctx, out, "out")))
        return rc;
    if (x->dtype != ATTN_DTYPE_F32 || out->dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "x and out must be float32");
    char sx[128], so[128];
    if (x->ndim != 3 || x->shape[2] != E)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "x has shape %s; expected [B, T, %lld] (embed_dim from the weights)",
                          attn__shape_str(x, sx, sizeof sx), (long long)E);
    if (out->ndim != 3 || memcmp(out->shape, x->shape, 3 * sizeof x->shape[0]) != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "out has shape %s; expected %s",
                          attn__shape_str(out, so, sizeof so), attn__shape_str(x, sx, sizeof sx));
    const int64_t B = x->shape[0], T = x->shape[1], H = num_heads, D = E / H;

    /* Workspace: qkv [B, T, 3E] and the merged context [B, T, E], one allocation. */
    int64_t bt, n_qkv;
    size_t bytes;
    if (!attn__mul_i64(B, T, &bt) || !attn__mul_i64(bt, 4 * E, &n_qkv) ||
        !attn__bytes(n_qkv, sizeof(float), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));
    float *ws = attn__alloc(ctx, bytes, "the q/k/v and context workspace");
    if (!ws)
        return ATTN_STATUS_NO_MEMORY;
    n_qkv = bt * 3 * E;
    float *qkv_buf = ws, *ctx_buf = ws + n_qkv; /* [B, T, 3E] then [B, T, E] */

    /* qkv = x W_qkv^T + b_qkv   [B, T, 3E] */
    attn_tensor qkv, merged;
    const int64_t qkv_shape[3] = {B, T, 3 * E}, merged_shape[3] = {B, T, E};
    attn_tensor_init(ctx, &qkv, ATTN_DTYPE_F32, qkv_buf, 3, qkv_shape);
    attn_tensor_init(ctx, &merged, ATTN_DTYPE_F32, ctx_buf, 3, merged_shape);
    rc = attn_linear(ctx, x, &w->w_qkv, &w->b_qkv, &qkv);

    /* Split q, k, v (columns 0, E, 2E of each qkv row) and the heads: [B, H, T, D]
     * views of the same memory. The context view writes the merged [B, T, E]. */
    attn_tensor q, k, v, context;
    head_view(&q, qkv_buf, B, T, H, D, 3 * E, 0);
    head_view(&k, qkv_buf, B, T, H, D, 3 * E, E);
    head_view(&v, qkv_buf, B, T, H, D, 3 * E, 2 * E);
    head_view(&context, ctx_buf, B, T, H, D, E, 0);

    if (rc == ATTN_OK)
        rc = attn_sdpa(ctx, &q, &k, &v, p, &context, weights);
    /* out = merged W_o^T + b_o   [B, T, E] */
    if (rc == ATTN_OK)
        rc = attn_linear(ctx, &merged, &w->w_o, &w->b_o, out);
    attn__free(ctx, ws);
    return rc;
}
