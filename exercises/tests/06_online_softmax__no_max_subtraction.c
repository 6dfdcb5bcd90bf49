/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * no running max: l and acc sum exp(score) itself, which overflows float on large
 * scores (inf / inf = NaN).
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include <math.h>

#include "exercises.h"

void online_softmax_init(online_softmax *st, int Dv)
{
    st->Dv = Dv;
    st->m = -INFINITY;
    st->l = 0.0f;
    for (int e = 0; e < Dv; e++)
        st->acc[e] = 0.0f;
}

void online_softmax_add(online_softmax *st, float score, const float *v /* [Dv] */)
{
    float p = expf(score); /* exp(-inf) = 0 for a masked key */
    st->l += p;
    for (int e = 0; e < st->Dv; e++)
        st->acc[e] += p * v[e];
}

void online_softmax_result(const online_softmax *st, float *out /* [Dv] */)
{
    float inv = st->l > 0.0f ? 1.0f / st->l : 0.0f;
    for (int e = 0; e < st->Dv; e++)
        out[e] = st->acc[e] * inv;
}
