/*
 * test_rope.c - rotary position embedding against PyTorch 2.15 (golden files from
 * tests/golden/gen_decode.py: both pairings, offsets, base 10000 and 500000, D up
 * to 128) and against a float64 oracle, plus the identities a cache relies on.
 *
 * Tolerances. attn follows PyTorch's float32 recipe (inv_freq = 1 / base^(2k/D),
 * angle = position * inv_freq, each rounded to float32), so the angle itself
 * carries float32 error: the exponent 2k/D rounds (relative eps/2, which the power
 * turns into ln(base) * eps/2 of inv_freq), pow and the division add a few ulps,
 * and the product with the position one more. An angle error dA moves each output
 * by at most (|a| + |b|) * dA. So against either reference an output may differ by
 *
 *     (|a| + |b|) * eps * (4 + |angle| * (4 + ln(base)))
 *
 * (eps = 2^-23; the 4 outside covers the rounding of cos, sin, two products and
 * a sum). Against PyTorch the same angle is computed the same way, and only its
 * pow, cos and sin may differ in the last bit, so most elements agree exactly;
 * the test prints how many.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/data"
#endif

#define EPS32 1.1920928955078125e-07

/* Feature indices of pair k. */
static void pair_of(attn_rope_pairing pairing, int64_t D, int64_t k, int64_t *i0, int64_t *i1)
{
    *i0 = pairing == ATTN_ROPE_HALF ? k : 2 * k;
    *i1 = pairing == ATTN_ROPE_HALF ? k + D / 2 : 2 * k + 1;
}

/* Compares got with want for x [rows, D] (rows at positions offset + (r % T)),
 * pair by pair under the bound above; returns the worst error / bound. */
static double compare_rows(const char *what, const float *x, const float *got, const double *want,
                           int64_t rows, int64_t T, int64_t D, int64_t offset, double base,
                           attn_rope_pairing pairing, long *exact)
{
    double worst = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double pos = (double)(offset + r % T);
        for (int64_t k = 0; k < D / 2; k++) {
            int64_t i0, i1;
            pair_of(pairing, D, k, &i0, &i1);
            const double a = x[r * D + i0], b = x[r * D + i1];
            const double angle = pos * pow(base, -2.0 * (double)k / (double)D);
            const double bound =
                (fabs(a) + fabs(b)) * EPS32 * (4.0 + angle * (4.0 + log(base))) + 1e-30;
            for (int m = 0; m < 2; m++) {
                const int64_t i = r * D + (m ? i1 : i0);
                const double err = fabs((double)got[i] - want[i]);
                if ((double)got[i] == want[i])
                    (*exact)++;
                if (err / bound > worst)
                    worst = err / bound;
                if (!(err <= bound)) {
                    fprintf(stderr, "  %s: row %lld feature %lld: %.9g vs %.9g (error %.3g, bound %.3g)\n",
                            what, (long long)r, (long long)(m ? i1 : i0), (double)got[i], want[i],
                            err, bound);
                    CHECK(err <= bound);
                    return worst;
                }
            }
        }
    }
    return worst;
}

static int load(const char *dir, const char *name, attn_array *a)
{
    char path[512];
    snprintf(path, sizeof path, "%s/golden_decode/%s/%s.npy", ATTN_TEST_DATA_DIR, dir, name);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int rc = attn_npy_load(&ctx, path, a);
    if (rc != ATTN_OK)
        fprintf(stderr, "  cannot load %s: %s\n", path, ctx.message);
    CHECK_INT(rc, ATTN_OK);
    return rc;
}

