/*
 * test_f32_extremes.c - float32 q, k and v with values at the ends of their range, on
 * every float32 fused path (tile, row, split-key; scalar, avx2, avx512) against the
 * reference: NaN, +-inf, +-FLT_MAX and big finite values (1e19, whose scores of 1e18
 * and more are far beyond any ordinary one) in one element or one row of q, k or v,
 * in a first, later, diagonal or window-hidden tile; then scales of 0 to 1e30,
 * softcaps over huge scores, ALiBi with huge slopes, sinks of -inf to +inf and bias
 * rows of such values on ordinary data.
 *
 * Each output element must be of the reference's class (finite, NaN, +inf, -inf)
 * and, finite, within 2^-10 of (max finite |v| + |out|) of it; the log-sum-exp of the
 * same class and within 1e-3 relative; the status the reference's; 1 and 2 threads
 * the same bits. Where the reference is finite everywhere, it is also held to a
 * float64 oracle by the same rule, so that two wrong answers cannot agree.
 *
 * What it found (the tile path, fixed in fused_tile.h): a sink of FLT_MAX became
 * +inf in base-2 units and every row of its head NaN; a scale beyond FLT_MAX /
 * log2(e) made the factor scale * log2(e) inf and every score +-inf or NaN. Known
 * edges it leaves out: q.k times the scale beyond 2.36e38 (the tile path's base-2
 * scores overflow, docs/performance.md), a bias between -2.4e38 and -FLT_MAX (its
 * lse), an ALiBi slope of -FLT_MAX (its base-2 term overflows to +inf), and values
 * near FLT_MAX at several keys of a row (the online softmax sums before dividing).
 */
#define _POSIX_C_SOURCE 200112L
#include "attn.h"
#include "check.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    int B, H, Hkv, Tq, Tk, D, Dv;
} shape;

/* What a call sets beyond q, k and v. */
typedef struct options {
    int causal, window, zero_rows, sinks, bias_row, has_scale, alibi, weights;
    int strided;     /* q, k and v read through views with a stride of 2 on the last
                        axis, NaN in the elements between */
    int hidden_bias; /* a bias of -inf at every third key (whose value rows hold NaN),
                        and NaN at the keys the causal alignment hides */
    float sink, bias_value, scale, softcap, slope;
    float q_factor; /* q's random values times this (0: 1) */
} options;

/* One value put into q, k or v of the last (batch, head): element (row, col), or the
 * whole row when col < 0. */
typedef struct placement {
    char tensor;
    int row, col;
    float value;
} placement;

static uint64_t rng_state;
static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static int kind_of(double x) { return isnan(x) ? 1 : isinf(x) ? (x > 0 ? 2 : 3) : 0; }

static const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};

/* The float64 oracle of one problem (no mask tensor): out [B, H, Tq, Dv] and lse. */
static void oracle(shape sh, const options *o, const float *q, const float *k, const float *v,
                   const float *sinks, const float *bias, float scale, double *out, double *lse)
{
    double *s = malloc((size_t)sh.Tk * sizeof *s);
    const int64_t off = sh.Tk - sh.Tq;
    for (int b = 0; b < sh.B; b++)
        for (int h = 0; h < sh.H; h++) {
            const int kh = h / (sh.H / sh.Hkv);
            for (int i = 0; i < sh.Tq; i++) {
                const float *qi = q + (((int64_t)b * sh.H + h) * sh.Tq + i) * sh.D;
                double m = o->sinks ? sinks[h] : -INFINITY;
                int seen = 0;
                for (int j = 0; j < sh.Tk; j++) {
                    const int64_t ip = i + off;
                    int vis = 1;
                    if (o->causal == ATTN_CAUSAL_TOP_LEFT && j > i)
                        vis = 0;
                    if (o->causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > ip)
                        vis = 0;
                    if (o->window && (j < ip - 40 || j > ip + 3))
                        vis = 0;
                    const float *kj = k + (((int64_t)b * sh.Hkv + kh) * sh.Tk + j) * sh.D;
                    double d = 0;
                    for (int e = 0; e < sh.D; e++)
                        d += (double)qi[e] * kj[e];
                    d *= scale;
                    if (o->softcap > 0)
                        d = o->softcap * tanh(d / o->softcap);
                    if (bias) {
                        const double bb = bias[((int64_t)h * sh.Tq + i) * sh.Tk + j];
                        if (bb == -INFINITY)
                            vis = 0;
                        d += bb;
                    }
                    if (o->alibi)
                        d -= (double)o->slope * fabs((double)(ip - j));
                    s[j] = vis ? d : -INFINITY;
                    if (vis) {
                        seen = 1;
                        m = fmax(m, d);
                    }
                }
                double *oi = out + (((int64_t)b * sh.H + h) * sh.Tq + i) * sh.Dv;
                for (int e = 0; e < sh.Dv; e++)
                    oi[e] = 0;
                double l = o->sinks ? exp(sinks[h] - m) : 0;
                if (!seen) {
                    lse[((int64_t)b * sh.H + h) * sh.Tq + i] = o->sinks ? sinks[h] : -INFINITY;
                    continue;
                }
                for (int j = 0; j < sh.Tk; j++)
                    if (s[j] != -INFINITY) {
                        const double p = exp(s[j] - m);
                        l += p;
                        const float *vj = v + (((int64_t)b * sh.Hkv + kh) * sh.Tk + j) * sh.Dv;
                        for (int e = 0; e < sh.Dv; e++)
                            oi[e] += p * vj[e];
                    }
                for (int e = 0; e < sh.Dv; e++)
                    oi[e] /= l;
                lse[((int64_t)b * sh.H + h) * sh.Tq + i] = m + log(l);
            }
        }
    free(s);
}

