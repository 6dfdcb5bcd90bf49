/*
 * test_mha_backward.c - the backward of the chapter's multi-head self-attention
 * (attn_mha_backward, SPEC section 8) against central finite differences of a
 * float64 forward written here from the module's formulas, and against PyTorch
 * 2.15's autograd of the chapter's module (tests/data/golden_mha_grads/, made by
 * tests/golden/gen_mha_grads.py), on every path (ATTN_ARCH ref, scalar, AVX2,
 * AVX-512 where the CPU has it) with 1 and 2 threads; the same bits for 1 and 2
 * threads; no allocation with a large enough workspace; and the argument checks.
 *
 * The loss is L = sum(dY * out) for a fixed random dY, so dL/dout = dY and the
 * finite differences of L are what the backward must return.
 *
 * Tolerance. The finite differences are central, of a float64 forward, with step
 * 1e-4 on inputs and weights of magnitude below 2: their own error is below 1e-8.
 * attn runs in float32: each gradient is a sum of at most B*T = 12 products (the
 * weights' gradients) or 3E = 36 (dx), each rounded once, after a float32 forward
 * and attention backward whose errors are a few ulps (6e-8) each, so the error is
 * a few ulps times the sum's length: 1e-6 + 1e-5 |expected| bounds it, the
 * bound test_sdpa_backward uses (measured on this machine, AVX-512: the worst error
 * is 0.23 of the bound; the program prints it). PyTorch's golden gradients are
 * float64 results rounded once to float32, so the same bound applies to them.
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

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/data"
#endif

/* ---- one problem ---------------------------------------------------------------- */

typedef struct problem {
    const char *name;
    int64_t B, T, E, H;
    int causal;
    int pad; /* 1: sequence b > 0 has its last b tokens padded (a [B, 1, 1, T] mask) */
    float *x, *wqkv, *bqkv, *wo, *bo, *dy;
    unsigned char *mask;
} problem;

static float *fill_new(int64_t n, uint64_t seed, float scale)
{
    float *p = malloc(sizeof(float) * (size_t)n);
    tu_fill(p, n, seed);
    for (int64_t i = 0; i < n; i++)
        p[i] *= scale;
    return p;
}

static void make(problem *P, uint64_t seed)
{
    const int64_t B = P->B, T = P->T, E = P->E, n = B * T * E;
    P->x = fill_new(n, seed, 1.0f);
    P->dy = fill_new(n, seed + 1, 1.0f);
    P->wqkv = fill_new(3 * E * E, seed + 2, 0.5f);
    P->bqkv = fill_new(3 * E, seed + 3, 0.5f);
    P->wo = fill_new(E * E, seed + 4, 0.5f);
    P->bo = fill_new(E, seed + 5, 0.5f);
    P->mask = malloc((size_t)(B * T));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            P->mask[b * T + t] = !P->pad || t < T - b;
}

static void unmake(problem *P)
{
    free(P->x);
    free(P->dy);
    free(P->wqkv);
    free(P->bqkv);
    free(P->wo);
    free(P->bo);
    free(P->mask);
}

/* ---- the float64 forward and its finite differences ------------------------------ */

typedef struct params64 {
    double *x, *wqkv, *bqkv, *wo, *bo;
} params64;

/* L = sum(dy * out) of the module in float64, step by step as in mha.c's comment. */
static double loss64(const problem *P, const params64 *q64)
{
    const int64_t B = P->B, T = P->T, E = P->E, H = P->H, D = E / H, R = 3 * E;
    double *qkv = malloc(sizeof(double) * (size_t)(T * R));
    double *merged = malloc(sizeof(double) * (size_t)(T * E));
    double *s = malloc(sizeof(double) * (size_t)T);
    double L = 0.0;
    for (int64_t b = 0; b < B; b++) {
        const double *x = q64->x + b * T * E;
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < R; r++) {
                double acc = q64->bqkv[r];
                for (int64_t e = 0; e < E; e++)
                    acc += x[t * E + e] * q64->wqkv[r * E + e];
                qkv[t * R + r] = acc;
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < T; j++) {
                    const int vis = P->mask[b * T + j] && (!P->causal || j <= i);
                    double d = 0.0;
                    for (int64_t c = 0; c < D; c++)
                        d += qkv[i * R + h * D + c] * qkv[j * R + E + h * D + c];
                    s[j] = vis ? d / sqrt((double)D) : -INFINITY;
                    if (s[j] > mx)
                        mx = s[j];
                }
                for (int64_t j = 0; j < T; j++) {
                    s[j] = s[j] == -INFINITY ? 0.0 : exp(s[j] - mx);
                    sum += s[j];
                }
                for (int64_t c = 0; c < D; c++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < T; j++)
                        acc += s[j] / sum * qkv[j * R + 2 * E + h * D + c];
                    merged[i * E + h * D + c] = acc;
                }
            }
        for (int64_t t = 0; t < T; t++)
            for (int64_t o = 0; o < E; o++) {
                double acc = q64->bo[o];
                for (int64_t e = 0; e < E; e++)
                    acc += merged[t * E + e] * q64->wo[o * E + e];
                L += (double)P->dy[(b * T + t) * E + o] * acc;
            }
    }
    free(qkv);
    free(merged);
    free(s);
    return L;
}

