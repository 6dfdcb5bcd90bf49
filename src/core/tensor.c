/*
 * tensor.c - the transparent tensor: sizes, strides, views, shapes as text.
 *
 * An attn_tensor is a description, not an owner: it points at memory the caller
 * owns. Strides are in elements, so a transpose or a slice is a new description of
 * the same memory (how the chapter's `view` + `transpose(1, 2)` works in PyTorch).
 */
#include "attn_internal.h"
#include "half.h"

#include <stdio.h>
#include <string.h>

size_t attn_dtype_size(attn_dtype dtype)
{
    switch (dtype) {
    case ATTN_DTYPE_F32: return 4;
    case ATTN_DTYPE_BOOL: return 1;
    case ATTN_DTYPE_I64: return 8;
    case ATTN_DTYPE_I32: return 4;
    case ATTN_DTYPE_BF16: return 2;
    case ATTN_DTYPE_F16: return 2;
    }
    return 0;
}

const char *attn_dtype_name(attn_dtype dtype)
{
    switch (dtype) {
    case ATTN_DTYPE_F32: return "float32";
    case ATTN_DTYPE_BOOL: return "bool";
    case ATTN_DTYPE_I64: return "int64";
    case ATTN_DTYPE_I32: return "int32";
    case ATTN_DTYPE_BF16: return "bfloat16";
    case ATTN_DTYPE_F16: return "float16";
    }
    return "unknown";
}

int attn_shape_format(char *buf, size_t size, int ndim, const int64_t *shape)
{
    /* Built in a local buffer first: 4 sizes of at most 20 digits fit easily. */
    char tmp[128];
    if (!shape)
        ndim = 0; /* nothing to show: "()" */
    int n = snprintf(tmp, sizeof tmp, "(");
    for (int i = 0; i < ndim && i < ATTN_MAX_DIMS; i++)
        n += snprintf(tmp + n, sizeof tmp - (size_t)n, i ? ", %lld" : "%lld", (long long)shape[i]);
    n += snprintf(tmp + n, sizeof tmp - (size_t)n, ndim == 1 ? ",)" : ")");
    if (buf && size) {
        size_t copy = (size_t)n < size ? (size_t)n : size - 1;
        memcpy(buf, tmp, copy);
        buf[copy] = '\0';
    }
    return n;
}

const char *attn__shape_str(const attn_tensor *t, char *buf, size_t size)
{
    if (!t)
        snprintf(buf, size, "(none)");
    else
        attn_shape_format(buf, size, t->ndim, t->shape);
    return buf;
}

static int check_shape(attn_ctx *ctx, int ndim, const int64_t *shape, const char *what)
{
    if (ndim < 1 || ndim > ATTN_MAX_DIMS)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s has %d dimensions; attn takes 1 to %d", what, ndim,
                          ATTN_MAX_DIMS);
    if (!shape)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s: shape is NULL", what);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1) {
            char s[128];
            attn_shape_format(s, sizeof s, ndim, shape);
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s shape %s has size %lld on axis %d; sizes must be at least 1",
                              what, s, (long long)shape[i], i);
        }
    return ATTN_OK;
}

/* Fills contiguous strides and returns the element count through *numel. */
static int contiguous(attn_ctx *ctx, attn_tensor *t, int ndim, const int64_t *shape,
                      int64_t *numel)
{
    int64_t n = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->stride[i] = n;
        if (!attn__mul_i64(n, shape[i], &n)) {
            char s[128];
            attn_shape_format(s, sizeof s, ndim, shape);
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "shape %s has more elements than fit in 64 bits", s);
        }
    }
    for (int i = ndim; i < ATTN_MAX_DIMS; i++) {
        t->shape[i] = 1;
        t->stride[i] = 1;
    }
    t->ndim = ndim;
    *numel = n;
    return ATTN_OK;
}

int attn_tensor_init(attn_ctx *ctx, attn_tensor *t, attn_dtype dtype, void *data,
                     int ndim, const int64_t *shape)
{
    if (!t)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_tensor_init: tensor is NULL");
    if (attn_dtype_size(dtype) == 0)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "unknown dtype %d", (int)dtype);
    int rc = check_shape(ctx, ndim, shape, "tensor");
    if (rc)
        return rc;
    attn_tensor tmp;
    memset(&tmp, 0, sizeof tmp);
    int64_t n = 0;
    if ((rc = contiguous(ctx, &tmp, ndim, shape, &n)))
        return rc;
    size_t bytes;
    if (!attn__bytes(n, attn_dtype_size(dtype), &bytes)) {
        char s[128];
        attn_shape_format(s, sizeof s, ndim, shape);
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "shape %s of %s needs more bytes than fit in size_t",
                          s, attn_dtype_name(dtype));
    }
    tmp.data = data;
    tmp.dtype = dtype;
    *t = tmp;
    return ATTN_OK;
}

