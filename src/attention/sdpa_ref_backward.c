/*
 * sdpa_ref_backward.c - the backward pass of scaled dot-product attention, the
 * reference.
 *
 * The forward (sdpa_ref.c) is S = scale q k^T (then the score modifications),
 * P = softmax(S) by row, O = P V. Given dO, the gradient of a loss with respect
 * to O, this file walks those steps backwards on plain loops, for each (batch b,
 * head h), in the order docs/walkthrough.md derives them:
 *
 *   1. P     = exp(S - L)              [Tq, Tk]  recomputed from q, k and the
 *                                                forward's log-sum-exp L; 0 where
 *                                                the key is hidden
 *   2. dV   += P^T dO                  [Tk, Dv]
 *   3. dP    = dO V^T                  [Tq, Tk]
 *      Delta = rowsum(dO * O)          [Tq]      (equals rowsum(P * dP))
 *      dS    = P * (dP - Delta)        [Tq, Tk]  the softmax's Jacobian applied
 *   4. through the score modifications, last first:
 *      sinks:   dsink_h -= sum_i P_sink,i Delta_i,  P_sink,i = exp(sink_h - L_i)
 *      ALiBi:   nothing (the slopes are constants)
 *      bias:    dbias += dS  (summed over the axes the bias was broadcast along)
 *      softcap: dS *= 1 - tanh^2(x / c),  x = scale q.k before the cap
 *   5. dQ    = scale dS K              [Tq, D]
 *      dK   += scale dS^T Q            [Tk, D]
 *
 * dK and dV add up over the query heads that share a key/value head (GQA), one
 * head after another in order, so the sums do not depend on anything but the
 * shapes. A hidden key is skipped, never multiplied by its zero weight, so its
 * gradients from the rows that cannot see it are exactly zero and a NaN in its
 * value stays out, as in the forward. A row that sees no key (zero mode, or
 * sinks) gives and gets no gradient.
 *
 * Shapes and strides as in sdpa_ref.c; dq, dk, dv like q, k, v. `scratch` holds
 * P [Tq, Tk], dS [Tq, Tk] and Delta [Tq], reused for every (b, h). The arguments
 * were checked before this runs (attn__sdpa_backward_prepare); the entry points
 * are in sdpa_backward.c.
 */
#include "sdpa_contract.h"

#include <math.h>

/* The number of keys query i of (b, h) may attend to. */
static int64_t visible_keys(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i)
{
    int64_t n = 0;
    for (int64_t j = 0; j < s->Tk; j++)
        n += attn__may_attend(s, b, h, i, j);
    return n;
}

/* scale * q_i . k_j, summed in the forward's order (the score before its
 * modifications). */
static float scaled_dot(const attn__sdpa_shapes *s, const float *qd, const float *kd,
                        int64_t b, int64_t h, int64_t hk, int64_t i, int64_t j)
{
    float dot = 0.0f;
    for (int64_t d = 0; d < s->D; d++)
        dot += qd[attn__off4(s->q_s, b, h, i, d)] * kd[attn__off4(s->k_s, b, hk, j, d)];
    return dot * s->scale;
}

