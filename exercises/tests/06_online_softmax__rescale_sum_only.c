/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * the running sum is rescaled when the max grows, the accumulator is not.
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
    /* A masked key adds nothing; skipping it also keeps -inf - (-inf) = NaN out of
     * the state when it comes first. */
    if (score == -INFINITY)
        return;
    float m_new = score > st->m ? score : st->m;
    float rescale = expf(st->m - m_new); /* exp(-inf) = 0 on the first key */
    float p = expf(score - m_new);
    st->l = st->l * rescale + p;
    for (int e = 0; e < st->Dv; e++)
        st->acc[e] = st->acc[e] + p * v[e];
    st->m = m_new;
}

void online_softmax_result(const online_softmax *st, float *out /* [Dv] */)
{
    /* l == 0 only when every key was masked: such a row gives zeros. */
    float inv = st->l > 0.0f ? 1.0f / st->l : 0.0f;
    for (int e = 0; e < st->Dv; e++)
        out[e] = st->acc[e] * inv;
}
