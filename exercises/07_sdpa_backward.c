/*
 * Exercise 7 (stretch): the backward of one head.
 *
 * Training needs the gradient of a loss L with respect to q, k and v. The forward
 * of exercise 4 was
 *
 *   S = q k^T * scale        [Tq, Tk]   scale = 1/sqrt(D)
 *   P = softmax(S) by row    [Tq, Tk]   (masked scores -inf, so P = 0 there)
 *   O = P v                  [Tq, Dv]
 *
 * and backpropagation is given dO = dL/dO [Tq, Dv]. docs/walkthrough.md, section 10,
 * derives each step by the chain rule, from the last to the first:
 *
 *   dV    = P^T dO                  [Tk, Dv]
 *   dP    = dO v^T                  [Tq, Tk]
 *   Delta = rowsum(dO o O)          [Tq]      = rowsum(P o dP), the same number
 *   dS    = P o (dP - Delta)        [Tq, Tk]  (Delta_i subtracted from row i)
 *   dQ    = scale dS k              [Tq, D]
 *   dK    = scale dS^T q            [Tk, D]
 *
 * where o is the entrywise product and rowsum sums over the keys, one number per
 * query row.
 *
 * 7a. softmax_backward: the softmax step alone. Given a row's weights p and the
 *     gradient dp of its weights, the gradient of its scores is
 *     ds_j = p_j * (dp_j - sum_l p_l dp_l). Write dscores = dS from weights = P and
 *     dweights = dP. A masked key has p_j = 0, so its ds_j must come out exactly 0.
 *
 * 7b. sdpa_backward: the whole head. weights is the forward's P (already 0 at a
 *     masked key); dout is dO. Write dq, dk and dv. mask is the forward's (may be
 *     NULL), passed for reference: with P in hand you need not read it. Note that
 *     dk and dv are sums over the query rows. You may call your softmax_backward.
 *
 * Index: q[i * D + d], k[j * D + d], v[j * Dv + e], weights[i * Tk + j],
 *        dout[i * Dv + e], dq[i * D + d], dk[j * D + d], dv[j * Dv + e];
 *        mask, dweights and dscores like weights.
 * Check it with `make exercises` (or `make exercises ONLY=7`; ONLY=7a grades 7a).
 */
#include <math.h>
#include <stdlib.h>

#include "exercises.h"

void softmax_backward(int Tq, int Tk, const float *weights /* P [Tq, Tk] */,
                      const float *dweights /* dP [Tq, Tk] */,
                      float *dscores /* dS [Tq, Tk] */)
{
    /* TODO: write this function (and delete this line when you start). */
}

void sdpa_backward(int Tq, int Tk, int D, int Dv, const float *q /* [Tq, D] */,
                   const float *k /* [Tk, D] */, const float *v /* [Tk, Dv] */,
                   const uint8_t *mask /* [Tq, Tk] or NULL */,
                   const float *weights /* P [Tq, Tk] */, const float *dout /* dO [Tq, Dv] */,
                   float *dq /* [Tq, D] */, float *dk /* [Tk, D] */, float *dv /* [Tk, Dv] */)
{
    /* TODO: write this function (and delete this line when you start). */
}