static double *to64(const float *p, int64_t n)
{
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        d[i] = p[i];
    return d;
}

/* The finite differences of L with respect to every element of one parameter. */
static void fd_of(const problem *P, params64 *q64, double *param, int64_t n, double *g)
{
    for (int64_t i = 0; i < n; i++) {
        const double keep = param[i];
        param[i] = keep + FD_STEP;
        const double up = loss64(P, q64);
        param[i] = keep - FD_STEP;
        const double down = loss64(P, q64);
        param[i] = keep;
        g[i] = (up - down) / (2 * FD_STEP);
    }
}

/* ---- attn's gradients ---------------------------------------------------------- */

typedef struct grads {
    float *dx, *dwqkv, *dbqkv, *dwo, *dbo;
} grads;

static void grads_alloc(const problem *P, grads *g)
{
    const int64_t E = P->E;
    g->dx = calloc((size_t)(P->B * P->T * E), sizeof(float));
    g->dwqkv = calloc((size_t)(3 * E * E), sizeof(float));
    g->dbqkv = calloc((size_t)(3 * E), sizeof(float));
    g->dwo = calloc((size_t)(E * E), sizeof(float));
    g->dbo = calloc((size_t)E, sizeof(float));
}

static void grads_free(grads *g)
{
    free(g->dx);
    free(g->dwqkv);
    free(g->dbqkv);
    free(g->dwo);
    free(g->dbo);
}

/* attn_mha_backward on P under ctx; returns its status. */
static int run_backward(attn_ctx *ctx, const problem *P, grads *g)
{
    const int64_t B = P->B, T = P->T, E = P->E;
    attn_mha_weights w = tu_mha_weights(P->wqkv, P->bqkv, P->wo, P->bo, E);
    attn_tensor x = tu_tensor3(P->x, B, T, E), dy = tu_tensor3(P->dy, B, T, E);
    attn_tensor dx = tu_tensor3(g->dx, B, T, E), dwqkv, dbqkv, dwo, dbo, mask;
    const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
    const int64_t sm[4] = {B, 1, 1, T};
    attn_tensor_init(NULL, &dwqkv, ATTN_DTYPE_F32, g->dwqkv, 2, s1);
    attn_tensor_init(NULL, &dbqkv, ATTN_DTYPE_F32, g->dbqkv, 1, s2);
    attn_tensor_init(NULL, &dwo, ATTN_DTYPE_F32, g->dwo, 2, s3);
    attn_tensor_init(NULL, &dbo, ATTN_DTYPE_F32, g->dbo, 1, s4);
    attn_tensor_init(NULL, &mask, ATTN_DTYPE_BOOL, P->mask, 4, sm);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = P->causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    p.mask = P->pad ? &mask : NULL;
    const attn_mha_grads mg = {&dx, &dwqkv, &dbqkv, &dwo, &dbo};
    return attn_mha_backward(ctx, &w, P->H, &x, &p, &dy, &mg);
}

typedef struct run_path {
    char name[32];
    attn_arch arch;
    int threads;
} run_path;

static int paths_of(run_path *paths)
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

static double worst_ratio = 0.0; /* the largest error / bound seen, reported at the end */

