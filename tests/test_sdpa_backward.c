/*
 * test_sdpa_backward.c - the backward of scaled dot-product attention
 * (attn_sdpa_backward, SPEC section 8) against central finite differences of a
 * float64 forward written here from the contract's formulas, on every option of
 * section 6 alone and all together, grouped-query heads and Tq != Tk; against
 * PyTorch's autograd (tests/data/golden_grads/, made by tests/golden/gen_grads.py);
 * and the claims that do not need a tolerance: a hidden key gets exactly zero
 * gradient, a NaN in dO stays in the rows it reaches, and the answer does not
 * depend on the thread count or the instruction set.
 *
 * The loss is L = sum(dO * O) for a fixed random dO, so dL/dO = dO and the
 * finite differences of L give exactly what the backward should return.
 *
 * Tolerances. The finite differences are central differences of a float64
 * forward with step 1e-4: their error is about h^2 |f'''|, below 1e-9 here, far
 * below float32's. The backward runs in float32 on inputs in [-1, 1), and every
 * gradient here is below 2 in magnitude: each is a short sum (at most 7 keys, or
 * 8 query rows of a GQA group, times at most 4 features) of products rounded once, on weights
 * recomputed from a float32 log-sum-exp, so its error is a few ulps of float32
 * (6e-8) times the sum's length: about 1e-6 at most. A gradient must be within
 * 1e-6 + 1e-5 |fd| of the finite difference (measured: every one is within
 * 1e-7 + 1e-7 |fd| on this machine, so the bound has a margin of about 10).
 * PyTorch's golden gradients are float64 results rounded once to float32, so the
 * same bound holds against them.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 1e-6
#define RTOL 1e-5
#define FD_STEP 1e-4

/* ---- one problem: shapes, options and data ------------------------------------- */

typedef struct problem {
    const char *name;
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int causal;
    int has_window;
    int64_t wl, wr;
    float softcap;
    int alibi;
    int64_t bias_shape[4]; /* all 0: no bias */
    int sinks;
    int mask;              /* 1: a boolean mask [B, 1, Tq, Tk] with an empty row */
    float scale;           /* 0: the default */
    /* data, filled by make() */
    float *q, *k, *v, *bias, *sinkv, *dout;
    unsigned char *maskv;
    int64_t nq, nk, nv, nbias, no;
} problem;

static int64_t bias_n(const problem *P)
{
    return P->bias_shape[0] ? P->bias_shape[0] * P->bias_shape[1] * P->bias_shape[2] *
                                  P->bias_shape[3]
                            : 0;
}

static void make(problem *P, uint64_t seed)
{
    P->nq = P->B * P->H * P->Tq * P->D;
    P->nk = P->B * P->Hkv * P->Tk * P->D;
    P->nv = P->B * P->Hkv * P->Tk * P->Dv;
    P->no = P->B * P->H * P->Tq * P->Dv;
    P->nbias = bias_n(P);
    P->q = malloc(sizeof(float) * (size_t)P->nq);
    P->k = malloc(sizeof(float) * (size_t)P->nk);
    P->v = malloc(sizeof(float) * (size_t)P->nv);
    P->dout = malloc(sizeof(float) * (size_t)P->no);
    tu_fill(P->q, P->nq, seed);
    tu_fill(P->k, P->nk, seed + 1);
    tu_fill(P->v, P->nv, seed + 2);
    tu_fill(P->dout, P->no, seed + 3);
    P->bias = P->nbias ? malloc(sizeof(float) * (size_t)P->nbias) : NULL;
    if (P->bias)
        tu_fill(P->bias, P->nbias, seed + 4);
    P->sinkv = P->sinks ? malloc(sizeof(float) * (size_t)P->H) : NULL;
    if (P->sinkv)
        tu_fill(P->sinkv, P->H, seed + 5);
    P->maskv = NULL;
    if (P->mask) {
        /* Random keys hidden, and row 1 of batch 0 sees nothing (a zero-mode row). */
        P->maskv = malloc((size_t)(P->B * P->Tq * P->Tk));
        uint64_t st = seed + 6;
        for (int64_t b = 0; b < P->B; b++)
            for (int64_t i = 0; i < P->Tq; i++)
                for (int64_t j = 0; j < P->Tk; j++)
                    P->maskv[(b * P->Tq + i) * P->Tk + j] =
                        (b == 0 && i == 1) ? 0 : tu_uniform(&st) > -0.5f;
    }
}

