/*
 * sdpa_contract.h - the contract of scaled dot-product attention, in one room:
 * the parameters, the argument check every kernel shares, the shared error
 * messages, and the plan (kernel, threads, scratch) that a checked call runs with.
 *
 * A public entry point checks once (attn__sdpa_prepare), plans once
 * (attn__sdpa_plan), takes its scratch once (attn__scratch_get, src/core) and then
 * runs the unchecked kernel (attn__sdpa_run). Callers inside the library that have
 * already checked their tensors (multi-head attention) call the last two steps
 * directly. Internal; names start with attn__.
 *
 * The backward (SPEC section 8) has the same shape: attn__sdpa_backward_prepare
 * checks once (the forward's q, k, v and options through attn__sdpa_prepare_shapes,
 * then out, lse, dout and the gradients), attn__sdpa_backward_plan_make plans once,
 * and the unchecked kernel runs on the caller's scratch (sdpa_backward.c).
 */
#ifndef ATTN_SDPA_CONTRACT_H
#define ATTN_SDPA_CONTRACT_H

#include "attn_internal.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Sizes, strides and options of one checked attn_sdpa call. */
typedef struct attn__sdpa_shapes {
    attn_dtype dtype;     /* of q, k, v and out: F32, BF16 or F16 (one for all four,
                             except as q_f32 and out_f32 say) */
    int q_f32, out_f32;   /* 1: q (out) is float32 while k and v are 16-bit: the KV
                             cache's call (attn__sdpa_prepare_cache); 0 otherwise */
    int64_t B, H, Tq, Tk, D, Dv;
    int64_t Hkv;          /* key/value heads; H is a multiple */
    int64_t group;        /* H / Hkv: query head h reads key/value head h / group */
    int64_t q_s[4], k_s[4], v_s[4], o_s[4], w_s[4]; /* 4-D strides, in elements */
    attn__mask4 mask;
    int causal;           /* an attn_causal value */
    int64_t offset;       /* Tk - Tq: query i sits at key position i + offset */
    int has_window;
    int64_t window_left, window_right; /* -1 = unbounded */
    float scale;
    float softcap;        /* 0 = off */
    int alibi;            /* 1: ALiBi on (attn__alibi_slope gives head h's slope) */
    const float *alibi_slopes; /* the caller's [H] at stride alibi_s, or NULL for the
                                  paper's default slopes */
    int64_t alibi_s;
    const float *bias;    /* NULL = none; else [B, H, Tq, Tk] through bias_s */
    int64_t bias_s[4];    /* broadcast axes have stride 0 */
    const float *sinks;   /* NULL = none; else [H] at stride sinks_s */
    int64_t sinks_s;
    float *lse;           /* NULL = not wanted; else [B, H, Tq] through lse_s */
    int64_t lse_s[3];
    attn_empty_rows empty_rows;
    int weights;          /* 1: the caller asked for the weights (the fused kernel's
                             split-key path cannot write them, so it is not planned) */
} attn__sdpa_shapes;

/* Checks q/k/v/out/weights (weights may be NULL) and p (NULL: the defaults) against
 * attn_sdpa's contract and fills s: sizes, strides, the mask view, the scale and
 * every option. Outputs that overlap an argument are refused here too. */
int attn__sdpa_prepare(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                       const attn_tensor *v, const attn_sdpa_params *p,
                       const attn_tensor *out, const attn_tensor *weights,
                       attn__sdpa_shapes *s);

/* attn__sdpa_prepare for the KV cache (src/attention/kv_cache.c): with 16-bit k
 * and v, q and out may each be float32 as well as k's dtype (s->q_f32 and
 * s->out_f32 say which); everything else as attn__sdpa_prepare. */
int attn__sdpa_prepare_cache(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                             const attn_tensor *v, const attn_sdpa_params *p,
                             const attn_tensor *out, const attn_tensor *weights,
                             attn__sdpa_shapes *s);

/* attn__sdpa_prepare without the check that outputs do not overlap inputs: for a
 * caller that plans on views of its own scratch (multi-head attention checks the
 * overlap of its own arguments instead). */
int attn__sdpa_prepare_shapes(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                              const attn_tensor *v, const attn_sdpa_params *p,
                              const attn_tensor *out, const attn_tensor *weights,
                              attn__sdpa_shapes *s);

/* Records the EMPTY_ROW error for query i of (b, h), naming where it is. */
int attn__empty_row_fail(attn_ctx *ctx, const attn__sdpa_shapes *s, int64_t b, int64_t h,
                         int64_t i);

/* 1 when query i may attend to key j of (b, h): the causal alignment, the window,
 * the boolean mask and a bias of -inf all let it through. Every kernel hides
 * exactly these keys: a hidden key's value never reaches the output. */
