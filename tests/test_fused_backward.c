/*
 * test_fused_backward.c - the fused backward (src/kernels/fused_backward.h) against
 * the reference backward and a float64 analytic backward written here, on awkward
 * shapes with every section 6 option and GQA ratio, every instruction set this
 * machine runs, 1 and 2 threads.
 *
 * Problems: Tq and Tk in {1, 3, 17, 64, 113}, D in {1, 17, 64} (Dv = D, or D + 3
 * for every third problem), (H, Hkv) in {(1, 1), (2, 1), (4, 2), (3, 3), (6, 2)},
 * B in {1, 2}, and one option set in turn: none, causal top-left, causal
 * bottom-right, a window, softcap, ALiBi, a full bias, a bias broadcast over (b,
 * h) (pass 2 then runs on one thread), sinks, a random mask, and all of them
 * together; with the bias, dbias is asked for, with sinks dsinks.
 *
 * The oracle: the forward and backward in double from the same float32 inputs,
 * the formulas of docs/gradients.md (P, dV = P^T dO, dP = dO V^T, dS = P * (dP -
 * Delta), the score modifications' terms, dQ = scale dS K, dK = scale dS^T Q).
 *
 * The bound, per problem and per gradient (dq, dk, dv, dbias, dsinks):
 *
 *     max |fused - oracle| <= 2 * max |reference - oracle| + floor,
 *     floor = 16 * FLT_EPSILON * max |oracle of absolute terms|
 *
 * Both backwards start from the same float32 out and lse of the forward, so the
 * reference's error measures how hard the problem is in float32; the fused
 * backward sums in another order and uses its own exp and tanh (a couple of ulp
 * against libm's), hence the factor 2. The floor is 16 float32 ulps of the scale
 * of the terms the gradient is summed from (the oracle run on absolute values,
 * the usual form of a summation's error bound): it covers problems where the
 * reference is exact by luck while the fused one rounds once or twice more - with
 * one key, for instance, dS = P (dP - Delta) cancels to exactly 0 in the
 * reference, whose Delta and dP sum the same products in the same order, and to
 * a few ulps of dP in the fused one, which sums Delta a vector at a time.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_NONE, OPT_CAUSAL_TL, OPT_CAUSAL_BR, OPT_WINDOW, OPT_SOFTCAP, OPT_ALIBI, OPT_BIAS,
       OPT_BIAS_SHARED, OPT_SINKS, OPT_MASK, OPT_ALL, OPT_COUNT };

static const char *const opt_names[OPT_COUNT] = {
    "none", "causal top-left", "causal bottom-right", "window", "softcap", "alibi",
    "bias", "bias broadcast over b and h", "sinks", "mask", "every option"};

typedef struct problem {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int opt;
    float *q, *k, *v, *dout;
    float *bias;           /* [bB, bH, Tq, Tk] or NULL */
    int64_t bias_shape[4];
    float *sinks;          /* [H] or NULL */
    unsigned char *mask;   /* [B, 1, Tq, Tk] or NULL */
    float slopes[8];       /* ALiBi's default slopes, when on */
    attn_sdpa_params p;
    attn_tensor tbias, tsinks, tmask;
} problem;

/* A gradient set, float32 from the library or double from the oracle. */
typedef struct grads {
    float *dq, *dk, *dv, *dbias, *dsinks;
} grads;

static int64_t n_bias(const problem *P)
{
    return P->bias ? P->bias_shape[0] * P->bias_shape[1] * P->Tq * P->Tk : 0;
}

static void problem_make(problem *P, uint64_t seed)
{
    const int o = P->opt;
    P->q = calloc((size_t)(P->B * P->H * P->Tq * P->D), sizeof(float));
    P->k = calloc((size_t)(P->B * P->Hkv * P->Tk * P->D), sizeof(float));
    P->v = calloc((size_t)(P->B * P->Hkv * P->Tk * P->Dv), sizeof(float));
    P->dout = calloc((size_t)(P->B * P->H * P->Tq * P->Dv), sizeof(float));
    tu_fill(P->q, P->B * P->H * P->Tq * P->D, seed);
    tu_fill(P->k, P->B * P->Hkv * P->Tk * P->D, seed + 1);
    tu_fill(P->v, P->B * P->Hkv * P->Tk * P->Dv, seed + 2);
    tu_fill(P->dout, P->B * P->H * P->Tq * P->Dv, seed + 3);
    /* Larger scores than 1/sqrt(D) gives, so the weights are far from uniform. */
    for (int64_t i = 0; i < P->B * P->H * P->Tq * P->D; i++)
        P->q[i] *= 2.0f;
    attn_sdpa_params *p = &P->p;
    attn_sdpa_params_init(p);
    p->empty_rows = ATTN_EMPTY_ROWS_ZERO;
    if (o == OPT_CAUSAL_TL)
        p->causal = ATTN_CAUSAL_TOP_LEFT;
    if (o == OPT_CAUSAL_BR || o == OPT_ALL)
        p->causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    if (o == OPT_WINDOW || o == OPT_ALL) {
        p->has_window = 1;
        p->window_left = 5;
        p->window_right = o == OPT_ALL ? -1 : 2;
    }
    if (o == OPT_SOFTCAP || o == OPT_ALL)
        p->softcap = 1.5f;
    if (o == OPT_ALIBI || o == OPT_ALL) {
        p->alibi = 1;
        attn_alibi_slopes(NULL, P->H, P->slopes);
    }
    if (o == OPT_BIAS || o == OPT_BIAS_SHARED || o == OPT_ALL) {
        const int shared = o != OPT_BIAS;
        P->bias_shape[0] = shared ? 1 : P->B;
        P->bias_shape[1] = shared ? 1 : P->H;
        P->bias_shape[2] = P->Tq;
        P->bias_shape[3] = P->Tk;
        const int64_t n = P->bias_shape[0] * P->bias_shape[1] * P->Tq * P->Tk;
        P->bias = calloc((size_t)n, sizeof(float));
        tu_fill(P->bias, n, seed + 4);
        /* A -inf now and then hides a key as a mask does. */
        for (int64_t i = 5; i < n; i += 11)
            P->bias[i] = -INFINITY;
        P->tbias = tu_tensor4(P->bias, P->bias_shape[0], P->bias_shape[1], P->Tq, P->Tk);
        p->bias = &P->tbias;
    }
    if (o == OPT_SINKS || o == OPT_ALL) {
        P->sinks = calloc((size_t)P->H, sizeof(float));
        tu_fill(P->sinks, P->H, seed + 5);
        const int64_t sh[1] = {P->H};
        attn_tensor_init(NULL, &P->tsinks, ATTN_DTYPE_F32, P->sinks, 1, sh);
        p->sinks = &P->tsinks;
    }
    if (o == OPT_MASK || o == OPT_ALL) {
        const int64_t n = P->B * P->Tq * P->Tk;
        P->mask = calloc((size_t)n, 1);
        uint64_t s = seed + 6;
        for (int64_t i = 0; i < n; i++)
            P->mask[i] = tu_uniform(&s) > -0.4f;
        const int64_t sh[4] = {P->B, 1, P->Tq, P->Tk};
        attn_tensor_init(NULL, &P->tmask, ATTN_DTYPE_BOOL, P->mask, 4, sh);
        p->mask = &P->tmask;
    }
}

