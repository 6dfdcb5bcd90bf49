/*
 * weights.c - multi-head attention weights from a .safetensors file.
 *
 * Three name sets are understood (SPEC section 3), each under an optional prefix:
 *
 *   chapter   qkv.weight [3E, E], qkv.bias [3E], output.weight [E, E], output.bias [E]
 *   torch     in_proj_weight [3E, E], in_proj_bias [3E], out_proj.weight [E, E],
 *             out_proj.bias [E]     (nn.MultiheadAttention's state_dict)
 *   separate  q_proj / k_proj / v_proj / o_proj .weight [E, E], .bias [E] optional
 *
 * All three end up in the chapter's layout: one fused w_qkv whose rows 0..E-1 make q,
 * E..2E-1 make k and 2E..3E-1 make v (nn.MultiheadAttention's in_proj_weight has the
 * same order), and w_o. A bias the file does not have is zeros, which is what a
 * Linear without bias computes.
 *
 * attn_weights_load_gqa reads the separate set with grouped-query shapes (a
 * Llama-style block under a prefix such as "model.layers.0.self_attn."):
 *
 *   q_proj.weight [H*D, E], k_proj.weight and v_proj.weight [Hkv*D, E],
 *   o_proj.weight [E, H*D], each .bias optional
 *
 * and keeps the four projections apart (attn_gqa_weights); a missing bias stays
 * absent (data NULL).
 */
#include "io_internal.h"

#include <stdio.h>
#include <string.h>

typedef enum wset { WSET_CHAPTER, WSET_TORCH, WSET_SEPARATE, WSET_COUNT } wset;

static const char *const wset_names[WSET_COUNT] = {
    "the chapter's (qkv.weight, qkv.bias, output.weight, output.bias)",
    ("nn.MultiheadAttention's (in_proj_weight, in_proj_bias, out_proj.weight, "
     "out_proj.bias)"),
    "separate projections (q_proj.weight, k_proj.weight, v_proj.weight, o_proj.weight)",
};
/* The name whose presence selects a set. */
static const char *const wset_key[WSET_COUNT] = {"qkv.weight", "in_proj_weight",
                                                 "q_proj.weight"};

typedef struct wload {
    attn_ctx *ctx;
    const char *path;
    const char *prefix;
    attn_safetensors *st;
    char name[512];
} wload;

static const char *full(wload *L, const char *suffix)
{
    snprintf(L->name, sizeof(L->name), "%s%s", L->prefix, suffix);
    return L->name;
}

static int has(wload *L, const char *suffix)
{
    return attn_safetensors_has(L->st, full(L, suffix));
}

/* Loads prefix+suffix as float32 into a; `required` says whether a missing tensor is
 * an error (else a->buffer stays NULL). */
static int get(wload *L, const char *suffix, int required, attn_array *a)
{
    memset(a, 0, sizeof(*a));
    const char *nm = full(L, suffix);
    if (!attn_safetensors_has(L->st, nm)) {
        if (!required)
            return ATTN_OK;
        return attn__fail(L->ctx, ATTN_STATUS_FORMAT, "%s: tensor '%s' is missing", L->path,
                          nm);
    }
    int rc = attn_safetensors_get(L->ctx, L->st, nm, a);
    if (rc)
        return rc;
    if (a->tensor.dtype != ATTN_DTYPE_F32) {
        rc = attn__fail(L->ctx, ATTN_STATUS_DTYPE,
                        "%s: tensor '%s' is %s; weights must be floating point (F32, F16, "
                        "BF16 or F64)",
                        L->path, full(L, suffix),
                        a->file_dtype ? a->file_dtype : attn_dtype_name(a->tensor.dtype));
        attn_array_free(L->ctx, a);
    }
    return rc;
}