static void test_golden(void)
{
    TEST("RoPE equals PyTorch 2.15's (chapter 21's float32 recipe; Llama's rotate_half) for "
         "both pairings, offsets 0, 37 and 4090, base 10000 and 500000, D 8, 16 and 128");
    static const struct {
        const char *dir;
        attn_rope_pairing pairing;
        float base;
        int64_t offset;
    } cases[] = {
        {"rope_interleaved_d8", ATTN_ROPE_INTERLEAVED, 10000.0f, 0},
        {"rope_half_d8", ATTN_ROPE_HALF, 10000.0f, 0},
        {"rope_interleaved_offset", ATTN_ROPE_INTERLEAVED, 10000.0f, 37},
        {"rope_half_offset", ATTN_ROPE_HALF, 10000.0f, 37},
        {"rope_interleaved_base500k", ATTN_ROPE_INTERLEAVED, 500000.0f, 4090},
        {"rope_half_base500k", ATTN_ROPE_HALF, 500000.0f, 4090},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        attn_array x, want;
        if (load(cases[c].dir, "x", &x) || load(cases[c].dir, "out", &want))
            return;
        const attn_tensor *xt = &x.tensor;
        const int64_t n = attn_tensor_numel(xt), T = xt->shape[2], D = xt->shape[3];
        float *got = malloc((size_t)n * sizeof *got);
        double *w = malloc((size_t)n * sizeof *w);
        attn_tensor out = tu_tensor4(got, xt->shape[0], xt->shape[1], T, D);
        attn_rope_params p;
        attn_rope_params_init(&p);
        p.pairing = cases[c].pairing;
        p.base = cases[c].base;
        p.offset = cases[c].offset;
        CHECK_INT(attn_rope_apply(NULL, &p, xt, &out), ATTN_OK);
        for (int64_t i = 0; i < n; i++)
            w[i] = ((const float *)want.tensor.data)[i];
        long exact = 0;
        double worst = compare_rows(cases[c].dir, xt->data, got, w, n / D, T, D, p.offset,
                                    p.base, p.pairing, &exact);
        fprintf(stderr, "   %s: %ld of %lld elements equal PyTorch's bit for bit; worst "
                        "error / bound %.3f\n", cases[c].dir, exact, (long long)n, worst);
        free(got);
        free(w);
        attn_array_free(NULL, &x);
        attn_array_free(NULL, &want);
    }
}

/* The float64 oracle: the rotation by the exact angle position * base^(-2k/D). */
static void oracle(const float *x, double *out, int64_t rows, int64_t T, int64_t D,
                   int64_t offset, double base, attn_rope_pairing pairing)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < D / 2; k++) {
            int64_t i0, i1;
            pair_of(pairing, D, k, &i0, &i1);
            const double angle = (double)(offset + r % T) * pow(base, -2.0 * (double)k / (double)D);
            const double a = x[r * D + i0], b = x[r * D + i1];
            out[r * D + i0] = a * cos(angle) - b * sin(angle);
            out[r * D + i1] = a * sin(angle) + b * cos(angle);
        }
}

static void test_oracle_and_norms(void)
{
    TEST("RoPE stays within the float32 angle bound of a float64 oracle and keeps each "
         "pair's norm to 4 ulps, for D 2 to 256, offsets up to 100000, bases 10000, 500000 "
         "and 1.5, both pairings");
    static const int64_t dims[] = {2, 6, 64, 130, 256};
    static const int64_t offsets[] = {0, 1, 4093, 100000};
    static const float bases[] = {10000.0f, 500000.0f, 1.5f};
    const int64_t B = 2, H = 3, T = 5;
    double worst = 0.0;
    long exact = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++)
            for (size_t bi = 0; bi < sizeof bases / sizeof bases[0]; bi++)
                for (int pr = 0; pr < 2; pr++) {
                    const int64_t D = dims[di], n = B * H * T * D;
                    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
                    double *want = malloc((size_t)n * sizeof *want);
                    tu_fill(x, n, (uint64_t)(di * 100 + oi * 10 + bi + 1));
                    attn_rope_params p;
                    attn_rope_params_init(&p);
                    p.pairing = pr ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
                    p.base = bases[bi];
                    p.offset = offsets[oi];
                    attn_tensor xt = tu_tensor4(x, B, H, T, D), yt = tu_tensor4(y, B, H, T, D);
                    CHECK_INT(attn_rope_apply(NULL, &p, &xt, &yt), ATTN_OK);
                    oracle(x, want, B * H * T, T, D, p.offset, p.base, p.pairing);
                    double w = compare_rows("oracle", x, y, want, B * H * T, T, D, p.offset,
                                            p.base, p.pairing, &exact);
                    if (w > worst)
                        worst = w;
                    for (int64_t r = 0; r < B * H * T; r++)
                        for (int64_t k = 0; k < D / 2; k++) {
                            int64_t i0, i1;
                            pair_of(p.pairing, D, k, &i0, &i1);
                            const double before = hypot(x[r * D + i0], x[r * D + i1]);
                            const double after = hypot(y[r * D + i0], y[r * D + i1]);
                            if (!(fabs(after - before) <= 4.0 * EPS32 * before)) {
                                fprintf(stderr, "  pair %lld of row %lld: norm %.9g became %.9g\n",
                                        (long long)k, (long long)r, before, after);
                                CHECK(fabs(after - before) <= 4.0 * EPS32 * before);
                                r = B * H * T;
                                break;
                            }
                        }
                    free(x);
                    free(y);
                    free(want);
                }
    fprintf(stderr, "   worst error / bound against the oracle: %.3f\n", worst);
}