/* A problem of two (b, hk) items, B = 2, H = 2, Hkv = 1 (the one-pass form), with
 * D = Dv; the caller makes its data (problem_make). */
static problem one_pass_problem(int64_t Tq, int64_t Tk, int64_t D, int opt)
{
    problem P;
    memset(&P, 0, sizeof P);
    P.B = 2;
    P.H = 2;
    P.Hkv = 1;
    P.Tq = Tq;
    P.Tk = Tk;
    P.D = P.Dv = D;
    P.opt = opt;
    return P;
}

static void problem_free(problem *P)
{
    free(P->q);
    free(P->k);
    free(P->v);
    free(P->dout);
    free(P->bias);
    free(P->sinks);
    free(P->mask);
}

/* attn__may_attend, restated from SPEC section 6 for the oracle. */
static int visible(const problem *P, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const attn_sdpa_params *p = &P->p;
    const int64_t ip = i + P->Tk - P->Tq;
    if (p->causal == ATTN_CAUSAL_TOP_LEFT && j > i)
        return 0;
    if (p->causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > ip)
        return 0;
    if (p->has_window && ((p->window_left >= 0 && j < ip - p->window_left) ||
                          (p->window_right >= 0 && j > ip + p->window_right)))
        return 0;
    if (P->mask && !P->mask[(b * P->Tq + i) * P->Tk + j])
        return 0;
    if (P->bias) {
        const int64_t bb = P->bias_shape[0] == 1 ? 0 : b, bh = P->bias_shape[1] == 1 ? 0 : h;
        if (P->bias[((bb * P->bias_shape[1] + bh) * P->Tq + i) * P->Tk + j] == -INFINITY)
            return 0;
    }
    return 1;
}

static int64_t bias_index(const problem *P, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t bb = P->bias_shape[0] == 1 ? 0 : b, bh = P->bias_shape[1] == 1 ? 0 : h;
    return ((bb * P->bias_shape[1] + bh) * P->Tq + i) * P->Tk + j;
}

/* The forward and backward in double; gradients into the d* arrays (zeroed here).
 * With `absolute` set, every sum of the backward adds the absolute values of its
 * terms instead (|dO|, |v|, |q|, |k| and dP + Delta for dP - Delta): the scale of
 * the terms each gradient is summed from, which float32 rounding is relative to
 * (a gradient that cancels to about 0 still has terms of that size). */
static void oracle(const problem *P, int absolute, double *dq, double *dk, double *dv,
                   double *dbias, double *dsinks)
{
#define A_(x) (absolute ? fabs((double)(x)) : (double)(x))
    const int64_t B = P->B, H = P->H, Tq = P->Tq, Tk = P->Tk, D = P->D, Dv = P->Dv;
    const int64_t group = H / P->Hkv;
    const double scale = 1.0 / sqrt((double)D), c = P->p.softcap;
    memset(dk, 0, sizeof(double) * (size_t)(B * P->Hkv * Tk * D));
    memset(dv, 0, sizeof(double) * (size_t)(B * P->Hkv * Tk * Dv));
    if (dbias)
        memset(dbias, 0, sizeof(double) * (size_t)n_bias(P));
    if (dsinks)
        memset(dsinks, 0, sizeof(double) * (size_t)H);
    double *x = malloc(sizeof(double) * (size_t)Tk), *pw = malloc(sizeof(double) * (size_t)Tk);
    double *o = malloc(sizeof(double) * (size_t)Dv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / group;
            const float *K = P->k + (b * P->Hkv + hk) * Tk * D;
            const float *V = P->v + (b * P->Hkv + hk) * Tk * Dv;
            for (int64_t i = 0; i < Tq; i++) {
                const float *qi = P->q + ((b * H + h) * Tq + i) * D;
                const float *doi = P->dout + ((b * H + h) * Tq + i) * Dv;
                double *dqi = dq + ((b * H + h) * Tq + i) * D;
                memset(dqi, 0, sizeof(double) * (size_t)D);
                double m = P->sinks ? P->sinks[h] : -INFINITY;
                int seen = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    if (!visible(P, b, h, i, j))
                        continue;
                    seen = 1;
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        dot += (double)qi[d] * K[j * D + d];
                    x[j] = scale * dot;
                    double s = c > 0.0 ? c * tanh(x[j] / c) : x[j];
                    if (P->bias)
                        s += P->bias[bias_index(P, b, h, i, j)];
                    if (P->p.alibi)
                        s -= P->slopes[h] * fabs((double)(i + Tk - Tq - j));
                    pw[j] = s;
                    if (s > m)
                        m = s;
                }
                if (!seen)
                    continue; /* a row that sees no key gives and gets nothing */
                double l = P->sinks ? exp(P->sinks[h] - m) : 0.0;
                for (int64_t j = 0; j < Tk; j++)
                    if (visible(P, b, h, i, j))
                        l += (pw[j] = exp(pw[j] - m));
                memset(o, 0, sizeof(double) * (size_t)Dv);
                for (int64_t j = 0; j < Tk; j++)
                    if (visible(P, b, h, i, j)) {
                        pw[j] /= l;
                        for (int64_t d = 0; d < Dv; d++)
                            o[d] += pw[j] * A_(V[j * Dv + d]);
                    }
                double delta = 0.0;
                for (int64_t d = 0; d < Dv; d++)
                    delta += A_(doi[d]) * o[d];
                if (dsinks)
                    dsinks[h] += (absolute ? 1.0 : -1.0) * exp(P->sinks[h] - m) / l * delta;
                for (int64_t j = 0; j < Tk; j++) {
                    if (!visible(P, b, h, i, j))
                        continue;
                    double dp = 0.0;
                    for (int64_t d = 0; d < Dv; d++) {
                        dp += A_(doi[d]) * A_(V[j * Dv + d]);
                        dv[((b * P->Hkv + hk) * Tk + j) * Dv + d] += pw[j] * A_(doi[d]);
                    }
                    double ds = pw[j] * (absolute ? dp + delta : dp - delta);
                    if (dbias)
                        dbias[bias_index(P, b, h, i, j)] += ds;
                    if (c > 0.0) {
                        const double t = tanh(x[j] / c);
                        ds *= 1.0 - t * t;
                    }
                    for (int64_t d = 0; d < D; d++) {
                        dqi[d] += scale * ds * A_(K[j * D + d]);
                        dk[((b * P->Hkv + hk) * Tk + j) * D + d] += scale * ds * A_(qi[d]);
                    }
                }
            }
        }
    free(x);
    free(pw);
    free(o);
