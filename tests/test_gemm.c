/*
 * test_gemm.c - attn_linear's GEMM against the reference loop and a double oracle,
 * on every instruction-set path, over sizes that hit every tail of the micro-tiles
 * (rows, output features, the reduction length), with and without a bias, and on
 * strided views of x and y.
 *
 * The bound, as in the attention sweep: max |gemm - oracle| <= 2 * max |reference -
 * oracle| + 1e-6. The reference sums x[k] w[k] in increasing k with one rounding
 * per product and per addition; the GEMM uses fused multiply-adds in the same
 * order on the SIMD paths, which is never worse by more than that factor; the
 * floor (8 ulps at 1.0) covers K = 1, where the reference is exact. Inputs are
 * uniform in [-1, 1), so outputs stay below about sqrt(K) in size.
 */
#include "attn.h"
#include "check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fill(float *p, int64_t n, uint64_t seed)
{
    attn_rng rng;
    attn_rng_seed(&rng, seed);
    attn_rng_uniform(&rng, p, n, -1.0f, 1.0f);
}

/* x is [M, K], seen either contiguously or (strided = 1) as the transpose of a
 * [K, M] array; y is [M, N], contiguous or every other float of a [M, 2N] array. */
static void run_case(int64_t M, int64_t N, int64_t K, int with_bias, int strided,
                     double *worst)
{
    float *xm = malloc((size_t)(M * K) * sizeof(float));
    float *w = malloc((size_t)(N * K) * sizeof(float));
    float *b = malloc((size_t)N * sizeof(float));
    float *ym = malloc((size_t)(M * N * 2) * sizeof(float));
    float *yr = malloc((size_t)(M * N) * sizeof(float));
    fill(xm, M * K, (uint64_t)(M * 1000 + N * 10 + K));
    fill(w, N * K, 2);
    fill(b, N, 3);
    attn_tensor tx, tw, tb, ty, tyr;
    const int64_t sw[2] = {N, K}, sb[1] = {N}, sy[2] = {M, N};
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, w, 2, sw);
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, b, 1, sb);
    attn_tensor_init(NULL, &tyr, ATTN_DTYPE_F32, yr, 2, sy);
    if (strided) {
        const int64_t sxt[2] = {K, M};
        attn_tensor base;
        attn_tensor_init(NULL, &base, ATTN_DTYPE_F32, xm, 2, sxt);
        attn_tensor_transpose(NULL, &base, 0, 1, &tx);
        attn_tensor_init(NULL, &ty, ATTN_DTYPE_F32, ym, 2, sy);
        ty.stride[0] = 2 * N, ty.stride[1] = 2;
    } else {
        const int64_t sx[2] = {M, K};
        attn_tensor_init(NULL, &tx, ATTN_DTYPE_F32, xm, 2, sx);
        attn_tensor_init(NULL, &ty, ATTN_DTYPE_F32, ym, 2, sy);
    }
    /* The double oracle and the reference's error. */
    double *oracle = malloc((size_t)(M * N) * sizeof(double));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = with_bias ? b[n] : 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)((float *)tx.data)[m * tx.stride[0] + k * tx.stride[1]] *
                       (double)w[n * K + k];
            oracle[m * N + n] = acc;
        }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = ATTN_ARCH_REF;
    CHECK_INT(attn_linear(&ctx, &tx, &tw, with_bias ? &tb : NULL, &tyr), ATTN_OK);
    double err_ref = 0;
    for (int64_t i = 0; i < M * N; i++)
        err_ref = fmax(err_ref, fabs(yr[i] - oracle[i]));
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        ctx.arch = archs[a];
        ctx.threads = 2;
        for (int64_t i = 0; i < M * N * 2; i++)
            ym[i] = NAN;
        CHECK_INT(attn_linear(&ctx, &tx, &tw, with_bias ? &tb : NULL, &ty), ATTN_OK);
        double err = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double e = fabs(ym[m * ty.stride[0] + n * ty.stride[1]] - oracle[m * N + n]);
                err = e <= err ? err : (isnan(e) ? INFINITY : e);
            }
        const double bound = 2 * err_ref + 1e-6;
        if (!(err <= bound))
            fprintf(stderr, "  M=%lld N=%lld K=%lld bias=%d strided=%d arch=%s: err %.3g, "
                            "bound %.3g\n", (long long)M, (long long)N, (long long)K,
                    with_bias, strided, attn_arch_name(archs[a]), err, bound);
        CHECK(err <= bound);
        if (err / bound > *worst)
            *worst = err / bound;
        /* The gaps between strided y's elements are never written. */
        if (strided) {
            int untouched = 1;
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++)
                    untouched &= isnan(ym[m * 2 * N + 2 * n + 1]);
            CHECK(untouched);
        }
    }
    free(xm), free(w), free(b), free(ym), free(yr), free(oracle);
}