static void unmake(problem *P)
{
    free(P->q);
    free(P->k);
    free(P->v);
    free(P->dout);
    free(P->bias);
    free(P->sinkv);
    free(P->maskv);
}

static double slope_of(int64_t h, int64_t H)
{
    int64_t m = 1;
    while (m * 2 <= H)
        m *= 2;
    return h < m ? pow(2.0, -8.0 * (double)(h + 1) / (double)m)
                 : pow(2.0, -8.0 * (double)(2 * (h - m) + 1) / (double)(2 * m));
}

static int visible(const problem *P, int64_t b, int64_t i, int64_t j, double biasv)
{
    const int64_t ip = i + P->Tk - P->Tq;
    if (P->causal == ATTN_CAUSAL_TOP_LEFT && j > i)
        return 0;
    if (P->causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > ip)
        return 0;
    if (P->has_window && ((P->wl >= 0 && j < ip - P->wl) || (P->wr >= 0 && j > ip + P->wr)))
        return 0;
    if (P->maskv && !P->maskv[(b * P->Tq + i) * P->Tk + j])
        return 0;
    return biasv != -INFINITY;
}

static int64_t bias_index(const problem *P, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t *s = P->bias_shape;
    const int64_t idx[4] = {s[0] == 1 ? 0 : b, s[1] == 1 ? 0 : h, s[2] == 1 ? 0 : i,
                            s[3] == 1 ? 0 : j};
    return ((idx[0] * s[1] + idx[1]) * s[2] + idx[2]) * s[3] + idx[3];
}

/* The loss sum(dO * O) of the contract's forward in float64, from the float32
 * inputs with one of them (which: 0 q, 1 k, 2 v, 3 bias, 4 sinks) moved by
 * `delta` at element `at`. */
static double oracle_loss(const problem *P, int which, int64_t at, double delta)
{
    const int64_t B = P->B, H = P->H, Tq = P->Tq, Tk = P->Tk, D = P->D, Dv = P->Dv;
    const int64_t group = H / P->Hkv;
    const double scale = P->scale != 0.0f ? P->scale : 1.0 / sqrt((double)D);
    double loss = 0.0;
    double *s = malloc(sizeof(double) * (size_t)Tk);
#define IN(arr, w, idx) ((double)(arr)[idx] + (which == (w) && at == (idx) ? delta : 0.0))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < Tq; i++) {
                double m = P->sinks ? IN(P->sinkv, 4, h) : -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    const double bv = P->bias ? IN(P->bias, 3, bias_index(P, b, h, i, j)) : 0.0;
                    s[j] = -INFINITY;
                    if (!visible(P, b, i, j, bv))
                        continue;
                    double x = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        x += IN(P->q, 0, ((b * H + h) * Tq + i) * D + d) *
                             IN(P->k, 1, ((b * P->Hkv + hk) * Tk + j) * D + d);
                    x *= scale;
                    if (P->softcap > 0.0f)
                        x = P->softcap * tanh(x / P->softcap);
                    x += bv;
                    if (P->alibi) {
                        const int64_t dist = i + Tk - Tq - j;
                        x -= slope_of(h, H) * (double)(dist < 0 ? -dist : dist);
                    }
                    s[j] = x;
                    any = 1;
                    if (x > m)
                        m = x;
                }
                if (!any)
                    continue; /* a row that sees nothing: zero output */
                double sum = P->sinks ? exp(IN(P->sinkv, 4, h) - m) : 0.0;
                for (int64_t j = 0; j < Tk; j++)
                    sum += exp(s[j] - m);
                for (int64_t d = 0; d < Dv; d++) {
                    double o = 0.0;
                    for (int64_t j = 0; j < Tk; j++)
                        if (s[j] != -INFINITY)
                            o += exp(s[j] - m) / sum *
                                 IN(P->v, 2, ((b * P->Hkv + hk) * Tk + j) * Dv + d);
                    loss += (double)P->dout[((b * H + h) * Tq + i) * Dv + d] * o;
                }
            }
        }
