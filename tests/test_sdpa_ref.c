/*
 * test_sdpa_ref.c - the reference scaled dot-product attention does what the
 * chapter says: rows of weights sum to 1, masked keys get exactly 0, Tq != Tk works,
 * the numbers agree with an independent double-precision computation, small cases
 * agree with arithmetic done by hand, and every bad input is refused with a message
 * that names the shapes. The same claims are checked through attn_sdpa (the default
 * path) so that whichever kernel it picks is held to them.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef int (*sdpa_fn)(attn_ctx *, const attn_tensor *, const attn_tensor *,
                       const attn_tensor *, const attn_sdpa_params *, attn_tensor *,
                       attn_tensor *);

/* float32 against the double oracle: inputs in [-1, 1], at most 128-term dot
 * products; float32's rounding (6e-8 per operation) accumulated over such sums stays
 * well below 2e-5 absolute, and softmax weights are in [0, 1]. */
#define ATOL 2e-5
#define RTOL 1e-5

/* Runs fn on random q, k, v with an optional mask [B, H, Tq, Tk] (full shape) and
 * compares output and weights with the oracle. */
static void compare_with_oracle(sdpa_fn fn, const char *what, int64_t B, int64_t H, int64_t Tq,
                                int64_t Tk, int64_t D, int64_t Dv, const unsigned char *mask,
                                int causal, uint64_t seed)
{
    int64_t nq = B * H * Tq * D, nk = B * H * Tk * D, nv = B * H * Tk * Dv;
    int64_t no = B * H * Tq * Dv, nw = B * H * Tq * Tk;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4);
    float *o = malloc(no * 4), *w = malloc(nw * 4);
    double *oo = malloc(no * 8), *ow = malloc(nw * 8);
    unsigned char *full = malloc(nw);
    tu_fill(q, nq, seed);
    tu_fill(k, nk, seed + 1);
    tu_fill(v, nv, seed + 2);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < Tq; i++)
            for (int64_t j = 0; j < Tk; j++) {
                int64_t at = (bh * Tq + i) * Tk + j;
                full[at] = (!mask || mask[at]) && (!causal || j <= i);
            }
    attn_tensor tq = tu_tensor4(q, B, H, Tq, D), tk = tu_tensor4(k, B, H, Tk, D),
                tv = tu_tensor4(v, B, H, Tk, Dv), to = tu_tensor4(o, B, H, Tq, Dv),
                tw = tu_tensor4(w, B, H, Tq, Tk), tm;
    const int64_t mshape[4] = {B, H, Tq, Tk};
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, (void *)mask, 4, mshape);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = mask ? &tm : NULL;
    p.causal = causal;
    p.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int rc = fn(&ctx, &tq, &tk, &tv, &p, &to, &tw);
    CHECK_INT(rc, ATTN_OK);
    tu_oracle(q, k, v, full, B, H, Tq, Tk, D, Dv, 1.0 / sqrt((double)D), oo, ow);
    double max_o = 0, max_w = 0;
    int bad = 0;
    for (int64_t i = 0; i < no; i++) {
        double e = fabs(o[i] - oo[i]);
        max_o = e > max_o ? e : max_o;
        bad += !(e <= ATOL + RTOL * fabs(oo[i]));
    }
    for (int64_t i = 0; i < nw; i++) {
        double e = fabs(w[i] - ow[i]);
        max_w = e > max_w ? e : max_w;
        bad += !(e <= ATOL + RTOL * fabs(ow[i]));
    }
    if (bad)
        fprintf(stderr, "  %s B=%lld H=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld: %d entries off, "
                        "max |err| out %.3g weights %.3g\n",
                what, (long long)B, (long long)H, (long long)Tq, (long long)Tk, (long long)D,
                (long long)Dv, bad, max_o, max_w);
    CHECK_INT(bad, 0);
    free(q), free(k), free(v), free(o), free(w), free(oo), free(ow), free(full);
}

