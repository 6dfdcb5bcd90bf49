/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * the softmax runs down each column (over the queries, PyTorch's dim=-2) instead of
 * along each row (over the keys).
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include <math.h>

#include "exercises.h"

void sdpa(int Tq, int Tk, int D, int Dv, const float *q /* [Tq, D] */,
          const float *k /* [Tk, D] */, const float *v /* [Tk, Dv] */,
          const uint8_t *mask /* [Tq, Tk] or NULL */, float *weights /* [Tq, Tk] */,
          float *out /* [Tq, Dv] */)
{
    const float scale = 1.0f / sqrtf((float)D);

    /* 1. scores = q k^T / sqrt(D), masked scores -inf. */
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++)
                dot += q[i * D + d] * k[j * D + d];
            weights[i * Tk + j] = (mask && !mask[i * Tk + j]) ? -INFINITY : dot * scale;
        }

    /* 2. softmax over the queries of each key: the wrong axis. */
    for (int64_t j = 0; j < Tk; j++) {
        float m = -INFINITY;
        for (int64_t i = 0; i < Tq; i++)
            if (weights[i * Tk + j] > m)
                m = weights[i * Tk + j];
        float sum = 0.0f;
        for (int64_t i = 0; i < Tq; i++) {
            weights[i * Tk + j] = expf(weights[i * Tk + j] - m);
            sum += weights[i * Tk + j];
        }
        for (int64_t i = 0; i < Tq; i++)
            weights[i * Tk + j] /= sum;
    }

    /* 3. out = weights v. */
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t e = 0; e < Dv; e++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < Tk; j++)
                acc += weights[i * Tk + j] * v[j * Dv + e];
            out[i * Dv + e] = acc;
        }
}