/* x [2, 3, 5, K] seen through permuted strides (a view of a [5, 3, 2, K] array)
 * and y [2, 3, 5, N] every other float of a larger array: the GEMM finds each row
 * from its three leading indices. The result must equal, bit for bit, the call on
 * contiguous copies, and a packed weight must give the bits of the unpacked one. */
static void test_leading_axes(void)
{
    enum { A0 = 2, A1 = 3, A2 = 5, K = 37, N = 45 };
    static float base[A2 * A1 * A0 * K], xc[A0 * A1 * A2 * K], w[N * K], b[N],
        ys[A0 * A1 * A2 * N * 2], yc[A0 * A1 * A2 * N], yp[A0 * A1 * A2 * N];
    fill(base, A2 * A1 * A0 * K, 7);
    fill(w, N * K, 8);
    fill(b, N, 9);
    attn_tensor tbase, tx, txc, tw, tb, ty, tyc, typ;
    const int64_t sbase[4] = {A2, A1, A0, K}, sx[4] = {A0, A1, A2, K}, sy[4] = {A0, A1, A2, N},
                  sw[2] = {N, K}, sb[1] = {N};
    attn_tensor_init(NULL, &tbase, ATTN_DTYPE_F32, base, 4, sbase);
    attn_tensor_transpose(NULL, &tbase, 0, 2, &tx); /* [A0, A1, A2, K], permuted strides */
    attn_tensor_init(NULL, &txc, ATTN_DTYPE_F32, xc, 4, sx);
    CHECK_INT(attn_tensor_copy(NULL, &tx, &txc), ATTN_OK);
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, w, 2, sw);
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, b, 1, sb);
    attn_tensor_init(NULL, &ty, ATTN_DTYPE_F32, ys, 4, sy);
    for (int i = 3; i >= 0; i--)
        ty.stride[i] *= 2;
    attn_tensor_init(NULL, &tyc, ATTN_DTYPE_F32, yc, 4, sy);
    attn_tensor_init(NULL, &typ, ATTN_DTYPE_F32, yp, 4, sy);
    const attn_arch archs[4] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                                ATTN_ARCH_AVX512};
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.arch = archs[a];
        ctx.threads = 2;
        attn_linear_packed *pl = NULL;
        CHECK_INT(attn_linear(&ctx, &tx, &tw, &tb, &ty), ATTN_OK);
        CHECK_INT(attn_linear(&ctx, &txc, &tw, &tb, &tyc), ATTN_OK);
        CHECK_INT(attn_linear_pack(&ctx, &tw, &tb, &pl), ATTN_OK);
        CHECK_INT(attn_linear_forward_packed(&ctx, &tx, pl, &typ), ATTN_OK);
        attn_linear_packed_free(&ctx, pl);
        int same = 1, same_packed = 1;
        for (int64_t r = 0; r < A0 * A1 * A2; r++)
            for (int64_t n = 0; n < N; n++) {
                same &= memcmp(&ys[(r * N + n) * 2], &yc[r * N + n], sizeof(float)) == 0;
                same_packed &= memcmp(&yp[r * N + n], &yc[r * N + n], sizeof(float)) == 0;
            }
        if (!same || !same_packed)
            fprintf(stderr, "  arch %s: strided %s, packed %s (y[0] %.9g vs %.9g vs %.9g)\n",
                    attn_arch_name(archs[a]), same ? "same" : "differs",
                    same_packed ? "same" : "differs", ys[0], yp[0], yc[0]);
        CHECK(same);
        CHECK(same_packed);
    }
}

/* One attn_linear call of x [M, K] W^T + b on arch with t threads into y. W is read
 * through w (row stride w_rs, column stride w_cs). */
static void linear_on(attn_arch arch, int t, const float *x, int64_t M, int64_t K,
                      const float *w, int64_t w_rs, int64_t w_cs, const float *b, int64_t N,
                      float *y)
{
    attn_tensor tx, tw, tb, ty;
    const int64_t sx[2] = {M, K}, sw[2] = {N, K}, sb[1] = {N}, sy[2] = {M, N};
    attn_tensor_init(NULL, &tx, ATTN_DTYPE_F32, (float *)x, 2, sx);
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, (float *)w, 2, sw);
    tw.stride[0] = w_rs, tw.stride[1] = w_cs;
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, (float *)b, 1, sb);
    attn_tensor_init(NULL, &ty, ATTN_DTYPE_F32, y, 2, sy);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = t;
    CHECK_INT(attn_linear(&ctx, &tx, &tw, &tb, &ty), ATTN_OK);
}

