/*
 * test_no_alloc.c - the steady state allocates nothing. A counting allocator
 * (attn_allocator) counts every allocation the library makes through the context.
 * After the first call, repeated attn_sdpa calls (with a workspace of
 * attn_sdpa_workspace_size bytes, or with keep_workspace), attn_mha_forward_packed
 * calls (with a workspace, or with keep_workspace) and attn_linear_forward_packed
 * calls make zero allocations, on every arch path this machine runs (ref, scalar,
 * avx2, avx512) with 1 and 2 threads, and give the same bits as the plain calls
 * (a fresh context, no workspace, unpacked weights). A workspace one byte too small
 * is not used: the call falls back to an allocation of its own (or the context's
 * kept buffer) and still gives the same bits.
 *
 * Threads started by the pool are not the library's allocations: the counter sees
 * what goes through attn_allocator, which is what a caller can control.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct counting {
    long calls; /* allocations so far */
    long live;  /* allocations not yet freed */
} counting;

static void *count_alloc(void *user, size_t n)
{
    counting *c = user;
    c->calls++;
    void *p = malloc(n);
    if (p)
        c->live++;
    return p;
}

static void count_free(void *user, void *p)
{
    counting *c = user;
    c->live--;
    free(p);
}

static void ctx_counting(attn_ctx *ctx, counting *c, attn_arch arch, int threads)
{
    attn_ctx_init(ctx);
    ctx->allocator.alloc = count_alloc;
    ctx->allocator.free = count_free;
    ctx->allocator.user = c;
    ctx->arch = arch;
    ctx->threads = threads;
}

/* 64-byte aligned memory of at least `bytes` (and at least 64) bytes. */
static void *workspace_alloc(size_t bytes)
{
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

static const attn_arch archs[4] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                                   ATTN_ARCH_AVX512};

/* Reports a difference in bits between a steady-state call and the plain one. */
static void check_same_bits(const char *what, attn_arch arch, int threads, const float *got,
                            const float *want, size_t n)
{
    size_t i = 0;
    while (i < n && memcmp(&got[i], &want[i], sizeof(float)) == 0)
        i++;
    if (i == n)
        return;
    fprintf(stderr, "  %s, arch %s, %d threads: element %zu is %.9g, the plain call gives %.9g\n",
            what, attn_arch_name(arch), threads, i, got[i], want[i]);
    CHECK(i == n);
}

/* ---- attention ------------------------------------------------------------------ */

enum { SB = 2, SH = 4, ST = 64, SD = 32 };
static float sq[SB * SH * ST * SD], sk[SB * SH * ST * SD], sv[SB * SH * ST * SD];

typedef struct sdpa_case {
    attn_tensor q, k, v, out, w;
    attn_sdpa_params p;
} sdpa_case;

static void sdpa_case_init(sdpa_case *c, float *out, float *w)
{
    c->q = tu_tensor4(sq, SB, SH, ST, SD);
    c->k = tu_tensor4(sk, SB, SH, ST, SD);
    c->v = tu_tensor4(sv, SB, SH, ST, SD);
    c->out = tu_tensor4(out, SB, SH, ST, SD);
    c->w = tu_tensor4(w, SB, SH, ST, ST);
    attn_sdpa_params_init(&c->p);
    c->p.causal = 1;
}