#undef A_
}

/* The forward on the reference (its out and lse), shared by every backward. */
static int forward(problem *P, float *out, float *lse)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ATTN_IMPL_REF;
    attn_tensor q = tu_tensor4(P->q, P->B, P->H, P->Tq, P->D);
    attn_tensor k = tu_tensor4(P->k, P->B, P->Hkv, P->Tk, P->D);
    attn_tensor v = tu_tensor4(P->v, P->B, P->Hkv, P->Tk, P->Dv);
    attn_tensor to = tu_tensor4(out, P->B, P->H, P->Tq, P->Dv);
    attn_tensor tl = tu_tensor3(lse, P->B, P->H, P->Tq);
    attn_sdpa_params p = P->p;
    p.lse = &tl;
    const int rc = attn_sdpa(&ctx, &q, &k, &v, &p, &to, NULL);
    if (rc != ATTN_OK)
        fprintf(stderr, "   forward: %s\n", ctx.message);
    attn_ctx_release(&ctx);
    return rc;
}

static void grads_alloc(const problem *P, grads *g)
{
    g->dq = calloc((size_t)(P->B * P->H * P->Tq * P->D), sizeof(float));
    g->dk = calloc((size_t)(P->B * P->Hkv * P->Tk * P->D), sizeof(float));
    g->dv = calloc((size_t)(P->B * P->Hkv * P->Tk * P->Dv), sizeof(float));
    g->dbias = P->bias ? calloc((size_t)n_bias(P), sizeof(float)) : NULL;
    g->dsinks = P->sinks ? calloc((size_t)P->H, sizeof(float)) : NULL;
}

static void grads_free(grads *g)
{
    free(g->dq);
    free(g->dk);
    free(g->dv);
    free(g->dbias);
    free(g->dsinks);
}

/* The backward into gr's tensors (any strides): the reference when arch is REF,
 * else the fused one on arch. */
static int backward_to(problem *P, const float *out, const float *lse, attn_arch arch,
                       int threads, const attn_sdpa_grads *gr)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_tensor q = tu_tensor4(P->q, P->B, P->H, P->Tq, P->D);
    attn_tensor k = tu_tensor4(P->k, P->B, P->Hkv, P->Tk, P->D);
    attn_tensor v = tu_tensor4(P->v, P->B, P->Hkv, P->Tk, P->Dv);
    attn_tensor to = tu_tensor4((float *)out, P->B, P->H, P->Tq, P->Dv);
    attn_tensor tl = tu_tensor3((float *)lse, P->B, P->H, P->Tq);
    attn_tensor tdo = tu_tensor4(P->dout, P->B, P->H, P->Tq, P->Dv);
    const int rc = arch == ATTN_ARCH_REF
                       ? attn_sdpa_backward_ref(&ctx, &q, &k, &v, &P->p, &to, &tl, &tdo, gr)
                       : attn_sdpa_backward(&ctx, &q, &k, &v, &P->p, &to, &tl, &tdo, gr);
    if (rc != ATTN_OK)
        fprintf(stderr, "   backward on %s: %s\n", attn_arch_name(arch), ctx.message);
    attn_ctx_release(&ctx);
    return rc;
}

/* The backward into g's contiguous arrays. */
static int backward(problem *P, const float *out, const float *lse, attn_arch arch,
                    int threads, grads *g)
{
    attn_tensor dq = tu_tensor4(g->dq, P->B, P->H, P->Tq, P->D);
    attn_tensor dk = tu_tensor4(g->dk, P->B, P->Hkv, P->Tk, P->D);
    attn_tensor dv = tu_tensor4(g->dv, P->B, P->Hkv, P->Tk, P->Dv);
    attn_tensor db, dsk;
    attn_sdpa_grads gr = {&dq, &dk, &dv, NULL, NULL};
    if (g->dbias) {
        db = tu_tensor4(g->dbias, P->bias_shape[0], P->bias_shape[1], P->Tq, P->Tk);
        gr.dbias = &db;
    }
    if (g->dsinks) {
        const int64_t sh[1] = {P->H};
        attn_tensor_init(NULL, &dsk, ATTN_DTYPE_F32, g->dsinks, 1, sh);
        gr.dsinks = &dsk;
    }
    return backward_to(P, out, lse, arch, threads, &gr);
}

static double max_err(const float *a, const double *o, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - o[i]);
        if (!(d <= e))
            e = d; /* a NaN makes the error NaN, which fails every bound */
    }
    return e;
}

static double max_abs(const double *o, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(o[i]));
    return m;
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return n == 0 || memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* 1 when a and b hold the same bits of dq, dk and dv (nq, nk, nv floats); else
 * prints both's first entries, labelled, after `where`, and returns 0. */
static int grads_same(const grads *a, const char *a_name, const grads *b, const char *b_name,
                      int64_t nq, int64_t nk, int64_t nv, const char *where)
{
    if (same_bits(a->dq, b->dq, nq) && same_bits(a->dk, b->dk, nk) &&
        same_bits(a->dv, b->dv, nv))
        return 1;
    fprintf(stderr, "   %s: %s dq[0] %.9g dk[0] %.9g dv[0] %.9g; %s %.9g %.9g %.9g\n", where,
            a_name, a->dq[0], a->dk[0], a->dv[0], b_name, b->dq[0], b->dk[0], b->dv[0]);
    return 0;
}

static const attn_arch fused_archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};

