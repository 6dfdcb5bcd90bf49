/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * 7b adds into dk and dv without setting them to 0 first.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include <math.h>
#include <stdlib.h>

#include "exercises.h"

void softmax_backward(int Tq, int Tk, const float *weights /* P [Tq, Tk] */,
                      const float *dweights /* dP [Tq, Tk] */,
                      float *dscores /* dS [Tq, Tk] */)
{
    for (int64_t i = 0; i < Tq; i++) {
        const float *p = weights + i * Tk, *dp = dweights + i * Tk;
        float delta = 0.0f; /* sum_j p_ij dp_ij: one number per row */
        for (int64_t j = 0; j < Tk; j++)
            delta += p[j] * dp[j];
        for (int64_t j = 0; j < Tk; j++)
            dscores[i * Tk + j] = p[j] * (dp[j] - delta);
    }
}

void sdpa_backward(int Tq, int Tk, int D, int Dv, const float *q /* [Tq, D] */,
                   const float *k /* [Tk, D] */, const float *v /* [Tk, Dv] */,
                   const uint8_t *mask /* [Tq, Tk] or NULL */,
                   const float *weights /* P [Tq, Tk] */, const float *dout /* dO [Tq, Dv] */,
                   float *dq /* [Tq, D] */, float *dk /* [Tk, D] */, float *dv /* [Tk, Dv] */)
{
    (void)mask; /* P is already 0 at a hidden key, and every term below has P in it */
    const float scale = 1.0f / sqrtf((float)D);
    float *ds = malloc((size_t)Tq * (size_t)Tk * sizeof *ds); /* dS [Tq, Tk] */
    if (!ds)
        abort();


    for (int64_t i = 0; i < Tq; i++) {
        const float *p = weights + i * Tk, *dOi = dout + i * Dv;

        /* Delta_i = dO_i . o_i, with o_i = sum_j p_ij v_j recomputed. */
        float delta = 0.0f;
        for (int64_t e = 0; e < Dv; e++) {
            float o = 0.0f;
            for (int64_t j = 0; j < Tk; j++)
                o += p[j] * v[j * Dv + e];
            delta += dOi[e] * o;
        }

        for (int64_t j = 0; j < Tk; j++) {
            /* dV += P^T dO: key j collects row i's dO, weighted by p_ij. */
            for (int64_t e = 0; e < Dv; e++)
                dv[j * Dv + e] += p[j] * dOi[e];
            /* dP = dO v^T, then dS = P o (dP - Delta). */
            float dp = 0.0f;
            for (int64_t e = 0; e < Dv; e++)
                dp += dOi[e] * v[j * Dv + e];
            ds[i * Tk + j] = p[j] * (dp - delta);
        }
    }

    /* dQ = scale dS k, dK = scale dS^T q. */
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < Tk; j++)
                acc += ds[i * Tk + j] * k[j * D + d];
            dq[i * D + d] = scale * acc;
        }
    for (int64_t j = 0; j < Tk; j++)
        for (int64_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < Tq; i++)
                acc += ds[i * Tk + j] * q[i * D + d];
            dk[j * D + d] += scale * acc;
        }
    free(ds);
}
