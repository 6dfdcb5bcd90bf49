/*
 * bench_mha.c - times attn_mha_forward (and, where the library has them, packed
 * weights and a kept workspace) and counts the allocations each call makes through
 * attn_allocator. `attn bench` times attention alone; this is the loop behind the
 * multi-head figures of docs/performance.md. Not a test.
 *
 * Build against a built tree (a library built from this repository):
 *   cc -O2 -std=c11 -Iinclude bench/bench_mha.c build/libattn.a -lm -lpthread -o bench_mha
 * Add -DBENCH_OLD_API to build it against a library from before attn_mha_pack
 * (commit 28603ce), which has only the plain call.
 *
 * Run: bench_mha B T E H THREADS [SECONDS]  (e.g. 1 1024 768 12 2, or 2 5 16 4 1)
 * It prints, per mode, the median time of one call over 10 runs of about
 * SECONDS / 10 each, the fastest of those runs (the better figure on a busy
 * machine), and the allocations per call after the first.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long n_alloc;

static void *count_alloc(void *user, size_t n)
{
    (void)user;
    n_alloc++;
    return malloc(n);
}

static void count_free(void *user, void *p)
{
    (void)user;
    free(p);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct bench {
    attn_ctx ctx;
    attn_mha_weights w;
#ifndef BENCH_OLD_API
    attn_mha_packed *pw;
#endif
    int64_t H;
    attn_tensor x, out;
    attn_sdpa_params p;
    int packed;
} bench;

static int call(bench *b)
{
#ifndef BENCH_OLD_API
    if (b->packed)
        return attn_mha_forward_packed(&b->ctx, b->pw, b->H, &b->x, &b->p, &b->out, NULL);
#endif
    return attn_mha_forward(&b->ctx, &b->w, b->H, &b->x, &b->p, &b->out, NULL);
}

/* Median seconds per call over 10 runs of about `seconds` / 10 each, and the
 * allocations per call after a warm-up call. */
static void run(const char *mode, bench *b, double seconds)
{
    if (call(b) != ATTN_OK) {
        fprintf(stderr, "%s: %s\n", mode, b->ctx.message);
        exit(1);
    }
    const long before = n_alloc;
    double t0 = now();
    int reps = 0;
    while (now() - t0 < seconds / 10 / 4 || reps < 1) {
        call(b);
        reps++;
    }
    const double per = (now() - t0) / reps;
    const long allocs = n_alloc - before;
    long n = (long)(seconds / 10 / per);
    n = n < 1 ? 1 : n;
    double runs[10];
    for (int r = 0; r < 10; r++) {
        t0 = now();
        for (long i = 0; i < n; i++)
            call(b);
        runs[r] = (now() - t0) / (double)n;
    }
    qsort(runs, 10, sizeof runs[0], cmp_double);
    printf("  %-34s median %12.3f us/call, fastest run %12.3f  %6.2f allocations/call\n",
           mode, 1e6 * 0.5 * (runs[4] + runs[5]), 1e6 * runs[0], (double)allocs / reps);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: bench_mha B T E H THREADS [SECONDS]\n");
        return 2;
    }
    const int64_t B = atoll(argv[1]), T = atoll(argv[2]), E = atoll(argv[3]), H = atoll(argv[4]);
    const int threads = atoi(argv[5]);
    const double seconds = argc > 6 ? atof(argv[6]) : 2.0;
    if (B < 1 || T < 1 || E < 1 || H < 1 || E % H || threads < 1 || !(seconds > 0)) {
        fprintf(stderr, "bench_mha: sizes and threads must be at least 1, H must divide E\n");
        return 2;
    }
    float *x = malloc(sizeof(float) * B * T * E), *out = malloc(sizeof(float) * B * T * E);
    float *wqkv = malloc(sizeof(float) * 3 * E * E), *bqkv = malloc(sizeof(float) * 3 * E);
    float *wo = malloc(sizeof(float) * E * E), *bo = malloc(sizeof(float) * E);
    attn_rng rng;
    attn_rng_seed(&rng, 42);
    attn_rng_randn(&rng, x, B * T * E);
    attn_rng_linear_init(&rng, wqkv, bqkv, 3 * E, E);
    attn_rng_linear_init(&rng, wo, bo, E, E);

    bench b;
    memset(&b, 0, sizeof b);
    attn_ctx_init(&b.ctx);
    b.ctx.threads = threads;
    b.ctx.allocator.alloc = count_alloc;
    b.ctx.allocator.free = count_free;
    const int64_t s3[3] = {B, T, E}, sq[2] = {3 * E, E}, sbq[1] = {3 * E}, so[2] = {E, E},
                  sbo[1] = {E};
    attn_tensor_init(NULL, &b.x, ATTN_DTYPE_F32, x, 3, s3);
    attn_tensor_init(NULL, &b.out, ATTN_DTYPE_F32, out, 3, s3);
    attn_tensor_init(NULL, &b.w.w_qkv, ATTN_DTYPE_F32, wqkv, 2, sq);
    attn_tensor_init(NULL, &b.w.b_qkv, ATTN_DTYPE_F32, bqkv, 1, sbq);
    attn_tensor_init(NULL, &b.w.w_o, ATTN_DTYPE_F32, wo, 2, so);
    attn_tensor_init(NULL, &b.w.b_o, ATTN_DTYPE_F32, bo, 1, sbo);
    b.H = H;
    attn_sdpa_params_init(&b.p);
    b.p.causal = 1;

    printf("multi-head attention B=%lld T=%lld E=%lld H=%lld causal, %d threads, arch %s\n",
           (long long)B, (long long)T, (long long)E, (long long)H, threads,
           attn_arch_name(attn_arch_selected(&b.ctx)));
    run("attn_mha_forward", &b, seconds);
#ifndef BENCH_OLD_API
    b.ctx.keep_workspace = 1;
    run("attn_mha_forward, keep_workspace", &b, seconds);
    if (attn_mha_pack(&b.ctx, &b.w, &b.pw) != ATTN_OK) {
        fprintf(stderr, "attn_mha_pack: %s\n", b.ctx.message);
        return 1;
    }
    b.packed = 1;
    run("attn_mha_forward_packed, keep", &b, seconds);
    attn_mha_packed_free(&b.ctx, b.pw);
    attn_ctx_release(&b.ctx);
#endif
    free(x), free(out), free(wqkv), free(bqkv), free(wo), free(bo);
    return 0;
}
