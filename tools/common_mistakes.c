/*
 * common_mistakes.c - the chapter's attention with one classic mistake at a time
 * (see common_mistakes.h). Plain loops, written to be read next to the correct
 * reference in src/attention/sdpa_ref.c: each mistake is one visible `if`.
 */
#include "common_mistakes.h"

#include <math.h>
#include <stddef.h>

const char *const mistake_names[MISTAKE_COUNT + 1] = {
    "none", "no-scale", "inverted-mask", "mask-queries", "softmax-wrong-axis", "mask-zero", NULL};

const char *mistake_explain(mistake m)
{
    switch (m) {
    case MISTAKE_NONE:
        return "no mistake: the chapter's attention";
    case MISTAKE_NO_SCALE:
        return "the scores are not divided by sqrt(D): their spread grows with D, so the "
               "softmax is sharper and each row puts more weight on its largest score";
    case MISTAKE_INVERTED_MASK:
        return "the mask's meaning is inverted (true read as 'hide', as nn.MultiheadAttention's "
               "boolean attn_mask means, where F.scaled_dot_product_attention and this "
               "project mean 'may attend'): each query sees exactly the keys it must not, "
               "future and pad tokens, and a row with nothing left is NaN";
    case MISTAKE_MASK_QUERIES:
        return "the padding mask is applied to the queries (rows) instead of the keys "
               "(columns): a pad query's row has no visible key, so its softmax is 0/0 = NaN "
               "and its output is NaN; the real queries are unchanged here only because the "
               "causal mask already hides the later pad keys from them";
    case MISTAKE_SOFTMAX_WRONG_AXIS:
        return "the softmax runs over the queries (dim=-2) instead of the keys: the columns "
               "sum to 1, not the rows; a pad key's column is all -inf, so it is NaN, and "
               "weights @ v spreads that NaN into every output";
    case MISTAKE_MASK_ZERO:
        return "hidden scores are set to 0 instead of -inf: exp(0 - max) is not 0, so future "
               "and pad keys get weight and leak into the output";
    case MISTAKE_COUNT:
        break;
    }
    return "unknown mistake";
}

const char *mistake_code(mistake m)
{
    switch (m) {
    case MISTAKE_NONE:
        return "scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~mask, float('-inf'))";
    case MISTAKE_NO_SCALE:
        return "scores = q @ k.transpose(-2, -1)   # missing: / math.sqrt(D)";
    case MISTAKE_INVERTED_MASK:
        return "scores = scores.masked_fill(mask, float('-inf'))   # should be ~mask";
    case MISTAKE_MASK_QUERIES:
        return "padding_mask = (token_ids != pad_id)[:, None, :, None]   # should be [:, None, None, :]";
    case MISTAKE_SOFTMAX_WRONG_AXIS:
        return "weights = scores.softmax(dim=-2)   # should be dim=-1";
    case MISTAKE_MASK_ZERO:
        return "scores = scores.masked_fill(~mask, 0.0)   # should be float('-inf')";
    case MISTAKE_COUNT:
        break;
    }
    return "";
}

int mistake_may_attend(mistake m, const uint8_t *pad, const uint8_t *comb, int64_t T,
                       int64_t b, int64_t i, int64_t j)
{
    if (m == MISTAKE_INVERTED_MASK)
        return !comb[(b * T + i) * T + j];
    if (m == MISTAKE_MASK_QUERIES) /* the pad test reads the query i, not the key j */
        return pad[b * T + i] && j <= i;
    return comb[(b * T + i) * T + j] != 0;
}

void mistake_attention(mistake m, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                       const float *q, const float *k, const float *v, const uint8_t *pad,
                       const uint8_t *comb, float *raw, float *scaled, float *masked,
                       float *weights, float *context)
{
    const float used_scale = m == MISTAKE_NO_SCALE ? 1.0f : scale;
    const float hidden = m == MISTAKE_MASK_ZERO ? 0.0f : -INFINITY;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t bh = b * H + h;
            const float *qh = q + bh * T * D, *kh = k + bh * T * D, *vh = v + bh * T * D;
            float *r = raw + bh * T * T, *s = scaled + bh * T * T, *mk = masked + bh * T * T;

            /* Step 1: scores = q k^T (* scale), hidden keys set to `hidden`. */
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < T; j++) {
                    float dot = 0.0f;
                    for (int64_t d = 0; d < D; d++)
                        dot += qh[i * D + d] * kh[j * D + d];
                    r[i * T + j] = dot;
                    s[i * T + j] = dot * used_scale;
                    mk[i * T + j] = mistake_may_attend(m, pad, comb, T, b, i, j) ? s[i * T + j]
                                                                                : hidden;
                }
            if (!weights || !context)
                continue;

            /* Step 2: softmax along one axis: over j (the keys) for each query i, or,
             * under softmax-wrong-axis, over i for each key j. `step` walks the axis
             * being normalised, `other` the one that is not. As in PyTorch, a line of
             * only -inf gives exp(-inf - -inf) = NaN. */
            float *w = weights + bh * T * T;
            const int wrong = m == MISTAKE_SOFTMAX_WRONG_AXIS;
            const int64_t step = wrong ? T : 1, other = wrong ? 1 : T;
            for (int64_t line = 0; line < T; line++) {
                const float *in = mk + line * other;
                float *out = w + line * other;
                float max = -INFINITY;
                for (int64_t n = 0; n < T; n++)
                    if (in[n * step] > max)
                        max = in[n * step];
                float sum = 0.0f;
                for (int64_t n = 0; n < T; n++) {
                    out[n * step] = expf(in[n * step] - max);
                    sum += out[n * step];
                }
                for (int64_t n = 0; n < T; n++)
                    out[n * step] /= sum;
            }

            /* Step 3: context = weights v over every key, as weights @ v does: a NaN
             * weight is not skipped. */
            float *c = context + bh * T * D;
            for (int64_t i = 0; i < T; i++)
                for (int64_t d = 0; d < D; d++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < T; j++)
                        acc += w[i * T + j] * vh[j * D + d];
                    c[i * D + d] = acc;
                }
        }
}