#undef IN
    free(s);
    return loss;
}

static double fd(const problem *P, int which, int64_t at)
{
    return (oracle_loss(P, which, at, FD_STEP) - oracle_loss(P, which, at, -FD_STEP)) /
           (2.0 * FD_STEP);
}

/* ---- running attn on a problem ----------------------------------------------- */

typedef struct result {
    float *out, *lse, *dq, *dk, *dv, *dbias, *dsinks;
    int rc_fwd, rc_bwd;
} result;

static void params_of(problem *P, attn_sdpa_params *p, attn_tensor *bias, attn_tensor *sinks,
                      attn_tensor *mask)
{
    attn_sdpa_params_init(p);
    p->causal = P->causal;
    p->has_window = P->has_window;
    p->window_left = P->wl;
    p->window_right = P->wr;
    p->softcap = P->softcap;
    p->alibi = P->alibi;
    if (P->scale != 0.0f) {
        p->has_scale = 1;
        p->scale = P->scale;
    }
    if (P->bias) {
        *bias = tu_tensor4(P->bias, P->bias_shape[0], P->bias_shape[1], P->bias_shape[2],
                           P->bias_shape[3]);
        p->bias = bias;
    }
    if (P->sinks) {
        const int64_t sh[1] = {P->H};
        attn_tensor_init(NULL, sinks, ATTN_DTYPE_F32, P->sinkv, 1, sh);
        p->sinks = sinks;
    }
    if (P->maskv) {
        const int64_t sh[4] = {P->B, 1, P->Tq, P->Tk};
        attn_tensor_init(NULL, mask, ATTN_DTYPE_BOOL, P->maskv, 4, sh);
        p->mask = mask;
        p->empty_rows = ATTN_EMPTY_ROWS_ZERO;
    }
}

/* The forward on ctx (its out and lse kept in r unless `given` has them), then the
 * backward on ctx. */
