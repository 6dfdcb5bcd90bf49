/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * the softmax runs down each column (over queries) instead of along each row.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include <math.h>

#include "exercises.h"

void masked_softmax(int Tq, int Tk, const float *scores /* [Tq, Tk] */,
                    const uint8_t *mask /* [Tq, Tk] or NULL */,
                    float *weights /* [Tq, Tk] */)
{
    for (int64_t j = 0; j < Tk; j++) {
        float m = -INFINITY;
        for (int64_t i = 0; i < Tq; i++) {
            float x = (mask && !mask[i * Tk + j]) ? -INFINITY : scores[i * Tk + j];
            weights[i * Tk + j] = x;
            if (x > m)
                m = x;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < Tq; i++) {
            weights[i * Tk + j] = expf(weights[i * Tk + j] - m);
            sum += weights[i * Tk + j];
        }
        for (int64_t i = 0; i < Tq; i++)
            weights[i * Tk + j] /= sum;
    }
}
