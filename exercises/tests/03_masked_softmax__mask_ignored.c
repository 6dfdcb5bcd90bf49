/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * the mask is never read: masked keys get weight.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include <math.h>

#include "exercises.h"

void masked_softmax(int Tq, int Tk, const float *scores /* [Tq, Tk] */,
                    const uint8_t *mask /* [Tq, Tk] or NULL */,
                    float *weights /* [Tq, Tk] */)
{
    (void)mask;
    for (int64_t i = 0; i < Tq; i++) {
        const float *s = scores + i * Tk;
        float *w = weights + i * Tk;
        float m = -INFINITY;
        for (int64_t j = 0; j < Tk; j++) {
            float x = s[j];
            w[j] = x;
            if (x > m)
                m = x;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < Tk; j++) {
            w[j] = expf(w[j] - m); /* exp(-inf) = 0 for a masked key */
            sum += w[j];
        }
        for (int64_t j = 0; j < Tk; j++)
            w[j] /= sum;
    }
}