static void test_against_oracle(sdpa_fn fn, const char *what)
{
    TEST("outputs and weights agree with a double-precision oracle (no mask, causal, random mask, Tq != Tk)");
    const int64_t sizes[][6] = {{1, 1, 1, 1, 1, 1},  {2, 4, 5, 5, 4, 4},   {1, 3, 17, 17, 8, 8},
                                {2, 2, 3, 7, 5, 3},  {1, 2, 113, 64, 40, 40}, {3, 1, 1, 255, 64, 64}};
    for (size_t n = 0; n < sizeof sizes / sizeof sizes[0]; n++) {
        const int64_t *s = sizes[n];
        compare_with_oracle(fn, what, s[0], s[1], s[2], s[3], s[4], s[5], NULL, 0, 10 + n);
        if (s[2] == s[3])
            compare_with_oracle(fn, what, s[0], s[1], s[2], s[3], s[4], s[5], NULL, 1, 20 + n);
        int64_t nm = s[0] * s[1] * s[2] * s[3];
        unsigned char *m = malloc(nm);
        uint64_t st = 99 + n;
        for (int64_t i = 0; i < nm; i++)
            m[i] = tu_uniform(&st) > -0.4f; /* about 70% visible, some rows empty */
        compare_with_oracle(fn, what, s[0], s[1], s[2], s[3], s[4], s[5], m, 0, 30 + n);
        free(m);
    }
}

/* The chapter's toy size with the combined padding + causal mask [B, 1, T, T]. */
static void test_masks_zero_weights(sdpa_fn fn)
{
    enum { B = 2, H = 4, T = 5, D = 4 };
    float q[B * H * T * D], k[B * H * T * D], v[B * H * T * D], o[B * H * T * D], w[B * H * T * T];
    tu_fill(q, B * H * T * D, 1);
    tu_fill(k, B * H * T * D, 2);
    tu_fill(v, B * H * T * D, 3);
    int64_t ids_data[B * T] = {1, 2, 3, 4, 0, 6, 7, 8, 0, 0};
    unsigned char pad[B * T], causal[T * T], comb[B * T * T];
    attn_tensor ids, tpad, tcausal, tcomb;
    const int64_t ids_shape[2] = {B, T}, pad_shape[4] = {B, 1, 1, T},
                  causal_shape[4] = {1, 1, T, T}, comb_shape[4] = {B, 1, T, T};
    attn_tensor_init(NULL, &ids, ATTN_DTYPE_I64, ids_data, 2, ids_shape);
    attn_tensor_init(NULL, &tpad, ATTN_DTYPE_BOOL, pad, 4, pad_shape);
    attn_tensor_init(NULL, &tcausal, ATTN_DTYPE_BOOL, causal, 4, causal_shape);
    attn_tensor_init(NULL, &tcomb, ATTN_DTYPE_BOOL, comb, 4, comb_shape);
    CHECK_INT(attn_mask_padding(NULL, &ids, 0, &tpad), ATTN_OK);
    CHECK_INT(attn_mask_causal(NULL, T, &tcausal), ATTN_OK);
    CHECK_INT(attn_mask_and(NULL, &tpad, &tcausal, &tcomb), ATTN_OK);

    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D),
                tw = tu_tensor4(w, B, H, T, T);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &tcomb;
    CHECK_INT(fn(NULL, &tq, &tk, &tv, &p, &to, &tw), ATTN_OK);

    TEST("each row of weights sums to 1");
    TEST("a padded key gets exactly 0 weight");
    TEST("a future key under the causal mask gets exactly 0 weight");
    TEST("the combined [B, 1, T, T] mask applies to every head");
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                double sum = 0;
                for (int j = 0; j < T; j++) {
                    float x = w[((b * H + h) * T + i) * T + j];
                    sum += x;
                    if (ids_data[b * T + j] == 0)
                        CHECK(x == 0.0f); /* padded key */
                    if (j > i)
                        CHECK(x == 0.0f); /* future key */
                    if (j <= i && ids_data[b * T + j] != 0)
                        CHECK(x > 0.0f); /* visible keys keep some weight */
                }
                CHECK_NEAR(sum, 1.0, 1e-6, 0);
            }
    TEST("query 0 sees only itself: its weight row is one-hot and its output is v[0]");
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            CHECK(w[((b * H + h) * T) * T] == 1.0f);
            for (int d = 0; d < D; d++)
                CHECK_NEAR(o[((b * H + h) * T) * D + d], v[((b * H + h) * T) * D + d], 1e-7, 0);
        }
}

