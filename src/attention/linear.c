/*
 * linear.c - nn.Linear: y = x W^T + b.
 *
 *   x [..., in]   W [out, in]   b [out] (optional)   y [..., out]
 *
 * The weight layout is PyTorch's, [out_features, in_features], so row o of W is the
 * vector that output feature o takes the dot product with. attn_linear runs the
 * blocked, vectorised GEMM of src/gemm*.c on the instruction set the dispatcher
 * selects (src/runtime/dispatch.c); with ATTN_ARCH=ref (or ctx->arch = ATTN_ARCH_REF) it
 * runs the plain loop below, the reference. The leading axes of x and y (up to
 * three) are walked by stride in both.
 */
#include "gemm.h"

#include <string.h>

int attn__linear_check(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W,
                       const attn_tensor *b, const attn_tensor *y)
{
    int rc;
    if ((rc = attn_tensor_check(ctx, x, "x")) || (rc = attn_tensor_check(ctx, W, "weight")) ||
        (b && (rc = attn_tensor_check(ctx, b, "bias"))) || (rc = attn_tensor_check(ctx, y, "y")))
        return rc;
    if (x->dtype != ATTN_DTYPE_F32 || W->dtype != ATTN_DTYPE_F32 || y->dtype != ATTN_DTYPE_F32 ||
        (b && b->dtype != ATTN_DTYPE_F32))
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "linear: x, weight, bias and y must be float32");
    const int64_t in = x->shape[x->ndim - 1], out = W->shape[0];
    const int w_ok = W->ndim == 2 && W->shape[1] == in;
    const int b_ok = !b || (b->ndim == 1 && b->shape[0] == out);
    int y_ok = y->ndim == x->ndim && y->shape[y->ndim - 1] == out;
    for (int i = 0; y_ok && i < x->ndim - 1; i++)
        y_ok = x->shape[i] == y->shape[i];
    if (w_ok && b_ok && y_ok)
        return ATTN_OK;
    /* Only a failing call pays for formatting the shapes. */
    char sx[128], sw[128], sb[128], sy[128];
    attn__shape_str(x, sx, sizeof sx);
    attn__shape_str(W, sw, sizeof sw);
    attn__shape_str(b, sb, sizeof sb);
    attn__shape_str(y, sy, sizeof sy);
    if (!w_ok)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "linear: weight %s does not fit x %s (expected [out, %lld])", sw, sx,
                          (long long)in);
    if (!b_ok)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "linear: bias %s does not fit weight %s (expected (%lld,))", sb, sw,
                          (long long)out);
    return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                      "linear: y %s does not fit x %s and weight %s (expected [..., %lld])", sy,
                      sx, sw, (long long)out);
}

/* The reference: one dot product per output element, in increasing k. */
static void linear_ref(const attn_tensor *x, const attn_tensor *W, const attn_tensor *b,
                       attn_tensor *y)
{
    int64_t xs[4], xst[4], ys[4], yst[4];
    attn__as4d(x, xs, xst);
    attn__as4d(y, ys, yst);
    const int64_t in = xs[3], out = ys[3];
    const float *xd = x->data, *wd = W->data, *bd = b ? b->data : NULL;
    float *yd = y->data;
    for (int64_t i0 = 0; i0 < xs[0]; i0++)
        for (int64_t i1 = 0; i1 < xs[1]; i1++)
            for (int64_t i2 = 0; i2 < xs[2]; i2++) {
                const float *xr = xd + attn__off4(xst, i0, i1, i2, 0);
                float *yr = yd + attn__off4(yst, i0, i1, i2, 0);
                for (int64_t o = 0; o < out; o++) {
                    const float *wr = wd + o * W->stride[0];
                    float acc = 0.0f;
                    for (int64_t k = 0; k < in; k++)
                        acc += xr[k * xst[3]] * wr[k * W->stride[1]];
                    yr[o * yst[3]] = acc + (bd ? bd[o * b->stride[0]] : 0.0f);
                }
            }
}

int attn_linear(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W, const attn_tensor *b,
                attn_tensor *y)
{
    int rc = attn__linear_check(ctx, x, W, b, y);
    if (rc)
        return rc;
    attn_arch arch;
    if ((rc = attn__arch_resolve(ctx, &arch)))
        return rc;
    if (arch == ATTN_ARCH_REF) {
        linear_ref(x, W, b, y);
        return ATTN_OK;
    }
    int64_t xs[4], xst[4], ys[4], yst[4];
    attn__as4d(x, xs, xst);
    attn__as4d(y, ys, yst);
    const int64_t M = xs[0] * xs[1] * xs[2]; /* checked: x's element count fits */
    size_t bytes;
    if (!attn__bytes(2 * M, sizeof(int64_t), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "linear: %lld rows overflow",
                          (long long)M);
    int64_t *rows = attn__alloc(ctx, bytes, "linear row offsets"); /* [2, M] */
    if (!rows)
        return ATTN_STATUS_NO_MEMORY;
    int64_t m = 0;
    for (int64_t i0 = 0; i0 < xs[0]; i0++)
        for (int64_t i1 = 0; i1 < xs[1]; i1++)
            for (int64_t i2 = 0; i2 < xs[2]; i2++, m++) {
                rows[m] = attn__off4(xst, i0, i1, i2, 0);
                rows[M + m] = attn__off4(yst, i0, i1, i2, 0);
            }
    attn__gemm_args g;
    g.M = M;
    g.N = ys[3];
    g.K = xs[3];
    g.x = x->data;
    g.x_row = rows;
    g.x_cs = xst[3];
    g.w = W->data;
    g.w_rs = W->stride[0];
    g.w_cs = W->stride[1];
    g.bias = b ? b->data : NULL;
    g.b_s = b ? b->stride[0] : 0;
    g.y = y->data;
    g.y_row = rows + M;
    g.y_cs = yst[3];
    rc = attn__gemm(ctx, arch, &g);
    attn__free(ctx, rows);
    return rc;
}
