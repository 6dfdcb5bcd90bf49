/*
 * max_weight.c - measures how sharp the softmax is with and without the 1/sqrt(D)
 * scale: for `rows` independent query rows, each with its own Tk keys, q and k
 * drawn from N(0, 1) (the unit-variance inputs under which the scale is derived),
 * it runs attn_sdpa_ref twice, with the default scale 1/sqrt(D) and with scale 1,
 * and prints percentiles of each row's largest weight. docs/exercises.md quotes
 * its output; tests/test_exercises.sh checks the quoted ranges.
 *
 *   exercise_max_weight [D [Tk [rows [seed]]]]     defaults: 64 5 10000 0
 */
#include <stdio.h>
#include <stdlib.h>

#include "attn.h"

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Row maxima of the weights [rows, Tk] under `scale` (0 = the default), sorted. */
static int row_maxima(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                      const attn_tensor *v, float scale, int64_t rows, int64_t Tk,
                      float *weights, float *maxima)
{
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    if (scale > 0) {
        p.has_scale = 1;
        p.scale = scale;
    }
    attn_tensor out, w;
    int64_t so[4] = {rows, 1, 1, 1}, sw[4] = {rows, 1, 1, Tk};
    float *out_data = malloc((size_t)rows * sizeof *out_data);
    if (!out_data)
        return ATTN_STATUS_NO_MEMORY;
    int st = attn_tensor_init(ctx, &out, ATTN_DTYPE_F32, out_data, 4, so);
    if (!st) st = attn_tensor_init(ctx, &w, ATTN_DTYPE_F32, weights, 4, sw);
    if (!st) st = attn_sdpa_ref(ctx, q, k, v, &p, &out, &w);
    free(out_data);
    if (st)
        return st;
    for (int64_t r = 0; r < rows; r++) {
        maxima[r] = 0.0f;
        for (int64_t j = 0; j < Tk; j++)
            if (weights[r * Tk + j] > maxima[r])
                maxima[r] = weights[r * Tk + j];
    }
    qsort(maxima, (size_t)rows, sizeof *maxima, cmp_float);
    return ATTN_OK;
}

int main(int argc, char **argv)
{
    const int64_t D = argc > 1 ? atoll(argv[1]) : 64, Tk = argc > 2 ? atoll(argv[2]) : 5,
                  rows = argc > 3 ? atoll(argv[3]) : 10000;
    const uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    if (D < 1 || Tk < 1 || rows < 1 || D > 4096 || Tk > 4096 || rows > 1000000) {
        fprintf(stderr, "usage: exercise_max_weight [D [Tk [rows [seed]]]] (sizes 1..4096, "
                        "rows 1..1000000)\n");
        return 2;
    }
    float *qd = malloc((size_t)(rows * D) * sizeof(float));
    float *kd = malloc((size_t)(rows * Tk * D) * sizeof(float));
    float *vd = malloc((size_t)(rows * Tk) * sizeof(float));
    float *wd = malloc((size_t)(rows * Tk) * sizeof(float));
    float *scaled = malloc((size_t)rows * sizeof(float));
    float *unscaled = malloc((size_t)rows * sizeof(float));
    int st = ATTN_STATUS_NO_MEMORY;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    if (qd && kd && vd && wd && scaled && unscaled) {
        attn_rng rng;
        attn_rng_seed(&rng, seed);
        attn_rng_randn(&rng, qd, rows * D);
        attn_rng_randn(&rng, kd, rows * Tk * D);
        attn_rng_randn(&rng, vd, rows * Tk);
        attn_tensor q, k, v;
        int64_t sq[4] = {rows, 1, 1, D}, sk[4] = {rows, 1, Tk, D}, sv[4] = {rows, 1, Tk, 1};
        st = attn_tensor_init(&ctx, &q, ATTN_DTYPE_F32, qd, 4, sq);
        if (!st) st = attn_tensor_init(&ctx, &k, ATTN_DTYPE_F32, kd, 4, sk);
        if (!st) st = attn_tensor_init(&ctx, &v, ATTN_DTYPE_F32, vd, 4, sv);
        if (!st) st = row_maxima(&ctx, &q, &k, &v, 0.0f, rows, Tk, wd, scaled);
        if (!st) st = row_maxima(&ctx, &q, &k, &v, 1.0f, rows, Tk, wd, unscaled);
    }
    if (!st) {
        printf("largest weight per row: D = %lld, Tk = %lld, %lld rows, q and k ~ N(0, 1), "
               "seed %llu\n", (long long)D, (long long)Tk, (long long)rows,
               (unsigned long long)seed);
        printf("%-18s %7s %7s %7s %7s %7s\n", "", "p10", "p25", "median", "p75", "p90");
        const double pct[5] = {0.10, 0.25, 0.50, 0.75, 0.90};
        const char *label[2] = {"scale 1/sqrt(D)", "no scale"};
        float *rowsets[2] = {scaled, unscaled};
        for (int s = 0; s < 2; s++) {
            printf("%-18s", label[s]);
            for (int i = 0; i < 5; i++)
                printf(" %7.3f", (double)rowsets[s][(int64_t)(pct[i] * (double)(rows - 1))]);
            printf("\n");
        }
    } else {
        fprintf(stderr, "exercise_max_weight: %s: %s\n", attn_status_name(st), ctx.message);
    }
    free(qd); free(kd); free(vd); free(wd); free(scaled); free(unscaled);
    return st ? 1 : 0;
}
