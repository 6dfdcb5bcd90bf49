/*
 * test_gqa_backward.c - the backward of grouped-query attention with separate
 * projections, with and without RoPE (attn_gqa_backward, SPEC section 8), and RoPE's
 * own backward (attn_rope_backward): against central finite differences of a float64
 * forward written here from the block's formulas, and against PyTorch 2.15's
 * autograd (tests/data/golden_gqa_grads/, made by tests/golden/gen_gqa_grads.py), on
 * every path (ATTN_ARCH ref, scalar, AVX2, AVX-512 where the CPU has it) with 1 and 2
 * threads; the same bits for 1 and 2 threads; attn_gqa_backward on W_qkv's row blocks
 * gives attn_mha_backward's bits; no allocation with a large enough workspace.
 *
 * The loss is L = sum(dY * out) for a fixed random dY, so dL/dout = dY.
 *
 * Tolerance: 1e-6 + 1e-5 |expected|, the bound of test_mha_backward.c, for the
 * same reasons (float32 sums of at most a few dozen terms after a float32 forward
 * and attention backward; float64 central differences with step 1e-4 whose own
 * error is below 1e-8). RoPE adds one rotation each way, two products and a sum
 * per element, rounded once each: a few ulps more. The float64 forward rotates
 * with the float32 cos and sin of SPEC section 7's recipe, widened, which is the
 * function attn computes; the program prints the worst error / bound it saw.
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
#define ROPE_BASE 10000.0f

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/data"
#endif

/* ---- one problem ---------------------------------------------------------------- */

enum { NO_ROPE = -1 };

/* Parameters in one order: x, then W_q, W_k, W_v, W_o, then b_q, b_k, b_v, b_o. */
enum { P_X, P_WQ, P_WK, P_WV, P_WO, P_BQ, P_BK, P_BV, P_BO, N_PARAMS };
static const char *const param_names[N_PARAMS] = {"dx",   "dw_q", "dw_k", "dw_v", "dw_o",
                                                  "db_q", "db_k", "db_v", "db_o"};

typedef struct problem {
    const char *name;
    int64_t B, T, E, H, Hkv, D;
    int causal;
    int pad;     /* 1: sequence b > 0 has its last b tokens padded (a [B, 1, 1, T] mask) */
    int rope;    /* NO_ROPE, ATTN_ROPE_INTERLEAVED or ATTN_ROPE_HALF */
    int64_t offset;
    int biases;  /* 0: the weights have no biases (their gradients are still asked for) */
    float *p[N_PARAMS];
    int64_t n[N_PARAMS];
    float *dy;
    unsigned char *mask;
} problem;

static void make(problem *P, uint64_t seed)
{
    const int64_t B = P->B, T = P->T, E = P->E, Q = P->H * P->D, KV = P->Hkv * P->D;
    const int64_t n[N_PARAMS] = {B * T * E, Q * E, KV * E, KV * E, E * Q, Q, KV, KV, E};
    for (int i = 0; i < N_PARAMS; i++) {
        P->n[i] = n[i];
        P->p[i] = malloc(sizeof(float) * (size_t)n[i]);
        tu_fill(P->p[i], n[i], seed + (uint64_t)i);
        const float scale = i == P_X ? 1.0f : 0.5f;
        for (int64_t e = 0; e < n[i]; e++)
            P->p[i][e] = i >= P_BQ && !P->biases ? 0.0f : P->p[i][e] * scale;
    }
    P->dy = malloc(sizeof(float) * (size_t)n[P_X]);
    tu_fill(P->dy, n[P_X], seed + 100);
    P->mask = malloc((size_t)(B * T));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            P->mask[b * T + t] = !P->pad || t < T - b;
}

static void unmake(problem *P)
{
    for (int i = 0; i < N_PARAMS; i++)
        free(P->p[i]);
    free(P->dy);
    free(P->mask);
}

/* ---- the float64 forward and its finite differences ------------------------------ */

/* RoPE on one row of D doubles at position pos, with SPEC section 7's float32 cos
 * and sin. */
static void rope64(const problem *P, double *row, int64_t pos)
{
    const int64_t half = P->D / 2;
    for (int64_t k = 0; k < half; k++) {
        const float e = (float)(2 * k) / (float)P->D;
        const float inv_freq = 1.0f / powf(ROPE_BASE, e);
        const float angle = (float)pos * inv_freq;
        const double c = cosf(angle), s = sinf(angle);
        const int64_t i0 = P->rope == ATTN_ROPE_HALF ? k : 2 * k;
        const int64_t i1 = P->rope == ATTN_ROPE_HALF ? k + half : 2 * k + 1;
        const double a = row[i0], b = row[i1];
        row[i0] = a * c - b * s;
        row[i1] = a * s + b * c;
    }
}

