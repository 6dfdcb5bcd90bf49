/*
 * test_threads.c - threads never change answers, and small problems do not pay
 * for them.
 *
 * The fused kernel and the GEMM split work into items whose boundaries depend on
 * the shapes only, and every sum has one order, so any thread count must give the
 * same bits; these tests compare with memcmp, not with a tolerance.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"
#include "threads.h"

#include <sys/wait.h>
#include <unistd.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fill(float *p, int64_t n, uint64_t seed)
{
    attn_rng rng;
    attn_rng_seed(&rng, seed);
    attn_rng_uniform(&rng, p, n, -1.0f, 1.0f);
}

static const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};

static void test_sdpa_bits(void)
{
    TEST("the fused kernel gives the same bits with 1, 2, 3, 4 and 7 threads, on every "
         "path, for causal + padding attention with weights");
    enum { B = 2, H = 3, T = 200, D = 64 };
    const int64_t n = (int64_t)B * H * T * D, nw = (int64_t)B * H * T * T;
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    float *o1 = malloc(n * sizeof *o1), *on = malloc(n * sizeof *on);
    float *w1 = malloc(nw * sizeof *w1), *wn = malloc(nw * sizeof *wn);
    uint8_t mask[B * T];
    fill(q, n, 1), fill(k, n, 2), fill(v, n, 3);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < T; j++)
            mask[b * T + j] = !(b == 1 && j >= T - 37);
    const int64_t s4[4] = {B, H, T, D}, sw[4] = {B, H, T, T}, sm[4] = {B, 1, 1, T};
    attn_tensor tq, tk, tv, to1, ton, tw1, twn, tm;
    attn_tensor_init(NULL, &tq, ATTN_DTYPE_F32, q, 4, s4);
    attn_tensor_init(NULL, &tk, ATTN_DTYPE_F32, k, 4, s4);
    attn_tensor_init(NULL, &tv, ATTN_DTYPE_F32, v, 4, s4);
    attn_tensor_init(NULL, &to1, ATTN_DTYPE_F32, o1, 4, s4);
    attn_tensor_init(NULL, &ton, ATTN_DTYPE_F32, on, 4, s4);
    attn_tensor_init(NULL, &tw1, ATTN_DTYPE_F32, w1, 4, sw);
    attn_tensor_init(NULL, &twn, ATTN_DTYPE_F32, wn, 4, sw);
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, mask, 4, sm);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    p.mask = &tm;
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = archs[a];
        ctx.threads = 1;
        CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to1, &tw1), ATTN_OK);
        const int counts[4] = {2, 3, 4, 7};
        for (int c = 0; c < 4; c++) {
            ctx.threads = counts[c];
            memset(on, 0xff, n * sizeof *on);
            memset(wn, 0xff, nw * sizeof *wn);
            CHECK_INT(attn_sdpa(&ctx, &tq, &tk, &tv, &p, &ton, &twn), ATTN_OK);
            if (memcmp(o1, on, n * sizeof *o1) || memcmp(w1, wn, nw * sizeof *w1))
                fprintf(stderr, "  arch %s, %d threads: bits differ from 1 thread\n",
                        attn_arch_name(archs[a]), counts[c]);
            CHECK(memcmp(o1, on, n * sizeof *o1) == 0);
            CHECK(memcmp(w1, wn, nw * sizeof *w1) == 0);
        }
    }
    free(q), free(k), free(v), free(o1), free(on), free(w1), free(wn);
}

static void test_linear_bits(void)
{
    TEST("attn_linear gives the same bits with 1, 2 and 5 threads on every path");
    enum { M = 301, K = 150, N = 203 };
    float *x = malloc(M * K * sizeof *x), *w = malloc(N * K * sizeof *w);
    float *b = malloc(N * sizeof *b), *y1 = malloc(M * N * sizeof *y1);
    float *yn = malloc(M * N * sizeof *yn);
    fill(x, M * K, 4), fill(w, N * K, 5), fill(b, N, 6);
    const int64_t sx[2] = {M, K}, swt[2] = {N, K}, sb[1] = {N}, sy[2] = {M, N};
    attn_tensor tx, tw, tb, ty1, tyn;
    attn_tensor_init(NULL, &tx, ATTN_DTYPE_F32, x, 2, sx);
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, w, 2, swt);
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, b, 1, sb);
    attn_tensor_init(NULL, &ty1, ATTN_DTYPE_F32, y1, 2, sy);
    attn_tensor_init(NULL, &tyn, ATTN_DTYPE_F32, yn, 2, sy);
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.arch = archs[a];
        ctx.threads = 1;
        CHECK_INT(attn_linear(&ctx, &tx, &tw, &tb, &ty1), ATTN_OK);
        for (int t = 2; t <= 5; t += 3) {
            ctx.threads = t;
            memset(yn, 0xff, M * N * sizeof *yn);
            CHECK_INT(attn_linear(&ctx, &tx, &tw, &tb, &tyn), ATTN_OK);
            CHECK(memcmp(y1, yn, M * N * sizeof *y1) == 0);
        }
    }
    free(x), free(w), free(b), free(y1), free(yn);
}

typedef struct count_arg {
    _Atomic int hits[1000];
    _Atomic int bad_worker;
    int threads;
} count_arg;

static void count_item(void *arg, int64_t item, int worker)
{
    count_arg *c = arg;
    atomic_fetch_add(&c->hits[item], 1);
    if (worker < 0 || worker >= c->threads)
        atomic_store(&c->bad_worker, 1);
}

static void test_pool(void)
{
    TEST("the pool runs every item exactly once, with worker numbers below the thread "
         "count, for any thread count and item count, and again on reuse");
    static count_arg c;
    /* More threads than cores (this machine may have two), past the pool's 64
     * workers (65 and 100 are capped), and counts that change from call to call. */
    const int threads[10] = {1, 2, 3, 8, 2, 64, 65, 100, 7, 3};
    const int64_t items[10] = {1000, 1, 999, 17, 1000, 1000, 64, 1000, 5, 1000};
    for (int r = 0; r < 10; r++) {
        memset(&c, 0, sizeof c);
        c.threads = threads[r];
        attn__parallel_for(threads[r], items[r], count_item, &c);
        int once = 1;
        for (int64_t i = 0; i < 1000; i++)
            once &= atomic_load(&c.hits[i]) == (i < items[r] ? 1 : 0);
        CHECK(once);
        CHECK_INT(atomic_load(&c.bad_worker), 0);
    }
    /* Back to back, so that a call's job is posted while workers of the last one
     * still spin, or are giving up their spin, or have just gone to sleep. */
    const int cycle[6] = {1, 2, 7, 3, 64, 2};
    int all_once = 1, bad_worker = 0;
    for (int r = 0; r < 300; r++) {
        const int64_t n = 1 + (r * 37) % 1000;
        memset(&c, 0, sizeof c);
        c.threads = cycle[r % 6];
        attn__parallel_for(c.threads, n, count_item, &c);
        for (int64_t i = 0; i < 1000; i++)
            all_once &= atomic_load(&c.hits[i]) == (i < n ? 1 : 0);
        bad_worker |= atomic_load(&c.bad_worker);
    }
    CHECK(all_once);
    CHECK_INT(bad_worker, 0);
}