/* Shapes that span several work items both ways (AVX-512 on a 2 MiB L2 takes 128
 * rows x 96 features per item, others 48-64 rows x 64-192 features) with tails in
 * every direction: 1, 2 and 3 threads must give the same bits, and so must a
 * weight read through a transposed view, which the register-transpose packing
 * cannot take and the portable loop packs instead. */
static void test_threads_and_packing(void)
{
    static const int64_t shapes[][3] = {{300, 200, 113}, {113, 113, 17}, {129, 97, 48},
                                        {3, 1, 1}};
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *x = malloc((size_t)(M * K) * sizeof(float));
        float *w = malloc((size_t)(N * K) * sizeof(float));
        float *wt = malloc((size_t)(N * K) * sizeof(float)); /* W^T [K, N] */
        float *b = malloc((size_t)N * sizeof(float));
        float *y1 = malloc((size_t)(M * N) * sizeof(float));
        float *yt = malloc((size_t)(M * N) * sizeof(float));
        fill(x, M * K, 11 + (uint64_t)s);
        fill(w, N * K, 12 + (uint64_t)s);
        fill(b, N, 13);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                wt[k * N + n] = w[n * K + k];
        for (int a = 0; a < 3; a++) {
            if (!attn_arch_supported(archs[a]))
                continue;
            linear_on(archs[a], 1, x, M, K, w, K, 1, b, N, y1);
            for (int t = 2; t <= 3; t++) {
                linear_on(archs[a], t, x, M, K, w, K, 1, b, N, yt);
                const int same = memcmp(y1, yt, (size_t)(M * N) * sizeof(float)) == 0;
                if (!same)
                    fprintf(stderr, "  %s M=%lld N=%lld K=%lld: %d threads differ from 1 "
                                    "(y[last] %.9g vs %.9g)\n",
                            attn_arch_name(archs[a]), (long long)M, (long long)N, (long long)K,
                            t, yt[M * N - 1], y1[M * N - 1]);
                CHECK(same);
            }
            linear_on(archs[a], 2, x, M, K, wt, 1, N, b, N, yt);
            const int same = memcmp(y1, yt, (size_t)(M * N) * sizeof(float)) == 0;
            if (!same)
                fprintf(stderr, "  %s M=%lld N=%lld K=%lld: a transposed weight view differs "
                                "(y[0] %.9g vs %.9g)\n",
                        attn_arch_name(archs[a]), (long long)M, (long long)N, (long long)K, yt[0],
                        y1[0]);
            CHECK(same);
        }
        free(x), free(w), free(wt), free(b), free(y1), free(yt);
    }
}

int main(void)
{
    TEST("attn_linear's GEMM stays within twice the reference's float32 error (plus "
         "1e-6) on every path, for every tail of rows, features and reduction length, "
         "with and without bias, on contiguous and strided views, including shapes of "
         "several work items (M 113 and 300, N 113 and 200) and reductions (17, 113) "
         "that are no multiple of the packing's transposes");
    static const int64_t Ms[] = {1, 5, 12, 13, 37, 100};
    static const int64_t Ns[] = {1, 7, 16, 33, 64, 70};
    static const int64_t Ks[] = {1, 3, 64, 300};
    double worst = 0;
    int n = 0;
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++)
        for (size_t j = 0; j < sizeof Ns / sizeof Ns[0]; j++)
            for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++, n++)
                run_case(Ms[i], Ns[j], Ks[k], n % 2, (n / 2) % 2, &worst);
    static const int64_t Ms2[] = {113, 300};
    static const int64_t Ns2[] = {3, 113, 200};
    static const int64_t Ks2[] = {17, 113};
    for (size_t i = 0; i < sizeof Ms2 / sizeof Ms2[0]; i++)
        for (size_t j = 0; j < sizeof Ns2 / sizeof Ns2[0]; j++)
            for (size_t k = 0; k < sizeof Ks2 / sizeof Ks2[0]; k++, n++)
                run_case(Ms2[i], Ns2[j], Ks2[k], n % 2, (n / 2) % 2, &worst);
    fprintf(stderr, "%d cases; worst error / bound = %.3f\n", n, worst);
    TEST("rows split over three leading axes with permuted strides give the bits of "
         "contiguous rows, and a packed weight the bits of the unpacked one, on every path");
    test_leading_axes();
    TEST("1, 2 and 3 threads give the same bits on every path, over several work items "
         "with tails, and a transposed weight view packs to the same bits as a contiguous one");
    test_threads_and_packing();
    return check_summary("test_gemm");
}