static void run_both(problem *P, attn_ctx *ctx, result *r, const result *given)
{
    attn_sdpa_params p;
    attn_tensor bias, sinks, mask;
    params_of(P, &p, &bias, &sinks, &mask);
    r->out = calloc((size_t)P->no, sizeof(float));
    r->lse = calloc((size_t)(P->B * P->H * P->Tq), sizeof(float));
    r->dq = calloc((size_t)P->nq, sizeof(float));
    r->dk = calloc((size_t)P->nk, sizeof(float));
    r->dv = calloc((size_t)P->nv, sizeof(float));
    r->dbias = P->nbias ? calloc((size_t)P->nbias, sizeof(float)) : NULL;
    r->dsinks = P->sinks ? calloc((size_t)P->H, sizeof(float)) : NULL;
    attn_tensor q = tu_tensor4(P->q, P->B, P->H, P->Tq, P->D);
    attn_tensor k = tu_tensor4(P->k, P->B, P->Hkv, P->Tk, P->D);
    attn_tensor v = tu_tensor4(P->v, P->B, P->Hkv, P->Tk, P->Dv);
    attn_tensor out = tu_tensor4(r->out, P->B, P->H, P->Tq, P->Dv);
    attn_tensor lse = tu_tensor3(r->lse, P->B, P->H, P->Tq);
    attn_tensor dout = tu_tensor4(P->dout, P->B, P->H, P->Tq, P->Dv);
    attn_tensor dq = tu_tensor4(r->dq, P->B, P->H, P->Tq, P->D);
    attn_tensor dk = tu_tensor4(r->dk, P->B, P->Hkv, P->Tk, P->D);
    attn_tensor dv = tu_tensor4(r->dv, P->B, P->Hkv, P->Tk, P->Dv);
    attn_tensor dbias, dsinks;
    attn_sdpa_grads g = {&dq, &dk, &dv, NULL, NULL};
    if (r->dbias) {
        dbias = tu_tensor4(r->dbias, P->bias_shape[0], P->bias_shape[1], P->bias_shape[2],
                           P->bias_shape[3]);
        g.dbias = &dbias;
    }
    if (r->dsinks) {
        const int64_t sh[1] = {P->H};
        attn_tensor_init(NULL, &dsinks, ATTN_DTYPE_F32, r->dsinks, 1, sh);
        g.dsinks = &dsinks;
    }
    if (given) {
        memcpy(r->out, given->out, sizeof(float) * (size_t)P->no);
        memcpy(r->lse, given->lse, sizeof(float) * (size_t)(P->B * P->H * P->Tq));
        r->rc_fwd = ATTN_OK;
    } else {
        p.lse = &lse;
        r->rc_fwd = attn_sdpa(ctx, &q, &k, &v, &p, &out, NULL);
        p.lse = NULL;
    }
    r->rc_bwd = attn_sdpa_backward(ctx, &q, &k, &v, &p, &out, &lse, &dout, &g);
}

static void result_free(result *r)
{
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->dbias);
    free(r->dsinks);
}

/* Every gradient of r against the finite differences. */
static void check_fd(problem *P, const result *r, const char *path)
{
    CHECK_INT(r->rc_fwd, ATTN_OK);
    CHECK_INT(r->rc_bwd, ATTN_OK);
    const float *got[5] = {r->dq, r->dk, r->dv, r->dbias, r->dsinks};
    const int64_t n[5] = {P->nq, P->nk, P->nv, P->nbias, P->sinks ? P->H : 0};
    const char *names[5] = {"dq", "dk", "dv", "dbias", "dsinks"};
    for (int w = 0; w < 5; w++)
        for (int64_t e = 0; e < n[w]; e++) {
            if (w == 3 && P->bias[e] == -INFINITY) {
                CHECK(got[w][e] == 0.0f); /* a hidden key's bias: exactly zero */
                continue;
            }
            const double want = fd(P, w, e);
            const double diff = fabs((double)got[w][e] - want);
            if (!(diff <= ATOL + RTOL * fabs(want)))
                fprintf(stderr, "   %s %s %s[%lld]: attn %.9g, finite differences %.9g\n",
                        P->name, path, names[w], (long long)e, (double)got[w][e], want);
            CHECK_NEAR(got[w][e], want, ATOL, RTOL);
        }
}

/* ---- the problems ------------------------------------------------------------ */