static inline int attn__may_attend(const attn__sdpa_shapes *s, int64_t b, int64_t h,
                                   int64_t i, int64_t j)
{
    const int64_t ip = i + s->offset; /* the query's key position */
    if (s->causal == ATTN_CAUSAL_TOP_LEFT && j > i)
        return 0;
    if (s->causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > ip)
        return 0;
    if (s->has_window && ((s->window_left >= 0 && j < ip - s->window_left) ||
                          (s->window_right >= 0 && j > ip + s->window_right)))
        return 0;
    if (s->mask.data && !s->mask.data[attn__off4(s->mask.stride, b, h, i, j)])
        return 0;
    if (s->bias && s->bias[attn__off4(s->bias_s, b, h, i, j)] == -INFINITY)
        return 0;
    return 1;
}

/* The ALiBi paper's default slope of head h out of H (see attn_alibi_slopes). */
float attn__alibi_default_slope(int64_t h, int64_t H);

/* Query head h's ALiBi slope (0 when ALiBi is off). Kernels take it once per head. */
static inline float attn__alibi_slope(const attn__sdpa_shapes *s, int64_t h)
{
    if (!s->alibi)
        return 0.0f;
    return s->alibi_slopes ? s->alibi_slopes[h * s->alibi_s]
                           : attn__alibi_default_slope(h, s->H);
}

/* The score of a visible key from its scaled dot product `x` = scale * q.k, in
 * the contract's order: softcap, then + bias, then + ALiBi (`slope` is
 * attn__alibi_slope(s, h)). */
static inline float attn__score_mod(const attn__sdpa_shapes *s, int64_t b, int64_t h,
                                    int64_t i, int64_t j, float x, float slope)
{
    if (s->softcap > 0.0f)
        x = s->softcap * tanhf(x / s->softcap);
    if (s->bias)
        x = x + s->bias[attn__off4(s->bias_s, b, h, i, j)];
    if (s->alibi) {
        const int64_t dist = i + s->offset - j;
        x = x - slope * (float)(dist < 0 ? -dist : dist);
    }
    return x;
}

/* The sink logit of query head h, or -inf without sinks (exp(-inf) = 0 adds
 * nothing to a denominator). */
static inline float attn__sink(const attn__sdpa_shapes *s, int64_t h)
{
    return s->sinks ? s->sinks[h * s->sinks_s] : -INFINITY;
}

/* Which kernel runs a checked call, with how many threads and how much scratch.
 * Everything here depends on the shapes, ctx->threads, ctx->impl and the selected
 * arch only, so the same call planned twice gets the same plan. */
typedef struct attn__sdpa_plan {
    attn__sdpa_shapes s;
    int use_ref;          /* 1: the reference (src/attention/sdpa_ref.c) */
    attn_arch arch;       /* the fused kernel's instruction set (not REF, not AUTO) */
    int threads;          /* workers the fused kernel uses */
    int64_t br, bc;       /* the fused kernel's tile sizes (0 on its row path) */
    int64_t n_chunks;     /* key chunks of its split-key decoding (0: not split) */
    int64_t ws_floats;    /* the fused kernel's scratch floats per worker */
    size_t scratch_bytes; /* what attn__sdpa_run needs in `scratch` */
} attn__sdpa_plan;

/* Plans s for the reference (use_ref) or the fused kernel on arch. Fails only on
 * overflow. */
int attn__sdpa_plan_make(attn_ctx *ctx, const attn__sdpa_shapes *s, int use_ref,
                         attn_arch arch, attn__sdpa_plan *plan);

/* Plans a call as attn_sdpa would run it under ctx (ctx->impl, ctx->arch). */
int attn__sdpa_plan_for_ctx(attn_ctx *ctx, const attn__sdpa_shapes *s,
                            attn__sdpa_plan *plan);

/* Runs a planned call on already checked data: q, k, v, out and weights (NULL when
 * not wanted) are the tensors' first elements, read through plan->s's strides
 * (q, k, v and out of plan->s.dtype: float32, or uint16_t for 16 bits, except
 * that q or out is float32 where plan->s.q_f32 or out_f32 says so);
 * scratch holds plan->scratch_bytes, 64-byte aligned. Allocates nothing. Fails only
 * with EMPTY_ROW. */
int attn__sdpa_run(attn_ctx *ctx, const attn__sdpa_plan *plan, const void *q,
                   const void *k, const void *v, void *out, float *weights,
                   void *scratch);

/* The reference and the fused kernel behind attn__sdpa_run. */
int attn__sdpa_ref_run(attn_ctx *ctx, const attn__sdpa_shapes *s, const float *q,
                       const float *k, const float *v, float *out, float *weights,
                       float *scores);
int attn__sdpa_fused_plan(attn_ctx *ctx, attn__sdpa_plan *plan);
int attn__sdpa_fused_run(attn_ctx *ctx, const attn__sdpa_plan *plan, const void *q,
                         const void *k, const void *v, void *out, float *weights,
                         void *scratch);

/* ---- the backward (SPEC section 8) -------------------------------------------- */

