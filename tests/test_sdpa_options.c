/*
 * test_sdpa_options.c - the options of current models (grouped-query heads, causal
 * alignment, sliding windows, softcap, ALiBi, additive bias, sinks, log-sum-exp),
 * alone and in combination, against a float64 oracle written here from the
 * contract's formulas, on every path this machine has (the reference, and attn_sdpa
 * on every instruction set) with 1 and 2 threads.
 *
 * Tolerances: the outputs and weights are below 1 in magnitude (v is uniform in
 * [-1, 1)), and a float32 computation of at most 33 keys of head dim <= 13 stays
 * within 2e-6 of the oracle plus 1e-5 relative (a few ulps per rounding, times the
 * sum's length); the log-sum-exp is a sum of exponentials plus its maximum, so it
 * gets the same relative bound against its own magnitude. Identities that hold
 * exactly in float32 (GQA against repeated heads, a window against the mask it
 * stands for, a -inf bias against a false mask) are compared bit for bit.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 2e-6
#define RTOL 1e-5

/* The fused kernel runs grouped-query heads itself; the other options still run on
 * the reference when attn_sdpa is called (sdpa_contract.c routes them), so the exact
 * identities between an option and its mask form hold on the fast paths only once
 * the kernel takes them too. Set to 1 with that change. */
#define FUSED_TAKES_OPTIONS 1

/* ---- the oracle ---------------------------------------------------------------- */

typedef struct opts {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int causal;            /* attn_causal */
    int has_window;
    int64_t wl, wr;
    double softcap;
    int alibi;             /* 0 off, 1 default slopes, 2 caller slopes */
    const float *slopes;   /* [H] */
    const float *bias;     /* [B, H, Tq, Tk] already broadcast, or NULL */
    const unsigned char *mask; /* [B, H, Tq, Tk] already broadcast, or NULL */
    const float *sinks;    /* [H] or NULL */
    double scale;
} opts;

static double default_slope(int64_t h, int64_t H)
{
    int64_t m = 1;
    while (m * 2 <= H)
        m *= 2;
    return h < m ? pow(2.0, -8.0 * (double)(h + 1) / (double)m)
                 : pow(2.0, -8.0 * (double)(2 * (h - m) + 1) / (double)(2 * m));
}

/* Returns the number of rows with every key hidden. out [B,H,Tq,Dv], w [B,H,Tq,Tk],
 * lse [B,H,Tq]; q [B,H,Tq,D], k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv], all contiguous. */
static int oracle(const opts *o, const float *q, const float *k, const float *v,
                  double *out, double *w, double *lse)
{
    int empty = 0;
    double *s = malloc((size_t)o->Tk * sizeof *s);
    int *vis = malloc((size_t)o->Tk * sizeof *vis);
    for (int64_t b = 0; b < o->B; b++)
        for (int64_t h = 0; h < o->H; h++) {
            const int64_t hk = h / (o->H / o->Hkv);
            const double slope = o->alibi == 1 ? (double)(float)default_slope(h, o->H)
                                 : o->alibi == 2 ? (double)o->slopes[h] : 0.0;
            for (int64_t i = 0; i < o->Tq; i++) {
                const int64_t ip = i + o->Tk - o->Tq;
                const int64_t row = (b * o->H + h) * o->Tq + i;
                double m = o->sinks ? (double)o->sinks[h] : -INFINITY;
                int nvis = 0;
                for (int64_t j = 0; j < o->Tk; j++) {
                    double x = 0;
                    for (int64_t d = 0; d < o->D; d++)
                        x += (double)q[row * o->D + d] *
                             (double)k[((b * o->Hkv + hk) * o->Tk + j) * o->D + d];
                    x *= o->scale;
                    if (o->softcap > 0)
                        x = o->softcap * tanh(x / o->softcap);
                    double bias = o->bias ? (double)o->bias[row * o->Tk + j] : 0.0;
                    x += bias;
                    x -= slope * fabs((double)(ip - j));
                    int ok = 1;
                    if (o->causal == 1 && j > i)
                        ok = 0;
                    if (o->causal == 2 && j > ip)
                        ok = 0;
                    if (o->has_window && ((o->wl >= 0 && j < ip - o->wl) ||
                                          (o->wr >= 0 && j > ip + o->wr)))
                        ok = 0;
                    if (o->mask && !o->mask[row * o->Tk + j])
                        ok = 0;
                    if (bias == -INFINITY)
                        ok = 0;
                    vis[j] = ok;
                    s[j] = x;
                    if (ok) {
                        nvis++;
                        if (x > m)
                            m = x;
                    }
                }
                double sum = o->sinks ? exp((double)o->sinks[h] - m) : 0.0;
                for (int64_t j = 0; j < o->Tk; j++)
                    if (vis[j])
                        sum += exp(s[j] - m);
                if (nvis == 0)
                    empty++;
                lse[row] = nvis == 0 ? (o->sinks ? (double)o->sinks[h] : -INFINITY)
                                     : m + log(sum);
                for (int64_t j = 0; j < o->Tk; j++)
                    w[row * o->Tk + j] = nvis && vis[j] ? exp(s[j] - m) / sum : 0.0;
                for (int64_t e = 0; e < o->Dv; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < o->Tk; j++)
                        if (vis[j] && nvis)
                            acc += w[row * o->Tk + j] *
                                   (double)v[((b * o->Hkv + hk) * o->Tk + j) * o->Dv + e];
                    out[row * o->Dv + e] = acc;
                }
            }
        }
    free(s);
    free(vis);
    return empty;
}