static void test_sdpa(attn_arch arch, int threads)
{
    static float want_o[SB * SH * ST * SD], want_w[SB * SH * ST * ST], o[SB * SH * ST * SD],
        w[SB * SH * ST * ST];
    sdpa_case c;
    attn_ctx plain;
    attn_ctx_init(&plain);
    plain.arch = arch;
    plain.threads = threads;
    sdpa_case_init(&c, want_o, want_w);
    CHECK_INT(attn_sdpa(&plain, &c.q, &c.k, &c.v, &c.p, &c.out, &c.w), ATTN_OK);
    sdpa_case_init(&c, o, w);

    counting cnt = {0, 0};
    attn_ctx ctx;
    ctx_counting(&ctx, &cnt, arch, threads);
    size_t bytes = 0;
    CHECK_INT(attn_sdpa_workspace_size(&ctx, &c.q, &c.k, &c.v, &c.p, &c.out, &c.w, &bytes),
              ATTN_OK);
    void *ws = workspace_alloc(bytes);
    /* Zeros first: nothing a workspace holds may pass for a past call's scratch (the
     * tile path's query tile packed ahead by item 0's predecessor, fused_tile.h). */
    memset(ws, 0, bytes);
    ctx.workspace = ws;
    ctx.workspace_size = bytes;
    for (int i = 0; i < 3; i++) {
        memset(o, 0, sizeof o);
        CHECK_INT(attn_sdpa(&ctx, &c.q, &c.k, &c.v, &c.p, &c.out, &c.w), ATTN_OK);
    }
    if (cnt.calls != 0)
        fprintf(stderr, "  attn_sdpa with a workspace of %zu bytes, arch %s, %d threads: %ld "
                        "allocations in 3 calls\n", bytes, attn_arch_name(arch), threads, cnt.calls);
    CHECK_INT(cnt.calls, 0);
    check_same_bits("attn_sdpa with a workspace", arch, threads, o, want_o, sizeof o / 4);
    check_same_bits("attn_sdpa weights with a workspace", arch, threads, w, want_w, sizeof w / 4);

    /* keep_workspace: the first call may allocate, the next ones do not. */
    ctx.workspace = NULL;
    ctx.workspace_size = 0;
    ctx.keep_workspace = 1;
    CHECK_INT(attn_sdpa(&ctx, &c.q, &c.k, &c.v, &c.p, &c.out, &c.w), ATTN_OK);
    const long first = cnt.calls;
    for (int i = 0; i < 3; i++) {
        memset(o, 0, sizeof o);
        CHECK_INT(attn_sdpa(&ctx, &c.q, &c.k, &c.v, &c.p, &c.out, &c.w), ATTN_OK);
    }
    CHECK_INT(cnt.calls - first, 0);
    check_same_bits("attn_sdpa with keep_workspace", arch, threads, o, want_o, sizeof o / 4);
    attn_ctx_release(&ctx);
    CHECK_INT(cnt.live, 0);

    /* A workspace one byte too small is not used: each call allocates its own
     * scratch (when it needs any beyond its stack) and frees it. */
    if (bytes > 4096) {
        ctx.keep_workspace = 0;
        ctx.workspace = ws;
        ctx.workspace_size = bytes - 1;
        cnt.calls = 0;
        memset(o, 0, sizeof o);
        CHECK_INT(attn_sdpa(&ctx, &c.q, &c.k, &c.v, &c.p, &c.out, &c.w), ATTN_OK);
        CHECK_INT(cnt.calls, 1);
        CHECK_INT(cnt.live, 0);
        check_same_bits("attn_sdpa with a workspace too small", arch, threads, o, want_o,
                        sizeof o / 4);
    }
    free(ws);
}

/* ---- multi-head attention and the projection ------------------------------------ */

typedef struct mha_sizes {
    int64_t B, T, E, H;
} mha_sizes;

