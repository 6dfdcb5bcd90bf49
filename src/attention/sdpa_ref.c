/*
 * sdpa_ref.c - scaled dot-product attention, the reference.
 *
 * This is the specification the tests trust and the code a learner reads first. It
 * follows the chapter's three steps for each (batch b, head h), on plain loops:
 *
 *   1. scores  = q k^T * scale           [Tq, Tk]  scale = 1/sqrt(D) by default
 *      masked scores become -inf         (the mask is false: may not attend)
 *   2. weights = softmax(scores) by row  [Tq, Tk]
 *   3. out     = weights v               [Tq, Dv]
 *
 * Shapes: q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv], out [B, H, Tq, Dv],
 * weights [B, H, Tq, Tk]. It keeps one [Tq, Tk] score block per (b, h); the fused
 * kernel (sdpa_fused*.c) computes the same thing without it.
 *
 * It also holds attn__sdpa_prepare(), the argument check every kernel shares, so
 * that all kernels accept and refuse exactly the same inputs with the same messages.
 */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

void attn_sdpa_params_init(attn_sdpa_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->empty_rows = ATTN_EMPTY_ROWS_ERROR;
}

static int check_f32(attn_ctx *ctx, const attn_tensor *t, const char *name)
{
    int rc = attn_tensor_check(ctx, t, name);
    if (rc)
        return rc;
    if (t->dtype != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s must be float32, not %s", name,
                          attn_dtype_name(t->dtype));
    return ATTN_OK;
}

int attn__sdpa_prepare(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                       const attn_tensor *v, const attn_sdpa_params *p,
                       const attn_tensor *out, const attn_tensor *weights,
                       attn__sdpa_shapes *s)
{
    int rc;
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    if ((rc = check_f32(ctx, q, "q")) || (rc = check_f32(ctx, k, "k")) ||
        (rc = check_f32(ctx, v, "v")) || (rc = check_f32(ctx, out, "out")) ||
        (weights && (rc = check_f32(ctx, weights, "weights"))))
        return rc;
    memset(s, 0, sizeof *s);
    int64_t qs[4], ks[4], vs[4], os[4], ws[4];
    attn__as4d(q, qs, s->q_s);
    attn__as4d(k, ks, s->k_s);
    attn__as4d(v, vs, s->v_s);
    attn__as4d(out, os, s->o_s);
    /* The shapes are formatted only when a check fails: this runs on every call. */
    char a[128], b[128], c[128];
#define ATTN__QKV_STRS() \
    (attn__shape_str(q, a, sizeof a), attn__shape_str(k, b, sizeof b), attn__shape_str(v, c, sizeof c))
    if (qs[3] != ks[3])
        return ATTN__QKV_STRS(),
               attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "q and k head_dim differ: q %s has D=%lld, k %s has D=%lld", a,
                          (long long)qs[3], b, (long long)ks[3]);
    if (ks[2] != vs[2])
        return ATTN__QKV_STRS(),
               attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "k and v lengths differ: k %s has Tk=%lld, v %s has Tk=%lld", b,
                          (long long)ks[2], c, (long long)vs[2]);
    if (qs[0] != ks[0] || qs[0] != vs[0] || qs[1] != ks[1] || qs[1] != vs[1])
        return ATTN__QKV_STRS(),
               attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "q %s, k %s and v %s must have the same batch and head sizes", a, b, c);
#undef ATTN__QKV_STRS
    s->B = qs[0];
    s->H = qs[1];
    s->Tq = qs[2];
    s->Tk = ks[2];
    s->D = qs[3];
    s->Dv = vs[3];
    const int64_t want_o[4] = {s->B, s->H, s->Tq, s->Dv};
    if (memcmp(os, want_o, sizeof os) != 0) {
        char d[128], e[128];
        attn_shape_format(e, sizeof e, 4, want_o);
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH, "out has shape %s; expected %s",
                          attn__shape_str(out, d, sizeof d), e);
    }
    if (weights) {
        attn__as4d(weights, ws, s->w_s);
        const int64_t want_w[4] = {s->B, s->H, s->Tq, s->Tk};
        if (memcmp(ws, want_w, sizeof ws) != 0) {
            char d[128], e[128];
            attn_shape_format(e, sizeof e, 4, want_w);
            return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                              "weights has shape %s; expected %s",
                              attn__shape_str(weights, d, sizeof d), e);
        }
    }
    if (p->causal && s->Tq != s->Tk)
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "the causal mask needs Tq == Tk, but Tq=%lld and Tk=%lld",
                          (long long)s->Tq, (long long)s->Tk);
    if (p->empty_rows != ATTN_EMPTY_ROWS_ERROR && p->empty_rows != ATTN_EMPTY_ROWS_ZERO)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "unknown empty_rows value %d",
                          (int)p->empty_rows);
    if (p->has_scale && !isfinite(p->scale))
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "scale %g is not a finite number",
                          (double)p->scale);
    if ((rc = attn__mask4_init(ctx, p->mask, s->B, s->H, s->Tq, s->Tk, &s->mask)))
        return rc;
    s->causal = p->causal != 0;
    s->scale = p->has_scale ? p->scale : (float)(1.0 / sqrt((double)s->D));
    s->empty_rows = p->empty_rows;
    return ATTN_OK;
}

