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
 * The split and the merge cost no pass of their own. The projection's GEMM writes
 * its output straight in the split layout: column n of row (b, t) goes to head
 * n / D of a [B, 3H, T, D] block (src/kernels/gemm.h's column blocks), so q, k and
 * v are views of contiguous heads. The attention writes its context straight into
 * the merged layout, the way PyTorch's view + transpose describes that memory.
 *
 * A call checks its arguments once (weights, x, out, the attention's parameters),
 * plans once (the attention's kernel and scratch, the layout of one scratch block)
 * and then runs unchecked steps that allocate nothing: the projection GEMM
 * (linear.h), the attention (attn__sdpa_run), the projection again. Its scratch is
 * one block, taken as attn_ctx says (the caller's workspace, the context's kept
 * buffer, or one allocation):
 *
 *   qkv      [B, 3H, T, D] floats (3E per row of x)
 *   merged   [B, T, E] floats
 *   region   the attention's scratch; for attn_mha_forward also W_qkv, then W_o,
 *            packed for the GEMM (the three are used one after another)
 *
 * attn_mha_pack packs W_qkv and W_o once, so attn_mha_forward_packed skips the
 * packing; both run the same GEMM on the same panels and give the same bits.
 *
 * Grouped-query attention (attn_gqa_*) is the same call with other row counts:
 * q takes H*D columns of each qkv row and k and v Hkv*D each, so the block's qkv
 * is [B, H + 2*Hkv, T, D] and merged [B, T, H*D]. The k and v views have Hkv
 * heads and the attention reads key/value head h / (H / Hkv) for query head h, so
 * no repeated k or v is ever built. attn_gqa_forward packs W_q, W_k and W_v one
 * after another into the region and runs three GEMMs into their heads;
 * attn_gqa_pack packs the three as one weight of H*D + 2*Hkv*D rows. Each output
 * element of the GEMM is its own sum over k in increasing order, whichever panel
 * or call it belongs to, so the two give the same bits.
 *
 * RoPE (attn_mha_forward_packed_rope) rotates q and k in place in the qkv block,
 * between the projection and the attention, as Llama's attention block does: row t
 * of every sequence sits at position rope->offset + t for queries and keys alike
 * (Tq == Tk, so the bottom-right and top-left alignments agree). It needs no
 * scratch of its own, so the workspace is the same as without it.
 */
#include "linear.h"
#include "rope.h"
#include "heads.h"
#include "sdpa_contract.h"

#include <stdio.h>
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


/* What attn_mha_pack returns. The weights are described by the rows of their
 * projections so that other layouts can produce the same type later: separate
 * q/k/v projections with fewer k/v heads (grouped-query attention) pack into the
 * same one GEMM of q_rows + 2 * kv_rows outputs, and only kv_rows changes. */
struct attn_mha_packed {
    attn_allocator allocator; /* first: attn__packed_free reads it */
    int64_t E;                /* embed_dim: x's last axis and out's */
    int64_t q_rows, kv_rows;  /* rows of W_qkv that make q, and k (and v): E and E */
    int64_t kv_heads, head_dim; /* attn_gqa_pack's Hkv and D; 0 for attn_mha_pack,
                                   whose head count is each call's (Hkv = H) */
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
    int64_t Hkv, qr, kvr, R; /* key/value heads; q's and k's columns; qkv's row */
    attn__sdpa_plan sdpa;
    attn__gemm_rows x_rows, qkv_rows, merged_rows, out_rows;
    size_t merged_off, region_off, bytes; /* offsets into the block, and its size */
    int use_rope;                         /* whether rope below applies */
    attn_rope_params rope;
} mha_plan;

/* A [B, heads, T, D] view of the heads g0 .. g0 + heads - 1 of a qkv block
 * [B, G, T, D] (G heads of q, k and v together): each head's rows contiguous. */
static void qkv_head_view(attn_tensor *t, float *base, int64_t B, int64_t T, int64_t heads,
                          int64_t D, int64_t G, int64_t g0)
{
    memset(t, 0, sizeof *t);
    t->data = base + g0 * T * D;
    t->dtype = ATTN_DTYPE_F32;
    t->ndim = 4;
    t->shape[0] = B, t->shape[1] = heads, t->shape[2] = T, t->shape[3] = D;
    t->stride[0] = G * T * D, t->stride[1] = T * D, t->stride[2] = D, t->stride[3] = 1;
}

/* Checks x, out, weights and p for embed_dim E and num_heads H (already checked)
 * and plans the call. pack_bytes is the room the per-call packing needs in the
 * region (0 when the weights come packed). */
/* Outputs that overlap inputs. out may be x itself: x is read whole by the q/k/v
 * projection before the output projection writes out. Nothing else may overlap:
 * out, the attention weights and the log-sum-exp against x, the masks and options,
 * the weight tensors (w, NULL for packed weights, which live in the library's
 * memory) and each other. */
static int mha_aliasing(attn_ctx *ctx, const char *fn, const attn_tensor *x,
                        const attn_sdpa_params *p, const attn_tensor *const *wt,
                        const char *const *wn, int nw, const attn_tensor *out,
                        const attn_tensor *weights)
{
    const attn_tensor *ins[13] = {x, p ? p->mask : NULL, p ? p->bias : NULL,
                                  p ? p->sinks : NULL, p ? p->alibi_slopes : NULL};
    const char *in_names[13] = {"x", "mask", "bias", "sinks", "alibi_slopes"};
    int n_in = 5;
    for (int i = 0; i < nw && n_in < 13; i++)
        if (wt[i] && wt[i]->data) {
            ins[n_in] = wt[i];
            in_names[n_in++] = wn[i];
        }
    const attn_tensor *const outs[3] = {out, weights, p ? p->lse : NULL};
    static const char *const out_names[3] = {"out", "weights", "lse"};
    return attn__outputs_apart(ctx, fn, outs, out_names, ins, in_names, n_in);
}

/* The chapter's weights for mha_aliasing (NULL for packed weights). */
static int mha_aliasing_fused(attn_ctx *ctx, const attn_tensor *x, const attn_sdpa_params *p,
                              const attn_mha_weights *w, const attn_tensor *out,
                              const attn_tensor *weights)
{
    const attn_tensor *wt[4] = {w ? &w->w_qkv : NULL, w ? &w->b_qkv : NULL,
                                w ? &w->w_o : NULL, w ? &w->b_o : NULL};
    static const char *const wn[4] = {"qkv weight", "qkv bias", "output weight",
                                      "output bias"};
    return mha_aliasing(ctx, "attn_mha_forward", x, p, wt, wn, 4, out, weights);
}

static int mha_plan_make(attn_ctx *ctx, int64_t E, int64_t H, int64_t Hkv, int64_t D,
                         const attn_tensor *x, const attn_sdpa_params *p,
                         const attn_tensor *out, const attn_tensor *weights,
                         size_t pack_bytes, mha_plan *mp)
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
    const int64_t B = x->shape[0], T = x->shape[1];
    /* The weights' checks keep H*D and Hkv*D below INT64_MAX / 4, so R fits. */
    const int64_t qr = H * D, kvr = Hkv * D, R = qr + 2 * kvr;

    /* The block: qkv [B, H + 2 Hkv, T, D] (R = (H + 2 Hkv) D floats per row of x),
     * merged [B, T, qr], then the region. */
    int64_t bt, n_all;
    size_t qkv_bytes, merged_bytes, region;
    if (!attn__mul_i64(B, T, &bt) || !attn__mul_i64(bt, R + qr, &n_all) ||
        !attn__bytes(bt * R, sizeof(float), &qkv_bytes) ||
        !attn__bytes(bt * qr, sizeof(float), &merged_bytes) ||
        !(qkv_bytes = attn__align64(qkv_bytes)) || !(merged_bytes = attn__align64(merged_bytes)))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "workspace for x %s does not fit in memory",
                          attn__shape_str(x, sx, sizeof sx));

    /* The attention is checked and planned on views of where q, k, v and the
     * context will be; only their strides matter until the call runs. */
    float *base = (float *)x->data;
    attn_tensor q, k, v, context;
    qkv_head_view(&q, base, B, T, H, D, H + 2 * Hkv, 0);
    qkv_head_view(&k, base, B, T, Hkv, D, H + 2 * Hkv, H);
    qkv_head_view(&v, base, B, T, Hkv, D, H + 2 * Hkv, H + Hkv);
    attn__head_view(&context, base, B, T, H, D, qr, 0);
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
    mp->Hkv = Hkv, mp->qr = qr, mp->kvr = kvr, mp->R = R;

    int64_t sh[4], st[4];
    attn__as4d(x, sh, st);
    attn__gemm_rows_from4d(sh, st, &mp->x_rows);
    attn__as4d(out, sh, st);
    attn__gemm_rows_from4d(sh, st, &mp->out_rows);
    mp->use_rope = 0;
    /* Row (b, t) of the projection starts at b T R + t D, and its columns come in
     * blocks of D, one per head, T D apart: the GEMM writes every head's q, k and v
     * contiguous. Reading q, k and v from rows R floats apart instead ([B, T, R],
     * views with head stride D) made the attention 15-20% slower at T = 1024,
     * E = 768 (docs/performance.md), more than the GEMM's extra care costs. */
    const attn__gemm_rows qkv_rows = {{1, B, T}, {0, T * R, D}, 1, D, T * D};
    const attn__gemm_rows merged_rows = {{1, B, T}, {0, T * qr, qr}, 1, 0, 0};
    mp->qkv_rows = qkv_rows;
    mp->merged_rows = merged_rows;
    return ATTN_OK;
}

/* Where a call's weights come from: packed (qkv, o), or tensors to be packed into
 * the region just before each is used, the chapter's fused ones (w) or separate
 * projections (g). Exactly one of the three is set. */
typedef struct mha_src {
    const attn__gemm_packed *qkv, *o;
    const attn_mha_weights *w;
    const attn_gqa_weights *g;
} mha_src;

/* Packs W [n, K] (and b, NULL data for none) into the region for arch. */
static void pack_tensor(attn_ctx *ctx, attn_arch arch, const attn_tensor *W,
                        const attn_tensor *b, void *region, attn__gemm_packed *pw)
{
    attn__gemm_pack(ctx, arch, W->data, W->stride[0], W->stride[1], b->data,
                    b->data ? b->stride[0] : 0, W->shape[0], W->shape[1], region, pw);
}

/* Runs a planned call in `scratch` (mp->bytes, 64-byte aligned) with the weights
 * of src, packed for arch when they come as tensors. Allocates nothing; fails
 * only with EMPTY_ROW. */
static int mha_run(attn_ctx *ctx, const mha_plan *mp, const mha_src *src, attn_arch arch,
                   const float *x, float *out, float *weights, char *scratch)
{
    float *qkv = (float *)scratch, *merged = (float *)(scratch + mp->merged_off);
    void *region = scratch + mp->region_off;
    const attn__gemm_packed *o_w = src->o;
    attn__gemm_packed pw;

    /* q, k, v = x W^T + b   [B, H + 2 Hkv, T, D]: q in heads [0, H), k in
     * [H, H + Hkv), v after (column n of the projection is head n / D). */
    if (src->g) {
        const attn_tensor *W[3] = {&src->g->w_q, &src->g->w_k, &src->g->w_v};
        const attn_tensor *b[3] = {&src->g->b_q, &src->g->b_k, &src->g->b_v};
        const int64_t col[3] = {0, mp->qr, mp->qr + mp->kvr};
        for (int i = 0; i < 3; i++) {
            pack_tensor(ctx, arch, W[i], b[i], region, &pw);
            attn__linear_run(ctx, &pw, x, &mp->x_rows, qkv + col[i] * mp->T, &mp->qkv_rows);
        }
    } else {
        if (src->w) {
            pack_tensor(ctx, arch, &src->w->w_qkv, &src->w->b_qkv, region, &pw);
            attn__linear_run(ctx, &pw, x, &mp->x_rows, qkv, &mp->qkv_rows);
        } else {
            attn__linear_run(ctx, src->qkv, x, &mp->x_rows, qkv, &mp->qkv_rows);
        }
    }

    /* RoPE on q [B, H, T, D] and k [B, Hkv, T, D] where they lie in the qkv
     * block (head stride T D, row stride D), in place: every position's angles are
     * the same for queries and keys because Tq == Tk. */
    const int64_t q_to_k = mp->qr * mp->T, q_to_v = (mp->qr + mp->kvr) * mp->T;
    if (mp->use_rope) {
        const int64_t st[3] = {mp->T * mp->D, mp->D, 1};
        for (int64_t b = 0; b < mp->B; b++) {
            float *q0 = qkv + b * mp->T * mp->R;
            attn__rope_run(&mp->rope, mp->H, mp->T, mp->D, q0, st, q0, st, mp->rope.offset);
            attn__rope_run(&mp->rope, mp->Hkv, mp->T, mp->D, q0 + q_to_k, st, q0 + q_to_k, st,
                           mp->rope.offset);
        }
    }

    /* The plan's strides split q, k and v into heads; the context is written
     * straight into the merged [B, T, qr]. */
    int rc = attn__sdpa_run(ctx, &mp->sdpa, qkv, qkv + q_to_k, qkv + q_to_v, merged, weights,
                            region);
    if (rc != ATTN_OK)
        return rc;

    /* out = merged W_o^T + b_o   [B, T, E] */
    if (src->w || src->g) {
        const attn_tensor *Wo = src->w ? &src->w->w_o : &src->g->w_o;
        const attn_tensor *bo = src->w ? &src->w->b_o : &src->g->b_o;
        pack_tensor(ctx, arch, Wo, bo, region, &pw);
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
    rc = mha_plan_make(ctx, E, num_heads, num_heads, E / num_heads, x, p, out, weights, pack,
                       mp);
    return rc != ATTN_OK ? rc : mha_aliasing_fused(ctx, x, p, w, out, weights);
}

/* Checks a 1-D or 2-D weight tensor's shape; `why` says where the sizes come from. */
static int want_shape(attn_ctx *ctx, const attn_tensor *t, const char *name, int ndim,
                      int64_t d0, int64_t d1, const char *why)
{
    if (t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1))
        return ATTN_OK;
    char got[128], want[96];
    const int64_t sw[2] = {d0, d1};
    attn__shape_str(t, got, sizeof got);
    attn_shape_format(want, sizeof want, ndim, sw);
    return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "%s has shape %s; expected %s (%s)",
                      name, got, want, why);
}

