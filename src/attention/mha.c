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
 *
 * A call checks its arguments once (weights, x, out, the attention's parameters),
 * plans once (the attention's kernel and scratch, the layout of one scratch block)
 * and then runs unchecked steps that allocate nothing: the projection GEMM
 * (linear.h), the attention (attn__sdpa_run), the projection again. Its scratch is
 * one block, taken as attn_ctx says (the caller's workspace, the context's kept
 * buffer, or one allocation):
 *
 *   qkv      [B, T, 3E] floats
 *   merged   [B, T, E] floats
 *   region   the attention's scratch; for attn_mha_forward also W_qkv, then W_o,
 *            packed for the GEMM (the three are used one after another)
 *
 * attn_mha_pack packs W_qkv and W_o once, so attn_mha_forward_packed skips the
 * packing; both run the same GEMM on the same panels and give the same bits.
 */
#include "linear.h"
#include "sdpa_contract.h"

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


/* What attn_mha_pack returns. The weights are described by the rows of their
 * projections so that other layouts can produce the same type later: separate
 * q/k/v projections with fewer k/v heads (grouped-query attention) pack into the
 * same one GEMM of q_rows + 2 * kv_rows outputs, and only kv_rows changes. */
struct attn_mha_packed {
    attn_allocator allocator; /* first: attn__packed_free reads it */
    int64_t E;                /* embed_dim: x's last axis and out's */
    int64_t q_rows, kv_rows;  /* rows of W_qkv that make q, and k (and v): E and E */
    attn__gemm_packed qkv;    /* W_qkv [q_rows + 2 kv_rows, E] and b_qkv */
    attn__gemm_packed o;      /* W_o [E, q_rows] and b_o */
};

/* num_heads against E, with the messages attn_mha_weights_check gives. */
static int heads_check(attn_ctx *ctx, int64_t E, int64_t num_heads)
{
    if (num_heads < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "num_heads is %lld; it must be at least 1", (long long)num_heads);
    if (E % num_heads != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "embed_dim %lld is not divisible by num_heads %lld", (long long)E,
                          (long long)num_heads);
    return ATTN_OK;
}

/* One checked call: its sizes, the attention's plan, the rows the two GEMMs walk,
 * and the layout of its scratch block. */
typedef struct mha_plan {
    int64_t B, T, E, H, D;
    attn__sdpa_plan sdpa;
    attn__gemm_rows x_rows, qkv_rows, merged_rows, out_rows;
    size_t merged_off, region_off, bytes; /* offsets into the block, and its size */
} mha_plan;

/* Checks x, out, weights and p for embed_dim E and num_heads H (already checked)
 * and plans the call. pack_bytes is the room the per-call packing needs in the
 * region (0 when the weights come packed). */
/* Outputs that overlap inputs. out may be x itself: x is read whole by the q/k/v
 * projection before the output projection writes out. Nothing else may overlap:
 * out, the attention weights and the log-sum-exp against x, the masks and options,
 * the weight tensors (w, NULL for packed weights, which live in the library's
 * memory) and each other. */
static int mha_aliasing(attn_ctx *ctx, const attn_tensor *x, const attn_sdpa_params *p,
                        const attn_mha_weights *w, const attn_tensor *out,
                        const attn_tensor *weights)
{
    const attn_tensor *ins[10] = {x, p ? p->mask : NULL, p ? p->bias : NULL,
                                  p ? p->sinks : NULL, p ? p->alibi_slopes : NULL,
                                  w ? &w->w_qkv : NULL, w ? &w->b_qkv : NULL,
                                  w ? &w->w_o : NULL, w ? &w->b_o : NULL, NULL};
    static const char *const in_names[10] = {"x", "mask", "bias", "sinks", "alibi_slopes",
                                             "qkv weight", "qkv bias", "output weight",
                                             "output bias", NULL};
    const attn_tensor *outs[3] = {out, weights, p ? p->lse : NULL};
    static const char *const out_names[3] = {"out", "weights", "lse"};
    int rc;
    /* Each output against the inputs first, then the outputs against each other,
     * so that the message names an input whenever one is involved. */
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < 9 && outs[o]; i++)
            if (ins[i] && (rc = attn__no_overlap(ctx, "attn_mha_forward", outs[o], out_names[o], ins[i],
                                                 in_names[i], o == 0 && i == 0)))
                return rc;
    for (int o = 0; o < 3; o++)
        for (int o2 = o + 1; o2 < 3 && outs[o]; o2++)
            if (outs[o2] && (rc = attn__no_overlap(ctx, "attn_mha_forward", outs[o2], out_names[o2], outs[o],
                                                   out_names[o], 0)))
                return rc;
    return ATTN_OK;
}

static int mha_plan_make(attn_ctx *ctx, int64_t E, int64_t H, const attn_tensor *x,
                         const attn_sdpa_params *p, const attn_tensor *out,
                         const attn_tensor *weights, size_t pack_bytes, mha_plan *mp)
{
    int rc;
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
    const int64_t B = x->shape[0], T = x->shape[1], D = E / H;

    /* The block: qkv [B, T, 3E], merged [B, T, E], then the region. */
    int64_t bt, n_all;
    size_t qkv_bytes, merged_bytes, region;
    if (!attn__mul_i64(B, T, &bt) || !attn__mul_i64(bt, 4 * E, &n_all) ||
        !attn__bytes(bt * 3 * E, sizeof(float), &qkv_bytes) ||
        !attn__bytes(bt * E, sizeof(float), &merged_bytes) ||
        !(qkv_bytes = attn__align64(qkv_bytes)) || !(merged_bytes = attn__align64(merged_bytes)))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));

    /* The attention is checked and planned on views of where q, k, v and the
     * context will be; only their strides matter until the call runs. */
    float *base = (float *)x->data;
    attn_tensor q, k, v, context;
    head_view(&q, base, B, T, H, D, 3 * E, 0);
    head_view(&k, base, B, T, H, D, 3 * E, E);
    head_view(&v, base, B, T, H, D, 3 * E, 2 * E);
    head_view(&context, base, B, T, H, D, E, 0);
    attn__sdpa_shapes s;
    if ((rc = attn__sdpa_prepare_shapes(ctx, &q, &k, &v, p, &context, weights, &s)) ||
        (rc = attn__sdpa_plan_for_ctx(ctx, &s, &mp->sdpa)))
        return rc;

    region = attn__align64(mp->sdpa.scratch_bytes > pack_bytes ? mp->sdpa.scratch_bytes
                                                                : pack_bytes);
    if (!region || qkv_bytes > SIZE_MAX - merged_bytes ||
        region > SIZE_MAX - qkv_bytes - merged_bytes)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));
    mp->merged_off = qkv_bytes;
    mp->region_off = qkv_bytes + merged_bytes;
    mp->bytes = mp->region_off + region;
    mp->B = B, mp->T = T, mp->E = E, mp->H = H, mp->D = D;

    int64_t sh[4], st[4];
    attn__as4d(x, sh, st);
    attn__gemm_rows_from4d(sh, st, &mp->x_rows);
    attn__as4d(out, sh, st);
    attn__gemm_rows_from4d(sh, st, &mp->out_rows);
    const attn__gemm_rows qkv_rows = {{1, B, T}, {0, T * 3 * E, 3 * E}, 1};
    const attn__gemm_rows merged_rows = {{1, B, T}, {0, T * E, E}, 1};
    mp->qkv_rows = qkv_rows;
    mp->merged_rows = merged_rows;
    return ATTN_OK;
}