int attn_tensor_alloc(attn_ctx *ctx, attn_tensor *t, attn_dtype dtype, int ndim,
                      const int64_t *shape)
{
    int rc = attn_tensor_init(ctx, t, dtype, NULL, ndim, shape);
    if (rc)
        return rc;
    size_t bytes;
    attn__bytes(attn_tensor_numel(t), attn_dtype_size(dtype), &bytes); /* checked above */
    void *p = attn__alloc(ctx, bytes, "a tensor");
    if (!p)
        return attn__alloc_status(ctx);
    memset(p, 0, bytes);
    t->data = p;
    return ATTN_OK;
}

void attn_tensor_free(attn_ctx *ctx, attn_tensor *t)
{
    if (!t)
        return;
    attn__free(ctx, t->data);
    t->data = NULL;
}

int64_t attn_tensor_numel(const attn_tensor *t)
{
    if (!t || t->ndim < 1 || t->ndim > ATTN_MAX_DIMS)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || !attn__mul_i64(n, t->shape[i], &n))
            return -1;
    return n;
}

int attn_tensor_is_contiguous(const attn_tensor *t)
{
    if (!t || t->ndim < 1 || t->ndim > ATTN_MAX_DIMS)
        return 0;
    int64_t n = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != n)
            return 0;
        if (!attn__mul_i64(n, t->shape[i], &n)) /* no array has that many elements */
            return 0;
    }
    return 1;
}

int attn_tensor_check(attn_ctx *ctx, const attn_tensor *t, const char *name)
{
    if (!name)
        name = "tensor";
    if (!t)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s is NULL", name);
    int rc = check_shape(ctx, t->ndim, t->shape, name);
    if (rc)
        return rc;
    if (attn_dtype_size(t->dtype) == 0)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s has unknown dtype %d", name, (int)t->dtype);
    if (!t->data)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s has no data (NULL pointer)", name);
    /* Elements are read and written as their C types (float, int64_t, uint16_t),
     * which C requires to be aligned, and a compiler may vectorise a loop with
     * aligned loads on that promise: a view at an odd byte offset (numpy's
     * frombuffer(..., offset=1)) is refused rather than read by luck. */
    if ((uintptr_t)t->data % attn_dtype_size(t->dtype) != 0)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s: data at address %p is not aligned to its %s elements (a multiple "
                          "of %zu bytes); copy it into an aligned buffer",
                          name, t->data, attn_dtype_name(t->dtype), attn_dtype_size(t->dtype));
    /* The element count must fit too: a view that reads one element through stride 0
     * can still claim more elements than any loop over it can count. */
    if (attn_tensor_numel(t) < 0) {
        char s[128];
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: shape %s has more elements than fit in 64 bits",
                          name, attn__shape_str(t, s, sizeof s));
    }
    /* The largest element offset must fit in 64 bits, and so must its byte offset. */
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t step;
        if (t->stride[i] < 0)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s has negative stride %lld on axis %d", name,
                              (long long)t->stride[i], i);
        if (!attn__mul_i64(t->shape[i] - 1, t->stride[i], &step) || last > INT64_MAX - step)
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "%s: its strides reach past a 64-bit offset", name);
        last += step;
    }
    size_t bytes;
    if (last == INT64_MAX || !attn__bytes(last + 1, attn_dtype_size(t->dtype), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: its strides reach past size_t", name);
    return ATTN_OK;
}

int attn_tensor_transpose(attn_ctx *ctx, const attn_tensor *t, int a, int b,
                          attn_tensor *view)
{
    int rc = attn_tensor_check(ctx, t, "tensor");
    if (rc)
        return rc;
    if (!view)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_tensor_transpose: view is NULL");
    if (a < 0 || b < 0 || a >= t->ndim || b >= t->ndim)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "cannot swap axes %d and %d of a %d-dimensional tensor", a, b, t->ndim);
    attn_tensor v = *t;
    v.shape[a] = t->shape[b];
    v.shape[b] = t->shape[a];
    v.stride[a] = t->stride[b];
    v.stride[b] = t->stride[a];
    *view = v;
    return ATTN_OK;
}