/* ---- the paths ------------------------------------------------------------------ */

typedef struct path {
    const char *name;
    int ref;        /* attn_sdpa_ref */
    attn_arch arch; /* else attn_sdpa on this arch */
    int threads;
} path;

static path paths[16];
static int n_paths = 0;

static void find_paths(void)
{
    paths[n_paths++] = (path){"ref", 1, ATTN_ARCH_REF, 1};
    const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    static char names[8][32];
    int nn = 0;
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int t = 1; t <= 2; t++) {
            snprintf(names[nn], sizeof names[nn], "%s/%dt", attn_arch_name(archs[a]), t);
            paths[n_paths++] = (path){names[nn++], 0, archs[a], t};
        }
    }
}

static int run_path(const path *pa, attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                    const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                    attn_tensor *w)
{
    attn_ctx_init(ctx);
    ctx->threads = pa->threads;
    if (pa->ref)
        return attn_sdpa_ref(ctx, q, k, v, p, out, w);
    ctx->arch = pa->arch;
    return attn_sdpa(ctx, q, k, v, p, out, w);
}

/* ---- the sweep ------------------------------------------------------------------ */

static uint64_t seed = 99;

static int64_t pick(int64_t n) /* 0 .. n-1 */
{
    int64_t r = (int64_t)((tu_uniform(&seed) + 1.0f) * 0.5f * (float)n);
    return r < 0 ? 0 : r >= n ? n - 1 : r;
}

static double worst = 0.0;

static void check_close(const char *what, const char *path_name, int problem, double got,
                        double want, double scale_ref)
{
    const double err = fabs(got - want), bound = ATOL + RTOL * fabs(scale_ref);
    const int ok = (isnan(got) && isnan(want)) || (got == want) || err <= bound;
    if (!ok && check_failures_ < 20)
        fprintf(stderr, "   problem %d, %s, %s: got %.9g, want %.9g\n", problem, path_name, what,
                got, want);
    CHECK(ok);
    if (ok && isfinite(err) && bound > 0 && err / bound > worst)
        worst = err / bound;
}