#define NPROB 14
static problem problems[NPROB] = {
    {.name = "plain", .B = 2, .H = 2, .Hkv = 2, .Tq = 5, .Tk = 5, .D = 4, .Dv = 3},
    {.name = "causal top-left Tq < Tk", .B = 1, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 6, .D = 3,
     .Dv = 4, .causal = ATTN_CAUSAL_TOP_LEFT},
    {.name = "causal bottom-right Tq < Tk", .B = 1, .H = 2, .Hkv = 2, .Tq = 3, .Tk = 6,
     .D = 4, .Dv = 2, .causal = ATTN_CAUSAL_BOTTOM_RIGHT},
    {.name = "Tq > Tk", .B = 1, .H = 1, .Hkv = 1, .Tq = 6, .Tk = 3, .D = 3, .Dv = 3},
    {.name = "window (2, 1)", .B = 1, .H = 2, .Hkv = 2, .Tq = 6, .Tk = 6, .D = 3, .Dv = 3,
     .has_window = 1, .wl = 2, .wr = 1},
    {.name = "softcap", .B = 1, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 5, .D = 4, .Dv = 3,
     .softcap = 0.8f, .scale = 2.5f},
    {.name = "ALiBi", .B = 1, .H = 3, .Hkv = 3, .Tq = 4, .Tk = 5, .D = 3, .Dv = 3, .alibi = 1},
    {.name = "full bias", .B = 2, .H = 2, .Hkv = 2, .Tq = 3, .Tk = 4, .D = 3, .Dv = 2,
     .bias_shape = {2, 2, 3, 4}},
    {.name = "broadcast bias [1, H, 1, Tk]", .B = 2, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 5,
     .D = 3, .Dv = 2, .bias_shape = {1, 2, 1, 5}},
    {.name = "sinks", .B = 2, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 4, .D = 3, .Dv = 3, .sinks = 1},
    {.name = "GQA (H 4, Hkv 2)", .B = 1, .H = 4, .Hkv = 2, .Tq = 3, .Tk = 5, .D = 3, .Dv = 2},
    {.name = "MQA causal", .B = 2, .H = 3, .Hkv = 1, .Tq = 4, .Tk = 4, .D = 2, .Dv = 3,
     .causal = ATTN_CAUSAL_TOP_LEFT},
    {.name = "mask with an empty row (zero mode)", .B = 2, .H = 2, .Hkv = 1, .Tq = 4,
     .Tk = 5, .D = 3, .Dv = 3, .mask = 1},
    {.name = "everything together", .B = 2, .H = 4, .Hkv = 2, .Tq = 4, .Tk = 7, .D = 3,
     .Dv = 2, .causal = ATTN_CAUSAL_BOTTOM_RIGHT, .has_window = 1, .wl = 3, .wr = -1,
     .softcap = 1.5f, .alibi = 1, .bias_shape = {1, 4, 4, 7}, .sinks = 1, .mask = 1,
     .scale = 0.9f},
};

typedef struct path {
    char name[32];
    attn_arch arch;
    int threads;
} path;

static int paths_of(path *paths)
{
    const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                               ATTN_ARCH_AVX512};
    int n = 0;
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int t = 1; t <= 2; t++) {
            snprintf(paths[n].name, sizeof paths[n].name, "%s/%dt", attn_arch_name(archs[a]), t);
            paths[n].arch = archs[a];
            paths[n].threads = t;
            n++;
        }
    }
    return n;
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return (n == 0) || (a && b && memcmp(a, b, sizeof(float) * (size_t)n) == 0);
}

static void test_finite_differences(void)
{
    TEST("every gradient (dq, dk, dv, dbias, dsinks) matches float64 central finite "
         "differences of the loss sum(dO * O), on every option alone and all together, "
         "with the forward on every path and 1 and 2 threads");
    path paths[8];
    const int np = paths_of(paths);
    for (int c = 0; c < NPROB; c++) {
        problem *P = &problems[c];
        make(P, 1000 + 17 * (uint64_t)c);
        if (P->bias && c == NPROB - 1)
            P->bias[3] = -INFINITY; /* a bias of -inf hides a key: zero gradient */
        for (int pi = 0; pi < np; pi++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = paths[pi].arch;
            ctx.threads = paths[pi].threads;
            result r;
            run_both(P, &ctx, &r, NULL);
            check_fd(P, &r, paths[pi].name);
            result_free(&r);
            attn_ctx_release(&ctx);
        }
    }
}

