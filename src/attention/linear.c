/*
 * linear.c - nn.Linear: y = x W^T + b.
 *
 *   x [..., in]   W [out, in]   b [out] (optional)   y [..., out]
 *
 * The weight layout is PyTorch's, [out_features, in_features], so row o of W is the
 * vector that output feature o takes the dot product with. attn_linear runs the
 * blocked, vectorised GEMM of src/kernels/gemm*.c on the instruction set the
 * dispatcher selects (src/runtime/dispatch.c); with ATTN_ARCH=ref (or ctx->arch =
 * ATTN_ARCH_REF) it runs the plain loop below, the reference. The leading axes of
 * x and y (up to three) are walked by stride in both.
 *
 * The GEMM reads W from panels (src/kernels/gemm.h). attn_linear packs W into
 * scratch on every call (attn_linear_workspace_size says how much); a caller that
 * applies one weight many times packs it once with attn_linear_pack and calls
 * attn_linear_forward_packed, which needs no scratch and allocates nothing.
 */
#include "linear.h"

#include <stdlib.h>
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
    if (w_ok && b_ok && y_ok) {
        /* Every y element is a sum over a whole row of x and a whole row of W, so
         * y may share memory with none of them (y == x gave wrong numbers). */
        if ((rc = attn__no_overlap(ctx, "attn_linear", y, "y", x, "x", 0)) ||
            (rc = attn__no_overlap(ctx, "attn_linear", y, "y", W, "weight", 0)) ||
            (b && (rc = attn__no_overlap(ctx, "attn_linear", y, "y", b, "bias", 0))))
            return rc;
        return ATTN_OK;
    }
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

/* The reference: one dot product per output element, in increasing k. W is read
 * through strides (w_rs, w_cs) and the bias at stride b_s (or not at all). */
static void linear_ref(const float *x, const attn__gemm_rows *xr, const float *w, int64_t w_rs,
                       int64_t w_cs, const float *b, int64_t b_s, int64_t N, int64_t K,
                       float *y, const attn__gemm_rows *yr)
{
    const int64_t M = xr->n[0] * xr->n[1] * xr->n[2];
    for (int64_t m = 0; m < M; m++) {
        const float *xrow = x + attn__gemm_row(xr, m);
        float *yrow = y + attn__gemm_row(yr, m);
        for (int64_t o = 0; o < N; o++) {
            const float *wr = w + o * w_rs;
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += xrow[k * xr->cs] * wr[k * w_cs];
            yrow[attn__gemm_col(yr, o)] = acc + (b ? b[o * b_s] : 0.0f);
        }
    }
}

void attn__linear_run(attn_ctx *ctx, const attn__gemm_packed *pw, const float *x,
                      const attn__gemm_rows *xr, float *y, const attn__gemm_rows *yr)
{
    if (pw->arch == ATTN_ARCH_REF) /* panels of width 1: W itself, row by row */
        linear_ref(x, xr, pw->wp, pw->K, 1, pw->bp, 1, pw->N, pw->K, y, yr);
    else
        attn__gemm_run(ctx, pw, x, xr, y, yr);
}

void *attn__packed_alloc(attn_ctx *ctx, size_t header, size_t data, const char *what,
                         void **mem)
{
    const size_t head = attn__align64(header);
    if (!head || data > SIZE_MAX - head - 64) {
        attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s of %zu bytes overflows", what, data);
        return NULL;
    }
    char *raw = attn__alloc(ctx, head + 64 + data, what);
    if (!raw)
        return NULL;
    /* The allocator that made it frees it, whatever context is at hand then. */
    attn_allocator a = {NULL, NULL, NULL};
    if (ctx)
        a = ctx->allocator;
    memcpy(raw, &a, sizeof a);
    uintptr_t start = ((uintptr_t)raw + head + 63) & ~(uintptr_t)63;
    *mem = raw + (start - (uintptr_t)raw);
    return raw;
}

void attn__packed_free(void *header)
{
    if (!header)
        return;
    attn_allocator a;
    memcpy(&a, header, sizeof a);
    if (a.free)
        a.free(a.user, header);
    else
        free(header); /* as attn__free does for a context without a free function */
}

int attn__packed_arch_check(attn_ctx *ctx, attn_arch packed, const char *what)
{
    attn_arch arch;
    int rc = attn__arch_resolve(ctx, &arch);
    if (rc != ATTN_OK || attn__arch_isa(arch) == attn__arch_isa(packed))
        return rc;
    return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                      "%s were packed for arch %s, but this call runs %s (%s); pack them "
                      "again under this call's arch",
                      what, attn_arch_name(packed), attn_arch_name(arch),
                      attn_arch_reason(ctx));
}

/* Checks y = x W^T for a weight of N outputs and K inputs that is already packed. */
static int linear_check_packed(attn_ctx *ctx, const attn_tensor *x, int64_t N, int64_t K,
                               const attn_tensor *y)
{
    int rc;
    if ((rc = attn_tensor_check(ctx, x, "x")) || (rc = attn_tensor_check(ctx, y, "y")))
        return rc;
    if (x->dtype != ATTN_DTYPE_F32 || y->dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "linear: x and y must be float32");
    int ok = x->shape[x->ndim - 1] == K && y->ndim == x->ndim && y->shape[y->ndim - 1] == N;
    for (int i = 0; ok && i < x->ndim - 1; i++)
        ok = x->shape[i] == y->shape[i];
    if (ok)
        return attn__no_overlap(ctx, "attn_linear_forward_packed", y, "y", x, "x", 0);
    char sx[128], sy[128];
    return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                      "linear: x %s and y %s do not fit the packed weight [%lld, %lld] "
                      "(expected x [..., %lld] and y [..., %lld])",
                      attn__shape_str(x, sx, sizeof sx), attn__shape_str(y, sy, sizeof sy),
                      (long long)N, (long long)K, (long long)K, (long long)N);
}