/* got [n] against want [n] within the bound; prints the first few misses. */
static void check_close(const char *where, const char *what, const float *got,
                        const double *want, int64_t n)
{
    int64_t bad = 0;
    for (int64_t e = 0; e < n; e++) {
        const double diff = fabs((double)got[e] - want[e]);
        const double bound = ATOL + RTOL * fabs(want[e]);
        if (diff / bound > worst_ratio)
            worst_ratio = diff / bound;
        if (!(diff <= bound) && bad++ < 3)
            fprintf(stderr, "   %s %s[%lld]: attn %.9g, expected %.9g\n", where, what,
                    (long long)e, (double)got[e], want[e]);
    }
    CHECK_INT(bad, 0);
}

static problem problems[] = {
    {.name = "plain", .B = 2, .T = 3, .E = 8, .H = 2},
    {.name = "causal", .B = 1, .T = 5, .E = 6, .H = 3, .causal = 1},
    {.name = "padding+causal", .B = 3, .T = 4, .E = 4, .H = 1, .causal = 1, .pad = 1},
};
#define N_PROBLEMS (int)(sizeof problems / sizeof problems[0])

static void test_finite_differences(void)
{
    TEST("attn_mha_backward's dx, dW_qkv, db_qkv, dW_o and db_o equal float64 central "
         "finite differences of L = sum(dY * out) within 1e-6 + 1e-5 |fd|, with and without "
         "causal and padding masks, on every path with 1 and 2 threads, and 2 threads give "
         "the same bits as 1");
    run_path paths[8];
    const int np = paths_of(paths);
    for (int pi = 0; pi < N_PROBLEMS; pi++) {
        problem *P = &problems[pi];
        make(P, 100 + 10 * (uint64_t)pi);
        const int64_t E = P->E, nx = P->B * P->T * E;
        params64 q64 = {to64(P->x, nx), to64(P->wqkv, 3 * E * E), to64(P->bqkv, 3 * E),
                        to64(P->wo, E * E), to64(P->bo, E)};
        double *fx = malloc(sizeof(double) * (size_t)nx);
        double *fwqkv = malloc(sizeof(double) * (size_t)(3 * E * E));
        double *fbqkv = malloc(sizeof(double) * (size_t)(3 * E));
        double *fwo = malloc(sizeof(double) * (size_t)(E * E));
        double *fbo = malloc(sizeof(double) * (size_t)E);
        fd_of(P, &q64, q64.x, nx, fx);
        fd_of(P, &q64, q64.wqkv, 3 * E * E, fwqkv);
        fd_of(P, &q64, q64.bqkv, 3 * E, fbqkv);
        fd_of(P, &q64, q64.wo, E * E, fwo);
        fd_of(P, &q64, q64.bo, E, fbo);
        grads one = {0};
        for (int k = 0; k < np; k++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = paths[k].arch;
            ctx.threads = paths[k].threads;
            grads g;
            grads_alloc(P, &g);
            const int rc = run_backward(&ctx, P, &g);
            if (rc != ATTN_OK)
                fprintf(stderr, "   %s %s: %s\n", P->name, paths[k].name, ctx.message);
            CHECK_INT(rc, ATTN_OK);
            char where[96];
            snprintf(where, sizeof where, "%.40s %.30s", P->name, paths[k].name);
            check_close(where, "dx", g.dx, fx, nx);
            check_close(where, "dw_qkv", g.dwqkv, fwqkv, 3 * E * E);
            check_close(where, "db_qkv", g.dbqkv, fbqkv, 3 * E);
            check_close(where, "dw_o", g.dwo, fwo, E * E);
            check_close(where, "db_o", g.dbo, fbo, E);
            if (paths[k].threads == 1) {
                grads_free(&one);
                one = g;
                continue;
            }
            /* 2 threads against 1 on the same arch: the same bits. */
            CHECK(memcmp(g.dx, one.dx, sizeof(float) * (size_t)nx) == 0);
            CHECK(memcmp(g.dwqkv, one.dwqkv, sizeof(float) * (size_t)(3 * E * E)) == 0);
            CHECK(memcmp(g.dbqkv, one.dbqkv, sizeof(float) * (size_t)(3 * E)) == 0);
            CHECK(memcmp(g.dwo, one.dwo, sizeof(float) * (size_t)(E * E)) == 0);
            CHECK(memcmp(g.dbo, one.dbo, sizeof(float) * (size_t)E) == 0);
            grads_free(&g);
        }
        grads_free(&one);
        free(fx);
        free(fwqkv);
        free(fbqkv);
        free(fwo);
        free(fbo);
        free(q64.x);
        free(q64.wqkv);
        free(q64.bqkv);
        free(q64.wo);
        free(q64.bo);
        unmake(P);
    }
}