/* Runs a planned call in `scratch` (mp->bytes, 64-byte aligned). The projections
 * come packed (qkv_w, o_w), or as tensors in w to be packed into the region for
 * arch just before each is used. Allocates nothing; fails only with EMPTY_ROW. */
static int mha_run(attn_ctx *ctx, const mha_plan *mp, const attn__gemm_packed *qkv_w,
                   const attn__gemm_packed *o_w, const attn_mha_weights *w, attn_arch arch,
                   const float *x, float *out, float *weights, char *scratch)
{
    const int64_t E = mp->E;
    float *qkv = (float *)scratch, *merged = (float *)(scratch + mp->merged_off);
    void *region = scratch + mp->region_off;
    attn__gemm_packed pw;

    /* qkv = x W_qkv^T + b_qkv   [B, T, 3E] */
    if (w) {
        attn__gemm_pack(ctx, arch, w->w_qkv.data, w->w_qkv.stride[0], w->w_qkv.stride[1],
                        w->b_qkv.data, w->b_qkv.stride[0], 3 * E, E, region, &pw);
        qkv_w = &pw;
    }
    attn__linear_run(ctx, qkv_w, x, &mp->x_rows, qkv, &mp->qkv_rows);

    /* q, k, v are columns 0, E, 2E of each qkv row, split into heads by the plan's
     * strides; the context is written straight into the merged [B, T, E]. */
    int rc = attn__sdpa_run(ctx, &mp->sdpa, qkv, qkv + E, qkv + 2 * E, merged, weights, region);
    if (rc != ATTN_OK)
        return rc;

    /* out = merged W_o^T + b_o   [B, T, E] */
    if (w) {
        attn__gemm_pack(ctx, arch, w->w_o.data, w->w_o.stride[0], w->w_o.stride[1],
                        w->b_o.data, w->b_o.stride[0], E, E, region, &pw);
        o_w = &pw;
    }
    attn__linear_run(ctx, o_w, merged, &mp->merged_rows, out, &mp->out_rows);
    return ATTN_OK;
}