/* Checks that a has the expected 1-D or 2-D shape; the message names the tensor. */
static int want_shape(wload *L, const char *suffix, const attn_array *a, int ndim,
                      int64_t d0, int64_t d1, const char *expect)
{
    const attn_tensor *t = &a->tensor;
    if (t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1))
        return ATTN_OK;
    char got[96], want[96];
    int64_t w[2] = {d0, d1};
    attn__shape_str(t, got, sizeof(got));
    attn_shape_format(want, sizeof(want), ndim, w);
    return attn__fail(L->ctx, ATTN_STATUS_SHAPE_MISMATCH,
                      "%s: tensor '%s' has shape %s; expected %s = %s", L->path,
                      full(L, suffix), got, expect, want);
}

/* Allocates a zero-filled float32 tensor (owned by the weights struct). */
static int alloc_f32(attn_ctx *ctx, attn_tensor *t, int ndim, const int64_t *shape,
                     const char *path)
{
    attn_array a;
    int rc = attn__array_alloc(ctx, &a, ATTN_DTYPE_F32, ndim, shape, path);
    if (rc)
        return rc;
    memset(a.buffer, 0, (size_t)attn_tensor_numel(&a.tensor) * sizeof(float));
    *t = a.tensor;
    return ATTN_OK;
}

void attn_weights_free(attn_ctx *ctx, attn_mha_weights *w)
{
    if (!w)
        return;
    attn__free(ctx, w->w_qkv.data);
    attn__free(ctx, w->b_qkv.data);
    attn__free(ctx, w->w_o.data);
    attn__free(ctx, w->b_o.data);
    memset(w, 0, sizeof(*w));
}

/* Takes ownership of a's buffer as tensor t. */
static void adopt(attn_tensor *t, attn_array *a)
{
    *t = a->tensor;
    a->buffer = NULL;
    memset(&a->tensor, 0, sizeof(a->tensor));
}

/* The fused sets: chapter and torch. */
static int load_fused(wload *L, wset set, attn_mha_weights *w)
{
    const char *wq = set == WSET_CHAPTER ? "qkv.weight" : "in_proj_weight";
    const char *bq = set == WSET_CHAPTER ? "qkv.bias" : "in_proj_bias";
    const char *wo = set == WSET_CHAPTER ? "output.weight" : "out_proj.weight";
    const char *bo = set == WSET_CHAPTER ? "output.bias" : "out_proj.bias";
    /* The chapter's module always has both biases; nn.MultiheadAttention(bias=False)
     * has neither. */
    int bias_required = set == WSET_CHAPTER;
    attn_array a[4];
    memset(a, 0, sizeof(a));
    int rc;
    if ((rc = get(L, wq, 1, &a[0])))
        goto done;
    const attn_tensor *t = &a[0].tensor;
    if (t->ndim != 2 || t->shape[0] != 3 * t->shape[1]) {
        char got[96];
        rc = attn__fail(L->ctx, ATTN_STATUS_SHAPE_MISMATCH,
                        "%s: tensor '%s' has shape %s; expected (3*E, E)", L->path,
                        full(L, wq), attn__shape_str(t, got, sizeof(got)));
        goto done;
    }
    int64_t E = t->shape[1];
    if ((rc = get(L, bq, bias_required, &a[1])) || (rc = get(L, wo, 1, &a[2])) ||
        (rc = get(L, bo, bias_required, &a[3])))
        goto done;
    if ((a[1].buffer && (rc = want_shape(L, bq, &a[1], 1, 3 * E, 0, "(3*E,)"))) ||
        (rc = want_shape(L, wo, &a[2], 2, E, E, "(E, E)")) ||
        (a[3].buffer && (rc = want_shape(L, bo, &a[3], 1, E, 0, "(E,)"))))
        goto done;
    adopt(&w->w_qkv, &a[0]);
    adopt(&w->w_o, &a[2]);
    int64_t s3[1] = {3 * E}, s1[1] = {E};
    if (a[1].buffer)
        adopt(&w->b_qkv, &a[1]);
    else if ((rc = alloc_f32(L->ctx, &w->b_qkv, 1, s3, L->path)))
        goto done;
    if (a[3].buffer)
        adopt(&w->b_o, &a[3]);
    else if ((rc = alloc_f32(L->ctx, &w->b_o, 1, s1, L->path)))
        goto done;
done:
    for (int i = 0; i < 4; i++)
        attn_array_free(L->ctx, &a[i]);
    return rc;
}