/* L = sum(dy * out) of the block in float64, step by step as in mha_backward.c. */
static double loss64(const problem *P, double *const *p)
{
    const int64_t B = P->B, T = P->T, E = P->E, H = P->H, D = P->D, Q = H * D,
                  KV = P->Hkv * D, R = Q + 2 * KV, group = H / P->Hkv;
    double *qkv = malloc(sizeof(double) * (size_t)(T * R));
    double *merged = malloc(sizeof(double) * (size_t)(T * Q));
    double *s = malloc(sizeof(double) * (size_t)T);
    const double *W[3] = {p[P_WQ], p[P_WK], p[P_WV]}, *bias[3] = {p[P_BQ], p[P_BK], p[P_BV]};
    const int64_t col[3] = {0, Q, Q + KV}, rows[3] = {Q, KV, KV};
    double L = 0.0;
    for (int64_t b = 0; b < B; b++) {
        const double *x = p[P_X] + b * T * E;
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < 3; i++)
                for (int64_t r = 0; r < rows[i]; r++) {
                    double acc = bias[i][r];
                    for (int64_t e = 0; e < E; e++)
                        acc += x[t * E + e] * W[i][r * E + e];
                    qkv[t * R + col[i] + r] = acc;
                }
        if (P->rope != NO_ROPE)
            for (int64_t t = 0; t < T; t++) {
                for (int64_t h = 0; h < H; h++)
                    rope64(P, qkv + t * R + h * D, P->offset + t);
                for (int64_t h = 0; h < P->Hkv; h++)
                    rope64(P, qkv + t * R + Q + h * D, P->offset + t);
            }
        for (int64_t h = 0; h < H; h++) {
            const int64_t kc = Q + (h / group) * D, vc = Q + KV + (h / group) * D;
            for (int64_t i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < T; j++) {
                    const int vis = P->mask[b * T + j] && (!P->causal || j <= i);
                    double d = 0.0;
                    for (int64_t c = 0; c < D; c++)
                        d += qkv[i * R + h * D + c] * qkv[j * R + kc + c];
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
                        acc += s[j] / sum * qkv[j * R + vc + c];
                    merged[i * Q + h * D + c] = acc;
                }
            }
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t o = 0; o < E; o++) {
                double acc = p[P_BO][o];
                for (int64_t e = 0; e < Q; e++)
                    acc += merged[t * Q + e] * p[P_WO][o * Q + e];
                L += (double)P->dy[(b * T + t) * E + o] * acc;
            }
    }
    free(qkv);
    free(merged);
    free(s);
    return L;
}

/* The finite differences of L with respect to every element of parameter i. */
static void fd_of(const problem *P, double *const *p64, int i, double *g)
{
    for (int64_t e = 0; e < P->n[i]; e++) {
        const double keep = p64[i][e];
        p64[i][e] = keep + FD_STEP;
        const double up = loss64(P, p64);
        p64[i][e] = keep - FD_STEP;
        const double down = loss64(P, p64);
        p64[i][e] = keep;
        g[e] = (up - down) / (2 * FD_STEP);
    }
}

/* ---- attn's gradients ---------------------------------------------------------- */

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

/* A contiguous float32 tensor of 1 or 2 dims over data. */
static attn_tensor tensor2(float *data, int ndim, int64_t a, int64_t b)
{
    attn_tensor t;
    const int64_t shape[2] = {a, b};
    attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, data, ndim, shape);
    return t;
}

/* attn_gqa_backward on P under ctx into g[N_PARAMS] (g[P_X] is dx); returns its
 * status. */