static void run_problem(problem *P, uint64_t seed, double *worst_ratio)
{
    problem_make(P, seed);
    const int64_t nq = P->B * P->H * P->Tq * P->D, nk = P->B * P->Hkv * P->Tk * P->D;
    const int64_t nv = P->B * P->Hkv * P->Tk * P->Dv, nb = n_bias(P);
    const int64_t ns = P->sinks ? P->H : 0;
    float *out = calloc((size_t)(P->B * P->H * P->Tq * P->Dv), sizeof(float));
    float *lse = calloc((size_t)(P->B * P->H * P->Tq), sizeof(float));
    double *oq = malloc(sizeof(double) * (size_t)nq), *ok = malloc(sizeof(double) * (size_t)nk);
    double *ov = malloc(sizeof(double) * (size_t)nv);
    double *ob = nb ? malloc(sizeof(double) * (size_t)nb) : NULL;
    double *os = ns ? malloc(sizeof(double) * (size_t)ns) : NULL;
    double *aq = malloc(sizeof(double) * (size_t)nq), *ak = malloc(sizeof(double) * (size_t)nk);
    double *av = malloc(sizeof(double) * (size_t)nv);
    double *ab = nb ? malloc(sizeof(double) * (size_t)nb) : NULL;
    double *as = ns ? malloc(sizeof(double) * (size_t)ns) : NULL;
    CHECK_INT(forward(P, out, lse), ATTN_OK);
    oracle(P, 0, oq, ok, ov, ob, os);
    oracle(P, 1, aq, ak, av, ab, as);
    grads ref;
    grads_alloc(P, &ref);
    CHECK_INT(backward(P, out, lse, ATTN_ARCH_REF, 1, &ref), ATTN_OK);

    const char *names[5] = {"dq", "dk", "dv", "dbias", "dsinks"};
    const int64_t ns5[5] = {nq, nk, nv, nb, ns};
    const double *or5[5] = {oq, ok, ov, ob, os};
    const double *ab5[5] = {aq, ak, av, ab, as};
    const float *rf5[5] = {ref.dq, ref.dk, ref.dv, ref.dbias, ref.dsinks};
    for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
        if (!attn_arch_supported(fused_archs[a]))
            continue;
        grads g[2];
        for (int t = 0; t < 2; t++) {
            grads_alloc(P, &g[t]);
            CHECK_INT(backward(P, out, lse, fused_archs[a], t + 1, &g[t]), ATTN_OK);
        }
        const float *f5[2][5] = {{g[0].dq, g[0].dk, g[0].dv, g[0].dbias, g[0].dsinks},
                                 {g[1].dq, g[1].dk, g[1].dv, g[1].dbias, g[1].dsinks}};
        for (int x = 0; x < 5; x++) {
            if (ns5[x] == 0)
                continue;
            const double eref = max_err(rf5[x], or5[x], ns5[x]);
            const double efus = max_err(f5[0][x], or5[x], ns5[x]);
            const double floor = 16.0 * FLT_EPSILON * max_abs(ab5[x], ns5[x]);
            const double bound = 2.0 * eref + floor;
            const int ok_bound = efus <= bound;
            const int ok_bits = same_bits(f5[0][x], f5[1][x], ns5[x]);
            if (!ok_bound || !ok_bits)
                fprintf(stderr,
                        "   B=%lld H=%lld Hkv=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld %s on %s, "
                        "%s: fused error %.3g, bound %.3g (reference %.3g); "
                        "1 and 2 threads %s\n",
                        (long long)P->B, (long long)P->H, (long long)P->Hkv, (long long)P->Tq,
                        (long long)P->Tk, (long long)P->D, (long long)P->Dv,
                        opt_names[P->opt], attn_arch_name(fused_archs[a]), names[x], efus,
                        bound, eref, ok_bits ? "agree" : "DIFFER");
            CHECK(ok_bound);
            CHECK(ok_bits);
            if (efus / bound > *worst_ratio)
                *worst_ratio = efus / bound;
        }
        grads_free(&g[0]);
        grads_free(&g[1]);
    }
    grads_free(&ref);
    free(out);
    free(lse);
    free(oq);
    free(ok);
    free(ov);
    free(ob);
    free(os);
    free(aq);
    free(ak);
    free(av);
    free(ab);
    free(as);
    problem_free(P);
}

static void test_sweep(void)
{
    TEST("on every shape in {1, 3, 17, 64, 113}, every option and GQA ratio, every "
         "instruction set, the fused backward's dq, dk, dv, dbias and dsinks are within "
         "2 x the reference's error against a float64 backward + 16 ulps, and 1 and 2 "
         "threads give the same bits");
    static const int64_t T[] = {1, 3, 17, 64, 113};
    static const int64_t Ds[] = {1, 17, 64};
    static const int64_t heads[][2] = {{1, 1}, {2, 1}, {4, 2}, {3, 3}, {6, 2}};
    double worst = 0.0;
    int n = 0;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++)
            for (int o = 0; o < OPT_COUNT; o++) {
                problem P;
                memset(&P, 0, sizeof P);
                const int c = n++;
                P.Tq = T[a];
                P.Tk = T[b];
                P.opt = o;
                P.D = Ds[c % 3];
                P.Dv = c % 3 == 1 ? P.D + 3 : P.D;
                P.H = heads[c % 5][0];
                P.Hkv = heads[c % 5][1];
                P.B = 1 + (c / 5) % 2;
                /* Small shapes run every option; the largest pair runs D = 64 only. */
                if (P.Tq * P.Tk * P.D * P.H * P.B > 2000000)
                    continue;
                run_problem(&P, 7000 + 31 * (uint64_t)c, &worst);
            }
    printf("   %d problems; the largest fused error is %.2f of its bound\n", n, worst);
}

static void test_threads_used(void)
{
    TEST("a problem large enough for 2 threads (B=1, H=4, Hkv=2, Tq=113, Tk=257, D=64) "
         "with every option gives the same bits on 1 and 2 threads, within the bound");
    problem P;
    memset(&P, 0, sizeof P);
    P.B = 1;
    P.H = 4;
    P.Hkv = 2;
    P.Tq = 113;
    P.Tk = 257;
    P.D = P.Dv = 64;
    P.opt = OPT_ALL;
    double worst = 0.0;
    run_problem(&P, 99, &worst);
    memset(&P, 0, sizeof P);
    P.B = 2;
    P.H = 4;
    P.Hkv = 1;
    P.Tq = 113;
    P.Tk = 113;
    P.D = P.Dv = 64;
    P.opt = OPT_BIAS;
    run_problem(&P, 98, &worst);
}

