/*
 * overlap.c - do two tensors share memory? The answer every output check needs.
 *
 * A tensor is a set of bytes: its elements, each attn_dtype_size bytes long, at
 * data + (sum_k i_k * stride_k) * size. Two tensors overlap when those sets share a
 * byte. Most calls answer at once: the byte ranges [first, last] of the two tensors
 * do not meet (separate buffers), or the two are the very same view. What is left
 * are views into one buffer whose ranges meet but whose elements may interleave (q
 * and k as column blocks of one qkv row), and there the answer is exact: the
 * elements of one tensor are walked and each is looked up in the other.
 *
 * The look-up is exact for a "nested" layout: drop the axes that add no bytes
 * (size 1, or stride 0, which repeats the same bytes), sort the others by stride,
 * and require each stride to be larger than the span of all smaller ones plus one
 * element - as for any C- or Fortran-ordered array and any slice or transpose of
 * one. Then a byte offset has at most one index tuple, found greedily from the
 * largest stride down. A tensor that is not nested (a view that overlaps itself) is
 * taken to overlap anything its range meets: the checks stay safe, never silent.
 */
#include "attn_internal.h"

#include <string.h>

typedef struct byte_layout {
    const unsigned char *base;
    int64_t esize;         /* bytes per element */
    int n;                 /* axes that add bytes */
    int64_t size[ATTN_MAX_DIMS];
    int64_t stride[ATTN_MAX_DIMS]; /* in bytes, decreasing */
    int64_t count;         /* elements, counting each byte set once */
    int nested;
} byte_layout;

static void layout_of(const attn_tensor *t, byte_layout *L)
{
    memset(L, 0, sizeof *L);
    L->base = (const unsigned char *)t->data;
    L->esize = (int64_t)attn_dtype_size(t->dtype);
    L->count = 1;
    for (int k = 0; k < t->ndim; k++) {
        if (t->shape[k] == 1 || t->stride[k] == 0)
            continue;
        /* Insertion by decreasing stride. */
        int at = L->n++;
        while (at > 0 && L->stride[at - 1] < t->stride[k] * L->esize) {
            L->size[at] = L->size[at - 1];
            L->stride[at] = L->stride[at - 1];
            at--;
        }
        L->size[at] = t->shape[k];
        L->stride[at] = t->stride[k] * L->esize;
        L->count *= t->shape[k];
    }
    /* Nested: each stride exceeds the last byte the smaller axes reach. */
    int64_t reach = L->esize; /* bytes spanned by the axes after k, plus one element */
    L->nested = 1;
    for (int k = L->n - 1; k >= 0; k--) {
        if (L->stride[k] < reach)
            L->nested = 0;
        reach += L->stride[k] * (L->size[k] - 1);
    }
}

/* Bytes from the first element's first byte to the last element's last byte. */
static int64_t span_of(const byte_layout *L)
{
    int64_t span = L->esize;
    for (int k = 0; k < L->n; k++)
        span += L->stride[k] * (L->size[k] - 1);
    return span;
}

/* 1 when byte `off` (relative to L's base) is inside one of L's elements; L nested. */
static int holds_byte(const byte_layout *L, int64_t off)
{
    if (off < 0)
        return 0;
    for (int k = 0; k < L->n; k++) {
        int64_t i = off / L->stride[k];
        if (i >= L->size[k])
            return 0;
        off -= i * L->stride[k];
    }
    return off < L->esize;
}

/* 1 when some byte of an element of `walk` lies in an element of `look` (nested). */
static int walk_overlaps(const byte_layout *walk, const byte_layout *look)
{
    const int64_t delta = (int64_t)(walk->base - look->base);
    int64_t idx[ATTN_MAX_DIMS] = {0};
    for (int64_t e = 0; e < walk->count; e++) {
        int64_t off = delta;
        for (int k = 0; k < walk->n; k++)
            off += idx[k] * walk->stride[k];
        for (int64_t byte = 0; byte < walk->esize; byte++)
            if (holds_byte(look, off + byte))
                return 1;
        for (int k = walk->n - 1; k >= 0; k--) {
            if (++idx[k] < walk->size[k])
                break;
            idx[k] = 0;
        }
    }
    return 0;
}