/* Checks and plans attn_mha_forward's arguments; *arch is the GEMM's. */
static int mha_prepare(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                       const attn_tensor *x, const attn_sdpa_params *p, const attn_tensor *out,
                       const attn_tensor *weights, attn_arch *arch, mha_plan *mp)
{
    int64_t E;
    int rc = attn_mha_weights_check(ctx, w, num_heads, &E);
    if (rc == ATTN_OK)
        rc = attn__arch_resolve(ctx, arch);
    if (rc != ATTN_OK)
        return rc;
    /* W_qkv is the larger of the two weights packed into the region. */
    const size_t pack = attn__gemm_pack_bytes(*arch, 3 * E, E);
    if (!pack)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "a packed qkv weight of %lld x %lld floats overflows",
                          (long long)(3 * E), (long long)E);
    rc = mha_plan_make(ctx, E, num_heads, x, p, out, weights, pack, mp);
    return rc != ATTN_OK ? rc : mha_aliasing(ctx, x, p, w, out, weights);
}

/* Checks and plans attn_mha_forward_packed's arguments. */
static int mha_prepare_packed(attn_ctx *ctx, const attn_mha_packed *pw, int64_t num_heads,
                              const attn_tensor *x, const attn_sdpa_params *p,
                              const attn_tensor *out, const attn_tensor *weights, mha_plan *mp)
{
    if (!pw)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "the packed weights are NULL");
    int rc = heads_check(ctx, pw->E, num_heads);
    if (rc == ATTN_OK)
        rc = attn__packed_arch_check(ctx, pw->qkv.arch, "the attention weights");
    if (rc == ATTN_OK)
        rc = mha_plan_make(ctx, pw->E, num_heads, x, p, out, weights, 0, mp);
    return rc != ATTN_OK ? rc : mha_aliasing(ctx, x, p, NULL, out, weights);
}

/* Takes the block, runs, gives the block back. */
static int mha_call(attn_ctx *ctx, const mha_plan *mp, const attn__gemm_packed *qkv_w,
                    const attn__gemm_packed *o_w, const attn_mha_weights *w, attn_arch arch,
                    const attn_tensor *x, attn_tensor *out, attn_tensor *weights)
{
    char *scratch = attn__scratch_get(ctx, mp->bytes, "the multi-head attention workspace");
    if (!scratch)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    int rc = mha_run(ctx, mp, qkv_w, o_w, w, arch, x->data, out->data,
                     weights ? weights->data : NULL, scratch);
    attn__scratch_put(ctx, scratch);
    return rc;
}