/* ---- golden gradients from PyTorch ---------------------------------------------- */

static int load(attn_ctx *ctx, const char *dir, const char *name, attn_array *a)
{
    char path[512];
    memset(a, 0, sizeof *a);
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return -1;
    const int rc = attn_npy_load(ctx, path, a);
    if (rc)
        fprintf(stderr, "   cannot load %s: %s\n", path, ctx->message);
    return rc;
}

/* The value of `key` in dir/case.txt (key=value lines) into val. */
static int case_value(const char *dir, const char *key, char *val, size_t size)
{
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/case.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    const size_t kl = strlen(key);
    int found = -1;
    while (found && fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == '=') {
            line[strcspn(line, "\r\n")] = '\0';
            snprintf(val, size, "%s", line + kl + 1);
            found = 0;
        }
    fclose(f);
    return found;
}

static void check_golden_array(const char *where, const char *what, const float *got,
                               const attn_array *want)
{
    const int64_t n = attn_tensor_numel(&want->tensor);
    double *w = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        w[i] = ((const float *)want->tensor.data)[i];
    check_close(where, what, got, w, n);
    free(w);
}

static void test_golden(void)
{
    TEST("on every case of tests/data/golden_mha_grads (PyTorch 2.15 autograd through the "
         "chapter's module, checked there against nn.MultiheadAttention), "
         "attn_mha_backward gives PyTorch's dx, dW_qkv, db_qkv, dW_o and db_o within "
         "1e-6 + 1e-5 |torch| on every path with 1 and 2 threads");
    char manifest[512], name[128];
    snprintf(manifest, sizeof manifest, "%s/golden_mha_grads/MANIFEST", ATTN_TEST_DATA_DIR);
    FILE *mf = fopen(manifest, "r");
    CHECK(mf != NULL);
    if (!mf)
        return;
    run_path paths[8];
    const int np = paths_of(paths);
    int ncases = 0;
    while (fgets(name, sizeof name, mf)) {
        name[strcspn(name, "\r\n")] = '\0';
        if (name[0] == '#' || !name[0])
            continue;
        char dir[512], val[64], maskname[64] = "";
        snprintf(dir, sizeof dir, "%s/golden_mha_grads/%s", ATTN_TEST_DATA_DIR, name);
        CHECK_INT(case_value(dir, "num_heads", val, sizeof val), 0);
        const int64_t H = atoll(val);
        CHECK_INT(case_value(dir, "causal", val, sizeof val), 0);
        const int causal = atoi(val);
        CHECK_INT(case_value(dir, "mask", maskname, sizeof maskname), 0);
        attn_ctx lctx;
        attn_ctx_init(&lctx);
        attn_array a[12];
        static const char *const files[11] = {"x.npy",  "dy.npy",     "w_qkv.npy", "b_qkv.npy",
                                              "w_o.npy", "b_o.npy",   "dx.npy",    "dw_qkv.npy",
                                              "db_qkv.npy", "dw_o.npy", "db_o.npy"};
        int rc = 0;
        for (int i = 0; i < 11; i++)
            rc |= load(&lctx, dir, files[i], &a[i]);
        memset(&a[11], 0, sizeof a[11]);
        if (maskname[0])
            rc |= load(&lctx, dir, maskname, &a[11]);
        CHECK_INT(rc, 0);
        if (rc == 0) {
            const attn_tensor *x = &a[0].tensor;
            const int64_t B = x->shape[0], T = x->shape[1], E = x->shape[2];
            attn_mha_weights w = {a[2].tensor, a[3].tensor, a[4].tensor, a[5].tensor};
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.causal = causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
            p.mask = maskname[0] ? &a[11].tensor : NULL;
            problem P = {.B = B, .T = T, .E = E, .H = H};
            for (int k = 0; k < np; k++) {
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.arch = paths[k].arch;
                ctx.threads = paths[k].threads;
                grads g;
                grads_alloc(&P, &g);
                attn_tensor dx = tu_tensor3(g.dx, B, T, E), dwqkv, dbqkv, dwo, dbo;
                const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
                attn_tensor_init(NULL, &dwqkv, ATTN_DTYPE_F32, g.dwqkv, 2, s1);
                attn_tensor_init(NULL, &dbqkv, ATTN_DTYPE_F32, g.dbqkv, 1, s2);
                attn_tensor_init(NULL, &dwo, ATTN_DTYPE_F32, g.dwo, 2, s3);
                attn_tensor_init(NULL, &dbo, ATTN_DTYPE_F32, g.dbo, 1, s4);
                const attn_mha_grads mg = {&dx, &dwqkv, &dbqkv, &dwo, &dbo};
                const int brc = attn_mha_backward(&ctx, &w, H, x, &p, &a[1].tensor, &mg);
                if (brc != ATTN_OK)
                    fprintf(stderr, "   %s %s: %s\n", name, paths[k].name, ctx.message);
                CHECK_INT(brc, ATTN_OK);
                char where[160];
                snprintf(where, sizeof where, "%.100s %.30s", name, paths[k].name);
                check_golden_array(where, "dx", g.dx, &a[6]);
                check_golden_array(where, "dw_qkv", g.dwqkv, &a[7]);
                check_golden_array(where, "db_qkv", g.dbqkv, &a[8]);
                check_golden_array(where, "dw_o", g.dwo, &a[9]);
                check_golden_array(where, "db_o", g.dbo, &a[10]);
                grads_free(&g);
            }
            ncases++;
        }
        for (int i = 0; i < 12; i++)
            attn_array_free(&lctx, &a[i]);
    }
    fclose(mf);
    CHECK(ncases >= 4);
}