int attn__sdpa_ref_backward_run(attn_ctx *ctx, const attn__sdpa_bwd_shapes *bsp,
                                const float *qd, const float *kd, const float *vd,
                                const float *od, const float *lsed, const float *dod,
                                float *dqd, float *dkd, float *dvd, float *scratch)
{
    const attn__sdpa_bwd_shapes bs = *bsp;
    const attn__sdpa_shapes s = bs.s;
    const int64_t Tq = s.Tq, Tk = s.Tk, D = s.D, Dv = s.Dv;
    float *P = scratch;          /* [Tq, Tk] */
    float *dS = P + Tq * Tk;     /* [Tq, Tk] */
    float *delta = dS + Tq * Tk; /* [Tq] */

    /* dK, dV, dbias and dsinks are sums over heads (and broadcast axes); they
     * start at zero. Every element of dbias is reached through its broadcast view. */
    for (int64_t b = 0; b < s.B; b++)
        for (int64_t hk = 0; hk < s.Hkv; hk++)
            for (int64_t j = 0; j < Tk; j++) {
                for (int64_t d = 0; d < D; d++)
                    dkd[attn__off4(bs.dk_s, b, hk, j, d)] = 0.0f;
                for (int64_t d = 0; d < Dv; d++)
                    dvd[attn__off4(bs.dv_s, b, hk, j, d)] = 0.0f;
            }
    if (bs.dbias)
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.H; h++)
                for (int64_t i = 0; i < Tq; i++)
                    for (int64_t j = 0; j < Tk; j++)
                        bs.dbias[attn__off4(bs.dbias_s, b, h, i, j)] = 0.0f;
    if (bs.dsinks)
        for (int64_t h = 0; h < s.H; h++)
            bs.dsinks[h * bs.dsinks_s] = 0.0f;

    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.H; h++) {
            const int64_t hk = h / s.group; /* the key/value head query head h reads */
            const float slope = attn__alibi_slope(&s, h);
            const float sink = attn__sink(&s, h);

            /* Step 1: P = exp(S - L), the forward's weights, from the scores
             * recomputed exactly as the forward made them.  [Tq, Tk] */
            for (int64_t i = 0; i < Tq; i++) {
                const float L = lsed[b * bs.lse_s[0] + h * bs.lse_s[1] + i * bs.lse_s[2]];
                if (visible_keys(&s, b, h, i) == 0 && s.empty_rows == ATTN_EMPTY_ROWS_ERROR &&
                    !s.sinks)
                    return attn__empty_row_fail(ctx, &s, b, h, i);
                for (int64_t j = 0; j < Tk; j++)
                    P[i * Tk + j] =
                        attn__may_attend(&s, b, h, i, j)
                            ? expf(attn__score_mod(&s, b, h, i, j,
                                                   scaled_dot(&s, qd, kd, b, h, hk, i, j),
                                                   slope) -
                                   L)
                            : 0.0f;
            }

            /* Step 2: dV += P^T dO.  [Tk, Dv]  Row i's share reaches only the keys
             * it sees. */
            for (int64_t j = 0; j < Tk; j++)
                for (int64_t d = 0; d < Dv; d++) {
                    float acc = 0.0f;
                    for (int64_t i = 0; i < Tq; i++)
                        if (attn__may_attend(&s, b, h, i, j))
                            acc += P[i * Tk + j] * dod[attn__off4(bs.do_s, b, h, i, d)];
                    dvd[attn__off4(bs.dv_s, b, hk, j, d)] += acc;
                }

            /* Step 3: dP = dO V^T, Delta = rowsum(dO * O), dS = P * (dP - Delta).
             * The softmax's Jacobian is diag(p) - p p^T for each row p, so the
             * gradient of its input is p * (dp - p.dp); p.dp = sum_j p_j (dO_i.v_j)
             * = dO_i.O_i, which is why Delta needs O and not a second pass over the
             * keys. A row that sees no key has no weights to differentiate. */
            for (int64_t i = 0; i < Tq; i++) {
                const int empty = visible_keys(&s, b, h, i) == 0;
                float dl = 0.0f;
                for (int64_t d = 0; d < Dv && !empty; d++)
                    dl += dod[attn__off4(bs.do_s, b, h, i, d)] * od[attn__off4(s.o_s, b, h, i, d)];
                delta[i] = dl;
                for (int64_t j = 0; j < Tk; j++) {
                    float g = 0.0f;
                    if (attn__may_attend(&s, b, h, i, j)) {
                        float dp = 0.0f;
                        for (int64_t d = 0; d < Dv; d++)
                            dp += dod[attn__off4(bs.do_s, b, h, i, d)] *
                                  vd[attn__off4(s.v_s, b, hk, j, d)];
                        g = P[i * Tk + j] * (dp - dl);
                    }
                    dS[i * Tk + j] = g;
                }
            }

            /* Step 4: back through the score modifications, the last one first.
             * The sink is one more logit of each row's softmax with no value
             * (its dp is 0), so its gradient is P_sink * (0 - Delta) per row. */
            if (bs.dsinks) {
                float acc = 0.0f;
                for (int64_t i = 0; i < Tq; i++)
                    if (visible_keys(&s, b, h, i) > 0) {
                        const float L =
                            lsed[b * bs.lse_s[0] + h * bs.lse_s[1] + i * bs.lse_s[2]];
                        acc -= expf(sink - L) * delta[i];
                    }
                bs.dsinks[h * bs.dsinks_s] += acc;
            }
            /* ALiBi adds a constant: nothing to do. The bias adds its element: its
             * gradient is dS itself, summed where it was broadcast. */
            if (bs.dbias)
                for (int64_t i = 0; i < Tq; i++)
                    for (int64_t j = 0; j < Tk; j++)
                        if (attn__may_attend(&s, b, h, i, j))
                            bs.dbias[attn__off4(bs.dbias_s, b, h, i, j)] += dS[i * Tk + j];
            /* The softcap c tanh(x / c) has derivative 1 - tanh^2(x / c) at the
             * score x it capped. */
            if (s.softcap > 0.0f)
                for (int64_t i = 0; i < Tq; i++)
                    for (int64_t j = 0; j < Tk; j++)
                        if (attn__may_attend(&s, b, h, i, j)) {
                            const float t =
                                tanhf(scaled_dot(&s, qd, kd, b, h, hk, i, j) / s.softcap);
                            dS[i * Tk + j] *= 1.0f - t * t;
                        }

            /* Step 5: x = scale q.k, so dQ = scale dS K and dK += scale dS^T Q. */
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t d = 0; d < D; d++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < Tk; j++)
                        if (attn__may_attend(&s, b, h, i, j))
                            acc += dS[i * Tk + j] * kd[attn__off4(s.k_s, b, hk, j, d)];
                    dqd[attn__off4(bs.dq_s, b, h, i, d)] = s.scale * acc;
                }
            for (int64_t j = 0; j < Tk; j++)
                for (int64_t d = 0; d < D; d++) {
                    float acc = 0.0f;
                    for (int64_t i = 0; i < Tq; i++)
                        if (attn__may_attend(&s, b, h, i, j))
                            acc += dS[i * Tk + j] * qd[attn__off4(s.q_s, b, h, i, d)];
                    dkd[attn__off4(bs.dk_s, b, hk, j, d)] += s.scale * acc;
                }
        }
    return ATTN_OK;
}