static void test_by_hand(sdpa_fn fn)
{
    TEST("equal scores give uniform weights: q = 0 makes every score 0, so weights are 1/Tk and the output is the mean of v");
    {
        float q[2 * 3] = {0}, k[4 * 3], v[4 * 2] = {1, 10, 2, 20, 3, 30, 6, 60}, o[2 * 2], w[2 * 4];
        tu_fill(k, 12, 5);
        attn_tensor tq = tu_tensor4(q, 1, 1, 2, 3), tk = tu_tensor4(k, 1, 1, 4, 3),
                    tv = tu_tensor4(v, 1, 1, 4, 2), to = tu_tensor4(o, 1, 1, 2, 2),
                    tw = tu_tensor4(w, 1, 1, 2, 4);
        CHECK_INT(fn(NULL, &tq, &tk, &tv, NULL, &to, &tw), ATTN_OK);
        for (int i = 0; i < 8; i++)
            CHECK_NEAR(w[i], 0.25, 1e-7, 0);
        CHECK_NEAR(o[0], 3.0, 1e-6, 0);  /* (1 + 2 + 3 + 6) / 4 */
        CHECK_NEAR(o[1], 30.0, 1e-5, 0); /* (10 + 20 + 30 + 60) / 4 */
    }
    TEST("a caller scale of 0 makes every score 0: uniform weights, the mean of v");
    {
        float q[2 * 3], k[4 * 3], v[4 * 2] = {1, 10, 2, 20, 3, 30, 6, 60}, o[2 * 2], w[2 * 4];
        tu_fill(q, 6, 4);
        tu_fill(k, 12, 5);
        attn_tensor tq = tu_tensor4(q, 1, 1, 2, 3), tk = tu_tensor4(k, 1, 1, 4, 3),
                    tv = tu_tensor4(v, 1, 1, 4, 2), to = tu_tensor4(o, 1, 1, 2, 2),
                    tw = tu_tensor4(w, 1, 1, 2, 4);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.has_scale = 1;
        p.scale = 0.0f;
        CHECK_INT(fn(NULL, &tq, &tk, &tv, &p, &to, &tw), ATTN_OK);
        for (int i = 0; i < 8; i++)
            CHECK_NEAR(w[i], 0.25, 1e-7, 0);
        CHECK_NEAR(o[0], 3.0, 1e-6, 0);
        CHECK_NEAR(o[3], 30.0, 1e-5, 0);
    }
    TEST("a one-hot score picks one value row: a score 100 above the others gives weight 1 to that key");
    {
        /* D = 1, scale 1: score j = q * k[j]; k = (0, 0, 1, 0), q = 100. */
        float q[1] = {100}, k[4] = {0, 0, 1, 0}, v[4 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
        float o[3], w[4];
        attn_tensor tq = tu_tensor4(q, 1, 1, 1, 1), tk = tu_tensor4(k, 1, 1, 4, 1),
                    tv = tu_tensor4(v, 1, 1, 4, 3), to = tu_tensor4(o, 1, 1, 1, 3),
                    tw = tu_tensor4(w, 1, 1, 1, 4);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.has_scale = 1;
        p.scale = 1.0f;
        CHECK_INT(fn(NULL, &tq, &tk, &tv, &p, &to, &tw), ATTN_OK);
        CHECK(w[2] == 1.0f); /* 1 / (1 + 3 e^-100) rounds to exactly 1 in float */
        CHECK_NEAR(o[0], 7.0, 1e-6, 0);
        CHECK_NEAR(o[1], 8.0, 1e-6, 0);
        CHECK_NEAR(o[2], 9.0, 1e-6, 0);
    }
    TEST("two keys with scores 0 and ln 3 get weights 1/4 and 3/4 (scale 1/sqrt(D) applied: D = 4)");
    {
        /* q . k1 = 2 ln 3 with D = 4, so the scaled score is ln 3. */
        float l3 = (float)log(3.0);
        float q[4] = {1, 0, 0, 0}, k[2 * 4] = {0, 0, 0, 0, 2 * l3, 0, 0, 0}, v[2] = {4, 8};
        float o[1], w[2];
        attn_tensor tq = tu_tensor4(q, 1, 1, 1, 4), tk = tu_tensor4(k, 1, 1, 2, 4),
                    tv = tu_tensor4(v, 1, 1, 2, 1), to = tu_tensor4(o, 1, 1, 1, 1),
                    tw = tu_tensor4(w, 1, 1, 1, 2);
        CHECK_INT(fn(NULL, &tq, &tk, &tv, NULL, &to, &tw), ATTN_OK);
        CHECK_NEAR(w[0], 0.25, 1e-6, 0);
        CHECK_NEAR(w[1], 0.75, 1e-6, 0);
        CHECK_NEAR(o[0], 7.0, 1e-5, 0); /* 4/4 + 8*3/4 */
    }
}

static void test_empty_rows(sdpa_fn fn)
{
    float q[3 * 2], k[3 * 2], v[3 * 2], o[3 * 2], w[3 * 3];
    tu_fill(q, 6, 7);
    tu_fill(k, 6, 8);
    tu_fill(v, 6, 9);
    unsigned char m[3 * 3] = {1, 1, 0, 0, 0, 0, 1, 0, 1}; /* row 1 sees nothing */
    attn_tensor tq = tu_tensor4(q, 1, 1, 3, 2), tk = tu_tensor4(k, 1, 1, 3, 2),
                tv = tu_tensor4(v, 1, 1, 3, 2), to = tu_tensor4(o, 1, 1, 3, 2),
                tw = tu_tensor4(w, 1, 1, 3, 3), tm;
    const int64_t ms[2] = {3, 3};
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, m, 2, ms);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &tm;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    TEST("a fully masked query row is an error by default, naming the row");
    CHECK_INT(fn(&ctx, &tq, &tk, &tv, &p, &to, &tw), ATTN_STATUS_EMPTY_ROW);
    CHECK_STR_CONTAINS(ctx.message, "query 1 of batch 0, head 0 has all 3 keys masked");
    TEST("with empty_rows = zero such a row gets zero output and zero weights, and no NaN anywhere");
    p.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    for (int i = 0; i < 6; i++)
        o[i] = NAN;
    for (int i = 0; i < 9; i++)
        w[i] = NAN;
    CHECK_INT(fn(&ctx, &tq, &tk, &tv, &p, &to, &tw), ATTN_OK);
    CHECK(o[2] == 0.0f && o[3] == 0.0f);
    CHECK(w[3] == 0.0f && w[4] == 0.0f && w[5] == 0.0f);
    for (int i = 0; i < 6; i++)
        CHECK(!isnan(o[i]));
    for (int i = 0; i < 9; i++)
        CHECK(!isnan(w[i]));
    CHECK_NEAR(w[0] + w[1], 1.0, 1e-6, 0);
    CHECK_NEAR(w[6] + w[8], 1.0, 1e-6, 0);
    TEST("values and keys stored at masked positions never reach the output (poisoned with NaN)");
    /* The new mask hides key 2 from every query; its key and value rows are NaN. */
    k[2 * 2] = k[2 * 2 + 1] = NAN;
    v[2 * 2] = v[2 * 2 + 1] = NAN;
    unsigned char m2[9] = {1, 1, 0, 1, 1, 0, 1, 1, 0};
    tm.data = m2;
    CHECK_INT(fn(&ctx, &tq, &tk, &tv, &p, &to, &tw), ATTN_OK);
    for (int i = 0; i < 6; i++)
        CHECK(!isnan(o[i]));
    for (int i = 0; i < 9; i++)
        CHECK(!isnan(w[i]));
}