/* ---- scratch and checks --------------------------------------------------------- */

static int n_allocs = 0;
static void *count_alloc(void *user, size_t size)
{
    (void)user;
    n_allocs++;
    return malloc(size);
}
static void count_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

static void test_workspace(void)
{
    TEST("with a ctx->workspace of attn_mha_backward_workspace_size bytes, "
         "attn_mha_backward allocates nothing and gives the same bits as without one");
    problem P = {.name = "ws", .B = 2, .T = 5, .E = 8, .H = 2, .causal = 1};
    make(&P, 7);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 2;
    ctx.allocator.alloc = count_alloc;
    ctx.allocator.free = count_free;
    grads plain, ws;
    grads_alloc(&P, &plain);
    grads_alloc(&P, &ws);
    n_allocs = 0;
    CHECK_INT(run_backward(&ctx, &P, &plain), ATTN_OK);
    CHECK(n_allocs > 0); /* without a workspace the scratch is allocated */

    attn_mha_weights w = tu_mha_weights(P.wqkv, P.bqkv, P.wo, P.bo, P.E);
    attn_tensor x = tu_tensor3(P.x, P.B, P.T, P.E), dy = tu_tensor3(P.dy, P.B, P.T, P.E);
    attn_tensor dx = tu_tensor3(ws.dx, P.B, P.T, P.E), dwqkv, dbqkv, dwo, dbo;
    const int64_t E = P.E, s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
    attn_tensor_init(NULL, &dwqkv, ATTN_DTYPE_F32, ws.dwqkv, 2, s1);
    attn_tensor_init(NULL, &dbqkv, ATTN_DTYPE_F32, ws.dbqkv, 1, s2);
    attn_tensor_init(NULL, &dwo, ATTN_DTYPE_F32, ws.dwo, 2, s3);
    attn_tensor_init(NULL, &dbo, ATTN_DTYPE_F32, ws.dbo, 1, s4);
    const attn_mha_grads mg = {&dx, &dwqkv, &dbqkv, &dwo, &dbo};
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    size_t bytes = 0;
    CHECK_INT(attn_mha_backward_workspace_size(&ctx, &w, P.H, &x, &p, &dy, &mg, &bytes),
              ATTN_OK);
    CHECK(bytes > 0);
    const size_t rounded = (bytes + 63) / 64 * 64;
    void *mem = aligned_alloc(64, rounded);
    ctx.workspace = mem;
    ctx.workspace_size = bytes;
    n_allocs = 0;
    CHECK_INT(attn_mha_backward(&ctx, &w, P.H, &x, &p, &dy, &mg), ATTN_OK);
    CHECK_INT(n_allocs, 0);
    CHECK(memcmp(ws.dx, plain.dx, sizeof(float) * (size_t)(P.B * P.T * E)) == 0);
    CHECK(memcmp(ws.dwqkv, plain.dwqkv, sizeof(float) * (size_t)(3 * E * E)) == 0);
    CHECK(memcmp(ws.dbo, plain.dbo, sizeof(float) * (size_t)E) == 0);
    free(mem);
    grads_free(&plain);
    grads_free(&ws);
    unmake(&P);
}