static void test_mha(mha_sizes z, attn_arch arch, int threads)
{
    const int64_t B = z.B, T = z.T, E = z.E, H = z.H;
    float *x = malloc(sizeof(float) * B * T * E), *wqkv = malloc(sizeof(float) * 3 * E * E),
          *bqkv = malloc(sizeof(float) * 3 * E), *wo = malloc(sizeof(float) * E * E),
          *bo = malloc(sizeof(float) * E), *want = malloc(sizeof(float) * B * T * E),
          *want_w = malloc(sizeof(float) * B * H * T * T), *y = malloc(sizeof(float) * B * T * E),
          *yw = malloc(sizeof(float) * B * H * T * T),
          *want_lin = malloc(sizeof(float) * B * T * 3 * E),
          *lin = malloc(sizeof(float) * B * T * 3 * E);
    tu_fill(x, B * T * E, 11);
    tu_fill(wqkv, 3 * E * E, 12);
    tu_fill(bqkv, 3 * E, 13);
    tu_fill(wo, E * E, 14);
    tu_fill(bo, E, 15);
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, B, T, E), tout = tu_tensor3(want, B, T, E),
                tw = tu_tensor4(want_w, B, H, T, T);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    char what[96];
    snprintf(what, sizeof what, "B=%lld T=%lld E=%lld H=%lld", (long long)B, (long long)T,
             (long long)E, (long long)H);

    /* The plain calls. */
    attn_ctx plain;
    attn_ctx_init(&plain);
    plain.arch = arch;
    plain.threads = threads;
    CHECK_INT(attn_mha_forward(&plain, &mw, H, &tx, &p, &tout, &tw), ATTN_OK);
    attn_tensor tlin = tu_tensor3(want_lin, B, T, 3 * E);
    CHECK_INT(attn_linear(&plain, &tx, &mw.w_qkv, &mw.b_qkv, &tlin), ATTN_OK);

    counting cnt = {0, 0};
    attn_ctx ctx;
    ctx_counting(&ctx, &cnt, arch, threads);
    attn_mha_packed *pw = NULL;
    attn_linear_packed *pl = NULL;
    CHECK_INT(attn_mha_pack(&ctx, &mw, &pw), ATTN_OK);
    CHECK_INT(attn_linear_pack(&ctx, &mw.w_qkv, &mw.b_qkv, &pl), ATTN_OK);
    CHECK_INT(cnt.calls, 2); /* one allocation each */
    tout.data = y;
    tw.data = yw;

    /* attn_linear_forward_packed allocates nothing, from the first call on. */
    tlin.data = lin;
    cnt.calls = 0;
    for (int i = 0; i < 2; i++)
        CHECK_INT(attn_linear_forward_packed(&ctx, &tx, pl, &tlin), ATTN_OK);
    CHECK_INT(cnt.calls, 0);
    check_same_bits("attn_linear_forward_packed", arch, threads, lin, want_lin,
                    (size_t)(B * T * 3 * E));

    /* attn_mha_forward_packed with a workspace. */
    size_t bytes = 0, unpacked_bytes = 0;
    CHECK_INT(attn_mha_packed_workspace_size(&ctx, pw, H, &tx, &p, &tout, &tw, &bytes), ATTN_OK);
    CHECK_INT(attn_mha_workspace_size(&ctx, &mw, H, &tx, &p, &tout, &tw, &unpacked_bytes),
              ATTN_OK);
    CHECK(bytes > 0 && bytes <= unpacked_bytes);
    void *ws = workspace_alloc(unpacked_bytes);
    ctx.workspace = ws;
    ctx.workspace_size = bytes;
    cnt.calls = 0;
    for (int i = 0; i < 3; i++) {
        memset(y, 0, sizeof(float) * B * T * E);
        CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &tout, &tw), ATTN_OK);
    }
    if (cnt.calls != 0)
        fprintf(stderr, "  attn_mha_forward_packed %s with a workspace, arch %s, %d threads: "
                        "%ld allocations\n", what, attn_arch_name(arch), threads, cnt.calls);
    CHECK_INT(cnt.calls, 0);
    check_same_bits("attn_mha_forward_packed with a workspace", arch, threads, y, want,
                    (size_t)(B * T * E));
    check_same_bits("attn_mha_forward_packed weights", arch, threads, yw, want_w,
                    (size_t)(B * H * T * T));

    /* attn_mha_forward (unpacked) with a workspace of its own size: it packs into
     * the workspace and allocates nothing either. */
    ctx.workspace_size = unpacked_bytes;
    for (int i = 0; i < 2; i++)
        CHECK_INT(attn_mha_forward(&ctx, &mw, H, &tx, &p, &tout, NULL), ATTN_OK);
    CHECK_INT(cnt.calls, 0);
    check_same_bits("attn_mha_forward with a workspace", arch, threads, y, want,
                    (size_t)(B * T * E));

    /* keep_workspace: the first call allocates the kept buffer, then nothing. */
    ctx.workspace = NULL;
    ctx.workspace_size = 0;
    ctx.keep_workspace = 1;
    CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &tout, &tw), ATTN_OK);
    CHECK_INT(cnt.calls, 1);
    for (int i = 0; i < 3; i++) {
        memset(y, 0, sizeof(float) * B * T * E);
        CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &tout, &tw), ATTN_OK);
    }
    CHECK_INT(cnt.calls, 1);
    check_same_bits("attn_mha_forward_packed with keep_workspace", arch, threads, y, want,
                    (size_t)(B * T * E));
    attn_ctx_release(&ctx);
    CHECK_INT(cnt.live, 2); /* the two packed weights */

    /* A workspace one byte too small falls back to one allocation per call, freed
     * before the call returns, with the same bits. */
    ctx.keep_workspace = 0;
    ctx.workspace = ws;
    ctx.workspace_size = bytes - 1;
    cnt.calls = 0;
    memset(y, 0, sizeof(float) * B * T * E);
    CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &tout, &tw), ATTN_OK);
    CHECK_INT(cnt.calls, 1);
    CHECK_INT(cnt.live, 2);
    check_same_bits("attn_mha_forward_packed with a workspace too small", arch, threads, y,
                    want, (size_t)(B * T * E));
    /* ... and with keep_workspace as well, to the kept buffer, once. */
    ctx.keep_workspace = 1;
    cnt.calls = 0;
    for (int i = 0; i < 3; i++)
        CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &tx, &p, &tout, &tw), ATTN_OK);
    CHECK_INT(cnt.calls, 1);
    check_same_bits("attn_mha_forward_packed with a small workspace and keep_workspace", arch,
                    threads, y, want, (size_t)(B * T * E));
    attn_ctx_release(&ctx);

    attn_mha_packed_free(&ctx, pw);
    attn_linear_packed_free(&ctx, pl);
    CHECK_INT(cnt.live, 0);
    free(ws);
    free(x), free(wqkv), free(bqkv), free(wo), free(bo), free(want), free(want_w), free(y);
    free(yw), free(want_lin), free(lin);
}

