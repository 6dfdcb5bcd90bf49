/*
 * test_nonfinite.c - what NaN and infinity in the inputs do, and what very large
 * logits do. The contract (README, "Non-finite numbers"):
 *
 *   - a NaN or an infinity touches only the rows it reaches: NaN in query row i
 *     makes output row i and weight row i NaN; NaN in key j makes NaN every row that
 *     may attend to j; NaN in value (j, d) makes NaN column d of every row that may
 *     attend to j; nothing else changes, bit for bit;
 *   - whatever is stored at a masked position never reaches the output;
 *   - scores of any finite size (1e4, 1e30) do not overflow the softmax: it starts
 *     from the row's maximum.
 *
 * Each claim is checked on the reference and on the default kernel on every
 * instruction-set path this machine runs. tests/test_nonfinite_paths.c sweeps the
 * same rule over the fused kernel's row and tile paths, masks and thread counts.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <string.h>

typedef int (*sdpa_fn)(attn_ctx *, const attn_tensor *, const attn_tensor *,
                       const attn_tensor *, const attn_sdpa_params *, attn_tensor *,
                       attn_tensor *);

enum { T = 7, D = 5 };

static attn_arch current_arch = ATTN_ARCH_AUTO;

/* The default kernel on the instruction-set path current_arch. */
static int sdpa_default(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                        const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                        attn_tensor *weights)
{
    attn_ctx local;
    attn_ctx_init(&local);
    local.arch = current_arch;
    (void)ctx;
    return attn_sdpa(&local, q, k, v, p, out, weights);
}

/* Runs causal attention on one head of T x D. */
static void run(sdpa_fn fn, const float *q, const float *k, const float *v,
                const attn_tensor *mask, float *o, float *w)
{
    attn_tensor tq = tu_tensor4((float *)q, 1, 1, T, D), tk = tu_tensor4((float *)k, 1, 1, T, D),
                tv = tu_tensor4((float *)v, 1, 1, T, D), to = tu_tensor4(o, 1, 1, T, D),
                tw = tu_tensor4(w, 1, 1, T, T);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    p.mask = mask;
    CHECK_INT(fn(NULL, &tq, &tk, &tv, &p, &to, &tw), ATTN_OK);
}

/* Row i of out/weights equals the clean run's row when keep(i), else is all NaN
 * (or, for `col` >= 0, NaN only in that output column). */
static void expect_rows(const float *o, const float *w, const float *o0, const float *w0,
                        const int *nan_rows, int col)
{
    for (int i = 0; i < T; i++)
        for (int d = 0; d < D; d++) {
            int want_nan = nan_rows[i] && (col < 0 || d == col);
            if (want_nan)
                CHECK(isnan(o[i * D + d]));
            else
                CHECK(memcmp(&o[i * D + d], &o0[i * D + d], sizeof(float)) == 0);
        }
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            int want_nan = nan_rows[i] && col < 0;
            if (want_nan && j <= i)
                CHECK(isnan(w[i * T + j]));
            else if (!want_nan)
                CHECK(memcmp(&w[i * T + j], &w0[i * T + j], sizeof(float)) == 0);
        }
}

