/*
 * test_grad_claims.c - the rules of docs/gradients.md that no other test showed.
 *
 * "Every element of the gradients is written (overwritten, not accumulated
 * into)", for attn_sdpa_backward (the reference and the fused kernel in both of
 * its forms), attn_mha_backward and attn_gqa_backward, on every path this machine
 * has, with 1 and 2 threads. The other backward tests hand in gradients from
 * calloc, so a kernel that added into its outputs, or left an element it thought
 * was zero (a hidden key, a row that sees no key, a key tile outside every row's
 * causal range) unwritten, would pass them. Here each call runs twice, once into
 * buffers of zeros and once into buffers of NaN, and the two results must have the
 * same bits: a NaN that survives is an element the call did not write, and any
 * other difference is a sum that read what was there.
 *
 * "dsinks without p->sinks: INVALID_ARGUMENT", and "the reference gives the same
 * bits on every instruction set".
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A path: the kernel (ref or the default), the instruction set and the threads. */
typedef struct path {
    attn_impl impl;
    attn_arch arch;
    int threads;
} path;

static int paths_of(path *out)
{
    const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                               ATTN_ARCH_AVX512};
    int n = 0;
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int impl = 0; impl < 2; impl++)
            for (int t = 1; t <= 2; t++) {
                out[n].impl = impl ? ATTN_IMPL_REF : ATTN_IMPL_AUTO;
                out[n].arch = archs[a];
                out[n].threads = t;
                n++;
            }
    }
    return n;
}

static float *filled(int64_t n, float value)
{
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        p[i] = value;
    return p;
}

/* Compares a with b bit for bit and prints the first element that differs with
 * both values (a first: the call into zeros, b: the call into NaN). */
static void check_same_bits(const char *what, const char *where, const float *a,
                            const float *b, int64_t n)
{
    check_count_++;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            check_failures_++;
            fprintf(stderr, "%s, %s: element %lld differs: %.9g vs %.9g\n", where, what,
                    (long long)i, a[i], b[i]);
            return;
        }
}

/* One attention problem: q [B, H, Tq, D], k, v [B, Hkv, Tk, D], dout like the
 * output; the options in p. */
typedef struct problem {
    const char *name;
    int64_t B, H, Hkv, Tq, Tk, D;
    int causal; /* 0 none, 1 bottom-right, 2 top-left */
    int sinks, bias, empty_row;
} problem;