/* The rows of x and y as the GEMM walks them. */
static void linear_rows(const attn_tensor *x, const attn_tensor *y, attn__gemm_rows *xr,
                        attn__gemm_rows *yr)
{
    int64_t s[4], st[4];
    attn__as4d(x, s, st);
    attn__gemm_rows_from4d(s, st, xr);
    attn__as4d(y, s, st);
    attn__gemm_rows_from4d(s, st, yr);
}

/* The scratch attn_linear needs on arch: the packed weight (none for the
 * reference, which reads W in place). */
static int linear_scratch(attn_ctx *ctx, attn_arch arch, const attn_tensor *W, size_t *bytes)
{
    *bytes = 0;
    if (arch == ATTN_ARCH_REF)
        return ATTN_OK;
    *bytes = attn__gemm_pack_bytes(arch, W->shape[0], W->shape[1]);
    if (!*bytes)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "linear: a packed weight of %lld x %lld floats overflows",
                          (long long)W->shape[0], (long long)W->shape[1]);
    return ATTN_OK;
}

int attn_linear_workspace_size(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W,
                               const attn_tensor *b, const attn_tensor *y, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    attn_arch arch;
    int rc = attn__linear_check(ctx, x, W, b, y);
    if (rc == ATTN_OK)
        rc = attn__arch_resolve(ctx, &arch);
    if (rc == ATTN_OK)
        rc = linear_scratch(ctx, arch, W, bytes);
    return rc;
}

int attn_linear(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W, const attn_tensor *b,
                attn_tensor *y)
{
    int rc = attn__linear_check(ctx, x, W, b, y);
    attn_arch arch;
    size_t bytes;
    if (rc == ATTN_OK)
        rc = attn__arch_resolve(ctx, &arch);
    if (rc == ATTN_OK)
        rc = linear_scratch(ctx, arch, W, &bytes);
    if (rc != ATTN_OK)
        return rc;
    attn__gemm_rows xr, yr;
    linear_rows(x, y, &xr, &yr);
    if (arch == ATTN_ARCH_REF) {
        linear_ref(x->data, &xr, W->data, W->stride[0], W->stride[1], b ? b->data : NULL,
                   b ? b->stride[0] : 0, W->shape[0], W->shape[1], y->data, &yr);
        return ATTN_OK;
    }
    void *scratch = attn__scratch_get(ctx, bytes, "the packed linear weight");
    if (!scratch)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    attn__gemm_packed pw;
    attn__gemm_pack(ctx, arch, W->data, W->stride[0], W->stride[1], b ? b->data : NULL,
                    b ? b->stride[0] : 0, W->shape[0], W->shape[1], scratch, &pw);
    attn__gemm_run(ctx, &pw, x->data, &xr, y->data, &yr);
    attn__scratch_put(ctx, scratch);
    return ATTN_OK;
}

int attn_linear_pack(attn_ctx *ctx, const attn_tensor *W, const attn_tensor *b,
                     attn_linear_packed **out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    int rc;
    if ((rc = attn_tensor_check(ctx, W, "weight")) ||
        (b && (rc = attn_tensor_check(ctx, b, "bias"))))
        return rc;
    if (W->dtype != ATTN_DTYPE_F32 || (b && b->dtype != ATTN_DTYPE_F32))
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "linear: weight and bias must be float32");
    if (W->ndim != 2 || (b && (b->ndim != 1 || b->shape[0] != W->shape[0]))) {
        char sw[128], sb[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "linear: weight %s and bias %s do not fit (expected [out, in] and "
                          "(out,))",
                          attn__shape_str(W, sw, sizeof sw), attn__shape_str(b, sb, sizeof sb));
    }
    attn_arch arch;
    if ((rc = attn__arch_resolve(ctx, &arch)))
        return rc;
    const int64_t N = W->shape[0], K = W->shape[1];
    const size_t bytes = attn__gemm_pack_bytes(arch, N, K);
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "linear: a packed weight of %lld x %lld floats overflows",
                          (long long)N, (long long)K);
    void *mem;
    attn_linear_packed *p = attn__packed_alloc(ctx, sizeof *p, bytes, "the packed linear weight", &mem);
    if (!p)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    attn__gemm_pack(ctx, arch, W->data, W->stride[0], W->stride[1], b ? b->data : NULL,
                    b ? b->stride[0] : 0, N, K, mem, &p->g);
    *out = p;
    return ATTN_OK;
}

void attn_linear_packed_free(attn_ctx *ctx, attn_linear_packed *pw)
{
    (void)ctx;
    attn__packed_free(pw);
}

int attn_linear_forward_packed(attn_ctx *ctx, const attn_tensor *x, const attn_linear_packed *pw,
                               attn_tensor *y)
{
    if (!pw)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "the packed weight is NULL");
    int rc = linear_check_packed(ctx, x, pw->g.N, pw->g.K, y);
    if (rc == ATTN_OK)
        rc = attn__packed_arch_check(ctx, pw->g.arch, "the linear weight");
    if (rc != ATTN_OK)
        return rc;
    attn__gemm_rows xr, yr;
    linear_rows(x, y, &xr, &yr);
    attn__linear_run(ctx, &pw->g, x->data, &xr, y->data, &yr);
    return ATTN_OK;
}