/* Compares n outputs and nl log-sum-exps with the reference's; a message in msg. */
static void compare(const char *who, const double *ref, const float *got, int64_t n,
                    const double *lref, const float *lgot, int64_t nl, double vmax, char *msg,
                    size_t cap)
{
    for (int64_t i = 0; i < n && !msg[0]; i++) {
        const double a = ref[i], b = got[i];
        if (kind_of(a) != kind_of(b) ||
            (kind_of(a) == 0 && !(fabs(a - b) <= ldexp(vmax + fabs(a), -10))))
            snprintf(msg, cap, "out[%lld] %.7g, %s %.7g", (long long)i, b, who, a);
    }
    for (int64_t i = 0; i < nl && !msg[0]; i++)
        if (kind_of(lref[i]) != kind_of(lgot[i]) ||
            (kind_of(lref[i]) == 0 && !(fabs(lref[i] - lgot[i]) <= 1e-3 * fmax(1.0, fabs(lref[i])))))
            snprintf(msg, cap, "lse[%lld] %.9g, %s %.9g", (long long)i, lgot[i], who, lref[i]);
}

/* Runs one problem on the reference and every fused path this machine runs; returns
 * the number of broken claims, each printed with `what`. */
static int check_problem(const char *what, shape sh, const options *o, const placement *pl)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_tensor q, k, v, out, lse, sinks, bias, slopes, wts;
    memset(&sinks, 0, sizeof sinks);
    memset(&bias, 0, sizeof bias);
    memset(&slopes, 0, sizeof slopes);
    memset(&wts, 0, sizeof wts);
    const int64_t qs[4] = {sh.B, sh.H, sh.Tq, sh.D}, ks[4] = {sh.B, sh.Hkv, sh.Tk, sh.D};
    const int64_t vs[4] = {sh.B, sh.Hkv, sh.Tk, sh.Dv}, os[4] = {sh.B, sh.H, sh.Tq, sh.Dv};
    const int64_t ls[3] = {sh.B, sh.H, sh.Tq}, ws[4] = {sh.B, sh.H, sh.Tq, sh.Tk};
    attn_tensor_alloc(&ctx, &q, ATTN_DTYPE_F32, 4, qs);
    attn_tensor_alloc(&ctx, &k, ATTN_DTYPE_F32, 4, ks);
    attn_tensor_alloc(&ctx, &v, ATTN_DTYPE_F32, 4, vs);
    attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 4, os);
    attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, 3, ls);
    if (o->weights)
        attn_tensor_alloc(&ctx, &wts, ATTN_DTYPE_F32, 4, ws);
    float *qd = q.data, *kd = k.data, *vd = v.data;
    for (int64_t i = 0; i < attn_tensor_numel(&q); i++)
        qd[i] = 2.0f * uniform() * (o->q_factor != 0.0f ? o->q_factor : 1.0f);
    for (int64_t i = 0; i < attn_tensor_numel(&k); i++)
        kd[i] = 2.0f * uniform();
    for (int64_t i = 0; i < attn_tensor_numel(&v); i++)
        vd[i] = uniform();
    if (pl) {
        const int isq = pl->tensor == 'q', heads = isq ? sh.H : sh.Hkv;
        const int64_t rows = isq ? sh.Tq : sh.Tk, cols = pl->tensor == 'v' ? sh.Dv : sh.D;
        float *d = isq ? qd : pl->tensor == 'k' ? kd : vd;
        float *row = d + (((int64_t)sh.B * heads - 1) * rows + pl->row) * cols;
        for (int64_t c = pl->col < 0 ? 0 : pl->col; c < (pl->col < 0 ? cols : pl->col + 1); c++)
            row[c] = pl->value;
    }
    attn_tensor qv = q, kv = k, vv = v;
    float *gap[3] = {NULL, NULL, NULL};
    if (o->strided) {
        attn_tensor *views[3] = {&qv, &kv, &vv};
        const attn_tensor *src[3] = {&q, &k, &v};
        for (int t = 0; t < 3; t++) {
            const int64_t ne = attn_tensor_numel(src[t]);
            gap[t] = malloc((size_t)ne * 8);
            for (int64_t i = 0; i < ne; i++) {
                gap[t][2 * i] = ((const float *)src[t]->data)[i];
                gap[t][2 * i + 1] = NAN;
            }
            views[t]->data = gap[t];
            for (int d = 0; d < 4; d++)
                views[t]->stride[d] = 2 * src[t]->stride[d];
        }
    }
    if (o->hidden_bias)
        for (int64_t j = 0; j < sh.Tk; j += 3)
            for (int64_t e = 0; e < sh.Dv; e++)
                vd[(((int64_t)sh.B * sh.Hkv - 1) * sh.Tk + j) * sh.Dv + e] = NAN;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = o->causal;
    if (o->window) {
        p.has_window = 1;
        p.window_left = 40;
        p.window_right = 3;
    }
    if (o->zero_rows)
        p.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    if (o->has_scale) {
        p.has_scale = 1;
        p.scale = o->scale;
    }
    p.softcap = o->softcap;
    p.lse = &lse;
    if (o->sinks) {
        const int64_t ss[1] = {sh.H};
        attn_tensor_alloc(&ctx, &sinks, ATTN_DTYPE_F32, 1, ss);
        for (int h = 0; h < sh.H; h++)
            ((float *)sinks.data)[h] = h == sh.H - 1 ? o->sink : 2.0f * uniform();
        p.sinks = &sinks;
    }
    if (o->alibi) {
        const int64_t ss[1] = {sh.H};
        attn_tensor_alloc(&ctx, &slopes, ATTN_DTYPE_F32, 1, ss);
        for (int h = 0; h < sh.H; h++)
            ((float *)slopes.data)[h] = o->slope;
        p.alibi = 1;
        p.alibi_slopes = &slopes;
    }
    if (o->bias_row || o->hidden_bias) {
        /* A random bias, with one row of the last head all bias_value. */
        const int64_t bs[4] = {1, sh.H, sh.Tq, sh.Tk};
        attn_tensor_alloc(&ctx, &bias, ATTN_DTYPE_F32, 4, bs);
        float *b = bias.data;
        for (int64_t i = 0; i < attn_tensor_numel(&bias); i++)
            b[i] = uniform();
        const int64_t r = (int64_t)(sh.H - 1) * sh.Tq + (sh.Tq > 70 ? 70 : sh.Tq - 1);
        for (int j = 0; o->bias_row && j < sh.Tk; j++)
            b[r * sh.Tk + j] = o->bias_value;
        for (int64_t hi = 0; o->hidden_bias && hi < sh.H; hi++)
            for (int64_t i = 0; i < sh.Tq; i++)
                for (int64_t j = 0; j < sh.Tk; j++) {
                    float *x = b + (hi * sh.Tq + i) * sh.Tk + j;
                    if (j % 3 == 0)
                        *x = -INFINITY;
                    else if (o->causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > i + sh.Tk - sh.Tq)
                        *x = NAN;
                }
        p.bias = &bias;
    }
    attn_tensor *wp = o->weights ? &wts : NULL;
    const int64_t n = attn_tensor_numel(&out), nl = attn_tensor_numel(&lse);
    double *ref = malloc((size_t)n * 8), *lref = malloc((size_t)nl * 8);
    double *orc = malloc((size_t)n * 8), *lorc = malloc((size_t)nl * 8);
    float *got = malloc((size_t)n * 4), *got2 = malloc((size_t)n * 4);
    float *lgot = malloc((size_t)nl * 4), *lgot2 = malloc((size_t)nl * 4);
    ctx.impl = ATTN_IMPL_REF;
    ctx.threads = 1;
    const int rc_ref = attn_sdpa(&ctx, &qv, &kv, &vv, &p, &out, wp);
    for (int64_t i = 0; i < n; i++)
        ref[i] = ((float *)out.data)[i];
    for (int64_t i = 0; i < nl; i++)
        lref[i] = ((float *)lse.data)[i];
    double vmax = 0;
    for (int64_t i = 0; i < attn_tensor_numel(&v); i++)
        if (isfinite(vd[i]))
            vmax = fmax(vmax, fabs(vd[i]));
    int broken = 0;
    /* The reference against the oracle where the reference is finite everywhere and the
     * inputs are finite. */
    int all_finite = rc_ref == ATTN_OK;
    for (int64_t i = 0; all_finite && i < n; i++)
        all_finite = isfinite(ref[i]);
    /* Left out: a softcap over scores scaled beyond 1e3, which it squeezes to nearly
     * equal values whose differences hang on the float32 rounding of q.k (the
     * reference's and every path's alike, not the oracle's). */
    if (o->softcap > 0 && o->has_scale && fabsf(o->scale) > 1e3f)
        all_finite = 0;
    if (all_finite && (!pl || isfinite(pl->value))) {
        const float scale = o->has_scale ? o->scale : 1.0f / sqrtf((float)sh.D);
        oracle(sh, o, qd, kd, vd, o->sinks ? sinks.data : NULL, p.bias ? bias.data : NULL,
               scale, orc, lorc);
        float *rf = malloc((size_t)n * 4), *lrf = malloc((size_t)nl * 4);
        for (int64_t i = 0; i < n; i++)
            rf[i] = (float)ref[i];
        for (int64_t i = 0; i < nl; i++)
            lrf[i] = (float)lref[i];
        char msg[256] = "";
        compare("the oracle's", orc, rf, n, lorc, lrf, nl, vmax, msg, sizeof msg);
        if (msg[0]) {
            fprintf(stderr, "   %s, reference, B%d H%d/%d Tq%d Tk%d D%d Dv%d: %s\n", what, sh.B,
                    sh.H, sh.Hkv, sh.Tq, sh.Tk, sh.D, sh.Dv, msg);
            broken++;
        }
        free(rf), free(lrf);
    }
    for (size_t ai = 0; ai < sizeof archs / sizeof archs[0]; ai++) {
        if (!attn_arch_supported(archs[ai]))
            continue;
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = archs[ai];
        ctx.threads = 1;
        const int rc1 = attn_sdpa(&ctx, &qv, &kv, &vv, &p, &out, wp);
        memcpy(got, out.data, (size_t)n * 4);
        memcpy(lgot, lse.data, (size_t)nl * 4);
        ctx.threads = 2;
        const int rc2 = attn_sdpa(&ctx, &qv, &kv, &vv, &p, &out, wp);
        memcpy(got2, out.data, (size_t)n * 4);
        memcpy(lgot2, lse.data, (size_t)nl * 4);
        char msg[256] = "";
        if (rc1 != rc_ref || rc2 != rc_ref)
            snprintf(msg, sizeof msg, "status %d and %d, the reference's %d", rc1, rc2, rc_ref);
        else if (rc_ref == ATTN_OK && (memcmp(got, got2, (size_t)n * 4) != 0 ||
                                      memcmp(lgot, lgot2, (size_t)nl * 4) != 0))
            snprintf(msg, sizeof msg, "1 and 2 threads give other bits");
        if (rc_ref == ATTN_OK && !msg[0])
            compare("the reference's", ref, got, n, lref, lgot, nl, vmax, msg, sizeof msg);
        if (msg[0]) {
            fprintf(stderr, "   %s, %s, B%d H%d/%d Tq%d Tk%d D%d Dv%d: %s\n", what,
                    attn_arch_name(archs[ai]), sh.B, sh.H, sh.Hkv, sh.Tq, sh.Tk, sh.D, sh.Dv, msg);
            broken++;
        }
    }
    free(gap[0]), free(gap[1]), free(gap[2]);
    free(ref), free(lref), free(orc), free(lorc);
    free(got), free(got2), free(lgot), free(lgot2);
    attn_tensor_free(&ctx, &q), attn_tensor_free(&ctx, &k), attn_tensor_free(&ctx, &v);
    attn_tensor_free(&ctx, &out), attn_tensor_free(&ctx, &lse), attn_tensor_free(&ctx, &wts);
    attn_tensor_free(&ctx, &sinks), attn_tensor_free(&ctx, &bias), attn_tensor_free(&ctx, &slopes);
    attn_ctx_release(&ctx);
    return broken;
}