static const char *const gqa_names[8] = {"q weight", "k weight", "v weight", "o weight",
                                         "q bias",   "k bias",   "v bias",   "o bias"};

/* The eight tensors of w in gqa_names' order. */
static void gqa_tensors(const attn_gqa_weights *w, const attn_tensor *t[8])
{
    t[0] = &w->w_q, t[1] = &w->w_k, t[2] = &w->w_v, t[3] = &w->w_o;
    t[4] = &w->b_q, t[5] = &w->b_k, t[6] = &w->b_v, t[7] = &w->b_o;
}

int attn_gqa_weights_check(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                           int64_t num_kv_heads, int64_t *embed_dim, int64_t *head_dim)
{
    if (!w)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "weights are NULL");
    const attn_tensor *t[8];
    gqa_tensors(w, t);
    int rc;
    for (int i = 0; i < 8; i++) {
        /* A bias without data is no bias; the weights are required. */
        if (i >= 4 && !t[i]->data)
            continue;
        if ((rc = attn_tensor_check(ctx, t[i], gqa_names[i])))
            return rc;
        if (t[i]->dtype != ATTN_DTYPE_F32)
            return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s is %s; attention weights must be float32",
                              gqa_names[i], attn_dtype_name(t[i]->dtype));
    }
    const int64_t H = num_heads, Hkv = num_kv_heads;
    if (H < 1 || Hkv < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "num_heads is %lld and num_kv_heads %lld; both must be at least 1",
                          (long long)H, (long long)Hkv);
    if (H % Hkv != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "num_heads %lld is not a multiple of num_kv_heads %lld",
                          (long long)H, (long long)Hkv);
    char sq[128];
    attn__shape_str(&w->w_q, sq, sizeof sq);
    if (w->w_q.ndim != 2)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "q weight has shape %s; expected [H*D, E]", sq);
    const int64_t Q = w->w_q.shape[0], E = w->w_q.shape[1];
    /* H*D + 2*Hkv*D and the workspace's sums below must not overflow. */
    if (Q > INT64_MAX / 4 || E > INT64_MAX / 4)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "q weight %s is too large", sq);
    if (Q % H != 0)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "q weight has shape %s; its %lld rows are not num_heads %lld "
                          "heads of one size",
                          sq, (long long)Q, (long long)H);
    const int64_t D = Q / H, KV = Hkv * D;
    char why[300];
    snprintf(why, sizeof why, "num_kv_heads %lld x head_dim %lld, E %lld; head_dim = %lld rows "
             "of q weight %s / num_heads %lld", (long long)Hkv, (long long)D, (long long)E,
             (long long)Q, sq, (long long)H);
    if ((rc = want_shape(ctx, &w->w_k, "k weight", 2, KV, E, why)) ||
        (rc = want_shape(ctx, &w->w_v, "v weight", 2, KV, E, why)))
        return rc;
    snprintf(why, sizeof why, "E %lld and H*D %lld from q weight %s", (long long)E,
             (long long)Q, sq);
    if ((rc = want_shape(ctx, &w->w_o, "o weight", 2, E, Q, why)) ||
        (w->b_q.data && (rc = want_shape(ctx, &w->b_q, "q bias", 1, Q, 0, "q weight's rows"))) ||
        (w->b_k.data && (rc = want_shape(ctx, &w->b_k, "k bias", 1, KV, 0, "k weight's rows"))) ||
        (w->b_v.data && (rc = want_shape(ctx, &w->b_v, "v bias", 1, KV, 0, "v weight's rows"))) ||
        (w->b_o.data && (rc = want_shape(ctx, &w->b_o, "o bias", 1, E, 0, "o weight's rows"))))
        return rc;
    if (embed_dim)
        *embed_dim = E;
    if (head_dim)
        *head_dim = D;
    return ATTN_OK;
}