static int run_backward(attn_ctx *ctx, const problem *P, float **g)
{
    const int64_t B = P->B, T = P->T, E = P->E, Q = P->H * P->D, KV = P->Hkv * P->D;
    attn_gqa_weights w;
    w.w_q = tensor2(P->p[P_WQ], 2, Q, E);
    w.w_k = tensor2(P->p[P_WK], 2, KV, E);
    w.w_v = tensor2(P->p[P_WV], 2, KV, E);
    w.w_o = tensor2(P->p[P_WO], 2, E, Q);
    w.b_q = tensor2(P->biases ? P->p[P_BQ] : NULL, 1, Q, 1);
    w.b_k = tensor2(P->biases ? P->p[P_BK] : NULL, 1, KV, 1);
    w.b_v = tensor2(P->biases ? P->p[P_BV] : NULL, 1, KV, 1);
    w.b_o = tensor2(P->biases ? P->p[P_BO] : NULL, 1, E, 1);
    attn_tensor x = tu_tensor3(P->p[P_X], B, T, E), dy = tu_tensor3(P->dy, B, T, E), mask;
    attn_tensor gt[N_PARAMS] = {tu_tensor3(g[P_X], B, T, E),
                                tensor2(g[P_WQ], 2, Q, E),
                                tensor2(g[P_WK], 2, KV, E),
                                tensor2(g[P_WV], 2, KV, E),
                                tensor2(g[P_WO], 2, E, Q),
                                tensor2(g[P_BQ], 1, Q, 1),
                                tensor2(g[P_BK], 1, KV, 1),
                                tensor2(g[P_BV], 1, KV, 1),
                                tensor2(g[P_BO], 1, E, 1)};
    const int64_t sm[4] = {B, 1, 1, T};
    attn_tensor_init(NULL, &mask, ATTN_DTYPE_BOOL, P->mask, 4, sm);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = P->causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    p.mask = P->pad ? &mask : NULL;
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    rp.pairing = P->rope == ATTN_ROPE_HALF ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
    rp.base = ROPE_BASE;
    rp.offset = P->offset;
    const attn_gqa_grads gg = {&gt[0], &gt[1], &gt[2], &gt[3], &gt[4],
                               &gt[5], &gt[6], &gt[7], &gt[8]};
    return attn_gqa_backward(ctx, &w, P->H, P->Hkv, &x, &p, P->rope == NO_ROPE ? NULL : &rp,
                             &dy, &gg);
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
    {.name = "gqa H4/Hkv2", .B = 2, .T = 3, .E = 6, .H = 4, .Hkv = 2, .D = 2, .rope = NO_ROPE,
     .biases = 1},
    {.name = "mqa causal+pad, no biases", .B = 3, .T = 4, .E = 4, .H = 2, .Hkv = 1, .D = 3,
     .causal = 1, .pad = 1, .rope = NO_ROPE},
    {.name = "gqa rope interleaved", .B = 2, .T = 4, .E = 5, .H = 2, .Hkv = 1, .D = 4,
     .causal = 1, .rope = ATTN_ROPE_INTERLEAVED, .offset = 3, .biases = 1},
    {.name = "gqa rope half+pad", .B = 2, .T = 3, .E = 4, .H = 4, .Hkv = 2, .D = 4, .pad = 1,
     .rope = ATTN_ROPE_HALF, .offset = 0, .biases = 1},
    {.name = "mha rope half", .B = 1, .T = 5, .E = 6, .H = 3, .Hkv = 3, .D = 2, .causal = 1,
     .rope = ATTN_ROPE_HALF, .offset = 11, .biases = 1},
};
#define N_PROBLEMS (int)(sizeof problems / sizeof problems[0])