int attn_mha_forward(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                     const attn_tensor *x, const attn_sdpa_params *p, attn_tensor *out,
                     attn_tensor *weights)
{
    attn_arch arch;
    mha_plan mp;
    int rc = mha_prepare(ctx, w, num_heads, x, p, out, weights, &arch, &mp);
    if (rc != ATTN_OK)
        return rc;
    return mha_call(ctx, &mp, NULL, NULL, w, arch, x, out, weights);
}

int attn_mha_workspace_size(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                            const attn_tensor *x, const attn_sdpa_params *p,
                            const attn_tensor *out, const attn_tensor *weights, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    attn_arch arch;
    mha_plan mp;
    int rc = mha_prepare(ctx, w, num_heads, x, p, out, weights, &arch, &mp);
    if (rc == ATTN_OK)
        *bytes = mp.bytes;
    return rc;
}

int attn_mha_pack(attn_ctx *ctx, const attn_mha_weights *w, attn_mha_packed **out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    int64_t E;
    attn_arch arch;
    /* One head always divides E: the head count is the forward call's to check. */
    int rc = attn_mha_weights_check(ctx, w, 1, &E);
    if (rc == ATTN_OK)
        rc = attn__arch_resolve(ctx, &arch);
    if (rc != ATTN_OK)
        return rc;
    const size_t qkv_bytes = attn__gemm_pack_bytes(arch, 3 * E, E);
    const size_t o_bytes = attn__gemm_pack_bytes(arch, E, E);
    if (!qkv_bytes || !o_bytes || qkv_bytes > SIZE_MAX - o_bytes)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "packed attention weights for embed_dim %lld overflow", (long long)E);
    void *mem;
    attn_mha_packed *pw = attn__packed_alloc(ctx, sizeof *pw, qkv_bytes + o_bytes,
                                             "the packed attention weights", &mem);
    if (!pw)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    pw->E = pw->q_rows = pw->kv_rows = E;
    attn__gemm_pack(ctx, arch, w->w_qkv.data, w->w_qkv.stride[0], w->w_qkv.stride[1],
                    w->b_qkv.data, w->b_qkv.stride[0], 3 * E, E, mem, &pw->qkv);
    attn__gemm_pack(ctx, arch, w->w_o.data, w->w_o.stride[0], w->w_o.stride[1], w->b_o.data,
                    w->b_o.stride[0], E, E, (char *)mem + qkv_bytes, &pw->o);
    *out = pw;
    return ATTN_OK;
}

void attn_mha_packed_free(attn_ctx *ctx, attn_mha_packed *pw)
{
    (void)ctx;
    attn__packed_free(pw);
}

int attn_mha_packed_workspace_size(attn_ctx *ctx, const attn_mha_packed *pw, int64_t num_heads,
                                   const attn_tensor *x, const attn_sdpa_params *p,
                                   const attn_tensor *out, const attn_tensor *weights,
                                   size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    mha_plan mp;
    int rc = mha_prepare_packed(ctx, pw, num_heads, x, p, out, weights, &mp);
    if (rc == ATTN_OK)
        *bytes = mp.bytes;
    return rc;
}

int attn_mha_forward_packed(attn_ctx *ctx, const attn_mha_packed *pw, int64_t num_heads,
                            const attn_tensor *x, const attn_sdpa_params *p, attn_tensor *out,
                            attn_tensor *weights)
{
    mha_plan mp;
    int rc = mha_prepare_packed(ctx, pw, num_heads, x, p, out, weights, &mp);
    if (rc != ATTN_OK)
        return rc;
    return mha_call(ctx, &mp, &pw->qkv, &pw->o, NULL, pw->qkv.arch, x, out, weights);
}
