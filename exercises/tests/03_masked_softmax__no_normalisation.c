/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * exp(s - max) is never divided by the row's sum.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include <math.h>

#include "exercises.h"

void masked_softmax(int Tq, int Tk, const float *scores /* [Tq, Tk] */,
                    const uint8_t *mask /* [Tq, Tk] or NULL */,
                    float *weights /* [Tq, Tk] */)
{
    for (int64_t i = 0; i < Tq; i++) {
        const float *s = scores + i * Tk;
        float *w = weights + i * Tk;
        /* A masked score is -inf; the row's max over the rest keeps exp() finite. */
        float m = -INFINITY;
        for (int64_t j = 0; j < Tk; j++) {
            float x = (mask && !mask[i * Tk + j]) ? -INFINITY : s[j];
            w[j] = x;
            if (x > m)
                m = x;
        }
        for (int64_t j = 0; j < Tk; j++)
            w[j] = expf(w[j] - m); /* exp(-inf) = 0 for a masked key */
    }
}