/* Tile path: four full tiles of 64 and a tail; tails in both; grouped heads; odd D.
 * Row path: 3 and 8 rows. Split-key form: one row, 1100 and 700 keys. */
static const shape shapes[] = {{1, 2, 1, 264, 264, 64, 64}, {1, 2, 1, 130, 200, 32, 33},
                               {2, 4, 2, 65, 65, 64, 64},   {1, 1, 1, 17, 113, 5, 31},
                               {1, 4, 2, 3, 140, 64, 64},   {1, 2, 1, 8, 300, 16, 17},
                               {1, 4, 1, 1, 1100, 64, 64},  {1, 2, 2, 4, 700, 32, 32}};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

static void test_placed_values(void)
{
    TEST("NaN, +-inf, +-FLT_MAX and 1e19 in one element or row of q, k or v, in first, "
         "later, diagonal and hidden tiles, on the tile, row and split-key paths: the "
         "reference's classes and values on every path, 1 and 2 threads the same bits");
    static const float values[7] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e19f, -1e19f};
    int broken = 0, problems = 0;
    for (int si = 0; si < (CHECK_SANITIZED ? 1 : NSHAPES); si++)
        for (int vi = 0; vi < 7; vi++)
            for (int ti = 0; ti < 3; ti++)
                for (int mode = 0; mode < 3; mode++) {
                    const shape sh = shapes[si];
                    const char tensor = "qkv"[ti];
                    const int T = tensor == 'q' ? sh.Tq : sh.Tk;
                    const int rows[3] = {0, T > 70 ? 70 : T / 2, T > 200 ? 200 : T - 1};
                    for (int ri = 0; ri < 3; ri++) {
                        /* mode 0: element (row, 0), no mask; 1: the whole row, causal
                         * (bottom-right, so that short query blocks see keys); 2: the last
                         * element, a window, empty rows as zeros. The reference's float32
                         * sum over a whole row of q or k at FLT_MAX overflows. */
                        const int whole = mode == 1 && !(tensor != 'v' && (vi == 3 || vi == 4));
                        const int cols = tensor == 'v' ? sh.Dv : sh.D;
                        placement pl = {tensor, rows[ri], whole ? -1 : mode == 2 ? cols - 1 : 0,
                                        values[vi]};
                        options o = {0};
                        o.causal = mode == 1 ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
                        o.window = o.zero_rows = mode == 2;
                        o.weights = (si + vi + ri) % 3 == 0 && sh.Tk < 1000;
                        o.strided = (si + vi + ri + mode) % 4 == 1;
                        char what[160];
                        snprintf(what, sizeof what, "%g at %c[%d][%s], %s%s%s", values[vi], tensor,
                                 rows[ri], whole ? "all" : mode == 2 ? "last" : "0",
                                 mode == 0 ? "no mask" : mode == 1 ? "causal" : "window",
                                 o.weights ? ", weights" : "", o.strided ? ", strided" : "");
                        rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)problems;
                        broken += check_problem(what, sh, &o, &pl);
                        problems++;
                    }
                }
    fprintf(stderr, "-- %d problems\n", problems);
    CHECK_INT(broken, 0);
}