static void test_finite_differences(void)
{
    TEST("attn_gqa_backward's dx and the gradients of W_q, W_k, W_v, W_o and their biases "
         "equal float64 central finite differences of L = sum(dY * out) within "
         "1e-6 + 1e-5 |fd|: GQA and MQA, RoPE in both pairings at an offset and none, with "
         "and without causal and padding masks, with and without biases, on every path "
         "with 1 and 2 threads, and 2 threads give the same bits as 1");
    run_path paths[8];
    const int np = paths_of(paths);
    for (int pi = 0; pi < N_PROBLEMS; pi++) {
        problem *P = &problems[pi];
        make(P, 300 + 10 * (uint64_t)pi);
        double *p64[N_PARAMS], *fd[N_PARAMS];
        for (int i = 0; i < N_PARAMS; i++) {
            p64[i] = malloc(sizeof(double) * (size_t)P->n[i]);
            for (int64_t e = 0; e < P->n[i]; e++)
                p64[i][e] = P->p[i][e];
        }
        for (int i = 0; i < N_PARAMS; i++) {
            fd[i] = malloc(sizeof(double) * (size_t)P->n[i]);
            fd_of(P, p64, i, fd[i]);
        }
        float *one[N_PARAMS] = {NULL};
        for (int k = 0; k < np; k++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = paths[k].arch;
            ctx.threads = paths[k].threads;
            float *g[N_PARAMS];
            for (int i = 0; i < N_PARAMS; i++)
                g[i] = calloc((size_t)P->n[i], sizeof(float));
            const int rc = run_backward(&ctx, P, g);
            if (rc != ATTN_OK)
                fprintf(stderr, "   %s %s: %s\n", P->name, paths[k].name, ctx.message);
            CHECK_INT(rc, ATTN_OK);
            char where[96];
            snprintf(where, sizeof where, "%.40s %.30s", P->name, paths[k].name);
            for (int i = 0; i < N_PARAMS; i++)
                check_close(where, param_names[i], g[i], fd[i], P->n[i]);
            for (int i = 0; i < N_PARAMS; i++) {
                if (paths[k].threads == 1) {
                    free(one[i]);
                    one[i] = g[i];
                    continue;
                }
                /* 2 threads against 1 on the same arch: the same bits. */
                const int same = memcmp(g[i], one[i], sizeof(float) * (size_t)P->n[i]) == 0;
                if (!same)
                    fprintf(stderr, "   %s: %s differs between 1 and 2 threads\n", where,
                            param_names[i]);
                CHECK(same);
                free(g[i]);
            }
        }
        for (int i = 0; i < N_PARAMS; i++) {
            free(one[i]);
            free(p64[i]);
            free(fd[i]);
        }
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

/* got (any strides) against dir/file within the bound; name says which gradient. */
static void check_golden_file(const char *where, const char *dir, const char *file,
                              const char *name, const attn_tensor *got)
{
    attn_ctx lctx;
    attn_ctx_init(&lctx);
    attn_array want;
    CHECK_INT(load(&lctx, dir, file, &want), 0);
    const int64_t n = attn_tensor_numel(got);
    CHECK_INT(attn_tensor_numel(&want.tensor), n);
    if (want.tensor.data && attn_tensor_numel(&want.tensor) == n) {
        float *g = malloc(sizeof(float) * (size_t)n);
        double *w = malloc(sizeof(double) * (size_t)n);
        int64_t idx[ATTN_MAX_DIMS] = {0};
        for (int64_t e = 0; e < n; e++) {
            int64_t off = 0;
            for (int k = 0; k < got->ndim; k++)
                off += idx[k] * got->stride[k];
            g[e] = ((const float *)got->data)[off];
            w[e] = ((const float *)want.tensor.data)[e];
            for (int k = got->ndim - 1; k >= 0 && ++idx[k] == got->shape[k]; k--)
                idx[k] = 0;
        }
        check_close(where, name, g, w, n);
        free(g);
        free(w);
    }
    attn_array_free(&lctx, &want);
}

/* got against dir/grad_<prefix><name>.npy, the gradient of weight <prefix><name>. */
static void check_golden(const char *where, const char *dir, const char *prefix,
                         const char *name, const attn_tensor *got)
{
    char file[256];
    snprintf(file, sizeof file, "grad_%s%s.npy", prefix, name);
    check_golden_file(where, dir, file, name, got);
}

/* Rows r0 .. r0 + n - 1 of t as a view. */
static attn_tensor rows_view(const attn_tensor *t, int64_t r0, int64_t n)
{
    attn_tensor v = *t;
    v.data = (float *)t->data + r0 * t->stride[0];
    v.shape[0] = n;
    return v;
}

/* One golden case on every path. */
static void golden_case(const char *name, const run_path *paths, int np)
{
    char dir[512], val[64], prefix[128] = "", layout[32], maskname[64] = "", rope[32];
    snprintf(dir, sizeof dir, "%s/golden_gqa_grads/%s", ATTN_TEST_DATA_DIR, name);
    CHECK_INT(case_value(dir, "layout", layout, sizeof layout), 0);
    CHECK_INT(case_value(dir, "prefix", prefix, sizeof prefix), 0);
    CHECK_INT(case_value(dir, "num_heads", val, sizeof val), 0);
    const int64_t H = atoll(val);
    CHECK_INT(case_value(dir, "num_kv_heads", val, sizeof val), 0);
    const int64_t Hkv = atoll(val);
    CHECK_INT(case_value(dir, "causal", val, sizeof val), 0);
    const int causal = atoi(val);
    CHECK_INT(case_value(dir, "mask", maskname, sizeof maskname), 0);
    CHECK_INT(case_value(dir, "rope", rope, sizeof rope), 0);
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    rp.pairing = strcmp(rope, "half") == 0 ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
    CHECK_INT(case_value(dir, "rope_base", val, sizeof val), 0);
    rp.base = (float)atof(val);
    CHECK_INT(case_value(dir, "rope_offset", val, sizeof val), 0);
    rp.offset = atoll(val);
    const int fused = strcmp(layout, "fused") == 0;

    attn_ctx lctx;
    attn_ctx_init(&lctx);
    attn_array x, dy, dx_want, mask;
    memset(&mask, 0, sizeof mask);
    attn_gqa_weights w;
    attn_mha_weights mw;
    memset(&w, 0, sizeof w);
    memset(&mw, 0, sizeof mw);
    char wpath[600];
    snprintf(wpath, sizeof wpath, "%s/weights.safetensors", dir);
    int rc = load(&lctx, dir, "x.npy", &x) | load(&lctx, dir, "dy.npy", &dy) |
             load(&lctx, dir, "dx.npy", &dx_want);
    if (maskname[0])
        rc |= load(&lctx, dir, maskname, &mask);
    if (fused) {
        rc |= attn_weights_load(&lctx, wpath, prefix, H, &mw);
        if (rc == 0) {
            /* The chapter's W_qkv as three row blocks: q's, k's and v's. */
            const int64_t E = mw.w_o.shape[0];
            w.w_q = rows_view(&mw.w_qkv, 0, E);
            w.w_k = rows_view(&mw.w_qkv, E, E);
            w.w_v = rows_view(&mw.w_qkv, 2 * E, E);
            w.b_q = rows_view(&mw.b_qkv, 0, E);
            w.b_k = rows_view(&mw.b_qkv, E, E);
            w.b_v = rows_view(&mw.b_qkv, 2 * E, E);
            w.w_o = mw.w_o;
            w.b_o = mw.b_o;
        }
    } else {
        rc |= attn_weights_load_gqa(&lctx, wpath, prefix, H, Hkv, &w);
    }
    if (rc)
        fprintf(stderr, "   %s: %s\n", name, lctx.message);
    CHECK_INT(rc, 0);
    if (rc == 0) {
        const attn_tensor *xt = &x.tensor;
        const int64_t B = xt->shape[0], T = xt->shape[1], E = xt->shape[2];
        const int64_t Q = w.w_q.shape[0], KV = w.w_k.shape[0];
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.causal = causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
        p.mask = maskname[0] ? &mask.tensor : NULL;
        for (int k = 0; k < np; k++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = paths[k].arch;
            ctx.threads = paths[k].threads;
            /* The gradients: fused, views of dW_qkv and db_qkv as PyTorch's module
             * has them; separate, one tensor each. */
            attn_tensor dx = {0}, dwqkv = {0}, dbqkv = {0}, g[8] = {{0}};
            const int64_t sq[2] = {Q, E}, skv[2] = {KV, E}, so[2] = {E, Q}, s3[3] = {B, T, E},
                          sf[2] = {Q + 2 * KV, E};
            int bad = attn_tensor_alloc(&ctx, &dx, ATTN_DTYPE_F32, 3, s3);
            if (fused) {
                bad |= attn_tensor_alloc(&ctx, &dwqkv, ATTN_DTYPE_F32, 2, sf);
                bad |= attn_tensor_alloc(&ctx, &dbqkv, ATTN_DTYPE_F32, 1, sf);
                if (!bad)
                    for (int i = 0; i < 3; i++) {
                        g[i] = rows_view(&dwqkv, i * E, E);
                        g[4 + i] = rows_view(&dbqkv, i * E, E);
                    }
            } else {
                bad |= attn_tensor_alloc(&ctx, &g[0], ATTN_DTYPE_F32, 2, sq);
                bad |= attn_tensor_alloc(&ctx, &g[1], ATTN_DTYPE_F32, 2, skv);
                bad |= attn_tensor_alloc(&ctx, &g[2], ATTN_DTYPE_F32, 2, skv);
                bad |= attn_tensor_alloc(&ctx, &g[4], ATTN_DTYPE_F32, 1, sq);
                bad |= attn_tensor_alloc(&ctx, &g[5], ATTN_DTYPE_F32, 1, skv);
                bad |= attn_tensor_alloc(&ctx, &g[6], ATTN_DTYPE_F32, 1, skv);
            }
            bad |= attn_tensor_alloc(&ctx, &g[3], ATTN_DTYPE_F32, 2, so);
            bad |= attn_tensor_alloc(&ctx, &g[7], ATTN_DTYPE_F32, 1, so);
            CHECK_INT(bad, 0);
            const attn_gqa_grads gg = {&dx, &g[0], &g[1], &g[2], &g[3],
                                       &g[4], &g[5], &g[6], &g[7]};
            const int brc = attn_gqa_backward(&ctx, &w, H, Hkv, xt, &p,
                                              strcmp(rope, "none") ? &rp : NULL, &dy.tensor, &gg);
            if (brc != ATTN_OK)
                fprintf(stderr, "   %s %s: %s\n", name, paths[k].name, ctx.message);
            CHECK_INT(brc, ATTN_OK);
            char where[160];
            snprintf(where, sizeof where, "%.100s %.30s", name, paths[k].name);
            check_golden_file(where, dir, "dx.npy", "dx", &dx);
            if (fused) {
                check_golden(where, dir, prefix, "qkv.weight", &dwqkv);
                check_golden(where, dir, prefix, "qkv.bias", &dbqkv);
                check_golden(where, dir, prefix, "output.weight", &g[3]);
                check_golden(where, dir, prefix, "output.bias", &g[7]);
            } else {
                static const char *const names[8] = {
                    "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                    "q_proj.bias",   "k_proj.bias",   "v_proj.bias",   "o_proj.bias"};
                const attn_tensor *bias[4] = {&w.b_q, &w.b_k, &w.b_v, &w.b_o};
                for (int i = 0; i < 8; i++)
                    if (i < 4 || bias[i - 4]->data) /* PyTorch has no gradient of no bias */
                        check_golden(where, dir, prefix, names[i], &g[i]);
            }
            attn_tensor_free(&ctx, &dx);
            attn_tensor_free(&ctx, &dwqkv);
            attn_tensor_free(&ctx, &dbqkv);
            if (!fused)
                for (int i = 0; i < 3; i++) {
                    attn_tensor_free(&ctx, &g[i]);
                    attn_tensor_free(&ctx, &g[4 + i]);
                }
            attn_tensor_free(&ctx, &g[3]);
            attn_tensor_free(&ctx, &g[7]);
        }
    }
    attn_array_free(&lctx, &x);
    attn_array_free(&lctx, &dy);
    attn_array_free(&lctx, &dx_want);
    attn_array_free(&lctx, &mask);
    if (fused)
        attn_weights_free(&lctx, &mw);
    else
        attn_gqa_weights_free(&lctx, &w);
}

static void test_golden(void)
{
    TEST("on every case of tests/data/golden_gqa_grads (PyTorch 2.15 autograd through "
         "Llama's block with F.scaled_dot_product_attention(enable_gqa=True), RoPE in both "
         "pairings or none, and the chapter's fused module with RoPE), attn_gqa_backward "
         "gives PyTorch's dx and every weight's and bias's gradient within "
         "1e-6 + 1e-5 |torch| on every path with 1 and 2 threads");
    char manifest[512], name[128];
    snprintf(manifest, sizeof manifest, "%s/golden_gqa_grads/MANIFEST", ATTN_TEST_DATA_DIR);
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
        golden_case(name, paths, np);
        ncases++;
    }
    fclose(mf);
    CHECK(ncases >= 6);
}

/* ---- the chapter's module as grouped-query attention ------------------------------ */

static void test_mha_views(void)
{
    TEST("attn_gqa_backward on W_qkv's three row blocks (H = Hkv, views of dW_qkv and "
         "db_qkv as the gradients) gives attn_mha_backward's bits, with a causal mask, on "
         "the default path with 2 threads");
    enum { B = 2, T = 5, E = 8, H = 2 };
    static float wqkv[3 * E * E], bqkv[3 * E], wo[E * E], bo[E], xb[B * T * E], dyb[B * T * E],
        dx1[B * T * E], dx2[B * T * E], dwqkv1[3 * E * E], dwqkv2[3 * E * E], dbqkv1[3 * E],
        dbqkv2[3 * E], dwo1[E * E], dwo2[E * E], dbo1[E], dbo2[E];
    tu_fill(wqkv, 3 * E * E, 1);
    tu_fill(bqkv, 3 * E, 2);
    tu_fill(wo, E * E, 3);
    tu_fill(bo, E, 4);
    tu_fill(xb, B * T * E, 5);
    tu_fill(dyb, B * T * E, 6);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 2;
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor x = tu_tensor3(xb, B, T, E), dy = tu_tensor3(dyb, B, T, E);
    attn_tensor a_dx = tu_tensor3(dx1, B, T, E), a_dwqkv = tensor2(dwqkv1, 2, 3 * E, E),
                a_dbqkv = tensor2(dbqkv1, 1, 3 * E, 1), a_dwo = tensor2(dwo1, 2, E, E),
                a_dbo = tensor2(dbo1, 1, E, 1);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    const attn_mha_grads mg = {&a_dx, &a_dwqkv, &a_dbqkv, &a_dwo, &a_dbo};
    CHECK_INT(attn_mha_backward(&ctx, &mw, H, &x, &p, &dy, &mg), ATTN_OK);

    attn_gqa_weights w;
    w.w_q = rows_view(&mw.w_qkv, 0, E);
    w.w_k = rows_view(&mw.w_qkv, E, E);
    w.w_v = rows_view(&mw.w_qkv, 2 * E, E);
    w.b_q = rows_view(&mw.b_qkv, 0, E);
    w.b_k = rows_view(&mw.b_qkv, E, E);
    w.b_v = rows_view(&mw.b_qkv, 2 * E, E);
    w.w_o = mw.w_o;
    w.b_o = mw.b_o;
    attn_tensor b_dx = tu_tensor3(dx2, B, T, E), b_dwqkv = tensor2(dwqkv2, 2, 3 * E, E),
                b_dbqkv = tensor2(dbqkv2, 1, 3 * E, 1), b_dwo = tensor2(dwo2, 2, E, E),
                b_dbo = tensor2(dbo2, 1, E, 1);
    attn_tensor v[6];
    for (int i = 0; i < 3; i++) {
        v[i] = rows_view(&b_dwqkv, i * E, E);
        v[3 + i] = rows_view(&b_dbqkv, i * E, E);
    }
    const attn_gqa_grads gg = {&b_dx, &v[0], &v[1], &v[2], &b_dwo, &v[3], &v[4], &v[5], &b_dbo};
    CHECK_INT(attn_gqa_backward(&ctx, &w, H, H, &x, &p, NULL, &dy, &gg), ATTN_OK);
    CHECK(memcmp(dx1, dx2, sizeof dx1) == 0);
    CHECK(memcmp(dwqkv1, dwqkv2, sizeof dwqkv1) == 0);
    CHECK(memcmp(dbqkv1, dbqkv2, sizeof dbqkv1) == 0);
    CHECK(memcmp(dwo1, dwo2, sizeof dwo1) == 0);
    CHECK(memcmp(dbo1, dbo2, sizeof dbo1) == 0);
}

/* ---- RoPE's backward ----------------------------------------------------------- */

static void test_rope_backward(void)
{
    TEST("attn_rope_backward is attn_rope_apply's transpose: <rope(x), dy> equals "
         "<x, rope_backward(dy)> within 1e-6 of the sum of |terms|, rope_backward(rope(x)) "
         "gives x back within 1e-6, and in place gives the same bits as out of place, "
         "for both pairings at offset 7");
    enum { B = 2, H = 3, T = 5, D = 8, N = B * H * T * D };
    static float x[N], dy[N], rx[N], bdy[N], back[N], inplace[N];
    tu_fill(x, N, 11);
    tu_fill(dy, N, 12);
    const attn_rope_pairing pairings[2] = {ATTN_ROPE_INTERLEAVED, ATTN_ROPE_HALF};
    for (int pi = 0; pi < 2; pi++) {
        attn_rope_params rp;
        attn_rope_params_init(&rp);
        rp.pairing = pairings[pi];
        rp.offset = 7;
        attn_tensor tx = tu_tensor4(x, B, H, T, D), tdy = tu_tensor4(dy, B, H, T, D),
                    trx = tu_tensor4(rx, B, H, T, D), tbdy = tu_tensor4(bdy, B, H, T, D),
                    tback = tu_tensor4(back, B, H, T, D), tin = tu_tensor4(inplace, B, H, T, D);
        CHECK_INT(attn_rope_apply(NULL, &rp, &tx, &trx), ATTN_OK);
        CHECK_INT(attn_rope_backward(NULL, &rp, &tdy, &tbdy), ATTN_OK);
        CHECK_INT(attn_rope_backward(NULL, &rp, &trx, &tback), ATTN_OK);
        memcpy(inplace, dy, sizeof inplace);
        CHECK_INT(attn_rope_backward(NULL, &rp, &tin, &tin), ATTN_OK);
        CHECK(memcmp(inplace, bdy, sizeof bdy) == 0);
        double lhs = 0.0, rhs = 0.0, mag = 0.0, worst = 0.0;
        for (int i = 0; i < N; i++) {
            lhs += (double)rx[i] * dy[i];
            rhs += (double)x[i] * bdy[i];
            mag += fabs((double)x[i] * dy[i]);
            if (fabs((double)back[i] - x[i]) > worst)
                worst = fabs((double)back[i] - x[i]);
        }
        if (!(fabs(lhs - rhs) <= 1e-6 * mag))
            fprintf(stderr, "   pairing %d: <rope(x), dy> %.12g, <x, rope_backward(dy)> %.12g\n",
                    pi, lhs, rhs);
        CHECK(fabs(lhs - rhs) <= 1e-6 * mag);
        if (!(worst <= 1e-6))
            fprintf(stderr, "   pairing %d: rope_backward(rope(x)) is off x by %.3g\n", pi,
                    worst);
        CHECK(worst <= 1e-6);
    }
}

/* ---- scratch ------------------------------------------------------------------- */

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

static void *no_alloc(void *user, size_t size)
{
    (void)user;
    (void)size;
    return NULL;
}

static void test_workspace(void)
{
    TEST("with a ctx->workspace of attn_gqa_backward_workspace_size bytes, "
         "attn_gqa_backward with RoPE allocates nothing and gives the same bits as without "
         "one; without a workspace, an allocator that gives nothing makes it NO_MEMORY");
    problem P = {.name = "ws", .B = 2, .T = 5, .E = 8, .H = 4, .Hkv = 2, .D = 4, .causal = 1,
                 .rope = ATTN_ROPE_HALF, .offset = 2, .biases = 1};
    make(&P, 9);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 2;
    ctx.allocator.alloc = count_alloc;
    ctx.allocator.free = count_free;
    float *plain[N_PARAMS], *ws[N_PARAMS];
    for (int i = 0; i < N_PARAMS; i++) {
        plain[i] = calloc((size_t)P.n[i], sizeof(float));
        ws[i] = calloc((size_t)P.n[i], sizeof(float));
    }
    n_allocs = 0;
    CHECK_INT(run_backward(&ctx, &P, plain), ATTN_OK);
    CHECK(n_allocs > 0); /* without a workspace the scratch is allocated */
    attn_ctx starved;
    attn_ctx_init(&starved);
    starved.allocator.alloc = no_alloc;
    starved.allocator.free = count_free;
    CHECK_INT(run_backward(&starved, &P, ws), ATTN_STATUS_NO_MEMORY);

    /* The size for the same arguments that run_backward passes. */
    const int64_t Q = P.H * P.D, KV = P.Hkv * P.D;
    attn_gqa_weights w;
    w.w_q = tensor2(P.p[P_WQ], 2, Q, P.E);
    w.w_k = tensor2(P.p[P_WK], 2, KV, P.E);
    w.w_v = tensor2(P.p[P_WV], 2, KV, P.E);
    w.w_o = tensor2(P.p[P_WO], 2, P.E, Q);
    w.b_q = tensor2(P.p[P_BQ], 1, Q, 1);
    w.b_k = tensor2(P.p[P_BK], 1, KV, 1);
    w.b_v = tensor2(P.p[P_BV], 1, KV, 1);
    w.b_o = tensor2(P.p[P_BO], 1, P.E, 1);
    attn_tensor x = tu_tensor3(P.p[P_X], P.B, P.T, P.E), dy = tu_tensor3(P.dy, P.B, P.T, P.E);
    attn_tensor gt[N_PARAMS] = {tu_tensor3(ws[P_X], P.B, P.T, P.E), tensor2(ws[P_WQ], 2, Q, P.E),
                                tensor2(ws[P_WK], 2, KV, P.E), tensor2(ws[P_WV], 2, KV, P.E),
                                tensor2(ws[P_WO], 2, P.E, Q), tensor2(ws[P_BQ], 1, Q, 1),
                                tensor2(ws[P_BK], 1, KV, 1), tensor2(ws[P_BV], 1, KV, 1),
                                tensor2(ws[P_BO], 1, P.E, 1)};
    const attn_gqa_grads gg = {&gt[0], &gt[1], &gt[2], &gt[3], &gt[4],
                               &gt[5], &gt[6], &gt[7], &gt[8]};
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    rp.pairing = ATTN_ROPE_HALF;
    rp.base = ROPE_BASE;
    rp.offset = P.offset;
    size_t bytes = 0;
    CHECK_INT(attn_gqa_backward_workspace_size(&ctx, &w, P.H, P.Hkv, &x, &p, &rp, &dy, &gg,
                                               &bytes),
              ATTN_OK);
    CHECK(bytes > 0);
    void *mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
    ctx.workspace = mem;
    ctx.workspace_size = bytes;
    n_allocs = 0;
    CHECK_INT(attn_gqa_backward(&ctx, &w, P.H, P.Hkv, &x, &p, &rp, &dy, &gg), ATTN_OK);
    CHECK_INT(n_allocs, 0);
    for (int i = 0; i < N_PARAMS; i++) {
        const int same = memcmp(ws[i], plain[i], sizeof(float) * (size_t)P.n[i]) == 0;
        if (!same)
            fprintf(stderr, "   %s differs with the workspace\n", param_names[i]);
        CHECK(same);
        free(plain[i]);
        free(ws[i]);
    }
    free(mem);
    unmake(&P);
}

int main(void)
{
    test_finite_differences();
    test_golden();
    test_mha_views();
    test_rope_backward();
    test_workspace();
    fprintf(stderr, "worst error / bound: %.3g\n", worst_ratio);
    return check_summary("test_gqa_backward");
}