static void run_sdpa_case(const problem *P, const path *paths, int npaths)
{
    const int64_t B = P->B, H = P->H, Hkv = P->Hkv, Tq = P->Tq, Tk = P->Tk, D = P->D;
    const int64_t nq = B * H * Tq * D, nk = B * Hkv * Tk * D, nb = Tq * Tk;
    float *q = malloc(sizeof(float) * (size_t)nq), *k = malloc(sizeof(float) * (size_t)nk);
    float *v = malloc(sizeof(float) * (size_t)nk), *dout = malloc(sizeof(float) * (size_t)nq);
    float *out = malloc(sizeof(float) * (size_t)nq), *lse = malloc(sizeof(float) * (size_t)(B * H * Tq));
    float *biasv = malloc(sizeof(float) * (size_t)nb), sinkv[8];
    unsigned char *maskv = malloc((size_t)(B * Tq * Tk));
    tu_fill(q, nq, 11);
    tu_fill(k, nk, 12);
    tu_fill(v, nk, 13);
    tu_fill(dout, nq, 14);
    tu_fill(biasv, nb, 15);
    tu_fill(sinkv, H, 16);
    /* Row 2 of batch 0 sees no key; every other row sees all but key 1. */
    for (int64_t i = 0; i < B * Tq * Tk; i++)
        maskv[i] = (i % Tk) != 1 && !(i / Tk == 2);

    attn_tensor tq = tu_tensor4(q, B, H, Tq, D), tk = tu_tensor4(k, B, Hkv, Tk, D);
    attn_tensor tv = tu_tensor4(v, B, Hkv, Tk, D), tdo = tu_tensor4(dout, B, H, Tq, D);
    attn_tensor tout = tu_tensor4(out, B, H, Tq, D), tlse = tu_tensor3(lse, B, H, Tq);
    attn_tensor tbias = tu_tensor4(biasv, 1, 1, Tq, Tk), tsinks, tmask;
    const int64_t hs[1] = {H}, ms[4] = {B, 1, Tq, Tk};
    attn_tensor_init(NULL, &tsinks, ATTN_DTYPE_F32, sinkv, 1, hs);
    attn_tensor_init(NULL, &tmask, ATTN_DTYPE_BOOL, maskv, 4, ms);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = P->causal == 2   ? ATTN_CAUSAL_TOP_LEFT
               : P->causal == 1 ? ATTN_CAUSAL_BOTTOM_RIGHT
                                : ATTN_CAUSAL_NONE;
    p.sinks = P->sinks ? &tsinks : NULL;
    p.bias = P->bias ? &tbias : NULL;
    if (P->empty_row) {
        p.mask = &tmask;
        p.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    }

    for (int pi = 0; pi < npaths; pi++) {
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.impl = paths[pi].impl;
        ctx.arch = paths[pi].arch;
        ctx.threads = paths[pi].threads;
        char where[160];
        snprintf(where, sizeof where, "%s, %s, arch %s, %d thread(s), into zeros vs NaN", P->name,
                 paths[pi].impl == ATTN_IMPL_REF ? "ref" : "default",
                 attn_arch_name(paths[pi].arch), paths[pi].threads);
        p.lse = &tlse;
        const int rf = attn_sdpa(&ctx, &tq, &tk, &tv, &p, &tout, NULL);
        CHECK_INT(rf, ATTN_OK);
        p.lse = NULL;
        float *g[2][5];
        for (int fill = 0; fill < 2; fill++) {
            const float value = fill ? NAN : 0.0f;
            g[fill][0] = filled(nq, value);
            g[fill][1] = filled(nk, value);
            g[fill][2] = filled(nk, value);
            g[fill][3] = filled(nb, value);
            g[fill][4] = filled(H, value);
            attn_tensor dq = tu_tensor4(g[fill][0], B, H, Tq, D);
            attn_tensor dk = tu_tensor4(g[fill][1], B, Hkv, Tk, D);
            attn_tensor dv = tu_tensor4(g[fill][2], B, Hkv, Tk, D);
            attn_tensor db = tu_tensor4(g[fill][3], 1, 1, Tq, Tk), ds;
            attn_tensor_init(NULL, &ds, ATTN_DTYPE_F32, g[fill][4], 1, hs);
            attn_sdpa_grads grads = {&dq, &dk, &dv, P->bias ? &db : NULL,
                                     P->sinks ? &ds : NULL};
            const int rc = attn_sdpa_backward(&ctx, &tq, &tk, &tv, &p, &tout, &tlse, &tdo,
                                              &grads);
            if (rc != ATTN_OK)
                fprintf(stderr, "%s: %s\n", where, ctx.message);
            CHECK_INT(rc, ATTN_OK);
        }
        check_same_bits("dq", where, g[0][0], g[1][0], nq);
        check_same_bits("dk", where, g[0][1], g[1][1], nk);
        check_same_bits("dv", where, g[0][2], g[1][2], nk);
        if (P->bias)
            check_same_bits("dbias", where, g[0][3], g[1][3], nb);
        if (P->sinks)
            check_same_bits("dsinks", where, g[0][4], g[1][4], H);
        for (int fill = 0; fill < 2; fill++)
            for (int i = 0; i < 5; i++)
                free(g[fill][i]);
        attn_ctx_release(&ctx);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
    free(biasv);
    free(maskv);
}

static void test_sdpa(const path *paths, int npaths)
{
    TEST("attn_sdpa_backward overwrites every element of dq, dk, dv, dbias and dsinks: "
         "into buffers of NaN it gives the bits it gives into zeros, on the reference and "
         "the fused kernel's one-pass form (GQA, several (b, kv head) items) and two-pass "
         "form (a broadcast dbias; a single item), with a row that sees no key, keys "
         "no row sees, and key tiles past the causal range, every path, 1 and 2 threads");
    /* One-pass: B * Hkv = 4 items, no dbias; sinks give dsinks. */
    const problem one = {.name = "one-pass, GQA 4/2, causal, sinks", .B = 2, .H = 4,
                         .Hkv = 2, .Tq = 17, .Tk = 23, .D = 8, .causal = 1, .sinks = 1};
    /* Two-pass: a dbias broadcast over b and h (pass 2 on one thread). */
    const problem two = {.name = "two-pass, broadcast dbias, sinks", .B = 2, .H = 4,
                         .Hkv = 2, .Tq = 17, .Tk = 23, .D = 8, .causal = 1, .sinks = 1,
                         .bias = 1};
    /* Two-pass: one (b, kv head) item; Tk = 150 is three key tiles of 64. */
    const problem single = {.name = "two-pass, one item, MQA, Tk 150", .B = 1, .H = 3,
                            .Hkv = 1, .Tq = 5, .Tk = 150, .D = 16, .causal = 1};
    /* A mask with an empty row (zero mode) and a key no row sees. */
    const problem empty = {.name = "empty row and a hidden key, zero mode", .B = 2, .H = 2,
                           .Hkv = 2, .Tq = 9, .Tk = 13, .D = 5, .empty_row = 1};
    /* The one-pass form over several key tiles, top-left causal with Tq = 70 and
     * Tk = 200: keys 70 to 199 (most of the second tile and all of the third) are
     * seen by no row, so their dk and dv must still be written, as zeros. */
    const problem tiles = {.name = "one-pass, Tk 200, top-left causal", .B = 2, .H = 2,
                           .Hkv = 1, .Tq = 70, .Tk = 200, .D = 8, .causal = 2};
    const problem *cases[] = {&one, &two, &single, &empty, &tiles};
    for (int c = 0; c < 5; c++)
        run_sdpa_case(cases[c], paths, npaths);
}

static void test_mha_gqa(const path *paths, int npaths)
{
    TEST("attn_mha_backward and attn_gqa_backward overwrite dx and every weight's and "
         "bias's gradient: into buffers of NaN they give the bits they give into zeros, "
         "every path, 1 and 2 threads");
    const int64_t B = 2, T = 7, E = 8, H = 2, Hkv = 1, D = E / H;
    float wqkv[3 * 8 * 8], bqkv[3 * 8], wo[8 * 8], bo[8], x[2 * 7 * 8], dy[2 * 7 * 8];
    tu_fill(wqkv, 3 * E * E, 21);
    tu_fill(bqkv, 3 * E, 22);
    tu_fill(wo, E * E, 23);
    tu_fill(bo, E, 24);
    tu_fill(x, B * T * E, 25);
    tu_fill(dy, B * T * E, 26);
    attn_mha_weights w = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), tdy = tu_tensor3(dy, B, T, E);
    /* The GQA block: W_q [H*D, E], W_k and W_v [Hkv*D, E] from W_qkv's rows. */
    attn_gqa_weights gw;
    memset(&gw, 0, sizeof gw);
    const int64_t sq[2] = {H * D, E}, skv[2] = {Hkv * D, E}, so[2] = {E, H * D};
    const int64_t sbq[1] = {H * D}, sbkv[1] = {Hkv * D}, sbo[1] = {E};
    attn_tensor_init(NULL, &gw.w_q, ATTN_DTYPE_F32, wqkv, 2, sq);
    attn_tensor_init(NULL, &gw.w_k, ATTN_DTYPE_F32, wqkv + E * E, 2, skv);
    attn_tensor_init(NULL, &gw.w_v, ATTN_DTYPE_F32, wqkv + 2 * E * E, 2, skv);
    attn_tensor_init(NULL, &gw.w_o, ATTN_DTYPE_F32, wo, 2, so);
    attn_tensor_init(NULL, &gw.b_q, ATTN_DTYPE_F32, bqkv, 1, sbq);
    attn_tensor_init(NULL, &gw.b_k, ATTN_DTYPE_F32, bqkv + E, 1, sbkv);
    attn_tensor_init(NULL, &gw.b_v, ATTN_DTYPE_F32, bqkv + 2 * E, 1, sbkv);
    attn_tensor_init(NULL, &gw.b_o, ATTN_DTYPE_F32, bo, 1, sbo);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_TOP_LEFT;
    /* mha: dx, dW_qkv, db_qkv, dW_o, db_o; gqa: dx, dW_q, dW_k, dW_v, dW_o and the
     * four biases. */
    const int64_t mn[5] = {B * T * E, 3 * E * E, 3 * E, E * E, E};
    const int64_t gn[9] = {B * T * E, H * D * E, Hkv * D * E, Hkv * D * E, E * H * D,
                           H * D, Hkv * D, Hkv * D, E};
    static const char *const mnames[5] = {"mha dx", "mha dW_qkv", "mha db_qkv", "mha dW_o",
                                          "mha db_o"};
    static const char *const gnames[9] = {"gqa dx",   "gqa dW_q", "gqa dW_k",
                                          "gqa dW_v", "gqa dW_o", "gqa db_q",
                                          "gqa db_k", "gqa db_v", "gqa db_o"};
    for (int pi = 0; pi < npaths; pi++) {
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.impl = paths[pi].impl;
        ctx.arch = paths[pi].arch;
        ctx.threads = paths[pi].threads;
        char where[128];
        snprintf(where, sizeof where, "%s, arch %s, %d thread(s), into zeros vs NaN",
                 paths[pi].impl == ATTN_IMPL_REF ? "ref" : "default",
                 attn_arch_name(paths[pi].arch), paths[pi].threads);
        float *m[2][5], *g[2][9];
        for (int fill = 0; fill < 2; fill++) {
            const float value = fill ? NAN : 0.0f;
            for (int i = 0; i < 5; i++)
                m[fill][i] = filled(mn[i], value);
            for (int i = 0; i < 9; i++)
                g[fill][i] = filled(gn[i], value);
            attn_tensor mdx = tu_tensor3(m[fill][0], B, T, E), mdw, mdb, mdwo, mdbo;
            const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
            attn_tensor_init(NULL, &mdw, ATTN_DTYPE_F32, m[fill][1], 2, s1);
            attn_tensor_init(NULL, &mdb, ATTN_DTYPE_F32, m[fill][2], 1, s2);
            attn_tensor_init(NULL, &mdwo, ATTN_DTYPE_F32, m[fill][3], 2, s3);
            attn_tensor_init(NULL, &mdbo, ATTN_DTYPE_F32, m[fill][4], 1, s4);
            const attn_mha_grads mg = {&mdx, &mdw, &mdb, &mdwo, &mdbo};
            int rc = attn_mha_backward(&ctx, &w, H, &tx, &p, &tdy, &mg);
            if (rc != ATTN_OK)
                fprintf(stderr, "%s: mha: %s\n", where, ctx.message);
            CHECK_INT(rc, ATTN_OK);

            attn_tensor gdx = tu_tensor3(g[fill][0], B, T, E), gt[8];
            const int64_t *shapes[8] = {sq, skv, skv, so, sbq, sbkv, sbkv, sbo};
            for (int i = 0; i < 8; i++)
                attn_tensor_init(NULL, &gt[i], ATTN_DTYPE_F32, g[fill][i + 1], i < 4 ? 2 : 1,
                                 shapes[i]);
            const attn_gqa_grads gg = {&gdx,   &gt[0], &gt[1], &gt[2], &gt[3],
                                       &gt[4], &gt[5], &gt[6], &gt[7]};
            rc = attn_gqa_backward(&ctx, &gw, H, Hkv, &tx, &p, NULL, &tdy, &gg);
            if (rc != ATTN_OK)
                fprintf(stderr, "%s: gqa: %s\n", where, ctx.message);
            CHECK_INT(rc, ATTN_OK);
        }
        for (int i = 0; i < 5; i++)
            check_same_bits(mnames[i], where, m[0][i], m[1][i], mn[i]);
        for (int i = 0; i < 9; i++)
            check_same_bits(gnames[i], where, g[0][i], g[1][i], gn[i]);
        for (int fill = 0; fill < 2; fill++) {
            for (int i = 0; i < 5; i++)
                free(m[fill][i]);
            for (int i = 0; i < 9; i++)
                free(g[fill][i]);
        }
        attn_ctx_release(&ctx);
    }
}