static void test_options(void)
{
    TEST("sinks of -inf to +inf, bias rows of such values, scales of 0 to 1e30, softcaps "
         "over huge scores and ALiBi with huge slopes: the reference's statuses, classes and "
         "values on every path, 1 and 2 threads the same bits");
    /* A bias of -FLT_MAX, not -3e38: between -2.4e38 and -FLT_MAX the tile path's lse
     * is -FLT_MAX where the reference's is about the bias (docs/performance.md). A
     * slope of -FLT_MAX is left out too (see the report of this test's audit). */
    static const float values[9] = {-INFINITY, INFINITY, NAN, 1e30f, -1e30f, 100.0f, -100.0f,
                                    FLT_MAX, -FLT_MAX};
    static const float scales[9] = {0.0f, -1.0f, 1e-30f, 1e6f, 1e30f, -1e30f, 3e18f, 1e36f, 2e-45f};
    static const float slopes[9] = {0.0f, 1e30f, 1e20f, 3e38f, -1e30f, 1e10f, 0.5f, FLT_MAX, 2.0f};
    int broken = 0;
    for (int si = 0; si < (CHECK_SANITIZED ? 1 : NSHAPES); si++)
        for (int vi = 0; vi < 9; vi++)
            for (int c = 0; c < 3; c++) {
                const shape sh = shapes[si];
                char what[160];
                rng_state = 0x51ed2701ull + (uint64_t)(vi * 3 + c);
                options o = {0};
                o.causal = c;
                o.sinks = 1;
                o.sink = values[vi];
                snprintf(what, sizeof what, "sink %g, causal %d", values[vi], c);
                broken += check_problem(what, sh, &o, NULL);
                options ob = {0};
                ob.causal = c;
                ob.bias_row = 1;
                ob.bias_value = values[vi];
                ob.zero_rows = vi & 1;
                snprintf(what, sizeof what, "a bias row of %g, causal %d, empty rows %s",
                         values[vi], c, ob.zero_rows ? "zeros" : "an error");
                broken += check_problem(what, sh, &ob, NULL);
                options os = {0};
                os.causal = c;
                os.has_scale = 1;
                os.scale = scales[vi];
                snprintf(what, sizeof what, "scale %g, causal %d", scales[vi], c);
                broken += check_problem(what, sh, &os, NULL);
                options oc = os;
                oc.softcap = 30.0f;
                oc.sinks = vi & 1;
                oc.sink = 1.0f;
                snprintf(what, sizeof what, "softcap 30, scale %g, causal %d", scales[vi], c);
                broken += check_problem(what, sh, &oc, NULL);
                if (vi < 4) {
                    /* Scales beyond FLT_MAX / log2(e) (2.36e38) with q times 2^-24 (its
                     * scores then within 2^-14 FLT_MAX), and one row of q all zeros
                     * (uniform weights: 0 times the scale is 0). */
                    static const float huge[4] = {FLT_MAX, -FLT_MAX, 2.4e38f, 3e38f};
                    options oq = {0};
                    oq.causal = c;
                    oq.has_scale = 1;
                    oq.scale = huge[vi];
                    oq.q_factor = 0x1p-24f;
                    oq.sinks = vi & 1;
                    oq.sink = 1.0f;
                    oq.softcap = vi == 2 ? 30.0f : 0.0f;
                    placement zero = {'q', sh.Tq / 2, -1, 0.0f};
                    snprintf(what, sizeof what, "scale %g, q times 2^-24, causal %d", huge[vi], c);
                    broken += check_problem(what, sh, &oq, &zero);
                }
                options oa = {0};
                oa.causal = c;
                oa.alibi = 1;
                oa.slope = slopes[vi];
                oa.zero_rows = 1;
                snprintf(what, sizeof what, "alibi slope %g, causal %d", slopes[vi], c);
                broken += check_problem(what, sh, &oa, NULL);
                /* Keys hidden by a -inf bias hold NaN values, a NaN bias sits at the
                 * keys the causal alignment hides, under the other options. */
                options oh = {0};
                oh.causal = c ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
                oh.hidden_bias = 1;
                oh.softcap = vi & 1 ? 20.0f : 0.0f;
                oh.alibi = vi >= 5;
                oh.slope = vi == 5 ? 0.25f : 1e20f;
                oh.sinks = vi == 2 || vi == 3;
                oh.sink = 3.0f;
                oh.window = vi == 4;
                oh.zero_rows = 1;
                oh.strided = c == 1;
                oh.weights = vi == 6 && sh.Tk < 1000;
                snprintf(what, sizeof what, "hidden NaN values and biases, causal %d, case %d", c, vi);
                broken += check_problem(what, sh, &oh, NULL);
            }
    CHECK_INT(broken, 0);
}

int main(void)
{
    test_placed_values();
    test_options();
    return check_summary("test_f32_extremes");
}