static void test_paths(sdpa_fn fn)
{
    float q[T * D], k[T * D], v[T * D], o0[T * D], w0[T * T], o[T * D], w[T * T];
    tu_fill(q, T * D, 1);
    tu_fill(k, T * D, 2);
    tu_fill(v, T * D, 3);
    run(fn, q, k, v, NULL, o0, w0);

    TEST("NaN in query row 3 makes output row 3 and weight row 3 NaN, and nothing else changes");
    {
        float qq[T * D];
        memcpy(qq, q, sizeof q);
        qq[3 * D + 1] = NAN;
        run(fn, qq, k, v, NULL, o, w);
        int rows[T] = {0, 0, 0, 1, 0, 0, 0};
        expect_rows(o, w, o0, w0, rows, -1);
    }
    TEST("NaN in key 4 makes NaN exactly the rows that may attend to it (4, 5, 6 under the causal mask)");
    {
        float kk[T * D];
        memcpy(kk, k, sizeof k);
        kk[4 * D + 2] = NAN;
        run(fn, q, kk, v, NULL, o, w);
        int rows[T] = {0, 0, 0, 0, 1, 1, 1};
        expect_rows(o, w, o0, w0, rows, -1);
    }
    TEST("+infinity in key 5 makes NaN exactly the rows that see it (5, 6): inf - inf has no value");
    {
        /* Every query gets a positive component 0, so q . k5 is +inf, not -inf (a
         * score of -inf would only act like a masked key). */
        float kk[T * D], qq[T * D];
        memcpy(kk, k, sizeof k);
        memcpy(qq, q, sizeof q);
        for (int i = 0; i < T; i++)
            qq[i * D] = fabsf(qq[i * D]) + 0.1f;
        kk[5 * D + 0] = INFINITY;
        run(fn, qq, k, v, NULL, o0, w0);
        run(fn, qq, kk, v, NULL, o, w);
        for (int i = 0; i < 5; i++)
            for (int d = 0; d < D; d++)
                CHECK(memcmp(&o[i * D + d], &o0[i * D + d], sizeof(float)) == 0);
        for (int i = 5; i < T; i++) {
            int any_nan = 0;
            for (int d = 0; d < D; d++)
                any_nan += isnan(o[i * D + d]) != 0;
            CHECK_INT(any_nan, D);
        }
    }
    run(fn, q, k, v, NULL, o0, w0);
    TEST("NaN in value (2, 1) makes NaN column 1 of the rows that see key 2, and the weights stay as they were");
    {
        float vv[T * D];
        memcpy(vv, v, sizeof v);
        vv[2 * D + 1] = NAN;
        run(fn, q, k, vv, NULL, o, w);
        int rows[T] = {0, 0, 1, 1, 1, 1, 1};
        expect_rows(o, w, o0, w0, rows, 1);
        CHECK(memcmp(w, w0, sizeof w) == 0);
    }
    TEST("NaN and infinity stored in masked keys and values never reach the output");
    {
        float kk[T * D], vv[T * D];
        memcpy(kk, k, sizeof k);
        memcpy(vv, v, sizeof v);
        unsigned char pad[T] = {1, 1, 1, 1, 1, 0, 0}; /* keys 5 and 6 are pads */
        attn_tensor tm;
        const int64_t ms[4] = {1, 1, 1, T};
        attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, pad, 4, ms);
        run(fn, q, k, v, &tm, o0, w0);
        for (int d = 0; d < D; d++) {
            kk[5 * D + d] = NAN;
            vv[5 * D + d] = NAN;
            kk[6 * D + d] = INFINITY;
            vv[6 * D + d] = -INFINITY;
        }
        run(fn, q, kk, vv, &tm, o, w);
        CHECK(memcmp(o, o0, sizeof o) == 0);
        CHECK(memcmp(w, w0, sizeof w) == 0);
    }
    TEST("scores near 1e4 and 1e30 do not overflow the softmax: finite weights that sum to 1, as the double oracle says");
    {
        const float scales[3] = {1e2f, 1e4f, 1e15f};
        for (int s = 0; s < 3; s++) {
            float qq[T * D], kk[T * D];
            for (int i = 0; i < T * D; i++) {
                qq[i] = q[i] * scales[s];
                kk[i] = k[i] * scales[s];
            }
            run(fn, qq, kk, v, NULL, o, w);
            double oo[T * D], ow[T * T];
            unsigned char causal[T * T];
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++)
                    causal[i * T + j] = j <= i;
            tu_oracle(qq, kk, v, causal, 1, 1, T, T, D, D, 1.0 / sqrt((double)D), oo, ow);
            for (int i = 0; i < T; i++) {
                double sum = 0;
                for (int j = 0; j < T; j++) {
                    CHECK(isfinite(w[i * T + j]));
                    sum += w[i * T + j];
                }
                CHECK_NEAR(sum, 1.0, 1e-6, 0);
            }
            /* With scores this large a one-ulp change in a score moves the weights a
             * lot, so compare only where the oracle's row is decided (weights 0 or 1
             * to within 1e-6): that is every row for 1e4 and 1e15. */
            for (int i = 0; i < T * T; i++)
                if (s > 0)
                    CHECK_NEAR(w[i], ow[i], 1e-6, 0);
            for (int i = 0; i < T * D; i++)
                CHECK(isfinite(o[i]));
        }
    }
}

int main(void)
{
    fprintf(stderr, "== attn_sdpa_ref\n");
    test_paths(attn_sdpa_ref);
    const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        current_arch = archs[a];
        fprintf(stderr, "== attn_sdpa (default kernel), path %s\n", attn_arch_name(archs[a]));
        test_paths(sdpa_default);
    }
    return check_summary("test_nonfinite");
}