/* Checks and plans attn_gqa_forward's arguments; *arch is the GEMM's. */
static int gqa_prepare(attn_ctx *ctx, const attn_gqa_weights *w, int64_t H, int64_t Hkv,
                       const attn_tensor *x, const attn_sdpa_params *p, const attn_tensor *out,
                       const attn_tensor *weights, attn_arch *arch, mha_plan *mp)
{
    int64_t E, D;
    int rc = attn_gqa_weights_check(ctx, w, H, Hkv, &E, &D);
    if (rc == ATTN_OK)
        rc = attn__arch_resolve(ctx, arch);
    if (rc != ATTN_OK)
        return rc;
    /* W_q, W_k, W_v and W_o are packed into the region one after another. */
    const size_t pq = attn__gemm_pack_bytes(*arch, H * D, E);
    const size_t pkv = attn__gemm_pack_bytes(*arch, Hkv * D, E);
    const size_t po = attn__gemm_pack_bytes(*arch, E, H * D);
    if (!pq || !pkv || !po)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "packed projections of %lld x %lld floats overflow",
                          (long long)(H * D), (long long)E);
    size_t pack = pq > po ? pq : po;
    pack = pack > pkv ? pack : pkv;
    rc = mha_plan_make(ctx, E, H, Hkv, D, x, p, out, weights, pack, mp);
    if (rc != ATTN_OK)
        return rc;
    const attn_tensor *t[8];
    gqa_tensors(w, t);
    return mha_aliasing(ctx, "attn_gqa_forward", x, p, t, gqa_names, 8, out, weights);
}