static void test_many_key_groups(void)
{
    TEST("with more key tiles than one group of the one-pass form holds (Tk = 300 and "
         "330: a second group starts at key 256), causal, bottom-right causal with Tq < "
         "Tk and a window (the path that makes P and dS in registers, whose rows for a "
         "group start at the first row that reaches it and stop at the first past it) "
         "are within the bound on every instruction set, 1 and 2 threads the same bits");
    static const struct {
        int64_t Tq, Tk, D;
        int opt;
    } cases[] = {
        {300, 300, 32, OPT_CAUSAL_TL},
        {130, 330, 32, OPT_CAUSAL_BR},
        {300, 300, 32, OPT_WINDOW},
        {130, 300, 17, OPT_NONE},
    };
    double worst = 0.0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        problem P = one_pass_problem(cases[c].Tq, cases[c].Tk, cases[c].D, cases[c].opt);
        run_problem(&P, 5100 + (uint64_t)c, &worst);
    }
    printf("   the largest fused error is %.2f of its bound\n", worst);
}

static void test_hidden_key_exact_zero(void)
{
    TEST("a key no row may see (masked everywhere) gets exactly zero dk and dv on every "
         "instruction set, even with NaN in its k and v, and no other gradient is NaN");
    problem P;
    memset(&P, 0, sizeof P);
    P.B = 1;
    P.H = 2;
    P.Hkv = 1;
    P.Tq = 17;
    P.Tk = 64;
    P.D = P.Dv = 17;
    P.opt = OPT_MASK;
    problem_make(&P, 4242);
    const int64_t hidden = 40;
    for (int64_t i = 0; i < P.Tq; i++)
        P.mask[i * P.Tk + hidden] = 0;
    for (int64_t d = 0; d < P.D; d++) {
        P.k[hidden * P.D + d] = NAN;
        P.v[hidden * P.Dv + d] = NAN;
    }
    float *out = calloc((size_t)(P.H * P.Tq * P.Dv), sizeof(float));
    float *lse = calloc((size_t)(P.H * P.Tq), sizeof(float));
    CHECK_INT(forward(&P, out, lse), ATTN_OK);
    for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
        if (!attn_arch_supported(fused_archs[a]))
            continue;
        grads g;
        grads_alloc(&P, &g);
        CHECK_INT(backward(&P, out, lse, fused_archs[a], 2, &g), ATTN_OK);
        int zero = 1, finite = 1;
        for (int64_t d = 0; d < P.D; d++)
            zero &= g.dk[hidden * P.D + d] == 0.0f && g.dv[hidden * P.Dv + d] == 0.0f;
        for (int64_t x = 0; x < P.Tk * P.D; x++)
            finite &= isfinite(g.dk[x]) && isfinite(g.dv[x]);
        for (int64_t x = 0; x < P.H * P.Tq * P.D; x++)
            finite &= isfinite(g.dq[x]) != 0;
        if (!zero || !finite)
            fprintf(stderr, "   %s: hidden key dk[0] %g dv[0] %g; all finite: %d\n",
                    attn_arch_name(fused_archs[a]), g.dk[hidden * P.D], g.dv[hidden * P.Dv],
                    finite);
        CHECK(zero);
        CHECK(finite);
        grads_free(&g);
    }
    free(out);
    free(lse);
    problem_free(&P);
}

/* The fused backward has two forms (src/kernels/fused_backward.h): one pass over
 * (b, key/value head) items when there are two or more, two passes (key tiles,
 * then query tiles) for a single one. They sum every element in the same order,
 * so the first sample of a B = 2 problem (one pass) and the same sample alone
 * (B = 1, Hkv = 1: two passes) must agree bit for bit. */
static void test_forms_agree(void)
{
    TEST("sample 0 of a B=2 problem (the one-pass form) and the same sample alone (the "
         "two-pass form) get the same bits of dq, dk and dv, on every instruction set "
         "and option without a bias, Tq=Tk=113 and 17 x 130");
    static const int opts[] = {OPT_NONE,  OPT_CAUSAL_TL, OPT_CAUSAL_BR, OPT_WINDOW,
                               OPT_SOFTCAP, OPT_ALIBI,   OPT_SINKS,     OPT_MASK};
    static const int64_t sizes[2][2] = {{113, 113}, {17, 130}};
    for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++)
        for (int z = 0; z < 2; z++) {
            problem P2;
            memset(&P2, 0, sizeof P2);
            P2.B = 2;
            P2.H = 2;
            P2.Hkv = 1;
            P2.Tq = sizes[z][0];
            P2.Tk = sizes[z][1];
            P2.D = 64;
            P2.Dv = z ? 17 : 64;
            P2.opt = opts[o];
            problem_make(&P2, 500 + 17 * (uint64_t)o + (uint64_t)z);
            /* The first sample is the prefix of every [B, ...] array. */
            problem P1 = P2;
            P1.B = 1;
            if (P2.mask) {
                const int64_t sh[4] = {1, 1, P2.Tq, P2.Tk};
                attn_tensor_init(NULL, &P1.tmask, ATTN_DTYPE_BOOL, P2.mask, 4, sh);
                P1.p.mask = &P1.tmask;
            }
            if (P2.sinks)
                P1.p.sinks = &P1.tsinks;
            const int64_t nq = P2.H * P2.Tq * P2.D, nk = P2.Hkv * P2.Tk * P2.D;
            const int64_t nv = P2.Hkv * P2.Tk * P2.Dv;
            float *out = calloc((size_t)(2 * P2.H * P2.Tq * P2.Dv), sizeof(float));
            float *lse = calloc((size_t)(2 * P2.H * P2.Tq), sizeof(float));
            CHECK_INT(forward(&P2, out, lse), ATTN_OK);
            for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
                if (!attn_arch_supported(fused_archs[a]))
                    continue;
                grads g1, g2;
                grads_alloc(&P1, &g1);
                grads_alloc(&P2, &g2);
                CHECK_INT(backward(&P1, out, lse, fused_archs[a], 2, &g1), ATTN_OK);
                CHECK_INT(backward(&P2, out, lse, fused_archs[a], 2, &g2), ATTN_OK);
                char where[160];
                snprintf(where, sizeof where, "%s, %s, Tq=%lld Tk=%lld", opt_names[opts[o]],
                         attn_arch_name(fused_archs[a]), (long long)P2.Tq, (long long)P2.Tk);
                CHECK(grads_same(&g2, "one pass", &g1, "two passes", nq, nk, nv, where));
                grads_free(&g1);
                grads_free(&g2);
            }
            free(out);
            free(lse);
            problem_free(&P2);
        }
}