int attn_tensor_reshape(attn_ctx *ctx, const attn_tensor *t, int ndim,
                        const int64_t *shape, attn_tensor *view)
{
    int rc = attn_tensor_check(ctx, t, "tensor");
    if (rc)
        return rc;
    if (!view)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_tensor_reshape: view is NULL");
    if (!attn_tensor_is_contiguous(t))
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "cannot reshape a non-contiguous tensor without a copy");
    attn_tensor v;
    if ((rc = attn_tensor_init(ctx, &v, t->dtype, t->data, ndim, shape)))
        return rc;
    if (attn_tensor_numel(&v) != attn_tensor_numel(t)) {
        char a[128], b[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "cannot reshape %s into %s",
                          attn__shape_str(t, a, sizeof a), attn__shape_str(&v, b, sizeof b));
    }
    *view = v;
    return ATTN_OK;
}

int attn_tensor_narrow(attn_ctx *ctx, const attn_tensor *t, int axis, int64_t start,
                       int64_t length, attn_tensor *view)
{
    int rc = attn_tensor_check(ctx, t, "tensor");
    if (rc)
        return rc;
    if (!view)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_tensor_narrow: view is NULL");
    if (axis < 0 || axis >= t->ndim)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "axis %d is out of range for a %d-dimensional tensor", axis, t->ndim);
    if (start < 0 || length < 1 || start > t->shape[axis] - length)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "range [%lld, %lld + %lld) is outside axis %d of size %lld",
                          (long long)start, (long long)start, (long long)length, axis,
                          (long long)t->shape[axis]);
    attn_tensor v = *t;
    v.data = (char *)t->data + (size_t)(start * t->stride[axis]) * attn_dtype_size(t->dtype);
    v.shape[axis] = length;
    *view = v;
    return ATTN_OK;
}

int attn_tensor_copy(attn_ctx *ctx, const attn_tensor *src, attn_tensor *dst)
{
    int rc;
    if ((rc = attn_tensor_check(ctx, src, "source")) || (rc = attn_tensor_check(ctx, dst, "destination")))
        return rc;
    if (src->dtype != dst->dtype)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "cannot copy %s into %s",
                          attn_dtype_name(src->dtype), attn_dtype_name(dst->dtype));
    char a[128], b[128];
    if (src->ndim != dst->ndim || memcmp(src->shape, dst->shape, sizeof src->shape) != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "cannot copy shape %s into shape %s",
                          attn__shape_str(src, a, sizeof a), attn__shape_str(dst, b, sizeof b));
    /* Copying a view onto itself changes nothing; any other overlap would read
     * elements the copy has already overwritten. */
    if (attn__same_view(src, dst))
        return ATTN_OK;
    if ((rc = attn__no_overlap(ctx, "attn_tensor_copy", dst, "destination", src, "source", 0)))
        return rc;
    int64_t sh[4], ss[4], ds[4];
    attn__as4d(src, sh, ss);
    attn__as4d(dst, sh, ds);
    size_t es = attn_dtype_size(src->dtype);
    const char *s = src->data;
    char *d = dst->data;
    for (int64_t i0 = 0; i0 < sh[0]; i0++)
        for (int64_t i1 = 0; i1 < sh[1]; i1++)
            for (int64_t i2 = 0; i2 < sh[2]; i2++)
                for (int64_t i3 = 0; i3 < sh[3]; i3++)
                    memcpy(d + (size_t)attn__off4(ds, i0, i1, i2, i3) * es,
                           s + (size_t)attn__off4(ss, i0, i1, i2, i3) * es, es);
    return ATTN_OK;
}

static int is_floating(attn_dtype dt)
{
    return dt == ATTN_DTYPE_F32 || dt == ATTN_DTYPE_BF16 || dt == ATTN_DTYPE_F16;
}

/* One element of a floating dtype, widened to float32. */
static float load_floating(const void *p, attn_dtype dt)
{
    uint16_t h;
    if (dt == ATTN_DTYPE_F32) {
        float x;
        memcpy(&x, p, sizeof x);
        return x;
    }
    memcpy(&h, p, sizeof h);
    return dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
}

static void store_floating(void *p, attn_dtype dt, float x)
{
    if (dt == ATTN_DTYPE_F32) {
        memcpy(p, &x, sizeof x);
        return;
    }
    const uint16_t h = dt == ATTN_DTYPE_BF16 ? attn__f32_to_bf16(x) : attn__f32_to_f16(x);
    memcpy(p, &h, sizeof h);
}