static void test_checks(void)
{
    TEST("attn_mha_backward refuses p->lse, a gradient of the wrong shape (naming it), a "
         "gradient that overlaps x or another gradient, and a NULL gradient, each with "
         "its own status");
    problem P = {.name = "checks", .B = 1, .T = 3, .E = 4, .H = 2};
    make(&P, 9);
    const int64_t E = P.E;
    grads g;
    grads_alloc(&P, &g);
    attn_mha_weights w = tu_mha_weights(P.wqkv, P.bqkv, P.wo, P.bo, E);
    attn_tensor x = tu_tensor3(P.x, P.B, P.T, E), dy = tu_tensor3(P.dy, P.B, P.T, E);
    attn_tensor dx = tu_tensor3(g.dx, P.B, P.T, E), dwqkv, dbqkv, dwo, dbo, bad;
    const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
    attn_tensor_init(NULL, &dwqkv, ATTN_DTYPE_F32, g.dwqkv, 2, s1);
    attn_tensor_init(NULL, &dbqkv, ATTN_DTYPE_F32, g.dbqkv, 1, s2);
    attn_tensor_init(NULL, &dwo, ATTN_DTYPE_F32, g.dwo, 2, s3);
    attn_tensor_init(NULL, &dbo, ATTN_DTYPE_F32, g.dbo, 1, s4);
    attn_tensor_init(NULL, &bad, ATTN_DTYPE_F32, g.dwqkv, 2, s3); /* [E, E], not [3E, E] */
    attn_ctx ctx;
    attn_ctx_init(&ctx);

    attn_mha_grads mg = {&dx, &bad, &dbqkv, &dwo, &dbo};
    CHECK_INT(attn_mha_backward(&ctx, &w, P.H, &x, NULL, &dy, &mg), ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "grads->dw_qkv has shape (4, 4)");

    attn_tensor xalias = tu_tensor3(P.x, P.B, P.T, E);
    mg = (attn_mha_grads){&xalias, &dwqkv, &dbqkv, &dwo, &dbo};
    CHECK_INT(attn_mha_backward(&ctx, &w, P.H, &x, NULL, &dy, &mg),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "grads->dx and x share memory");

    attn_tensor dbo_in_dwo;
    attn_tensor_init(NULL, &dbo_in_dwo, ATTN_DTYPE_F32, g.dwo + 2, 1, s4);
    mg = (attn_mha_grads){&dx, &dwqkv, &dbqkv, &dwo, &dbo_in_dwo};
    CHECK_INT(attn_mha_backward(&ctx, &w, P.H, &x, NULL, &dy, &mg),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "grads->db_o and grads->dw_o share memory");

    mg = (attn_mha_grads){&dx, &dwqkv, NULL, &dwo, &dbo};
    CHECK_INT(attn_mha_backward(&ctx, &w, P.H, &x, NULL, &dy, &mg),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "grads->db_qkv is NULL");

    float lse_buf[8];
    attn_tensor lse = tu_tensor3(lse_buf, 1, 2, 3);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.lse = &lse;
    mg = (attn_mha_grads){&dx, &dwqkv, &dbqkv, &dwo, &dbo};
    CHECK_INT(attn_mha_backward(&ctx, &w, P.H, &x, &p, &dy, &mg), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "p->lse must be NULL");
    grads_free(&g);
    unmake(&P);
}

