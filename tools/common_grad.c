/*
 * common_grad.c - see common_grad.h. The loss is L = mean(output), so every
 * element of dL/doutput is 1 / (B T E). From there the gradient flows back through
 * the module's steps in reverse (docs/gradients.md, "Multi-head attention"):
 *
 *   output = merged W_o^T + b_o   ->  dmerged = doutput W_o, dW_o, db_o
 *   context = attention(q, k, v)  ->  dq, dk, dv  (attn_sdpa_backward)
 *   q, k, v = split(qkv)          ->  dqkv = the three side by side
 *   qkv = x W_qkv^T + b_qkv       ->  dx, dW_qkv, db_qkv
 *
 * The steps' own gradients (dmerged, dq, dk, dv) are computed here from the public
 * calls so that a learner can see each one; dx and the weights' gradients come
 * from attn_mha_backward, the one call a training loop would make.
 */
#include "common_grad.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A [B, H, T, D] view of head-split data in a [B, T, row] buffer at column col. */
static attn_tensor heads(float *base, int64_t B, int64_t T, int64_t H, int64_t D,
                         int64_t row, int64_t col)
{
    attn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = base + col;
    t.dtype = ATTN_DTYPE_F32;
    t.ndim = 4;
    t.shape[0] = B, t.shape[1] = H, t.shape[2] = T, t.shape[3] = D;
    t.stride[0] = T * row, t.stride[1] = D, t.stride[2] = row, t.stride[3] = 1;
    return t;
}

/* One line: the tensor's name, shape, norm and first four elements (C order). */
static void line(FILE *f, const char *name, const attn_tensor *t)
{
    char s[128];
    attn_shape_format(s, sizeof s, t->ndim, t->shape);
    const int64_t n = attn_tensor_numel(t);
    int64_t idx[ATTN_MAX_DIMS] = {0};
    double sum = 0.0;
    float first[4];
    for (int64_t e = 0; e < n; e++) {
        int64_t off = 0;
        for (int k = 0; k < t->ndim; k++)
            off += idx[k] * t->stride[k];
        const float v = ((const float *)t->data)[off];
        sum += (double)v * v;
        if (e < 4)
            first[e] = v;
        for (int k = t->ndim - 1; k >= 0 && ++idx[k] == t->shape[k]; k--)
            idx[k] = 0;
    }
    fprintf(f, "grad %-8s %-16s norm=%.6e first=[", name, s, sqrt(sum));
    for (int64_t e = 0; e < n && e < 4; e++)
        fprintf(f, e ? ", %.6e" : "%.6e", (double)first[e]);
    fprintf(f, "]\n");
}