/* The README: the fused kernel "never allocates [Tq, Tk] unless the weights are asked
 * for". On a problem whose [Tq, Tk] scores would take 16 MiB per head, the scratch a
 * call asks for (attn_sdpa_workspace_size) and the largest single allocation it
 * makes stay below one [Tq, Tk] float matrix, with a causal and with no mask, on every
 * fused path with 1 and 2 threads; asking for the weights is what may need more. */
typedef struct largest {
    size_t max;
    long live;
} largest;

static void *largest_alloc(void *user, size_t n)
{
    largest *l = user;
    if (n > l->max)
        l->max = n;
    void *p = malloc(n);
    if (p)
        l->live++;
    return p;
}

static void largest_free(void *user, void *p)
{
    largest *l = user;
    l->live--;
    free(p);
}

static void test_no_square(void)
{
    TEST("the fused kernel asks for less scratch than one [Tq, Tk] float matrix and "
         "allocates none that large, at Tq = Tk = 2048, causal and unmasked, every fused "
         "path, 1 and 2 threads");
    enum { B = 1, H = 2, T = 2048, D = 64 };
    const size_t square = (size_t)T * T * sizeof(float);
    const size_t n = (size_t)B * H * T * D;
    float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)),
          *v = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
    if (!q || !k || !v || !o) {
        CHECK(!"out of memory");
        free(q), free(k), free(v), free(o);
        return;
    }
    tu_fill(q, (int64_t)n, 11);
    tu_fill(k, (int64_t)n, 12);
    tu_fill(v, (int64_t)n, 13);
    attn_tensor tq = tu_tensor4(q, B, H, T, D), tk = tu_tensor4(k, B, H, T, D),
                tv = tu_tensor4(v, B, H, T, D), to = tu_tensor4(o, B, H, T, D);
    int runs = 0;
    for (int a = 1; a < 4; a++) { /* scalar, avx2, avx512: the fused builds */
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int threads = 1; threads <= 2; threads++)
            for (int causal = 0; causal <= 1; causal++) {
                largest l = {0, 0};
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.allocator.alloc = largest_alloc;
                ctx.allocator.free = largest_free;
                ctx.allocator.user = &l;
                ctx.arch = archs[a];
                ctx.threads = threads;
                ctx.impl = ATTN_IMPL_FUSED;
                attn_sdpa_params p;
                attn_sdpa_params_init(&p);
                p.causal = causal;
                size_t bytes = 0;
                CHECK_INT(attn_sdpa_workspace_size(&ctx, &tq, &tk, &tv, &p, &to, NULL, &bytes),
                          ATTN_OK);
                CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, NULL), ATTN_OK);
                if (!(bytes < square) || !(l.max < square))
                    fprintf(stderr, "  %s, %d threads, %s: workspace %zu bytes, largest "
                            "allocation %zu bytes; one [Tq, Tk] float matrix is %zu\n",
                            attn_arch_name(archs[a]), threads, causal ? "causal" : "no mask",
                            bytes, l.max, square);
                CHECK(bytes < square);
                CHECK(l.max < square);
                attn_ctx_release(&ctx);
                CHECK_INT(l.live, 0);
                runs++;
            }
    }
    fprintf(stderr, "  %d fused runs checked\n", runs);
    CHECK(runs >= 4);
    free(q), free(k), free(v), free(o);
}