/* Sizes, strides and options of one checked attn_sdpa_backward call: the forward's
 * (s, whose lse is NULL: the backward reads the forward's log-sum-exp through
 * lse_s instead) and the strides of the backward's own tensors. */
typedef struct attn__sdpa_bwd_shapes {
    attn__sdpa_shapes s;     /* q, k, v, out (o_s) and every section 6 option */
    int64_t lse_s[3];        /* the forward's log-sum-exp [B, H, Tq] */
    int64_t do_s[4];         /* dout [B, H, Tq, Dv] */
    int64_t dq_s[4];         /* dq [B, H, Tq, D] */
    int64_t dk_s[4];         /* dk [B, Hkv, Tk, D] */
    int64_t dv_s[4];         /* dv [B, Hkv, Tk, Dv] */
    float *dbias;            /* NULL = not wanted; else the bias's own shape, read as
                                [B, H, Tq, Tk] through dbias_s (stride 0 on the axes
                                the bias is broadcast along, so += sums over them) */
    int64_t dbias_s[4];
    float *dsinks;           /* NULL = not wanted; else [H] at stride dsinks_s */
    int64_t dsinks_s;
} attn__sdpa_bwd_shapes;

/* Checks attn_sdpa_backward's arguments: q, k, v and p as attn__sdpa_prepare_shapes
 * checks them for the forward (p->lse must be NULL: the forward's log-sum-exp is
 * the lse argument), out [B, H, Tq, Dv], lse [B, H, Tq], dout like out, and the
 * gradients' shapes; no gradient may share memory with an argument or another
 * gradient. Fills bs. */
int attn__sdpa_backward_prepare(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                                const attn_tensor *v, const attn_sdpa_params *p,
                                const attn_tensor *out, const attn_tensor *lse,
                                const attn_tensor *dout, const attn_sdpa_grads *grads,
                                attn__sdpa_bwd_shapes *bs);

/* Which kernel runs a checked backward, with how many threads and how much
 * scratch. Depends on the shapes and ctx only, like attn__sdpa_plan. */
typedef struct attn__sdpa_bwd_plan {
    attn__sdpa_bwd_shapes bs;
    int use_ref;          /* 1: the reference (src/attention/sdpa_ref_backward.c) */
    attn_arch arch;       /* the fused backward's instruction set (not REF, not AUTO) */
    int threads;
    int64_t ws_floats;    /* the fused backward's scratch floats per worker */
    size_t scratch_bytes; /* what attn__sdpa_backward_run needs in `scratch` */
} attn__sdpa_bwd_plan;

/* Plans bs for the reference. Fails only on overflow. */
int attn__sdpa_backward_plan_make(attn_ctx *ctx, const attn__sdpa_bwd_shapes *bs,
                                  attn__sdpa_bwd_plan *plan);

/* Plans a backward as attn_sdpa_backward runs it under ctx: the fused backward on
 * the selected arch (src/kernels/fused_backward.h), or the reference when ctx->impl
 * is ATTN_IMPL_REF or the arch is REF. */
/* Runs a planned backward (the fused kernel or the reference, as the plan says)
 * on checked data; scratch holds plan->scratch_bytes. Allocates nothing. */
int attn__sdpa_backward_run(attn_ctx *ctx, const attn__sdpa_bwd_plan *plan, const float *q,
                            const float *k, const float *v, const float *out,
                            const float *lse, const float *dout, float *dq, float *dk,
                            float *dv, void *scratch);

int attn__sdpa_backward_plan_for_ctx(attn_ctx *ctx, const attn__sdpa_bwd_shapes *bs,
                                     attn__sdpa_bwd_plan *plan);

/* The fused backward (src/kernels/sdpa_fused_backward.c): plan->bs and plan->arch
 * set, fills threads, ws_floats and scratch_bytes; the run, on checked data, with
 * plan->scratch_bytes of 64-byte aligned scratch, allocates nothing and fails only
 * with EMPTY_ROW (before it writes anything). */
int attn__sdpa_fused_backward_plan(attn_ctx *ctx, attn__sdpa_bwd_plan *plan);
int attn__sdpa_fused_backward_run(attn_ctx *ctx, const attn__sdpa_bwd_plan *plan,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const float *dout,
                                  float *dq, float *dk, float *dv, void *scratch);

/* The reference backward behind attn__sdpa_backward_run, on checked data (each
 * pointer is its tensor's first element, read through bs's strides); `scratch`
 * holds 2 Tq Tk + Tq floats. Writes every element of dq, dk, dv (and dbias, dsinks
 * when wanted). Allocates nothing; fails only with EMPTY_ROW. */
int attn__sdpa_ref_backward_run(attn_ctx *ctx, const attn__sdpa_bwd_shapes *bs,
                                const float *q, const float *k, const float *v,
                                const float *out, const float *lse, const float *dout,
                                float *dq, float *dk, float *dv, float *scratch);

#endif /* ATTN_SDPA_CONTRACT_H */