static void test_dsinks_refused(void)
{
    TEST("attn_sdpa_backward refuses dsinks when p has no sinks (INVALID_ARGUMENT, the "
         "message naming both), as docs/gradients.md says");
    float q[8], out[8], lse[4], dq[8], dk[8], dv[8], ds[2];
    tu_fill(q, 8, 31);
    attn_tensor t = tu_tensor4(q, 1, 2, 2, 2), to = tu_tensor4(out, 1, 2, 2, 2);
    attn_tensor tl = tu_tensor3(lse, 1, 2, 2), tdq = tu_tensor4(dq, 1, 2, 2, 2);
    attn_tensor tdk = tu_tensor4(dk, 1, 2, 2, 2), tdv = tu_tensor4(dv, 1, 2, 2, 2), tds;
    const int64_t hs[1] = {2};
    attn_tensor_init(NULL, &tds, ATTN_DTYPE_F32, ds, 1, hs);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    p.lse = &tl;
    CHECK_INT(attn_sdpa(&ctx, &t, &t, &t, &p, &to, NULL), ATTN_OK);
    p.lse = NULL;
    attn_sdpa_grads g = {&tdq, &tdk, &tdv, NULL, &tds};
    CHECK_INT(attn_sdpa_backward(&ctx, &t, &t, &t, &p, &to, &tl, &t, &g),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "grads->dsinks is given but p->sinks is NULL");
    attn_ctx_release(&ctx);
}

