/*
 * Exercise 5: splitting into heads and merging them back.
 *
 * Multi-head attention cuts each position's E = H * D features into H slices of D
 * and lets every head attend on its own slice. The chapter writes the shapes:
 *
 *   split:  [B, T, E] -> [B, H, T, D]     x.view(B, T, H, D).transpose(1, 2)
 *   merge:  [B, H, T, D] -> [B, T, E]     heads.transpose(1, 2).reshape(B, T, E)
 *
 * so heads[b][h][t][d] = x[b][t][h * D + d]. The transpose matters: viewing x
 * directly as [B, H, T, D] (without it) keeps the numbers in memory order and
 * hands each "head" features of several positions, mixing tokens and heads.
 *
 * Index: x[(b * T + t) * E + h * D + d], heads[((b * H + h) * T + t) * D + d].
 * Check it with `make exercises` (or `make exercises ONLY=5`).
 */
#include "exercises.h"

void split_heads(int B, int T, int H, int D, const float *x /* [B, T, H*D] */,
                 float *heads /* [B, H, T, D] */)
{
    /* TODO: write this function (and delete this line when you start). */
}

void merge_heads(int B, int T, int H, int D, const float *heads /* [B, H, T, D] */,
                 float *x /* [B, T, H*D] */)
{
    /* TODO: write this function (and delete this line when you start). */
}