static void test_strided(void)
{
    TEST("attn_mha_backward reads x and dout and writes every gradient through any "
         "strides: x and dout with padded rows, dx with padded rows, dW_qkv and dW_o "
         "as transposed views, the biases at stride 2, give the same bits as "
         "contiguous tensors");
    problem P = {.name = "strided", .B = 2, .T = 3, .E = 8, .H = 2, .causal = 1};
    make(&P, 21);
    const int64_t B = P.B, T = P.T, E = P.E, RS = E + 3; /* a padded row */
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    grads plain;
    grads_alloc(&P, &plain);
    CHECK_INT(run_backward(&ctx, &P, &plain), ATTN_OK);

    float *xs = calloc((size_t)(B * T * RS), sizeof(float));
    float *dys = calloc((size_t)(B * T * RS), sizeof(float));
    float *dxs = calloc((size_t)(B * T * RS), sizeof(float));
    float *dwqkv = calloc((size_t)(3 * E * E), sizeof(float));
    float *dwo = calloc((size_t)(E * E), sizeof(float));
    float *dbqkv = calloc((size_t)(6 * E), sizeof(float));
    float *dbo = calloc((size_t)(2 * E), sizeof(float));
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t e = 0; e < E; e++) {
            xs[r * RS + e] = P.x[r * E + e];
            dys[r * RS + e] = P.dy[r * E + e];
        }
    attn_tensor x = tu_tensor3(xs, B, T, E), dy = tu_tensor3(dys, B, T, E);
    attn_tensor dx = tu_tensor3(dxs, B, T, E);
    attn_tensor *rowed[3] = {&x, &dy, &dx};
    for (int i = 0; i < 3; i++) {
        rowed[i]->stride[0] = T * RS;
        rowed[i]->stride[1] = RS;
    }
    /* dW_qkv [3E, E] stored as its transpose [E, 3E]; dW_o [E, E] likewise. */
    attn_tensor tq, to, tbq, tbo;
    const int64_t sq[2] = {3 * E, E}, so[2] = {E, E}, sbq[1] = {3 * E}, sbo[1] = {E};
    attn_tensor_init(NULL, &tq, ATTN_DTYPE_F32, dwqkv, 2, sq);
    tq.stride[0] = 1;
    tq.stride[1] = 3 * E;
    attn_tensor_init(NULL, &to, ATTN_DTYPE_F32, dwo, 2, so);
    to.stride[0] = 1;
    to.stride[1] = E;
    attn_tensor_init(NULL, &tbq, ATTN_DTYPE_F32, dbqkv, 1, sbq);
    tbq.stride[0] = 2;
    attn_tensor_init(NULL, &tbo, ATTN_DTYPE_F32, dbo, 1, sbo);
    tbo.stride[0] = 2;
    attn_mha_weights w = tu_mha_weights(P.wqkv, P.bqkv, P.wo, P.bo, E);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    const attn_mha_grads mg = {&dx, &tq, &tbq, &to, &tbo};
    const int rc = attn_mha_backward(&ctx, &w, P.H, &x, &p, &dy, &mg);
    if (rc != ATTN_OK)
        fprintf(stderr, "   %s\n", ctx.message);
    CHECK_INT(rc, ATTN_OK);
    int64_t diff = 0;
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t e = 0; e < E; e++)
            diff += memcmp(&dxs[r * RS + e], &plain.dx[r * E + e], sizeof(float)) != 0;
    for (int64_t n = 0; n < 3 * E; n++) {
        for (int64_t k = 0; k < E; k++)
            diff += memcmp(&dwqkv[k * 3 * E + n], &plain.dwqkv[n * E + k], sizeof(float)) != 0;
        diff += memcmp(&dbqkv[2 * n], &plain.dbqkv[n], sizeof(float)) != 0;
    }
    for (int64_t n = 0; n < E; n++) {
        for (int64_t k = 0; k < E; k++)
            diff += memcmp(&dwo[k * E + n], &plain.dwo[n * E + k], sizeof(float)) != 0;
        diff += memcmp(&dbo[2 * n], &plain.dbo[n], sizeof(float)) != 0;
    }
    CHECK_INT(diff, 0);
    free(xs);
    free(dys);
    free(dxs);
    free(dwqkv);
    free(dwo);
    free(dbqkv);
    free(dbo);
    grads_free(&plain);
    unmake(&P);
}

int main(void)
{
    test_finite_differences();
    test_golden();
    test_workspace();
    test_strided();
    test_checks();
    fprintf(stderr, "worst error / bound: %.3g\n", worst_ratio);
    return check_summary("test_mha_backward");
}