/* Without a bias, ALiBi or softcap the kernel makes P and dS in registers
 * (fb_rows_tile_fast), and on AVX-512 it scores the causal diagonal's last keys
 * one vector (16 keys) at a time where a step of two would reach past the rows'
 * keys. An all-true mask gives the same visible keys with the mask's choice
 * added to each vector (until the sixth look at the backward's speed it sent the
 * problem through the general path, scores stored and the options applied after;
 * that path's agreement with the registers' is now test_forms_agree's, whose
 * two-pass form takes dQ through it). Both compute every value by the same
 * operations in the same order, so the gradients must agree bit for bit, on
 * shapes whose sub-blocks end on every offset within a step (113, a bottom-right
 * 40 x 100, a window) and on 1 and 2 threads. */
static void test_fast_general_agree(void)
{
    TEST("causal (top-left 113 x 113, bottom-right 40 x 100) and window problems get the "
         "same bits of dq, dk and dv with no mask (P and dS in registers, the diagonal by "
         "single vectors) as with an all-true mask (the mask chosen in registers too), on "
         "every instruction set, 1 and 2 threads");
    static const struct {
        int opt;
        int64_t Tq, Tk;
    } cases[] = {{OPT_CAUSAL_TL, 113, 113}, {OPT_CAUSAL_BR, 40, 100}, {OPT_WINDOW, 113, 113}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        problem P = one_pass_problem(cases[c].Tq, cases[c].Tk, 64, cases[c].opt);
        problem_make(&P, 6100 + (uint64_t)c);
        /* The same problem with every key let through by a mask. */
        problem M = P;
        const int64_t nm = P.B * P.Tq * P.Tk;
        unsigned char *ones = malloc((size_t)nm);
        memset(ones, 1, (size_t)nm);
        const int64_t sh[4] = {P.B, 1, P.Tq, P.Tk};
        attn_tensor_init(NULL, &M.tmask, ATTN_DTYPE_BOOL, ones, 4, sh);
        M.p.mask = &M.tmask;
        const int64_t nq = P.B * P.H * P.Tq * P.D, nk = P.B * P.Hkv * P.Tk * P.D;
        const int64_t nv = P.B * P.Hkv * P.Tk * P.Dv;
        float *out = calloc((size_t)(P.B * P.H * P.Tq * P.Dv), sizeof(float));
        float *lse = calloc((size_t)(P.B * P.H * P.Tq), sizeof(float));
        CHECK_INT(forward(&P, out, lse), ATTN_OK);
        for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
            if (!attn_arch_supported(fused_archs[a]))
                continue;
            for (int threads = 1; threads <= 2; threads++) {
                grads gf, gm;
                grads_alloc(&P, &gf);
                grads_alloc(&P, &gm);
                CHECK_INT(backward(&P, out, lse, fused_archs[a], threads, &gf), ATTN_OK);
                CHECK_INT(backward(&M, out, lse, fused_archs[a], threads, &gm), ATTN_OK);
                char where[160];
                snprintf(where, sizeof where, "%s, %s, %d threads, Tq=%lld Tk=%lld",
                         opt_names[cases[c].opt], attn_arch_name(fused_archs[a]), threads,
                         (long long)P.Tq, (long long)P.Tk);
                CHECK(grads_same(&gf, "no mask", &gm, "all-true mask", nq, nk, nv, where));
                grads_free(&gf);
                grads_free(&gm);
            }
        }
        free(out);
        free(lse);
        free(ones);
        problem_free(&P);
    }
}

/* The mask is chosen in registers, a vector of keys at a time, where its row is
 * contiguous along the keys (fb_mask_keep), and key by key where it is not or
 * where a vector reaches past the tile's last key; a padding mask [B, 1, 1, Tk]
 * serves every query from one row, and a key tile it hides whole is left out
 * (fb_mask_hides_tile: sample 1's last quarter of 130 and of 300 keys holds the
 * whole last tile). A mask with a stride of two bytes along the keys (the same
 * values) must give the same bits as the contiguous one, and a padding mask the
 * same bits as its expansion to [B, 1, Tq, Tk], which is read row by row. */
