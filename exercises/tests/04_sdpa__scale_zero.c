/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * the scale is 1 / D in integer arithmetic, 0 for D > 1: every score is 0.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include <math.h>

#include "exercises.h"

void sdpa(int Tq, int Tk, int D, int Dv, const float *q /* [Tq, D] */,
          const float *k /* [Tk, D] */, const float *v /* [Tk, Dv] */,
          const uint8_t *mask /* [Tq, Tk] or NULL */, float *weights /* [Tq, Tk] */,
          float *out /* [Tq, Dv] */)
{
    const float scale = 1 / D;
    for (int64_t i = 0; i < Tq; i++) {
        float *w = weights + i * Tk; /* [Tk] */

        /* 1. scores = q k^T / sqrt(D), masked scores -inf. */
        float m = -INFINITY;
        for (int64_t j = 0; j < Tk; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++)
                dot += q[i * D + d] * k[j * D + d];
            w[j] = (mask && !mask[i * Tk + j]) ? -INFINITY : dot * scale;
            if (w[j] > m)
                m = w[j];
        }

        /* 2. softmax over the keys. */
        float sum = 0.0f;
        for (int64_t j = 0; j < Tk; j++) {
            w[j] = expf(w[j] - m);
            sum += w[j];
        }
        for (int64_t j = 0; j < Tk; j++)
            w[j] /= sum;

        /* 3. out = weights v. */
        for (int64_t e = 0; e < Dv; e++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < Tk; j++)
                acc += w[j] * v[j * Dv + e];
            out[i * Dv + e] = acc;
        }
    }
}