static void test_errors(sdpa_fn fn)
{
    float buf[4096];
    tu_fill(buf, 4096, 3);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_tensor q = tu_tensor4(buf, 2, 1, 3, 4), k = tu_tensor4(buf, 2, 1, 3, 4),
                v = tu_tensor4(buf, 2, 1, 3, 4), o = tu_tensor4(buf + 2048, 2, 1, 3, 4);

    TEST("q and k with different head_dim are refused, naming both shapes");
    attn_tensor k5 = tu_tensor4(buf, 2, 1, 3, 5);
    CHECK_INT(fn(&ctx, &q, &k5, &v, NULL, &o, NULL), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "q and k head_dim differ: q (2, 1, 3, 4) has D=4, k (2, 1, 3, 5) has D=5");

    TEST("k and v of different lengths are refused, naming both shapes");
    attn_tensor v4 = tu_tensor4(buf, 2, 1, 4, 4);
    CHECK_INT(fn(&ctx, &q, &k, &v4, NULL, &o, NULL), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "k and v lengths differ: k (2, 1, 3, 4) has Tk=3, v (2, 1, 4, 4) has Tk=4");

    TEST("a mask that does not broadcast is refused, naming both shapes");
    unsigned char m[25] = {0};
    attn_tensor tm;
    const int64_t ms[2] = {5, 5};
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, m, 2, ms);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &tm;
    CHECK_INT(fn(&ctx, &q, &k, &v, &p, &o, NULL), ATTN_STATUS_MASK_BROADCAST);
    CHECK_STR_CONTAINS(ctx.message, "mask shape (5, 5) does not broadcast to (2, 1, 3, 3)");

    TEST("a float mask is refused: masks are boolean");
    attn_tensor fm = tu_tensor4(buf, 1, 1, 3, 3);
    p.mask = &fm;
    CHECK_INT(fn(&ctx, &q, &k, &v, &p, &o, NULL), ATTN_STATUS_DTYPE);

    TEST("an unknown causal value is refused, naming it");
    attn_tensor q2 = tu_tensor4(buf, 2, 1, 2, 4), o2 = tu_tensor4(buf + 2048, 2, 1, 2, 4);
    attn_sdpa_params_init(&p);
    p.causal = 3;
    CHECK_INT(fn(&ctx, &q2, &k, &v, &p, &o2, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "unknown causal value 3");

    TEST("an output of the wrong shape is refused");
    attn_tensor obad = tu_tensor4(buf + 2048, 2, 1, 3, 3);
    CHECK_INT(fn(&ctx, &q, &k, &v, NULL, &obad, NULL), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "out has shape (2, 1, 3, 3); expected (2, 1, 3, 4)");

    TEST("weights of the wrong shape are refused");
    attn_tensor wbad = tu_tensor4(buf + 3000, 2, 1, 3, 4);
    CHECK_INT(fn(&ctx, &q, &k, &v, NULL, &o, &wbad), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "weights has shape (2, 1, 3, 4); expected (2, 1, 3, 3)");

    TEST("a size below 1, a NULL tensor, a NULL data pointer and a non-finite scale are refused");
    attn_tensor z = q;
    z.shape[2] = 0;
    CHECK_INT(fn(&ctx, &z, &k, &v, NULL, &o, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "sizes must be at least 1");
    CHECK_INT(fn(&ctx, NULL, &k, &v, NULL, &o, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "q is NULL");
    attn_tensor nodata = q;
    nodata.data = NULL;
    CHECK_INT(fn(&ctx, &nodata, &k, &v, NULL, &o, NULL), ATTN_STATUS_INVALID_ARGUMENT);
    attn_sdpa_params_init(&p);
    p.has_scale = 1;
    p.scale = INFINITY;
    CHECK_INT(fn(&ctx, &q, &k, &v, &p, &o, NULL), ATTN_STATUS_INVALID_ARGUMENT);

    TEST("sizes whose offsets overflow 64 bits are refused");
    attn_tensor huge = q;
    huge.shape[0] = (int64_t)1 << 62;
    huge.stride[0] = 1 << 4;
    CHECK_INT(fn(&ctx, &huge, &k, &v, NULL, &o, NULL), ATTN_STATUS_OVERFLOW);
}

static void test_cross_and_views(sdpa_fn fn)
{
    TEST("cross-attention with Tq != Tk and Dv != D gives [B, H, Tq, Dv] and [B, H, Tq, Tk]");
    compare_with_oracle(fn, "cross", 2, 3, 4, 9, 6, 2, NULL, 0, 77);

    TEST("a caller scale replaces 1/sqrt(D)");
    {
        float q[3 * 4], k[5 * 4], v[5 * 2], o1[3 * 2], o2[3 * 2];
        tu_fill(q, 12, 1);
        tu_fill(k, 20, 2);
        tu_fill(v, 10, 3);
        attn_tensor tq = tu_tensor4(q, 1, 1, 3, 4), tk = tu_tensor4(k, 1, 1, 5, 4),
                    tv = tu_tensor4(v, 1, 1, 5, 2), to1 = tu_tensor4(o1, 1, 1, 3, 2),
                    to2 = tu_tensor4(o2, 1, 1, 3, 2);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.has_scale = 1;
        p.scale = 2.0f;
        CHECK_INT(fn(NULL, &tq, &tk, &tv, &p, &to1, NULL), ATTN_OK);
        /* Scale 2 on q equals scale 1/sqrt(4) = 0.5 on 4 q. */
        for (int i = 0; i < 12; i++)
            q[i] *= 4.0f;
        CHECK_INT(fn(NULL, &tq, &tk, &tv, NULL, &to2, NULL), ATTN_OK);
        double oo[6];
        for (int i = 0; i < 12; i++)
            q[i] /= 4.0f;
        tu_oracle(q, k, v, NULL, 1, 1, 3, 5, 4, 2, 2.0, oo, NULL);
        for (int i = 0; i < 6; i++) {
            CHECK_NEAR(o1[i], oo[i], ATOL, RTOL);
            CHECK_NEAR(o1[i], o2[i], 1e-6, 1e-6);
        }
    }

    TEST("strided views (q, k, v as [B, T, H, D] memory seen as [B, H, T, D]) give the same result as contiguous copies");
    {
        enum { B = 2, T = 6, H = 3, D = 4 };
        float mem[3][B * T * H * D], cont[3][B * H * T * D], o1[B * H * T * D], o2[B * H * T * D];
        attn_tensor views[3], conts[3];
        for (int a = 0; a < 3; a++) {
            tu_fill(mem[a], B * T * H * D, 40 + a);
            const int64_t s[4] = {B, T, H, D};
            attn_tensor t;
            attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, mem[a], 4, s);
            CHECK_INT(attn_tensor_transpose(NULL, &t, 1, 2, &views[a]), ATTN_OK);
            conts[a] = tu_tensor4(cont[a], B, H, T, D);
            CHECK_INT(attn_tensor_copy(NULL, &views[a], &conts[a]), ATTN_OK);
        }
        attn_tensor to1 = tu_tensor4(o1, B, H, T, D), to2 = tu_tensor4(o2, B, H, T, D);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = 1;
        CHECK_INT(fn(NULL, &views[0], &views[1], &views[2], &p, &to1, NULL), ATTN_OK);
        CHECK_INT(fn(NULL, &conts[0], &conts[1], &conts[2], &p, &to2, NULL), ATTN_OK);
        CHECK(memcmp(o1, o2, sizeof o1) == 0);
    }
}

static int sdpa_default(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                        const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                        attn_tensor *weights)
{
    return attn_sdpa(ctx, q, k, v, p, out, weights);
}

static int sdpa_impl_ref(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                         const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                         attn_tensor *weights)
{
    attn_ctx local;
    attn_ctx_init(&local);
    local.impl = ATTN_IMPL_REF;
    int rc = attn_sdpa(&local, q, k, v, p, out, weights);
    if (ctx) {
        ctx->status = local.status;
        memcpy(ctx->message, local.message, sizeof ctx->message);
    }
    return rc;
}

int main(void)
{
    const struct {
        const char *name;
        sdpa_fn fn;
    } paths[] = {{"attn_sdpa_ref", attn_sdpa_ref},
                 {"attn_sdpa (ctx.impl = REF)", sdpa_impl_ref},
                 {"attn_sdpa (default path)", sdpa_default}};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        fprintf(stderr, "== %s\n", paths[i].name);
        test_against_oracle(paths[i].fn, paths[i].name);
        test_masks_zero_weights(paths[i].fn);
        test_by_hand(paths[i].fn);
        test_empty_rows(paths[i].fn);
        test_errors(paths[i].fn);
        test_cross_and_views(paths[i].fn);
    }
    return check_summary("test_sdpa_ref");
}
