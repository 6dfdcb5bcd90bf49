/*
 * A deliberately broken exercise for the grader's self-test (tests/test_exercises.sh):
 * split_heads takes feature d * H + h instead of h * D + d.
 * The grader must name this mistake; the rest of the file is the model solution.
 */
#include "exercises.h"

void split_heads(int B, int T, int H, int D, const float *x /* [B, T, H*D] */,
                 float *heads /* [B, H, T, D] */)
{
    const int64_t E = (int64_t)H * D;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < D; d++)
                    heads[((b * H + h) * T + t) * D + d] = x[(b * T + t) * E + d * H + h];
}

void merge_heads(int B, int T, int H, int D, const float *heads /* [B, H, T, D] */,
                 float *x /* [B, T, H*D] */)
{
    const int64_t E = (int64_t)H * D;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    x[(b * T + t) * E + h * D + d] = heads[((b * H + h) * T + t) * D + d];
}