/* Checks and plans attn_mha_forward_packed's arguments. */
static int mha_prepare_packed(attn_ctx *ctx, const attn_mha_packed *pw, int64_t num_heads,
                              const attn_tensor *x, const attn_sdpa_params *p,
                              const attn_tensor *out, const attn_tensor *weights, mha_plan *mp)
{
    if (!pw)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "the packed weights are NULL");
    int rc;
    int64_t Hkv = num_heads, D;
    if (pw->kv_heads == 0) {
        rc = heads_check(ctx, pw->E, num_heads);
        D = rc == ATTN_OK ? pw->E / num_heads : 0;
    } else {
        /* attn_gqa_pack fixed the head size and the key/value heads; the query head
         * count must be the one the weights were packed with. */
        Hkv = pw->kv_heads, D = pw->head_dim;
        rc = ATTN_OK;
        if (num_heads < 1 || pw->q_rows % num_heads != 0 || pw->q_rows / num_heads != D)
            rc = attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                            "num_heads is %lld; the packed weights have %lld query rows = "
                            "%lld heads of head_dim %lld (and %lld key/value heads)",
                            (long long)num_heads, (long long)pw->q_rows,
                            (long long)(pw->q_rows / D), (long long)D, (long long)Hkv);
    }
    if (rc == ATTN_OK)
        rc = attn__packed_arch_check(ctx, pw->qkv.arch, "the attention weights");
    if (rc == ATTN_OK)
        rc = mha_plan_make(ctx, pw->E, num_heads, Hkv, D, x, p, out, weights, 0, mp);
    return rc != ATTN_OK ? rc : mha_aliasing_fused(ctx, x, p, NULL, out, weights);
}