static void sweep(void)
{
    TEST("every option alone and in combination (GQA ratios 1, 2, 4 and H, top-left and "
         "bottom-right causal with Tq < Tk and Tq > Tk, windows that hide whole rows, "
         "softcap, ALiBi, broadcast biases with -inf, sinks, log-sum-exp, empty rows in "
         "zero mode) matches the float64 oracle on every path with 1 and 2 threads");
    static const int64_t Ts[] = {1, 3, 17, 33};
    static const int64_t Ds[] = {1, 8, 13};
    int problems = 0, with_empty = 0;
    for (int n = 0; n < 400; n++) {
        opts o;
        memset(&o, 0, sizeof o);
        o.B = 1 + pick(2);
        static const int64_t Hs[] = {1, 2, 4, 8};
        o.H = Hs[pick(4)];
        const int64_t ratio = (int64_t)1 << pick(4); /* 1, 2, 4, 8 */
        o.Hkv = ratio <= o.H ? o.H / ratio : 1;
        o.Tq = Ts[pick(4)];
        o.Tk = Ts[pick(4)];
        o.D = Ds[pick(3)];
        o.Dv = pick(3) == 0 ? 5 : o.D;
        o.causal = (int)pick(3);
        o.has_window = pick(3) == 0;
        if (o.has_window) {
            static const int64_t ws[] = {-1, 0, 1, 4, 40};
            o.wl = ws[pick(5)];
            o.wr = ws[pick(5)];
        }
        static const double caps[] = {0, 0, 5.0, 30.0};
        o.softcap = caps[pick(4)];
        o.alibi = (int)pick(4);
        if (o.alibi == 3)
            o.alibi = 0;
        const int bias_kind = (int)pick(5); /* 0 none, 1 [Tk], 2 [1,H,1,Tk], 3 [B,1,Tq,Tk], 4 full */
        const int use_mask = pick(4) == 0;
        const int use_sinks = pick(3) == 0;
        o.scale = pick(4) == 0 ? 0.5 : 1.0 / sqrt((double)o.D);

        const int64_t nq = o.B * o.H * o.Tq * o.D, nk = o.B * o.Hkv * o.Tk * o.D;
        const int64_t nv = o.B * o.Hkv * o.Tk * o.Dv, no = o.B * o.H * o.Tq * o.Dv;
        const int64_t nw = o.B * o.H * o.Tq * o.Tk, nl = o.B * o.H * o.Tq;
        float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nv * sizeof *v);
        float *outb = malloc(no * sizeof *outb), *wb = malloc(nw * sizeof *wb);
        float *lseb = malloc(nl * sizeof *lseb), *biasfull = malloc(nw * sizeof *biasfull);
        float slopes[8], sinks[8];
        unsigned char *maskfull = malloc(nw);
        double *ow = malloc(no * sizeof *ow), *ww = malloc(nw * sizeof *ww), *lw = malloc(nl * sizeof *lw);
        tu_fill(q, nq, 1000 + n);
        tu_fill(k, nk, 2000 + n);
        tu_fill(v, nv, 3000 + n);
        for (int h = 0; h < 8; h++) {
            slopes[h] = 0.05f * (float)(h + 1);
            sinks[h] = tu_uniform(&seed) * 2.0f;
        }
        o.slopes = slopes;
        o.sinks = use_sinks ? sinks : NULL;

        /* The bias in its own (broadcast) shape, and the same broadcast in full. */
        int64_t bshape[4] = {1, 1, 1, o.Tk};
        int bnd = 1;
        if (bias_kind == 2) { bshape[1] = o.H; bnd = 4; }
        if (bias_kind == 3) { bshape[0] = o.B; bshape[2] = o.Tq; bnd = 4; }
        if (bias_kind == 4) { bshape[0] = o.B; bshape[1] = o.H; bshape[2] = o.Tq; bnd = 4; }
        float *bsmall = malloc(nw * sizeof *bsmall);
        const int64_t nbs = bshape[0] * bshape[1] * bshape[2] * bshape[3];
        for (int64_t e = 0; e < nbs; e++)
            bsmall[e] = pick(9) == 0 ? -INFINITY : tu_uniform(&seed) * 2.0f;
        for (int64_t b = 0; b < o.B; b++)
            for (int64_t h = 0; h < o.H; h++)
                for (int64_t i = 0; i < o.Tq; i++)
                    for (int64_t j = 0; j < o.Tk; j++) {
                        int64_t src = (((bshape[0] > 1 ? b : 0) * bshape[1] + (bshape[1] > 1 ? h : 0)) *
                                           bshape[2] + (bshape[2] > 1 ? i : 0)) * bshape[3] + j;
                        biasfull[((b * o.H + h) * o.Tq + i) * o.Tk + j] = bsmall[src];
                        maskfull[((b * o.H + h) * o.Tq + i) * o.Tk + j] = pick(5) != 0;
                    }
        o.bias = bias_kind ? biasfull : NULL;
        o.mask = use_mask ? maskfull : NULL;
        o.scale = (double)(float)o.scale; /* the library's scale is a float */
        const int empty = oracle(&o, q, k, v, ow, ww, lw);
        with_empty += empty > 0;

        attn_tensor tq = tu_tensor4(q, o.B, o.H, o.Tq, o.D), tk = tu_tensor4(k, o.B, o.Hkv, o.Tk, o.D);
        attn_tensor tv = tu_tensor4(v, o.B, o.Hkv, o.Tk, o.Dv), to = tu_tensor4(outb, o.B, o.H, o.Tq, o.Dv);
        attn_tensor tw = tu_tensor4(wb, o.B, o.H, o.Tq, o.Tk), tl = tu_tensor3(lseb, o.B, o.H, o.Tq);
        attn_tensor tm = tu_tensor4((float *)maskfull, o.B, o.H, o.Tq, o.Tk);
        tm.dtype = ATTN_DTYPE_BOOL;
        attn_tensor tb, tsl, tsk;
        const int64_t hshape[1] = {o.H};
        attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, bsmall, bnd, bnd == 1 ? bshape + 3 : bshape);
        attn_tensor_init(NULL, &tsl, ATTN_DTYPE_F32, slopes, 1, hshape);
        attn_tensor_init(NULL, &tsk, ATTN_DTYPE_F32, sinks, 1, hshape);

        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = o.causal;
        p.has_scale = 1;
        p.scale = (float)o.scale;
        p.has_window = o.has_window;
        p.window_left = o.wl;
        p.window_right = o.wr;
        p.softcap = (float)o.softcap;
        p.alibi = o.alibi != 0;
        p.alibi_slopes = o.alibi == 2 ? &tsl : NULL;
        p.bias = bias_kind ? &tb : NULL;
        p.mask = use_mask ? &tm : NULL;
        p.sinks = use_sinks ? &tsk : NULL;
        p.lse = &tl;
        p.empty_rows = ATTN_EMPTY_ROWS_ZERO;

        for (int pi = 0; pi < n_paths; pi++) {
            attn_ctx ctx;
            memset(outb, 0xff, no * sizeof *outb);
            int rc = run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to, &tw);
            CHECK_INT(rc, ATTN_OK);
            if (rc != ATTN_OK) {
                fprintf(stderr, "   problem %d, %s: %s\n", n, paths[pi].name, ctx.message);
                continue;
            }
            for (int64_t e = 0; e < no; e++)
                check_close("out", paths[pi].name, n, outb[e], ow[e], 1.0);
            for (int64_t e = 0; e < nw; e++)
                check_close("weights", paths[pi].name, n, wb[e], ww[e], 1.0);
            for (int64_t e = 0; e < nl; e++)
                check_close("lse", paths[pi].name, n, lseb[e], lw[e], lw[e]);

            /* Without the zero mode, a row with every key hidden is an error
             * unless a sink takes its weight. */
            attn_sdpa_params perr = p;
            perr.empty_rows = ATTN_EMPTY_ROWS_ERROR;
            rc = run_path(&paths[pi], &ctx, &tq, &tk, &tv, &perr, &to, NULL);
            CHECK_INT(rc, empty && !use_sinks ? ATTN_STATUS_EMPTY_ROW : ATTN_OK);
        }
        problems++;
        free(q); free(k); free(v); free(outb); free(wb); free(lseb); free(biasfull);
        free(maskfull); free(ow); free(ww); free(lw); free(bsmall);
    }
    fprintf(stderr, "   %d problems (%d with rows whose keys are all hidden) on %d paths; worst "
                    "error / bound %.3f\n", problems, with_empty, n_paths, worst);
    CHECK(with_empty > 20 && with_empty < problems - 20);
}