int attn__overlap(const attn_tensor *a, const attn_tensor *b)
{
    if (!a || !b || !a->data || !b->data)
        return 0;
    byte_layout A, B;
    layout_of(a, &A);
    layout_of(b, &B);
    const unsigned char *a_end = A.base + span_of(&A), *b_end = B.base + span_of(&B);
    if (a_end <= B.base || b_end <= A.base)
        return 0;
    /* Walk the smaller tensor through the nested one. */
    if (B.nested && (!A.nested || A.count <= B.count))
        return walk_overlaps(&A, &B);
    if (A.nested)
        return walk_overlaps(&B, &A);
    return 1;
}

int attn__same_view(const attn_tensor *a, const attn_tensor *b)
{
    if (!a || !b || a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim)
        return 0;
    for (int k = 0; k < a->ndim; k++)
        if (a->shape[k] != b->shape[k] || (a->shape[k] > 1 && a->stride[k] != b->stride[k]))
            return 0;
    return 1;
}

int attn__no_overlap(attn_ctx *ctx, const char *fn, const attn_tensor *out,
                     const char *out_name, const attn_tensor *in, const char *in_name,
                     int same_view_ok)
{
    /* An output that overlaps itself would have two results written to one place:
     * which one stays depends on the order, and with several threads on the
     * schedule. Every output meets this function, so it is refused here: stride 0
     * on an axis longer than 1 repeats memory for certain; axes whose strides
     * interleave (not the layout of any slice or transpose of an array) may, and
     * telling exactly would mean walking every element, so they are refused too. */
    if (out && out->data) {
        byte_layout L;
        layout_of(out, &L);
        int zero_axis = -1;
        for (int k = 0; k < out->ndim && zero_axis < 0; k++)
            if (out->shape[k] > 1 && out->stride[k] == 0)
                zero_axis = k;
        if (zero_axis >= 0 || !L.nested) {
            char s[128], st[128];
            attn_shape_format(s, sizeof s, out->ndim, out->shape);
            attn_shape_format(st, sizeof st, out->ndim, out->stride);
            if (zero_axis >= 0)
                return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                                  "%s: %s (shape %s, strides %s) overlaps itself: stride 0 on "
                                  "axis %d writes its %lld entries to the same memory; an "
                                  "output needs its own memory for every element",
                                  fn, out_name, s, st, zero_axis,
                                  (long long)out->shape[zero_axis]);
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s: %s (shape %s, strides %s) may overlap itself: its axes' "
                              "strides interleave, as no slice or transpose of an array's do; "
                              "an output needs its own memory for every element",
                              fn, out_name, s, st);
        }
    }
    if (!attn__overlap(out, in))
        return ATTN_OK;
    if (same_view_ok && attn__same_view(out, in))
        return ATTN_OK;
    return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                      same_view_ok
                          ? "%s: %s and %s share memory (%s may be %s itself, the same view, "
                            "but not overlap it otherwise)"
                          : "%s: %s and %s share memory (%s must not overlap %s)",
                      fn, out_name, in_name, out_name, in_name);
}

int attn__outputs_apart(attn_ctx *ctx, const char *fn, const attn_tensor *const outs[3],
                        const char *const out_names[3], const attn_tensor *const *ins,
                        const char *const *in_names, int n_in)
{
    int rc;
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < n_in && outs[o]; i++)
            if (ins[i] && (rc = attn__no_overlap(ctx, fn, outs[o], out_names[o], ins[i],
                                                 in_names[i], o == 0 && i == 0)))
                return rc;
    for (int o = 0; o < 3; o++)
        for (int o2 = o + 1; o2 < 3 && outs[o]; o2++)
            if (outs[o2] && (rc = attn__no_overlap(ctx, fn, outs[o2], out_names[o2], outs[o],
                                                   out_names[o], 0)))
                return rc;
    return ATTN_OK;
}