/* Takes the block, runs, gives the block back. */
static int mha_call(attn_ctx *ctx, const mha_plan *mp, const mha_src *src, attn_arch arch,
                    const attn_tensor *x, attn_tensor *out, attn_tensor *weights)
{
    char *scratch = attn__scratch_get(ctx, mp->bytes, "the multi-head attention workspace");
    if (!scratch)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    int rc = mha_run(ctx, mp, src, arch, x->data, out->data, weights ? weights->data : NULL,
                     scratch);
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
    const mha_src src = {NULL, NULL, w, NULL};
    return mha_call(ctx, &mp, &src, arch, x, out, weights);
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

int attn_gqa_forward(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                     int64_t num_kv_heads, const attn_tensor *x, const attn_sdpa_params *p,
                     attn_tensor *out, attn_tensor *weights)
{
    attn_arch arch;
    mha_plan mp;
    int rc = gqa_prepare(ctx, w, num_heads, num_kv_heads, x, p, out, weights, &arch, &mp);
    if (rc != ATTN_OK)
        return rc;
    const mha_src src = {NULL, NULL, NULL, w};
    return mha_call(ctx, &mp, &src, arch, x, out, weights);
}

int attn_gqa_workspace_size(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                            int64_t num_kv_heads, const attn_tensor *x,
                            const attn_sdpa_params *p, const attn_tensor *out,
                            const attn_tensor *weights, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    attn_arch arch;
    mha_plan mp;
    int rc = gqa_prepare(ctx, w, num_heads, num_kv_heads, x, p, out, weights, &arch, &mp);
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
    pw->kv_heads = pw->head_dim = 0;
    attn__gemm_pack(ctx, arch, w->w_qkv.data, w->w_qkv.stride[0], w->w_qkv.stride[1],
                    w->b_qkv.data, w->b_qkv.stride[0], 3 * E, E, mem, &pw->qkv);
    attn__gemm_pack(ctx, arch, w->w_o.data, w->w_o.stride[0], w->w_o.stride[1], w->b_o.data,
                    w->b_o.stride[0], E, E, (char *)mem + qkv_bytes, &pw->o);
    *out = pw;
    return ATTN_OK;
}

int attn_gqa_pack(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                  int64_t num_kv_heads, attn_mha_packed **out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    int64_t E, D;
    attn_arch arch;
    int rc = attn_gqa_weights_check(ctx, w, num_heads, num_kv_heads, &E, &D);
    if (rc == ATTN_OK)
        rc = attn__arch_resolve(ctx, &arch);
    if (rc != ATTN_OK)
        return rc;
    const int64_t Q = num_heads * D, KV = num_kv_heads * D, R = Q + 2 * KV;
    const size_t qkv_bytes = attn__gemm_pack_bytes(arch, R, E);
    const size_t o_bytes = attn__gemm_pack_bytes(arch, E, Q);
    int64_t n_cat;
    size_t cat_bytes;
    if (!qkv_bytes || !o_bytes || qkv_bytes > SIZE_MAX - o_bytes ||
        !attn__mul_i64(R, E + 1, &n_cat) || !attn__bytes(n_cat, sizeof(float), &cat_bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "packed attention weights of %lld x %lld floats overflow",
                          (long long)R, (long long)E);
    /* The packing reads one matrix with one row stride, so W_q, W_k and W_v are
     * first copied, once, into one [R, E] matrix (and their biases into [R]). */
    float *cat = attn__alloc(ctx, cat_bytes, "the concatenated q/k/v weights");
    if (!cat)
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    float *bias = cat + R * E;
    const attn_tensor *Ws[3] = {&w->w_q, &w->w_k, &w->w_v};
    const attn_tensor *bs[3] = {&w->b_q, &w->b_k, &w->b_v};
    int64_t row = 0;
    for (int i = 0; i < 3; i++) {
        const attn_tensor *W = Ws[i], *b = bs[i];
        const float *wd = W->data, *bd = b->data;
        for (int64_t r = 0; r < W->shape[0]; r++, row++) {
            for (int64_t c = 0; c < E; c++)
                cat[row * E + c] = wd[r * W->stride[0] + c * W->stride[1]];
            /* No bias is a bias of zeros: the packed panel holds zeros either way. */
            bias[row] = bd ? bd[r * b->stride[0]] : 0.0f;
        }
    }
    void *mem;
    attn_mha_packed *pw = attn__packed_alloc(ctx, sizeof *pw, qkv_bytes + o_bytes,
                                             "the packed attention weights", &mem);
    if (!pw) {
        attn__free(ctx, cat);
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    }
    pw->E = E;
    pw->q_rows = Q;
    pw->kv_rows = KV;
    pw->kv_heads = num_kv_heads;
    pw->head_dim = D;
    attn__gemm_pack(ctx, arch, cat, E, 1, bias, 1, R, E, mem, &pw->qkv);
    attn__free(ctx, cat);
    pack_tensor(ctx, arch, &w->w_o, &w->b_o, (char *)mem + qkv_bytes, &pw->o);
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
    return attn_mha_forward_packed_rope(ctx, pw, num_heads, x, p, NULL, out, weights);
}

int attn_mha_forward_packed_rope(attn_ctx *ctx, const attn_mha_packed *pw, int64_t num_heads,
                                 const attn_tensor *x, const attn_sdpa_params *p,
                                 const attn_rope_params *rope, attn_tensor *out,
                                 attn_tensor *weights)
{
    mha_plan mp;
    int rc = mha_prepare_packed(ctx, pw, num_heads, x, p, out, weights, &mp);
    if (rc != ATTN_OK)
        return rc;
    if (rope) {
        /* The check is the one attn_rope_apply makes, so the messages agree. */
        if ((rc = attn__rope_check(ctx, rope, mp.D, 1)))
            return rc;
        if (rope->offset > INT64_MAX - (mp.T - 1)) /* the last row at offset + T - 1 */
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "RoPE offset %lld plus %lld positions overflows",
                              (long long)rope->offset, (long long)mp.T);
        mp.use_rope = 1;
        mp.rope = *rope;
    }
    const mha_src src = {&pw->qkv, &pw->o, NULL, NULL};
    return mha_call(ctx, &mp, &src, pw->qkv.arch, x, out, weights);
}