static void test_paths_agree(void)
{
    TEST("given the same out and lse, the backward gives the same bits on every "
         "instruction set and thread count");
    path paths[8];
    const int np = paths_of(paths);
    for (int c = 0; c < NPROB; c++) {
        problem *P = &problems[c];
        attn_ctx ctx0;
        attn_ctx_init(&ctx0);
        ctx0.impl = ATTN_IMPL_REF;
        result r0;
        run_both(P, &ctx0, &r0, NULL);
        for (int pi = 0; pi < np; pi++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = paths[pi].arch;
            ctx.threads = paths[pi].threads;
            result r;
            run_both(P, &ctx, &r, &r0);
            int same = same_bits(r.dq, r0.dq, P->nq) && same_bits(r.dk, r0.dk, P->nk) &&
                       same_bits(r.dv, r0.dv, P->nv) && same_bits(r.dbias, r0.dbias, P->nbias) &&
                       same_bits(r.dsinks, r0.dsinks, P->sinks ? P->H : 0);
            if (!same)
                fprintf(stderr, "   %s on %s: the gradients differ from the reference's\n",
                        P->name, paths[pi].name);
            CHECK(same);
            result_free(&r);
            attn_ctx_release(&ctx);
        }
        result_free(&r0);
        attn_ctx_release(&ctx0);
    }
}

static void test_hidden_keys_exact_zero(void)
{
    TEST("a key that no query may see (causal, Tk > Tq) gets exactly zero dk and dv, "
         "even with NaN in its value and key rows; a query row that sees no key gets "
         "exactly zero dq");
    problem P = {.name = "hidden", .B = 1, .H = 2, .Hkv = 1, .Tq = 3, .Tk = 5, .D = 3, .Dv = 2,
                 .causal = ATTN_CAUSAL_TOP_LEFT, .mask = 1};
    make(&P, 77);
    /* Top-left causal: keys 3 and 4 are seen by no query (i <= 2). */
    for (int64_t d = 0; d < P.Dv; d++)
        P.v[4 * P.Dv + d] = NAN;
    for (int64_t d = 0; d < P.D; d++)
        P.k[4 * P.D + d] = NAN;
    result r;
    run_both(&P, NULL, &r, NULL);
    CHECK_INT(r.rc_fwd, ATTN_OK);
    CHECK_INT(r.rc_bwd, ATTN_OK);
    for (int64_t j = 3; j < 5; j++) {
        for (int64_t d = 0; d < P.D; d++) {
            CHECK(r.dk[j * P.D + d] == 0.0f);
            if (r.dk[j * P.D + d] != 0.0f)
                fprintf(stderr, "   dk[%lld][%lld] = %g, want 0\n", (long long)j, (long long)d,
                        (double)r.dk[j * P.D + d]);
        }
        for (int64_t d = 0; d < P.Dv; d++)
            CHECK(r.dv[j * P.Dv + d] == 0.0f);
    }
    /* Keys the queries do see have finite gradients: the NaN stayed out. */
    for (int64_t e = 0; e < 3 * P.D; e++)
        CHECK(isfinite(r.dk[e]));
    /* Row 1 of batch 0 sees no key (the mask), in both heads. */
    for (int64_t h = 0; h < P.H; h++)
        for (int64_t d = 0; d < P.D; d++)
            CHECK(r.dq[(h * P.Tq + 1) * P.D + d] == 0.0f);
    result_free(&r);
    unmake(&P);
}

