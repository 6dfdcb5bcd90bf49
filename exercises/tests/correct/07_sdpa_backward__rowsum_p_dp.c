/*
 * A right answer written another way, for the grader's self-test
 * (tests/test_exercises.sh): 7b takes Delta as rowsum(P o dP), from the dP it has
 * just computed, instead of rowsum(dO o O). The two are the same number
 * (sum_j p_ij dO_i . v_j = dO_i . o_i), so the grader must pass it.
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

    /* dk and dv are sums over the queries: start them at 0. */
    for (int64_t x = 0; x < (int64_t)Tk * D; x++)
        dk[x] = 0.0f;
    for (int64_t x = 0; x < (int64_t)Tk * Dv; x++)
        dv[x] = 0.0f;

    for (int64_t i = 0; i < Tq; i++) {
        const float *p = weights + i * Tk, *dOi = dout + i * Dv;

        /* dP = dO v^T into ds's row, and Delta_i = sum_j p_ij dp_ij beside it. */
        float delta = 0.0f;
        for (int64_t j = 0; j < Tk; j++) {
            for (int64_t e = 0; e < Dv; e++)
                dv[j * Dv + e] += p[j] * dOi[e]; /* dV += P^T dO */
            float dp = 0.0f;
            for (int64_t e = 0; e < Dv; e++)
                dp += dOi[e] * v[j * Dv + e];
            ds[i * Tk + j] = dp;
            delta += p[j] * dp;
        }
        for (int64_t j = 0; j < Tk; j++)
            ds[i * Tk + j] = p[j] * (ds[i * Tk + j] - delta); /* dS = P o (dP - Delta) */
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
            dk[j * D + d] = scale * acc;
        }
    free(ds);
}