int attn_tensor_convert(attn_ctx *ctx, const attn_tensor *src, attn_tensor *dst)
{
    int rc;
    if ((rc = attn_tensor_check(ctx, src, "source")) || (rc = attn_tensor_check(ctx, dst, "destination")))
        return rc;
    if (!is_floating(src->dtype) || !is_floating(dst->dtype))
        return attn__fail(ctx, ATTN_STATUS_DTYPE,
                          "attn_tensor_convert converts float32, bfloat16 and float16 only, "
                          "not %s into %s",
                          attn_dtype_name(src->dtype), attn_dtype_name(dst->dtype));
    if (src->dtype == dst->dtype)
        return attn_tensor_copy(ctx, src, dst);
    char a[128], b[128];
    if (src->ndim != dst->ndim || memcmp(src->shape, dst->shape, sizeof src->shape) != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "cannot convert shape %s into shape %s",
                          attn__shape_str(src, a, sizeof a), attn__shape_str(dst, b, sizeof b));
    /* Elements of different sizes: any shared byte would be overwritten before it
     * is read, or read after, depending on the order, so no overlap is allowed. */
    if ((rc = attn__no_overlap(ctx, "attn_tensor_convert", dst, "destination", src, "source", 0)))
        return rc;
    int64_t sh[4], ss[4], ds[4];
    attn__as4d(src, sh, ss);
    attn__as4d(dst, sh, ds);
    const size_t se = attn_dtype_size(src->dtype), de = attn_dtype_size(dst->dtype);
    const char *s = src->data;
    char *d = dst->data;
    for (int64_t i0 = 0; i0 < sh[0]; i0++)
        for (int64_t i1 = 0; i1 < sh[1]; i1++)
            for (int64_t i2 = 0; i2 < sh[2]; i2++)
                for (int64_t i3 = 0; i3 < sh[3]; i3++)
                    store_floating(d + (size_t)attn__off4(ds, i0, i1, i2, i3) * de, dst->dtype,
                                   load_floating(s + (size_t)attn__off4(ss, i0, i1, i2, i3) * se,
                                                 src->dtype));
    return ATTN_OK;
}

void attn__as4d(const attn_tensor *t, int64_t shape[4], int64_t stride[4])
{
    int pad = ATTN_MAX_DIMS - t->ndim;
    for (int i = 0; i < ATTN_MAX_DIMS; i++) {
        if (i < pad) {
            shape[i] = 1;
            stride[i] = 0;
        } else {
            shape[i] = t->shape[i - pad];
            stride[i] = t->stride[i - pad];
        }
    }
}

int attn_broadcast_shape(attn_ctx *ctx, int ndim_a, const int64_t *shape_a, int ndim_b,
                         const int64_t *shape_b, int *out_ndim, int64_t *out_shape)
{
    if (!shape_a || !shape_b || !out_ndim || !out_shape || ndim_a < 1 || ndim_b < 1 ||
        ndim_a > ATTN_MAX_DIMS || ndim_b > ATTN_MAX_DIMS)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_broadcast_shape: bad arguments (ndim %d and %d)", ndim_a, ndim_b);
    for (int i = 0; i < ndim_a + ndim_b; i++) {
        int64_t v = i < ndim_a ? shape_a[i] : shape_b[i - ndim_a];
        if (v < 1) {
            char sa[128], sb[128];
            attn_shape_format(sa, sizeof sa, ndim_a, shape_a);
            attn_shape_format(sb, sizeof sb, ndim_b, shape_b);
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "attn_broadcast_shape: shapes %s and %s have a size below 1", sa, sb);
        }
    }
    int n = ndim_a > ndim_b ? ndim_a : ndim_b;
    int64_t res[ATTN_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        int ia = ndim_a - n + i, ib = ndim_b - n + i;
        int64_t a = ia >= 0 ? shape_a[ia] : 1, b = ib >= 0 ? shape_b[ib] : 1;
        if (a != b && a != 1 && b != 1) {
            char sa[128], sb[128];
            attn_shape_format(sa, sizeof sa, ndim_a, shape_a);
            attn_shape_format(sb, sizeof sb, ndim_b, shape_b);
            return attn__fail(ctx, ATTN_STATUS_MASK_BROADCAST,
                              "shapes %s and %s do not broadcast (axis %d: %lld vs %lld)", sa,
                              sb, i, (long long)a, (long long)b);
        }
        res[i] = a == 1 ? b : a;
    }
    *out_ndim = n;
    memcpy(out_shape, res, (size_t)n * sizeof *res);
    return ATTN_OK;
}