static void test_arch_mismatch(void)
{
    TEST("weights packed for one arch are refused, naming both arches, by a call that runs another");
    enum { E = 8 };
    float wqkv[3 * E * E] = {0}, bqkv[3 * E] = {0}, wo[E * E] = {0}, bo[E] = {0},
          x[2 * E] = {0}, y[2 * E] = {0};
    attn_mha_weights mw = tu_mha_weights(wqkv, bqkv, wo, bo, E);
    attn_tensor tx = tu_tensor3(x, 1, 2, E), ty = tu_tensor3(y, 1, 2, E);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = ATTN_ARCH_SCALAR;
    attn_mha_packed *pw = NULL;
    CHECK_INT(attn_mha_pack(&ctx, &mw, &pw), ATTN_OK);
    ctx.arch = ATTN_ARCH_REF;
    CHECK_INT(attn_mha_forward_packed(&ctx, pw, 2, &tx, NULL, &ty, NULL),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "packed for arch scalar, but this call runs ref");
    ctx.arch = ATTN_ARCH_SCALAR;
    CHECK_INT(attn_mha_forward_packed(&ctx, pw, 2, &tx, NULL, &ty, NULL), ATTN_OK);
    attn_mha_packed_free(NULL, pw);
}

int main(void)
{
    tu_fill(sq, SB * SH * ST * SD, 1);
    tu_fill(sk, SB * SH * ST * SD, 2);
    tu_fill(sv, SB * SH * ST * SD, 3);
    const mha_sizes sizes[2] = {{2, 5, 16, 4}, {2, 64, 64, 4}};
    TEST("after the first call, attn_sdpa with a workspace or keep_workspace, "
         "attn_mha_forward_packed with a workspace or keep_workspace, and "
         "attn_linear_forward_packed make no allocation, on every arch with 1 and 2 "
         "threads, and give the bits of the plain calls; a workspace too small falls back");
    int paths = 0;
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        paths++;
        for (int threads = 1; threads <= 2; threads++) {
            test_sdpa(archs[a], threads);
            for (int s = 0; s < 2; s++)
                test_mha(sizes[s], archs[a], threads);
        }
    }
    fprintf(stderr, "  %d arch paths checked\n", paths);
    CHECK(paths >= 2);
    test_no_square();
    test_arch_mismatch();
    return check_summary("test_no_alloc");
}