int grad_report(attn_ctx *ctx, FILE *f, const attn_tensor *x, const attn_mha_weights *w,
                int64_t H, const attn_tensor *mask)
{
    const int64_t B = x->shape[0], T = x->shape[1], E = x->shape[2], D = E / H, R = 3 * E;
    const int64_t s3[3] = {B, T, E}, sq[3] = {B, T, R}, sl[3] = {B, H, T};
    attn_tensor out = {0}, qkv = {0}, merged = {0}, lse = {0}, dy = {0}, dm = {0}, dqkv = {0},
                dx = {0}, dw[4] = {{0}};
    const attn_tensor *ws[4] = {&w->w_qkv, &w->b_qkv, &w->w_o, &w->b_o};
    int rc;
    if ((rc = attn_tensor_alloc(ctx, &out, ATTN_DTYPE_F32, 3, s3)) ||
        (rc = attn_tensor_alloc(ctx, &qkv, ATTN_DTYPE_F32, 3, sq)) ||
        (rc = attn_tensor_alloc(ctx, &merged, ATTN_DTYPE_F32, 3, s3)) ||
        (rc = attn_tensor_alloc(ctx, &lse, ATTN_DTYPE_F32, 3, sl)) ||
        (rc = attn_tensor_alloc(ctx, &dy, ATTN_DTYPE_F32, 3, s3)) ||
        (rc = attn_tensor_alloc(ctx, &dm, ATTN_DTYPE_F32, 3, s3)) ||
        (rc = attn_tensor_alloc(ctx, &dqkv, ATTN_DTYPE_F32, 3, sq)) ||
        (rc = attn_tensor_alloc(ctx, &dx, ATTN_DTYPE_F32, 3, s3)))
        goto done;
    for (int i = 0; i < 4; i++)
        if ((rc = attn_tensor_alloc(ctx, &dw[i], ATTN_DTYPE_F32, ws[i]->ndim, ws[i]->shape)))
            goto done;

    /* The forward, step by step, keeping the log-sum-exp for the backward. */
    attn_tensor q = heads(qkv.data, B, T, H, D, R, 0), k = heads(qkv.data, B, T, H, D, R, E),
                v = heads(qkv.data, B, T, H, D, R, 2 * E), c = heads(merged.data, B, T, H, D, E, 0);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = mask;
    p.lse = &lse;
    if ((rc = attn_linear(ctx, x, &w->w_qkv, &w->b_qkv, &qkv)) ||
        (rc = attn_sdpa(ctx, &q, &k, &v, &p, &c, NULL)) ||
        (rc = attn_linear(ctx, &merged, &w->w_o, &w->b_o, &out)))
        goto done;
    const int64_t n = B * T * E;
    double loss = 0.0;
    float *y = out.data, *g = dy.data;
    for (int64_t i = 0; i < n; i++) {
        loss += y[i];
        g[i] = (float)(1.0 / (double)n);
    }
    loss /= (double)n;

    /* dmerged = doutput W_o: row bt of dmerged is sum_i doutput[bt, i] W_o[i, :]. */
    const float *wo = w->w_o.data;
    float *dmv = dm.data;
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t j = 0; j < E; j++) {
            double acc = 0.0;
            for (int64_t i = 0; i < E; i++)
                acc += (double)g[bt * E + i] * wo[i * E + j];
            dmv[bt * E + j] = (float)acc;
        }
    attn_tensor dq = heads(dqkv.data, B, T, H, D, R, 0), dk = heads(dqkv.data, B, T, H, D, R, E),
                dv = heads(dqkv.data, B, T, H, D, R, 2 * E),
                dc = heads(dm.data, B, T, H, D, E, 0);
    const attn_sdpa_grads sg = {&dq, &dk, &dv, NULL, NULL};
    p.lse = NULL; /* the forward's output; the backward takes it as `lse` */
    const attn_mha_grads mg = {&dx, &dw[0], &dw[1], &dw[2], &dw[3]};
    if ((rc = attn_sdpa_backward(ctx, &q, &k, &v, &p, &c, &lse, &dc, &sg)) ||
        (rc = attn_mha_backward(ctx, w, H, x, &p, &dy, &mg)))
        goto done;

    fprintf(f, "== gradients of loss = mean(output) = %.6e, from the output back to the input\n",
            loss);
    line(f, "output", &dy);
    line(f, "W_o", &dw[2]);
    line(f, "b_o", &dw[3]);
    line(f, "context", &dm);
    line(f, "v", &dv);
    line(f, "k", &dk);
    line(f, "q", &dq);
    line(f, "qkv", &dqkv);
    line(f, "W_qkv", &dw[0]);
    line(f, "b_qkv", &dw[1]);
    line(f, "x", &dx);

done:
    attn_tensor_free(ctx, &out);
    attn_tensor_free(ctx, &qkv);
    attn_tensor_free(ctx, &merged);
    attn_tensor_free(ctx, &lse);
    attn_tensor_free(ctx, &dy);
    attn_tensor_free(ctx, &dm);
    attn_tensor_free(ctx, &dqkv);
    attn_tensor_free(ctx, &dx);
    for (int i = 0; i < 4; i++)
        attn_tensor_free(ctx, &dw[i]);
    return rc;
}