static void test_ref_same_bits_every_isa(const path *paths, int npaths)
{
    TEST("attn_sdpa_backward_ref gives the same bits whatever ctx->arch says (the "
         "reference is one plain-C build), with 1 and 2 threads");
    const int64_t B = 2, H = 4, Hkv = 2, Tq = 9, Tk = 14, D = 6;
    const int64_t nq = B * H * Tq * D, nk = B * Hkv * Tk * D;
    float *q = malloc(sizeof(float) * (size_t)nq), *k = malloc(sizeof(float) * (size_t)nk);
    float *v = malloc(sizeof(float) * (size_t)nk), *dout = malloc(sizeof(float) * (size_t)nq);
    float *out = malloc(sizeof(float) * (size_t)nq), lse[2 * 4 * 9], sinkv[4];
    tu_fill(q, nq, 41);
    tu_fill(k, nk, 42);
    tu_fill(v, nk, 43);
    tu_fill(dout, nq, 44);
    tu_fill(sinkv, H, 45);
    attn_tensor tq = tu_tensor4(q, B, H, Tq, D), tk = tu_tensor4(k, B, Hkv, Tk, D);
    attn_tensor tv = tu_tensor4(v, B, Hkv, Tk, D), tdo = tu_tensor4(dout, B, H, Tq, D);
    attn_tensor tout = tu_tensor4(out, B, H, Tq, D), tlse = tu_tensor3(lse, B, H, Tq), ts;
    const int64_t hs[1] = {H};
    attn_tensor_init(NULL, &ts, ATTN_DTYPE_F32, sinkv, 1, hs);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    p.softcap = 2.0f;
    p.sinks = &ts;
    attn_ctx ctx0;
    attn_ctx_init(&ctx0);
    ctx0.impl = ATTN_IMPL_REF;
    p.lse = &tlse;
    CHECK_INT(attn_sdpa(&ctx0, &tq, &tk, &tv, &p, &tout, NULL), ATTN_OK);
    p.lse = NULL;
    float *g0[4] = {NULL, NULL, NULL, NULL};
    for (int pi = 0; pi < npaths; pi++) {
        if (paths[pi].impl != ATTN_IMPL_REF)
            continue;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.arch = paths[pi].arch;
        ctx.threads = paths[pi].threads;
        float *g[4] = {filled(nq, 0), filled(nk, 0), filled(nk, 0), filled(H, 0)};
        attn_tensor dq = tu_tensor4(g[0], B, H, Tq, D), dk = tu_tensor4(g[1], B, Hkv, Tk, D);
        attn_tensor dv = tu_tensor4(g[2], B, Hkv, Tk, D), ds;
        attn_tensor_init(NULL, &ds, ATTN_DTYPE_F32, g[3], 1, hs);
        attn_sdpa_grads grads = {&dq, &dk, &dv, NULL, &ds};
        CHECK_INT(attn_sdpa_backward_ref(&ctx, &tq, &tk, &tv, &p, &tout, &tlse, &tdo, &grads),
                  ATTN_OK);
        char where[96];
        snprintf(where, sizeof where, "reference on arch %s, %d thread(s), against the first",
                 attn_arch_name(paths[pi].arch), paths[pi].threads);
        if (!g0[0]) {
            for (int i = 0; i < 4; i++)
                g0[i] = g[i];
        } else {
            check_same_bits("dq", where, g0[0], g[0], nq);
            check_same_bits("dk", where, g0[1], g[1], nk);
            check_same_bits("dv", where, g0[2], g[2], nk);
            check_same_bits("dsinks", where, g0[3], g[3], H);
            for (int i = 0; i < 4; i++)
                free(g[i]);
        }
        attn_ctx_release(&ctx);
    }
    for (int i = 0; i < 4; i++)
        free(g0[i]);
    attn_ctx_release(&ctx0);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
}

int main(void)
{
    path paths[32];
    const int npaths = paths_of(paths);
    test_sdpa(paths, npaths);
    test_mha_gqa(paths, npaths);
    test_dsinks_refused();
    test_ref_same_bits_every_isa(paths, npaths);
    return check_summary("test_grad_claims");
}