/* ---- exact identities ------------------------------------------------------------ */

static void identities(void)
{
    enum { B = 2, H = 4, HKV = 2, T = 9, D = 6 };
    static float q[B * H * T * D], k[B * HKV * T * D], v[B * HKV * T * D];
    static float kr[B * H * T * D], vr[B * H * T * D];
    static float o1[B * H * T * D], o2[B * H * T * D], w1[B * H * T * T], w2[B * H * T * T];
    tu_fill(q, B * H * T * D, 1);
    tu_fill(k, B * HKV * T * D, 2);
    tu_fill(v, B * HKV * T * D, 3);
    /* repeat_kv: query head h reads key/value head h / (H / HKV). */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            memcpy(kr + (b * H + h) * T * D, k + (b * HKV + h / (H / HKV)) * T * D, T * D * sizeof(float)),
            memcpy(vr + (b * H + h) * T * D, v + (b * HKV + h / (H / HKV)) * T * D, T * D * sizeof(float));
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, HKV, T, D), tv = tu_tensor4(v, B, HKV, T, D);
    attn_tensor tkr = tu_tensor4(kr, B, H, T, D), tvr = tu_tensor4(vr, B, H, T, D);
    attn_tensor to1 = tu_tensor4(o1, B, H, T, D), to2 = tu_tensor4(o2, B, H, T, D);
    attn_tensor tw1 = tu_tensor4(w1, B, H, T, T), tw2 = tu_tensor4(w2, B, H, T, T);

    for (int pi = 0; pi < n_paths; pi++) {
        attn_ctx ctx;
        attn_sdpa_params p;

        TEST("grouped-query attention equals attention on explicitly repeated k and v, "
             "bit for bit");
        attn_sdpa_params_init(&p);
        p.causal = ATTN_CAUSAL_TOP_LEFT;
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to1, &tw1), ATTN_OK);
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tkr, &tvr, &p, &to2, &tw2), ATTN_OK);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(w1, w2, sizeof w1) == 0);

        if (!paths[pi].ref && !FUSED_TAKES_OPTIONS)
            continue;
        TEST("bottom-right causal equals top-left when Tq == Tk, bit for bit");
        p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to2, &tw2), ATTN_OK);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(w1, w2, sizeof w1) == 0);

        TEST("the window (w - 1, 0) equals chapter 21's sliding_window_causal_mask(T, w) "
             "given as a mask, bit for bit");
        static unsigned char sw[T * T];
        const int wlen = 3;
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++)
                sw[i * T + j] = j <= i && j > i - wlen;
        attn_tensor tsw = tu_tensor4((float *)sw, 1, 1, T, T);
        tsw.dtype = ATTN_DTYPE_BOOL;
        tsw.stride[0] = tsw.stride[1] = T * T;
        attn_sdpa_params_init(&p);
        p.has_window = 1;
        p.window_left = wlen - 1;
        p.window_right = 0;
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to1, &tw1), ATTN_OK);
        attn_sdpa_params_init(&p);
        p.mask = &tsw;
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to2, &tw2), ATTN_OK);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(w1, w2, sizeof w1) == 0);

        TEST("a bias of -inf hides a key exactly as a false mask entry does, and a NaN in "
             "that key's value never reaches the output");
        static float bias[T * T];
        for (int e = 0; e < T * T; e++)
            bias[e] = sw[e] ? 0.0f : -INFINITY;
        attn_tensor tb = tu_tensor4(bias, 1, 1, T, T);
        float saved = v[0];
        v[0] = NAN; /* key 0 of k/v head 0: hidden from rows i >= wlen */
        attn_sdpa_params_init(&p);
        p.bias = &tb;
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to1, &tw1), ATTN_OK);
        attn_sdpa_params_init(&p);
        p.mask = &tsw;
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to2, &tw2), ATTN_OK);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(w1, w2, sizeof w1) == 0);
        CHECK(!isnan(o1[(0 * H + 0) * T * D + (T - 1) * D]) && isnan(o1[0]));
        v[0] = saved;

        TEST("with sinks each row's weights sum to 1 - exp(sink - lse) < 1");
        float sinks[H] = {0.5f, -1.0f, 2.0f, 0.0f}, lse[B * H * T];
        const int64_t hs[1] = {H};
        attn_tensor tsk, tl = tu_tensor3(lse, B, H, T);
        attn_tensor_init(NULL, &tsk, ATTN_DTYPE_F32, sinks, 1, hs);
        attn_sdpa_params_init(&p);
        p.sinks = &tsk;
        p.lse = &tl;
        CHECK_INT(run_path(&paths[pi], &ctx, &tq, &tk, &tv, &p, &to1, &tw1), ATTN_OK);
        for (int r = 0; r < B * H * T; r++) {
            double sum = 0;
            for (int j = 0; j < T; j++)
                sum += w1[r * T + j];
            const int h = (r / T) % H;
            CHECK(sum < 1.0);
            CHECK_NEAR(sum + exp((double)sinks[h] - (double)lse[r]), 1.0, 1e-6, 0);
        }
    }
}

static void alibi_slopes(void)
{
    TEST("ALiBi's default slopes are 2^-1 .. 2^-8 for 8 heads, and for 6 heads those of 4 "
         "heads then every other slope of 8 (the paper's rule)");
    float s8[8], s6[6];
    CHECK_INT(attn_alibi_slopes(NULL, 8, s8), ATTN_OK);
    for (int h = 0; h < 8; h++)
        CHECK(s8[h] == ldexpf(1.0f, -(h + 1)));
    CHECK_INT(attn_alibi_slopes(NULL, 6, s6), ATTN_OK);
    const float want6[6] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    for (int h = 0; h < 6; h++)
        CHECK(s6[h] == want6[h]);
}

int main(void)
{
    find_paths();
    alibi_slopes();
    identities();
    sweep();
    return check_summary("test_sdpa_options");
}