static int load_separate(wload *L, attn_mha_weights *w)
{
    static const char *const wn[4] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                      "o_proj.weight"};
    static const char *const bn[4] = {"q_proj.bias", "k_proj.bias", "v_proj.bias",
                                      "o_proj.bias"};
    attn_array W[4], b[4];
    memset(W, 0, sizeof(W));
    memset(b, 0, sizeof(b));
    int rc;
    if ((rc = get(L, wn[0], 1, &W[0])))
        goto done;
    const attn_tensor *t = &W[0].tensor;
    if (t->ndim != 2 || t->shape[0] != t->shape[1]) {
        char got[96];
        rc = attn__fail(L->ctx, ATTN_STATUS_SHAPE_MISMATCH,
                        "%s: tensor '%s' has shape %s; expected (E, E)", L->path,
                        full(L, wn[0]), attn__shape_str(t, got, sizeof(got)));
        goto done;
    }
    int64_t E = t->shape[1];
    for (int i = 0; i < 4; i++) {
        if ((i > 0 && (rc = get(L, wn[i], 1, &W[i]))) ||
            (rc = want_shape(L, wn[i], &W[i], 2, E, E, "(E, E)")) ||
            (rc = get(L, bn[i], 0, &b[i])) ||
            (b[i].buffer && (rc = want_shape(L, bn[i], &b[i], 1, E, 0, "(E,)"))))
            goto done;
    }
    /* Concatenate q, k, v along the output axis: w_qkv rows [0,E) q, [E,2E) k,
     * [2E,3E) v; a missing bias stays zero. */
    int64_t s_w[2] = {3 * E, E}, s_b[1] = {3 * E}, s_o[1] = {E};
    if ((rc = alloc_f32(L->ctx, &w->w_qkv, 2, s_w, L->path)) ||
        (rc = alloc_f32(L->ctx, &w->b_qkv, 1, s_b, L->path)))
        goto done;
    size_t mat = (size_t)(E * E), vec = (size_t)E;
    for (int i = 0; i < 3; i++) {
        memcpy((float *)w->w_qkv.data + (size_t)i * mat, W[i].buffer, mat * sizeof(float));
        if (b[i].buffer)
            memcpy((float *)w->b_qkv.data + (size_t)i * vec, b[i].buffer,
                   vec * sizeof(float));
    }
    adopt(&w->w_o, &W[3]);
    if (b[3].buffer)
        adopt(&w->b_o, &b[3]);
    else
        rc = alloc_f32(L->ctx, &w->b_o, 1, s_o, L->path);
done:
    for (int i = 0; i < 4; i++) {
        attn_array_free(L->ctx, &W[i]);
        attn_array_free(L->ctx, &b[i]);
    }
    return rc;
}

/* When no set matched, look for one of the key names under another prefix, so the
 * message can suggest --prefix. */
static void suggest_prefix(wload *L, char *buf, size_t cap)
{
    buf[0] = '\0';
    int64_t n = attn_safetensors_count(L->st);
    for (int64_t i = 0; i < n; i++) {
        const char *nm = attn_safetensors_name(L->st, i);
        size_t len = strlen(nm);
        for (int s = 0; s < WSET_COUNT; s++) {
            size_t kl = strlen(wset_key[s]);
            if (len >= kl && strcmp(nm + len - kl, wset_key[s]) == 0 &&
                len - kl < 200) {
                snprintf(buf, cap, " (the file has '%s': try the prefix '%.*s')", nm,
                         (int)(len - kl), nm);
                return;
            }
        }
    }
}

