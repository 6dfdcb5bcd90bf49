/*
 * mask.c - the chapter's masks. Boolean, one byte per entry, true = may attend.
 *
 *   padding  [B, 1, 1, T]  false where the KEY is a pad token
 *   causal   [1, 1, T, T]  (i, j) true when j <= i: position t sees 0..t
 *   combined [B, 1, T, T]  padding AND causal, by numpy broadcasting
 *
 * Every mask broadcasts to the scores [B, H, Tq, Tk]: right-aligned shapes, each
 * axis equal or 1.
 */
#include "attn_internal.h"

#include <string.h>

static int check_bool_out(attn_ctx *ctx, const attn_tensor *mask, int ndim,
                          const int64_t *shape, const char *what)
{
    int rc = attn_tensor_check(ctx, mask, what);
    if (rc)
        return rc;
    if (mask->dtype != ATTN_DTYPE_BOOL)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s must be bool, not %s", what,
                          attn_dtype_name(mask->dtype));
    if (mask->ndim != ndim || memcmp(mask->shape, shape, (size_t)ndim * sizeof *shape) != 0) {
        char a[128], b[128];
        attn_shape_format(b, sizeof b, ndim, shape);
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "%s has shape %s; expected %s", what,
                          attn__shape_str(mask, a, sizeof a), b);
    }
    return ATTN_OK;
}

int attn_mask_padding(attn_ctx *ctx, const attn_tensor *token_ids, int64_t pad_id,
                      attn_tensor *mask)
{
    int rc = attn_tensor_check(ctx, token_ids, "token_ids");
    if (rc)
        return rc;
    if (token_ids->dtype != ATTN_DTYPE_I64 && token_ids->dtype != ATTN_DTYPE_I32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "token_ids must be int64 or int32, not %s",
                          attn_dtype_name(token_ids->dtype));
    if (token_ids->ndim != 2) {
        char s[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "token_ids has shape %s; expected [B, T]",
                          attn__shape_str(token_ids, s, sizeof s));
    }
    int64_t B = token_ids->shape[0], T = token_ids->shape[1];
    const int64_t want[4] = {B, 1, 1, T};
    if ((rc = check_bool_out(ctx, mask, 4, want, "padding mask")) ||
        (rc = attn__no_overlap(ctx, "attn_mask_padding", mask, "mask", token_ids, "token_ids", 0)))
        return rc;
    uint8_t *m = mask->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            int64_t off = b * token_ids->stride[0] + t * token_ids->stride[1];
            int64_t id = token_ids->dtype == ATTN_DTYPE_I64 ? ((const int64_t *)token_ids->data)[off]
                                                            : ((const int32_t *)token_ids->data)[off];
            m[b * mask->stride[0] + t * mask->stride[3]] = id != pad_id;
        }
    return ATTN_OK;
}

int attn_mask_causal(attn_ctx *ctx, int64_t T, attn_tensor *mask)
{
    if (T < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "causal mask length %lld must be at least 1", (long long)T);
    const int64_t want[4] = {1, 1, T, T};
    int rc = check_bool_out(ctx, mask, 4, want, "causal mask");
    if (rc)
        return rc;
    uint8_t *m = mask->data;
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            m[i * mask->stride[2] + j * mask->stride[3]] = j <= i;
    return ATTN_OK;
}

int attn_mask_and(attn_ctx *ctx, const attn_tensor *a, const attn_tensor *b, attn_tensor *out)
{
    int rc;
    if ((rc = attn_tensor_check(ctx, a, "mask a")) || (rc = attn_tensor_check(ctx, b, "mask b")))
        return rc;
    if (a->dtype != ATTN_DTYPE_BOOL || b->dtype != ATTN_DTYPE_BOOL)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "masks must be bool, not %s and %s",
                          attn_dtype_name(a->dtype), attn_dtype_name(b->dtype));
    int nd;
    int64_t shape[ATTN_MAX_DIMS];
    if ((rc = attn_broadcast_shape(ctx, a->ndim, a->shape, b->ndim, b->shape, &nd, shape)))
        return rc;
    if ((rc = check_bool_out(ctx, out, nd, shape, "combined mask")))
        return rc;
    /* Each entry is read before it is written, so out may be a or b itself. */
    if ((rc = attn__no_overlap(ctx, "attn_mask_and", out, "out", a, "a", 1)) ||
        (rc = attn__no_overlap(ctx, "attn_mask_and", out, "out", b, "b", 1)))
        return rc;
    int64_t sh[4], as[4], bs[4], os[4], ash[4], bsh[4];
    attn__as4d(out, sh, os);
    attn__as4d(a, ash, as);
    attn__as4d(b, bsh, bs);
    for (int i = 0; i < 4; i++) { /* a broadcast axis reads the same entry again */
        if (ash[i] == 1)
            as[i] = 0;
        if (bsh[i] == 1)
            bs[i] = 0;
    }
    const uint8_t *pa = a->data, *pb = b->data;
    uint8_t *po = out->data;
    for (int64_t i0 = 0; i0 < sh[0]; i0++)
        for (int64_t i1 = 0; i1 < sh[1]; i1++)
            for (int64_t i2 = 0; i2 < sh[2]; i2++)
                for (int64_t i3 = 0; i3 < sh[3]; i3++)
                    po[attn__off4(os, i0, i1, i2, i3)] =
                        pa[attn__off4(as, i0, i1, i2, i3)] && pb[attn__off4(bs, i0, i1, i2, i3)];
    return ATTN_OK;
}

int attn__mask4_init(attn_ctx *ctx, const attn_tensor *mask, int64_t B, int64_t H,
                     int64_t Tq, int64_t Tk, attn__mask4 *m)
{
    memset(m, 0, sizeof *m);
    if (!mask)
        return ATTN_OK;
    int rc = attn_tensor_check(ctx, mask, "mask");
    if (rc)
        return rc;
    if (mask->dtype != ATTN_DTYPE_BOOL)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "mask must be bool, not %s",
                          attn_dtype_name(mask->dtype));
    const int64_t target[4] = {B, H, Tq, Tk};
    int64_t sh[4], st[4];
    attn__as4d(mask, sh, st);
    for (int i = 0; i < 4; i++) {
        if (sh[i] == target[i] && sh[i] != 1)
            continue;
        if (sh[i] == 1) {
            st[i] = 0; /* broadcast: every index reads entry 0 of this axis */
            continue;
        }
        char a[128], b[128];
        attn_shape_format(b, sizeof b, 4, target);
        return attn__fail(ctx, ATTN_STATUS_MASK_BROADCAST,
                          "mask shape %s does not broadcast to %s",
                          attn__shape_str(mask, a, sizeof a), b);
    }
    m->data = mask->data;
    memcpy(m->stride, st, sizeof st);
    return ATTN_OK;
}

int attn_mask_check(attn_ctx *ctx, const attn_tensor *mask, int64_t B, int64_t H,
                    int64_t Tq, int64_t Tk)
{
    if (!mask)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "mask is NULL");
    if (B < 1 || H < 1 || Tq < 1 || Tk < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_mask_check: sizes B=%lld, H=%lld, Tq=%lld, Tk=%lld must be at "
                          "least 1",
                          (long long)B, (long long)H, (long long)Tq, (long long)Tk);
    attn__mask4 m;
    return attn__mask4_init(ctx, mask, B, H, Tq, Tk, &m);
}