static void test_nan_in_dout(void)
{
    TEST("a NaN in dO (query 1 of batch 0, head 0, feature 0, causal) makes NaN exactly "
         "the gradients it reaches: dq of that row, dk of the keys it sees, and feature 0 "
         "of those keys' dv (dV = P^T dO keeps features apart); every other gradient "
         "stays finite");
    problem P = {.name = "nan", .B = 2, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 4, .D = 3, .Dv = 3,
                 .causal = ATTN_CAUSAL_TOP_LEFT};
    make(&P, 91);
    P.dout[1 * P.Dv + 0] = NAN;
    result r;
    run_both(&P, NULL, &r, NULL);
    CHECK_INT(r.rc_bwd, ATTN_OK);
    int wrong = 0;
    for (int64_t b = 0; b < P.B; b++)
        for (int64_t h = 0; h < P.H; h++) {
            const int head = b == 0 && h == 0;
            for (int64_t i = 0; i < P.Tq; i++)
                for (int64_t d = 0; d < P.D; d++)
                    wrong += isnan(r.dq[((b * P.H + h) * P.Tq + i) * P.D + d]) != (head && i == 1);
            for (int64_t j = 0; j < P.Tk; j++) {
                for (int64_t d = 0; d < P.D; d++)
                    wrong += isnan(r.dk[((b * P.H + h) * P.Tk + j) * P.D + d]) != (head && j <= 1);
                for (int64_t d = 0; d < P.Dv; d++)
                    wrong += isnan(r.dv[((b * P.H + h) * P.Tk + j) * P.Dv + d]) !=
                             (head && j <= 1 && d == 0);
            }
        }
    CHECK_INT(wrong, 0);
    result_free(&r);
    unmake(&P);
}

static void test_refusals(void)
{
    TEST("the backward refuses p->lse (the forward's output), gradients that overlap an "
         "input or each other, dbias without a bias, and shapes that do not fit, naming "
         "the tensors");
    problem P = {.name = "args", .B = 1, .H = 2, .Hkv = 1, .Tq = 3, .Tk = 4, .D = 2, .Dv = 2};
    make(&P, 5);
    float out_d[12], lse_d[6], dq_d[12], dk_d[8], dv_d[8];
    attn_tensor q = tu_tensor4(P.q, 1, 2, 3, 2), k = tu_tensor4(P.k, 1, 1, 4, 2),
                v = tu_tensor4(P.v, 1, 1, 4, 2), out = tu_tensor4(out_d, 1, 2, 3, 2),
                lse = tu_tensor3(lse_d, 1, 2, 3), dout = tu_tensor4(P.dout, 1, 2, 3, 2),
                dq = tu_tensor4(dq_d, 1, 2, 3, 2), dk = tu_tensor4(dk_d, 1, 1, 4, 2),
                dv = tu_tensor4(dv_d, 1, 1, 4, 2);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.lse = &lse;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_sdpa(&ctx, &q, &k, &v, &p, &out, NULL), ATTN_OK);
    attn_sdpa_grads g = {&dq, &dk, &dv, NULL, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "p->lse must be NULL");
    p.lse = NULL;
    attn_sdpa_grads alias = {&dq, &dk, &dv, NULL, NULL};
    attn_tensor dq_on_q = tu_tensor4(P.q, 1, 2, 3, 2);
    alias.dq = &dq_on_q;
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &alias),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "dq and q share memory");
    attn_sdpa_grads twice = {&dq, &dk, &dk, NULL, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &twice),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "dv and dk share memory");
    attn_tensor dbias = tu_tensor4(dq_d, 1, 1, 3, 4);
    attn_sdpa_grads nobias = {&dq, &dk, &dv, &dbias, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &nobias),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "p->bias is NULL");
    attn_tensor dk_wrong = tu_tensor4(dk_d, 1, 2, 2, 2);
    attn_sdpa_grads shape = {&dq, &dk_wrong, &dv, NULL, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &shape),
              ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "grads->dk has shape (1, 2, 2, 2); expected (1, 1, 4, 2)");
    size_t bytes = 0;
    CHECK_INT(attn_sdpa_backward_workspace_size(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g,
                                                &bytes),
              ATTN_OK);
    CHECK_INT(bytes, (2 * 3 * 4 + 3) * sizeof(float));
    CHECK_INT(attn_sdpa_backward_ref(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g), ATTN_OK);
    attn_ctx_release(&ctx);
    unmake(&P);
}

int main(void)
{
    test_finite_differences();
    test_paths_agree();
    for (int c = 0; c < NPROB; c++)
        unmake(&problems[c]);
    test_hidden_keys_exact_zero();
    test_nan_in_dout();
    test_refusals();
    return check_summary("test_sdpa_backward");
}