int attn_weights_load(attn_ctx *ctx, const char *path, const char *prefix,
                      int64_t num_heads, attn_mha_weights *w)
{
    if (!w)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_weights_load: w is NULL");
    memset(w, 0, sizeof(*w));
    if (num_heads < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "num_heads must be at least 1 (got %lld)", (long long)num_heads);
    if (!prefix)
        prefix = "";
    if (strlen(prefix) > 300)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "the weight name prefix is longer than 300 bytes");
    wload L = {ctx, path, prefix, NULL, {0}};
    int rc = attn_safetensors_open(ctx, path, &L.st);
    if (rc)
        return rc;

    int found[WSET_COUNT], nfound = 0;
    for (int s = 0; s < WSET_COUNT; s++)
        nfound += found[s] = has(&L, wset_key[s]);
    /* Separate projections without q_proj (k_proj only, say) still count, so the
     * message below can name what is missing. */
    if (!found[WSET_SEPARATE] && (has(&L, "k_proj.weight") || has(&L, "v_proj.weight") ||
                                  has(&L, "o_proj.weight"))) {
        found[WSET_SEPARATE] = 1;
        nfound++;
    }
    if (nfound == 0) {
        char hint[300];
        suggest_prefix(&L, hint, sizeof(hint));
        rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: no attention weights under the prefix '%s': looked for "
                        "'%sqkv.weight', '%sin_proj_weight' and '%sq_proj.weight'%s",
                        path, prefix, prefix, prefix, prefix, hint);
        goto done;
    }
    if (nfound > 1) {
        int a = found[0] ? 0 : 1, b = found[2] ? 2 : 1;
        rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: ambiguous weights under the prefix '%s': the file has both %s "
                        "and %s names",
                        path, prefix, wset_names[a], wset_names[b]);
        goto done;
    }
    /* nn.MultiheadAttention(add_bias_kv=True) appends learned rows to k and v, which
     * the chapter's module does not have. */
    if (found[WSET_TORCH] && (has(&L, "bias_k") || has(&L, "bias_v"))) {
        rc = attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                        "%s: '%sbias_k'/'%sbias_v' (add_bias_kv=True) are not supported",
                        path, prefix, prefix);
        goto done;
    }
    if (found[WSET_SEPARATE])
        rc = load_separate(&L, w);
    else
        rc = load_fused(&L, found[WSET_CHAPTER] ? WSET_CHAPTER : WSET_TORCH, w);
    if (rc)
        goto done;
    int64_t E = w->w_o.shape[0];
    if (E % num_heads != 0) {
        rc = attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                        "%s: embed_dim %lld (from the weights) is not divisible by "
                        "num_heads %lld",
                        path, (long long)E, (long long)num_heads);
        goto done;
    }
    rc = attn_mha_weights_check(ctx, w, num_heads, NULL);
done:
    if (rc)
        attn_weights_free(ctx, w);
    attn_safetensors_close(ctx, L.st);
    return rc;
}

void attn_gqa_weights_free(attn_ctx *ctx, attn_gqa_weights *w)
{
    if (!w)
        return;
    attn_tensor *t[8] = {&w->w_q, &w->w_k, &w->w_v, &w->w_o,
                         &w->b_q, &w->b_k, &w->b_v, &w->b_o};
    for (int i = 0; i < 8; i++)
        attn__free(ctx, t[i]->data);
    memset(w, 0, sizeof(*w));
}