static void test_mask_layouts_agree(void)
{
    TEST("a [B, 1, Tq, Tk] mask read with a stride of 2 bytes along the keys, and a [B, 1, "
         "1, Tk] padding mask, give the same bits of dq, dk and dv as the same masks "
         "contiguous and expanded (causal 113 x 113, none 17 x 130, bottom-right causal 100 "
         "x 300; every instruction set, 1 and 2 threads)");
    static const struct {
        int opt;
        int64_t Tq, Tk;
    } cases[] = {{OPT_CAUSAL_TL, 113, 113}, {OPT_NONE, 17, 130}, {OPT_CAUSAL_BR, 100, 300}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        problem P = one_pass_problem(cases[c].Tq, cases[c].Tk, 64, cases[c].opt);
        problem_make(&P, 6300 + (uint64_t)c);
        const int64_t B = P.B, Tq = P.Tq, Tk = P.Tk, nm = B * Tq * Tk;
        /* A padding row per sample (sample 1 pads its last quarter of keys, and
         * both hide every fifth key), its expansion, a random per-query mask and
         * the same values every other byte. */
        unsigned char *pad = malloc((size_t)(B * Tk)), *full = malloc((size_t)nm);
        unsigned char *rnd = malloc((size_t)nm), *wide = calloc((size_t)(2 * nm), 1);
        uint64_t seed = 6400 + (uint64_t)c;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Tk; j++)
                pad[b * Tk + j] = !(b == 1 && j >= Tk - Tk / 4) && j % 5 != 3;
        for (int64_t x = 0; x < nm; x++) {
            full[x] = pad[(x / (Tq * Tk)) * Tk + x % Tk];
            rnd[x] = tu_uniform(&seed) > -0.4f;
            wide[2 * x] = rnd[x];
        }
        const int64_t sh_full[4] = {B, 1, Tq, Tk}, sh_pad[4] = {B, 1, 1, Tk};
        problem Mf = P, Mp = P, Mr = P, Mw = P;
        attn_tensor_init(NULL, &Mf.tmask, ATTN_DTYPE_BOOL, full, 4, sh_full);
        attn_tensor_init(NULL, &Mp.tmask, ATTN_DTYPE_BOOL, pad, 4, sh_pad);
        attn_tensor_init(NULL, &Mr.tmask, ATTN_DTYPE_BOOL, rnd, 4, sh_full);
        attn_tensor_init(NULL, &Mw.tmask, ATTN_DTYPE_BOOL, wide, 4, sh_full);
        for (int d = 0; d < 4; d++)
            Mw.tmask.stride[d] *= 2;
        Mf.p.mask = &Mf.tmask;
        Mp.p.mask = &Mp.tmask;
        Mr.p.mask = &Mr.tmask;
        Mw.p.mask = &Mw.tmask;
        const int64_t nq = B * P.H * Tq * P.D, nk = B * P.Hkv * Tk * P.D;
        const int64_t nv = B * P.Hkv * Tk * P.Dv;
        float *out_f = calloc((size_t)(B * P.H * Tq * P.Dv), sizeof(float));
        float *lse_f = calloc((size_t)(B * P.H * Tq), sizeof(float));
        float *out_r = calloc((size_t)(B * P.H * Tq * P.Dv), sizeof(float));
        float *lse_r = calloc((size_t)(B * P.H * Tq), sizeof(float));
        CHECK_INT(forward(&Mf, out_f, lse_f), ATTN_OK);
        CHECK_INT(forward(&Mr, out_r, lse_r), ATTN_OK);
        for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
            if (!attn_arch_supported(fused_archs[a]))
                continue;
            for (int threads = 1; threads <= 2; threads++) {
                grads gf, gp, gr, gw;
                grads_alloc(&P, &gf);
                grads_alloc(&P, &gp);
                grads_alloc(&P, &gr);
                grads_alloc(&P, &gw);
                CHECK_INT(backward(&Mf, out_f, lse_f, fused_archs[a], threads, &gf), ATTN_OK);
                CHECK_INT(backward(&Mp, out_f, lse_f, fused_archs[a], threads, &gp), ATTN_OK);
                CHECK_INT(backward(&Mr, out_r, lse_r, fused_archs[a], threads, &gr), ATTN_OK);
                CHECK_INT(backward(&Mw, out_r, lse_r, fused_archs[a], threads, &gw), ATTN_OK);
                char where[160];
                snprintf(where, sizeof where, "%s, %s, %d threads, Tq=%lld Tk=%lld",
                         opt_names[cases[c].opt], attn_arch_name(fused_archs[a]), threads,
                         (long long)Tq, (long long)Tk);
                CHECK(grads_same(&gp, "padding [B,1,1,Tk]", &gf, "expanded [B,1,Tq,Tk]", nq,
                                 nk, nv, where));
                CHECK(grads_same(&gw, "mask at stride 2", &gr, "contiguous mask", nq, nk, nv,
                                 where));
                grads_free(&gf);
                grads_free(&gp);
                grads_free(&gr);
                grads_free(&gw);
            }
        }
        free(out_f);
        free(lse_f);
        free(out_r);
        free(lse_r);
        free(pad);
        free(full);
        free(rnd);
        free(wide);
        problem_free(&P);
    }
}

/* A [B, Hx, T, Dx] view of a buffer whose rows are padded to Dx + 16 floats
 * (gap set) or whose last index takes every other float (gap clear). */
static attn_tensor strided_view(float *buf, int64_t B, int64_t Hx, int64_t T, int64_t Dx, int gap)
{
    attn_tensor t = tu_tensor4(buf, B, Hx, T, Dx);
    const int64_t row = gap ? Dx + 16 : 2 * Dx;
    t.stride[3] = gap ? 1 : 2;
    t.stride[2] = row;
    t.stride[1] = T * row;
    t.stride[0] = Hx * T * row;
    return t;
}

/* Element (b, h, i, d) of a strided view equals contiguous c's, bit for bit. */
static int same_view(const attn_tensor *t, const float *c)
{
    const float *x = (const float *)t->data;
    int64_t at = 0;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t i = 0; i < t->shape[2]; i++)
                for (int64_t d = 0; d < t->shape[3]; d++, at++) {
                    const float y = x[b * t->stride[0] + h * t->stride[1] + i * t->stride[2] +
                                      d * t->stride[3]];
                    if (memcmp(&y, &c[at], sizeof y) != 0) {
                        fprintf(stderr, "   at (%lld, %lld, %lld, %lld): view %.9g, contiguous %.9g\n",
                                (long long)b, (long long)h, (long long)i, (long long)d, y, c[at]);
                        return 0;
                    }
                }
    return 1;
}

/* The causal (top-left) problem of B batches, H query and Hkv key/value heads,
 * Tq = Tk = 113 and D = Dv = 64 that the NaN and strided-output tests share. */
static void causal113(problem *P, int64_t B, int64_t H, int64_t Hkv, uint64_t seed)
{
    memset(P, 0, sizeof *P);
    P->B = B;
    P->H = H;
    P->Hkv = Hkv;
    P->Tq = P->Tk = 113;
    P->D = P->Dv = 64;
    P->opt = OPT_CAUSAL_TL;
    problem_make(P, seed);
}