static void test_identities(void)
{
    TEST("RoPE in place equals RoPE out of place bit for bit, a strided view gives the "
         "same bits, position 0 is left as it is, an offset equals the same rows of a "
         "longer sequence, and the half pairing is the interleaved one on features "
         "reordered (k, k + D/2) -> (2k, 2k + 1)");
    const int64_t B = 2, H = 3, T = 9, D = 10, n = B * H * T * D;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    float *z = malloc((size_t)n * sizeof *z), *wide = malloc((size_t)(2 * n) * sizeof *wide);
    tu_fill(x, n, 99);
    for (int pr = 0; pr < 2; pr++) {
        attn_rope_params p;
        attn_rope_params_init(&p);
        p.pairing = pr ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
        p.offset = 3;
        attn_tensor xt = tu_tensor4(x, B, H, T, D), yt = tu_tensor4(y, B, H, T, D),
                    zt = tu_tensor4(z, B, H, T, D);
        CHECK_INT(attn_rope_apply(NULL, &p, &xt, &yt), ATTN_OK);
        memcpy(z, x, (size_t)n * sizeof *z);
        CHECK_INT(attn_rope_apply(NULL, &p, &zt, &zt), ATTN_OK);
        CHECK(memcmp(y, z, (size_t)n * sizeof *y) == 0);

        /* Every other float of a wider buffer. */
        for (int64_t i = 0; i < n; i++)
            wide[2 * i] = x[i];
        attn_tensor st = xt;
        st.data = wide;
        for (int d = 0; d < 4; d++)
            st.stride[d] *= 2;
        CHECK_INT(attn_rope_apply(NULL, &p, &st, &st), ATTN_OK);
        int same = 1;
        for (int64_t i = 0; i < n; i++)
            same &= memcmp(&wide[2 * i], &y[i], sizeof(float)) == 0;
        CHECK(same);

        /* Rows 3.. of x at offset 0 are rows 0.. of x[:, :, 3:] at offset 3. */
        p.offset = 0;
        CHECK_INT(attn_rope_apply(NULL, &p, &xt, &yt), ATTN_OK);
        attn_tensor tail, tail_out;
        CHECK_INT(attn_tensor_narrow(NULL, &xt, 2, 3, T - 3, &tail), ATTN_OK);
        CHECK_INT(attn_tensor_narrow(NULL, &zt, 2, 3, T - 3, &tail_out), ATTN_OK);
        p.offset = 3;
        CHECK_INT(attn_rope_apply(NULL, &p, &tail, &tail_out), ATTN_OK);
        same = 1;
        for (int64_t r = 0; r < B * H * T; r++) {
            if (r % T < 3)
                same &= memcmp(&y[r * D], &x[r * D], (size_t)D * sizeof(float)) == 0 ||
                        r % T != 0; /* row 0: cos 0 = 1, sin 0 = 0 */
            else
                same &= memcmp(&y[r * D], &z[r * D], (size_t)D * sizeof(float)) == 0;
        }
        CHECK(same);
    }
    /* half on x == interleaved on x reordered, reordered back. */
    attn_rope_params ph, pi;
    attn_rope_params_init(&ph);
    attn_rope_params_init(&pi);
    ph.pairing = ATTN_ROPE_HALF;
    ph.offset = pi.offset = 11;
    ph.base = pi.base = 500000.0f;
    for (int64_t r = 0; r < B * H * T; r++)
        for (int64_t k = 0; k < D / 2; k++) {
            z[r * D + 2 * k] = x[r * D + k];
            z[r * D + 2 * k + 1] = x[r * D + k + D / 2];
        }
    attn_tensor xt = tu_tensor4(x, B, H, T, D), yt = tu_tensor4(y, B, H, T, D),
                zt = tu_tensor4(z, B, H, T, D);
    CHECK_INT(attn_rope_apply(NULL, &ph, &xt, &yt), ATTN_OK);
    CHECK_INT(attn_rope_apply(NULL, &pi, &zt, &zt), ATTN_OK);
    int same = 1;
    for (int64_t r = 0; r < B * H * T; r++)
        for (int64_t k = 0; k < D / 2; k++)
            same &= y[r * D + k] == z[r * D + 2 * k] && y[r * D + k + D / 2] == z[r * D + 2 * k + 1];
    CHECK(same);
    free(x);
    free(y);
    free(z);
    free(wide);
}

int main(void)
{
    test_golden();
    test_oracle_and_norms();
    test_identities();
    return check_summary("test_rope");
}