/* The separate set with grouped-query shapes into w (owned tensors). */
static int load_gqa(wload *L, int64_t H, int64_t Hkv, attn_gqa_weights *w)
{
    static const char *const wn[4] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                      "o_proj.weight"};
    static const char *const bn[4] = {"q_proj.bias", "k_proj.bias", "v_proj.bias",
                                      "o_proj.bias"};
    attn_array W[4], b[4];
    memset(W, 0, sizeof(W));
    memset(b, 0, sizeof(b));
    int rc;
    for (int i = 0; i < 4; i++)
        if ((rc = get(L, wn[i], 1, &W[i])) || (rc = get(L, bn[i], 0, &b[i])))
            goto done;
    const attn_tensor *q = &W[0].tensor;
    char got[96], expect[160];
    if (q->ndim != 2 || q->shape[0] % H != 0) {
        rc = attn__fail(L->ctx, ATTN_STATUS_SHAPE_MISMATCH,
                        "%s: tensor '%s' has shape %s; expected (H*D, E) with num_heads H = "
                        "%lld",
                        L->path, full(L, wn[0]), attn__shape_str(q, got, sizeof(got)),
                        (long long)H);
        goto done;
    }
    const int64_t Q = q->shape[0], E = q->shape[1], D = Q / H, KV = Hkv * D;
    snprintf(expect, sizeof(expect), "(Hkv*D, E) for num_kv_heads %lld, head_dim %lld",
             (long long)Hkv, (long long)D);
    if ((rc = want_shape(L, wn[1], &W[1], 2, KV, E, expect)) ||
        (rc = want_shape(L, wn[2], &W[2], 2, KV, E, expect)) ||
        (rc = want_shape(L, wn[3], &W[3], 2, E, Q, "(E, H*D)")) ||
        (b[0].buffer && (rc = want_shape(L, bn[0], &b[0], 1, Q, 0, "(H*D,)"))) ||
        (b[1].buffer && (rc = want_shape(L, bn[1], &b[1], 1, KV, 0, "(Hkv*D,)"))) ||
        (b[2].buffer && (rc = want_shape(L, bn[2], &b[2], 1, KV, 0, "(Hkv*D,)"))) ||
        (b[3].buffer && (rc = want_shape(L, bn[3], &b[3], 1, E, 0, "(E,)"))))
        goto done;
    attn_tensor *wt[4] = {&w->w_q, &w->w_k, &w->w_v, &w->w_o};
    attn_tensor *bt[4] = {&w->b_q, &w->b_k, &w->b_v, &w->b_o};
    for (int i = 0; i < 4; i++) {
        adopt(wt[i], &W[i]);
        if (b[i].buffer)
            adopt(bt[i], &b[i]);
    }
done:
    for (int i = 0; i < 4; i++) {
        attn_array_free(L->ctx, &W[i]);
        attn_array_free(L->ctx, &b[i]);
    }
    return rc;
}

int attn_weights_load_gqa(attn_ctx *ctx, const char *path, const char *prefix,
                          int64_t num_heads, int64_t num_kv_heads, attn_gqa_weights *w)
{
    if (!w)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_weights_load_gqa: w is NULL");
    memset(w, 0, sizeof(*w));
    if (num_heads < 1 || num_kv_heads < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "num_heads (%lld) and num_kv_heads (%lld) must be at least 1",
                          (long long)num_heads, (long long)num_kv_heads);
    if (num_heads % num_kv_heads != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "num_heads %lld is not a multiple of num_kv_heads %lld",
                          (long long)num_heads, (long long)num_kv_heads);
    if (!prefix)
        prefix = "";
    if (strlen(prefix) > 300)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "the weight name prefix is longer than 300 bytes");
    wload L = {ctx, path, prefix, NULL, {0}};
    int rc = attn_safetensors_open(ctx, path, &L.st);
    if (rc)
        return rc;
    if (!has(&L, "q_proj.weight") && !has(&L, "k_proj.weight") &&
        !has(&L, "v_proj.weight") && !has(&L, "o_proj.weight")) {
        if (has(&L, wset_key[WSET_CHAPTER]) || has(&L, wset_key[WSET_TORCH])) {
            rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                            "%s: the weights under the prefix '%s' are %s, a fused set with "
                            "as many key/value heads as query heads; grouped-query attention "
                            "reads separate projections (q_proj.weight, k_proj.weight, "
                            "v_proj.weight, o_proj.weight)",
                            path, prefix,
                            wset_names[has(&L, wset_key[WSET_CHAPTER]) ? WSET_CHAPTER
                                                                       : WSET_TORCH]);
        } else {
            char hint[300];
            suggest_prefix(&L, hint, sizeof(hint));
            rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                            "%s: no attention weights under the prefix '%s': looked for "
                            "'%sq_proj.weight'%s",
                            path, prefix, prefix, hint);
        }
        goto done;
    }
    if ((rc = load_gqa(&L, num_heads, num_kv_heads, w)))
        goto done;
    rc = attn_gqa_weights_check(ctx, w, num_heads, num_kv_heads, NULL, NULL);
done:
    if (rc)
        attn_gqa_weights_free(ctx, w);
    attn_safetensors_close(ctx, L.st);
    return rc;
}
