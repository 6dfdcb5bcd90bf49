/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * the softmax over every key, then the masked weights set to 0 (the rows no longer sum to 1).
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
        float m = -INFINITY;
        for (int64_t j = 0; j < Tk; j++)
            if (s[j] > m)
                m = s[j];
        float sum = 0.0f;
        for (int64_t j = 0; j < Tk; j++) {
            w[j] = expf(s[j] - m);
            sum += w[j];
        }
        for (int64_t j = 0; j < Tk; j++)
            w[j] = (mask && !mask[i * Tk + j]) ? 0.0f : w[j] / sum;
    }
}