static void test_strided_outputs(void)
{
    TEST("dq, dk and dv written into views whose rows have a gap, or whose last index is "
         "not contiguous, get the same bits as contiguous outputs (which the kernel fills "
         "with one copy of its scratch), in both forms (B = 2 and B = 1), causal, on every "
         "instruction set, Tq=Tk=113, D=Dv=64");
    for (int64_t B = 1; B <= 2; B++) {
        problem P;
        causal113(&P, B, 2, 1, 900 + (uint64_t)B);
        float *out = calloc((size_t)(B * P.H * P.Tq * P.Dv), sizeof(float));
        float *lse = calloc((size_t)(B * P.H * P.Tq), sizeof(float));
        CHECK_INT(forward(&P, out, lse), ATTN_OK);
        for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
            if (!attn_arch_supported(fused_archs[a]))
                continue;
            grads g;
            grads_alloc(&P, &g);
            CHECK_INT(backward(&P, out, lse, fused_archs[a], 2, &g), ATTN_OK);
            for (int gap = 0; gap <= 1; gap++) {
                /* Room for either layout: rows of 2 D floats at most. */
                float *bq = calloc((size_t)(B * P.H * P.Tq * 2 * P.D), sizeof(float));
                float *bk = calloc((size_t)(B * P.Hkv * P.Tk * 2 * P.D), sizeof(float));
                float *bv = calloc((size_t)(B * P.Hkv * P.Tk * 2 * P.Dv), sizeof(float));
                attn_tensor dq = strided_view(bq, B, P.H, P.Tq, P.D, gap);
                attn_tensor dk = strided_view(bk, B, P.Hkv, P.Tk, P.D, gap);
                attn_tensor dv = strided_view(bv, B, P.Hkv, P.Tk, P.Dv, gap);
                const attn_sdpa_grads gr = {&dq, &dk, &dv, NULL, NULL};
                CHECK_INT(backward_to(&P, out, lse, fused_archs[a], 2, &gr), ATTN_OK);
                const int same = same_view(&dq, g.dq) && same_view(&dk, g.dk) &&
                                 same_view(&dv, g.dv);
                if (!same)
                    fprintf(stderr, "   %s, B=%lld, %s\n", attn_arch_name(fused_archs[a]),
                            (long long)B, gap ? "rows with a gap" : "every other float");
                CHECK(same);
                free(bq);
                free(bk);
                free(bv);
            }
            grads_free(&g);
        }
        free(out);
        free(lse);
        problem_free(&P);
    }
}

/* A NaN in one row of dO, with D = Dv = 64 (rows read in place, not copied, on
 * AVX-512 and AVX2), in both forms of the fused backward. */
static void test_nan_in_dout_wide(void)
{
    TEST("a NaN in dO (row 40 of batch 0, head 0, feature 0, causal, D=64, Tq=Tk=113) "
         "makes NaN exactly dq of that row, dk of keys 0..40 and feature 0 of their dv, "
         "in one pass (B=2) and two (B=1), on every instruction set");
    for (int64_t B = 1; B <= 2; B++) {
        problem P;
        causal113(&P, B, 1, 1, 777);
        const int64_t i0 = 40;
        float *out = calloc((size_t)(P.B * P.Tq * P.Dv), sizeof(float));
        float *lse = calloc((size_t)(P.B * P.Tq), sizeof(float));
        CHECK_INT(forward(&P, out, lse), ATTN_OK);
        P.dout[i0 * P.Dv] = NAN;
        for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
            if (!attn_arch_supported(fused_archs[a]))
                continue;
            grads g;
            grads_alloc(&P, &g);
            CHECK_INT(backward(&P, out, lse, fused_archs[a], 2, &g), ATTN_OK);
            int64_t wrong = 0;
            for (int64_t b = 0; b < P.B; b++)
                for (int64_t i = 0; i < P.Tq; i++)
                    for (int64_t d = 0; d < P.D; d++) {
                        const int64_t at = (b * P.Tq + i) * P.D + d;
                        wrong += isnan(g.dq[at]) != (b == 0 && i == i0);
                        wrong += isnan(g.dk[at]) != (b == 0 && i <= i0);
                        wrong += isnan(g.dv[at]) != (b == 0 && i <= i0 && d == 0);
                    }
            if (wrong)
                fprintf(stderr, "   B=%lld on %s: %lld gradients NaN where they should not "
                        "be or finite where they should be NaN (0 expected)\n",
                        (long long)B, attn_arch_name(fused_archs[a]), (long long)wrong);
            CHECK_INT(wrong, 0);
            grads_free(&g);
        }
        free(out);
        free(lse);
        problem_free(&P);
    }
}

/* A NaN in v of one key, with k finite and no mask but causal, D = 64: the
 * fused backward's path for such calls makes P and dS in registers, choosing 0
 * for a hidden key, and a row that cannot see the key must not take the NaN
 * from its dP. */
static void test_nan_in_v_hidden(void)
{
    TEST("a NaN in v of key 100 (batch 0, causal, D=64, Tq=Tk=113; k finite) makes NaN "
         "exactly the gradients the reference makes NaN, and dq of rows 0..99 (which "
         "cannot see the key) finite, in one pass (B=2) and two (B=1), on every "
         "instruction set");
    for (int64_t B = 1; B <= 2; B++) {
        problem P;
        causal113(&P, B, 1, 1, 778);
        const int64_t j0 = 100;
        for (int64_t d = 0; d < P.Dv; d++)
            P.v[j0 * P.Dv + d] = NAN;
        float *out = calloc((size_t)(P.B * P.Tq * P.Dv), sizeof(float));
        float *lse = calloc((size_t)(P.B * P.Tq), sizeof(float));
        CHECK_INT(forward(&P, out, lse), ATTN_OK);
        grads ref;
        grads_alloc(&P, &ref);
        CHECK_INT(backward(&P, out, lse, ATTN_ARCH_REF, 1, &ref), ATTN_OK);
        const int64_t n = P.B * P.Tq * P.D;
        for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
            if (!attn_arch_supported(fused_archs[a]))
                continue;
            grads g;
            grads_alloc(&P, &g);
            CHECK_INT(backward(&P, out, lse, fused_archs[a], 2, &g), ATTN_OK);
            int64_t differ = 0, early_nan = 0;
            for (int64_t x = 0; x < n; x++) {
                differ += isnan(g.dq[x]) != isnan(ref.dq[x]);
                differ += isnan(g.dk[x]) != isnan(ref.dk[x]);
                differ += isnan(g.dv[x]) != isnan(ref.dv[x]);
            }
            for (int64_t x = 0; x < j0 * P.D; x++)
                early_nan += !isfinite(g.dq[x]);
            if (differ || early_nan)
                fprintf(stderr, "   B=%lld on %s: %lld gradients NaN where the reference's "
                        "are not or the other way (0 expected), %lld of dq's rows 0..99 "
                        "not finite (0 expected)\n",
                        (long long)B, attn_arch_name(fused_archs[a]), (long long)differ,
                        (long long)early_nan);
            CHECK_INT(differ, 0);
            CHECK_INT(early_nan, 0);
            grads_free(&g);
        }
        grads_free(&ref);
        free(out);
        free(lse);
        problem_free(&P);
    }
}

int main(void)
{
    test_nan_in_dout_wide();
    test_nan_in_v_hidden();
    test_forms_agree();
    test_fast_general_agree();
    test_mask_layouts_agree();
    test_strided_outputs();
    test_hidden_key_exact_zero();
    test_threads_used();
    test_many_key_groups();
    test_sweep();
    return check_summary("test_fused_backward");
}