int attn__empty_row_fail(attn_ctx *ctx, const attn__sdpa_shapes *s, int64_t b, int64_t h,
                         int64_t i)
{
    return attn__fail(ctx, ATTN_STATUS_EMPTY_ROW,
                      "query %lld of batch %lld, head %lld has all %lld keys masked "
                      "(use empty_rows = zero to give such rows zero output)",
                      (long long)i, (long long)b, (long long)h, (long long)s->Tk);
}

int attn_sdpa_ref(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                  const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                  attn_tensor *weights)
{
    attn__sdpa_shapes s;
    int rc = attn__sdpa_prepare(ctx, q, k, v, p, out, weights, &s);
    if (rc)
        return rc;
    const int64_t Tq = s.Tq, Tk = s.Tk, D = s.D, Dv = s.Dv;
    int64_t n;
    size_t bytes;
    if (!attn__mul_i64(Tq, Tk, &n) || !attn__bytes(n, sizeof(float), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "a [%lld, %lld] score block does not fit in memory", (long long)Tq,
                          (long long)Tk);
    float *scores = attn__alloc(ctx, bytes, "the [Tq, Tk] score block"); /* [Tq, Tk] */
    if (!scores)
        return ATTN_STATUS_NO_MEMORY;
    const float *qd = q->data, *kd = k->data, *vd = v->data;
    float *od = out->data, *wd = weights ? weights->data : NULL;

    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.H; h++) {
            /* Step 1: scores = q k^T * scale, masked entries -inf.  [Tq, Tk] */
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t j = 0; j < Tk; j++) {
                    float dot = 0.0f;
                    for (int64_t d = 0; d < D; d++)
                        dot += qd[attn__off4(s.q_s, b, h, i, d)] * kd[attn__off4(s.k_s, b, h, j, d)];
                    scores[i * Tk + j] =
                        attn__may_attend(&s, b, h, i, j) ? dot * s.scale : -INFINITY;
                }

            /* Step 2: softmax over the key axis, from the row's maximum so that exp
             * never overflows. A masked key has exp(-inf) = 0 weight. A row with no
             * visible key is an error, or all zeros when asked. (Visibility is read
             * from the mask, not from the scores, so a NaN score is not taken for a
             * masked one: it makes its own row NaN, as in PyTorch.) */
            for (int64_t i = 0; i < Tq; i++) {
                float *row = scores + i * Tk;
                float max = -INFINITY;
                int64_t visible = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    visible += attn__may_attend(&s, b, h, i, j);
                    if (row[j] > max)
                        max = row[j];
                }
                if (visible == 0) {
                    if (s.empty_rows == ATTN_EMPTY_ROWS_ERROR) {
                        attn__free(ctx, scores);
                        return attn__empty_row_fail(ctx, &s, b, h, i);
                    }
                    for (int64_t j = 0; j < Tk; j++)
                        row[j] = 0.0f;
                    continue;
                }
                float sum = 0.0f;
                for (int64_t j = 0; j < Tk; j++) {
                    row[j] = expf(row[j] - max);
                    sum += row[j];
                }
                for (int64_t j = 0; j < Tk; j++)
                    row[j] /= sum;
            }

            /* Step 3: out = weights v.  [Tq, Dv]  A masked key is skipped, not
             * multiplied by its zero weight, so whatever its value row holds (even NaN)
             * never reaches the output. */
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t d = 0; d < Dv; d++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < Tk; j++)
                        if (attn__may_attend(&s, b, h, i, j))
                            acc += scores[i * Tk + j] * vd[attn__off4(s.v_s, b, h, j, d)];
                    od[attn__off4(s.o_s, b, h, i, d)] = acc;
                }

            if (wd)
                for (int64_t i = 0; i < Tq; i++)
                    for (int64_t j = 0; j < Tk; j++)
                        wd[attn__off4(s.w_s, b, h, i, j)] = scores[i * Tk + j];
        }
    attn__free(ctx, scores);
    return ATTN_OK;
}
