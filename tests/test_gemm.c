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

int main(void)
{
    TEST("attn_linear's GEMM stays within twice the reference's float32 error (plus "
         "1e-6) on every path, for every tail of rows, features and reduction length, "
         "with and without bias, on contiguous and strided views");
    static const int64_t Ms[] = {1, 5, 12, 13, 37, 100};
    static const int64_t Ns[] = {1, 7, 16, 33, 64, 70};
    static const int64_t Ks[] = {1, 3, 64, 300};
    double worst = 0;
    int n = 0;
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++)
        for (size_t j = 0; j < sizeof Ns / sizeof Ns[0]; j++)
            for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++, n++)
                run_case(Ms[i], Ns[j], Ks[k], n % 2, (n / 2) % 2, &worst);
    fprintf(stderr, "%d cases; worst error / bound = %.3f\n", n, worst);
    TEST("rows split over three leading axes with permuted strides give the bits of "
         "contiguous rows, and a packed weight the bits of the unpacked one, on every path");
    test_leading_axes();
    return check_summary("test_gemm");
}