/* ThreadSanitizer refuses to start threads in the child of a threaded fork. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

static void test_fork(void)
{
    TEST("after fork() the child's pool starts empty and works (the parent's workers "
         "do not exist there), and so does a grandchild's");
    if (UNDER_TSAN) {
        fprintf(stderr, "  skipped under ThreadSanitizer (no threads after a threaded fork)\n");
        return;
    }
    static count_arg c;
    memset(&c, 0, sizeof c);
    c.threads = 2;
    attn__parallel_for(2, 100, count_item, &c); /* the parent's pool has a worker now */
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* a deadlock would otherwise hang the test */
        memset(&c, 0, sizeof c);
        c.threads = 2;
        attn__parallel_for(2, 1000, count_item, &c);
        int once = 1;
        for (int64_t i = 0; i < 1000; i++)
            once &= atomic_load(&c.hits[i]) == 1;
        /* The child's own worker is spinning now: a fork again, and the
         * grandchild computes as well. */
        pid_t grand = fork();
        if (grand == 0) {
            memset(&c, 0, sizeof c);
            c.threads = 3;
            attn__parallel_for(3, 1000, count_item, &c);
            int g = 1;
            for (int64_t i = 0; i < 1000; i++)
                g &= atomic_load(&c.hits[i]) == 1;
            _exit(g ? 0 : 1);
        }
        int gs = 0;
        if (grand < 0 || waitpid(grand, &gs, 0) != grand || !WIFEXITED(gs) ||
            WEXITSTATUS(gs) != 0)
            once = 0;
        _exit(once ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0);
    if (pid > 0)
        waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_small_problems(void)
{
    TEST("the chapter's size (2x4x5x5, D=4) runs on one thread; large problems use "
         "ctx->threads; 0 threads means the cores the process may run on");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 8;
    /* S1: 4*B*H*Tq*Tk*D = 3200 FLOPs in 8 items. */
    CHECK_INT(attn__threads_for(&ctx, 3200.0, 8), 1);
    CHECK_INT(attn__threads_for(&ctx, 1e10, 1000), 8);
    CHECK_INT(attn__threads_for(&ctx, 1e10, 3), 3); /* no more threads than items */
    ctx.threads = 0;
    CHECK_INT(attn_threads_resolve(&ctx), attn_threads_online());
    CHECK(attn_threads_online() >= 1);
}

int main(void)
{
    test_pool();
    test_fork();
    test_small_problems();
    test_sdpa_bits();
    test_linear_bits();
    return check_summary("test_threads");
}
