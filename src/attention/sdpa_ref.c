/*
 * sdpa_ref.c - scaled dot-product attention, the reference.
 *
 * This is the specification the tests trust and the code a learner reads first,
 * beside the chapter. For each (batch b, head h), on plain loops:
 *
 *   1. scores  = q k^T * scale           [Tq, Tk]  scale = 1/sqrt(D) by default
 *      hidden keys' scores become -inf   (the mask is false: may not attend)
 *   2. weights = softmax(scores) by row  [Tq, Tk]
 *   3. out     = weights v               [Tq, Dv]
 *
 * Shapes: q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], out [B, H, Tq, Dv],
 * weights [B, H, Tq, Tk]; element (b, h, i, d) of q is qd[attn__off4(s.q_s, b, h, i, d)].
 * `scores` is the caller's [Tq, Tk] block, reused for every (b, h).
 *
 * The options of current models fit into these steps where the contract
 * (sdpa_contract.h) says: step 1 applies the softcap, the bias and ALiBi to each
 * score (attn__score_mod) and hides keys by the causal alignment, the window, the
 * mask and a -inf bias (attn__may_attend); step 2 puts the sink in the denominator
 * and records the log-sum-exp; grouped-query heads read key/value head h / group.
 * With none of them set, the steps are exactly the chapter's.
 *
 * The arguments were checked before this runs (sdpa_contract.c); the public entry
 * point, attn_sdpa_ref, is in sdpa.c. The fused kernel (src/kernels/) computes the
 * same thing without the score block, and gives the same answer for NaN and inf
 * inputs.
 */
#include "sdpa_contract.h"

#include <math.h>

int attn__sdpa_ref_run(attn_ctx *ctx, const attn__sdpa_shapes *sp, const float *qd,
                       const float *kd, const float *vd, float *od, float *wd, float *scores)
{
    const attn__sdpa_shapes s = *sp;
    const int64_t Tq = s.Tq, Tk = s.Tk, D = s.D, Dv = s.Dv;

    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.H; h++) {
            const int64_t hk = h / s.group; /* the key/value head query head h reads */
            const float slope = attn__alibi_slope(&s, h);
            const float sink = attn__sink(&s, h);

            /* Step 1: scores = q k^T * scale, hidden keys -inf.  [Tq, Tk] */
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t j = 0; j < Tk; j++) {
                    float dot = 0.0f;
                    for (int64_t d = 0; d < D; d++)
                        dot += qd[attn__off4(s.q_s, b, h, i, d)] * kd[attn__off4(s.k_s, b, hk, j, d)];
                    scores[i * Tk + j] = attn__may_attend(&s, b, h, i, j)
                                             ? attn__score_mod(&s, b, h, i, j, dot * s.scale, slope)
                                             : -INFINITY;
                }

            /* Step 2: weights = softmax over the key axis, in place.  [Tq, Tk]
             * It starts from the row's maximum so that exp never overflows. A hidden
             * key has exp(-inf) = 0 weight; a sink adds exp(sink - max) to the sum
             * and takes no value. A row with no visible key is an error, or all
             * zeros when asked (always zeros with a sink). Visibility is read from
             * the mask, not from the scores, so a NaN score is not taken for a hidden
             * one: it makes its own row NaN, as in PyTorch (and so does a row whose
             * visible scores are all -inf: exp(-inf - -inf) is NaN). */
            for (int64_t i = 0; i < Tq; i++) {
                float *row = scores + i * Tk;
                float max = sink;
                int64_t visible = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    visible += attn__may_attend(&s, b, h, i, j);
                    if (row[j] > max)
                        max = row[j];
                }
                float lse = visible == 0 ? sink : 0.0f;
                if (visible == 0) {
                    if (s.empty_rows == ATTN_EMPTY_ROWS_ERROR && !s.sinks)
                        return attn__empty_row_fail(ctx, &s, b, h, i);
                    for (int64_t j = 0; j < Tk; j++)
                        row[j] = 0.0f;
                } else {
                    float sum = s.sinks ? expf(sink - max) : 0.0f;
                    for (int64_t j = 0; j < Tk; j++) {
                        row[j] = expf(row[j] - max);
                        sum += row[j];
                    }
                    for (int64_t j = 0; j < Tk; j++)
                        row[j] /= sum;
                    lse = max + logf(sum);
                }
                if (s.lse)
                    s.lse[b * s.lse_s[0] + h * s.lse_s[1] + i * s.lse_s[2]] = lse;
                if (wd)
                    for (int64_t j = 0; j < Tk; j++)
                        wd[attn__off4(s.w_s, b, h, i, j)] = row[j];
            }

            /* Step 3: out = weights v.  [Tq, Dv]  A hidden key is skipped, not
             * multiplied by its zero weight, so whatever its value row holds (even
             * NaN) never reaches the output. Every other key is multiplied, even
             * when its weight underflowed to 0: 0 * NaN and 0 * inf are NaN, and a
             * bad value must reach every row whose softmax includes its key. */
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t d = 0; d < Dv; d++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < Tk; j++)
                        if (attn__may_attend(&s, b, h, i, j))
                            acc += scores[i * Tk + j] * vd[attn__off4(s.v_s, b, hk, j, d)];
                    od[attn__off4(s.o_s, b, h, i, d)] = acc;
                }
        }
    return ATTN_OK;
}
