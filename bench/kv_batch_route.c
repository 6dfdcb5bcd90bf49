/*
 * kv_batch_route.c - what the KV cache's batch path saves, per dtype: S9's decode
 * step (B = 4 sequences of 1024, 2048, 3072 and 4096 positions, H = Hkv = 16,
 * D = 64, one query each, bottom-right causal) as one attn_kv_cache_attend over the
 * four sequences and as four attends of one sequence each. Every dtype runs the
 * first as one parallel job (docs/decoding.md, split-key decoding; 16-bit caches
 * since issue 16), so the two columns show what the one job saves. Uses
 * include/attn.h only.
 *
 *     cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/kv_batch_route.c \
 *         build/libattn.a -lm -lpthread -o kv_batch_route
 *     ./kv_batch_route [CALLS] [TQ]   # 2 threads; CALLS timed calls per figure (30);
 *                                     # TQ query rows per sequence (1; 16: a
 *                                     # speculative step, the tile path)
 *
 * Prints, for three interleaved rounds of float32, bfloat16 and float16, the median
 * and the fastest call of each form, in ms.
 */
#include "attn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CALLS 1000

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One dtype's round: fills a cache, times both forms; 0 on success. */
static int round_of(attn_dtype dt, int calls, int tq)
{
    enum { B = 4, H = 16, D = 64, CAP = 4096 };
    static const int64_t len[B] = {1024, 2048, 3072, 4096};
    static double one[MAX_CALLS], four[MAX_CALLS];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 2;
    ctx.keep_workspace = 1;
    const attn_kv_cache_config cfg = {B, H, CAP, D, 0, dt};
    attn_kv_cache *c = NULL;
    float *kv = malloc(sizeof(float) * H * CAP * D);
    attn_tensor q, o, qb, ob;
    memset(&q, 0, sizeof q), memset(&o, 0, sizeof o);
    const int64_t qs[4] = {B, H, tq, D};
    int rc = kv ? attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c) : ATTN_STATUS_NO_MEMORY;
    for (int64_t i = 0; kv && i < (int64_t)H * CAP * D; i++)
        kv[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int b = 0; b < B && rc == ATTN_OK; b++) {
        const int64_t s[4] = {1, H, len[b], D};
        attn_tensor t;
        attn_tensor_init(NULL, &t, ATTN_DTYPE_F32, kv, 4, s);
        rc = attn_kv_cache_append(&ctx, c, b, &t, &t, NULL);
    }
    if (rc == ATTN_OK)
        rc = attn_tensor_alloc(&ctx, &q, dt, 4, qs);
    if (rc == ATTN_OK)
        rc = attn_tensor_alloc(&ctx, &o, dt, 4, qs);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    /* Two untimed calls of each form first: the pages and the threads warm up. */
    for (int r = 0; r < calls + 2 && rc == ATTN_OK; r++) {
        const double t0 = now_s();
        rc = attn_kv_cache_attend(&ctx, c, 0, &q, &p, NULL, &o, NULL);
        const double t1 = now_s();
        for (int b = 0; b < B && rc == ATTN_OK; b++) {
            attn_tensor_narrow(&ctx, &q, 0, b, 1, &qb);
            attn_tensor_narrow(&ctx, &o, 0, b, 1, &ob);
            rc = attn_kv_cache_attend(&ctx, c, b, &qb, &p, NULL, &ob, NULL);
        }
        const double t2 = now_s();
        if (r >= 2)
            one[r - 2] = t1 - t0, four[r - 2] = t2 - t1;
    }
    if (rc == ATTN_OK) {
        qsort(one, (size_t)calls, sizeof *one, cmp_double);
        qsort(four, (size_t)calls, sizeof *four, cmp_double);
        printf("%-8s S9, Tq %d: one attend of 4 sequences median %.3f ms (min %.3f); 4 attends "
               "of 1: median %.3f ms (min %.3f)\n",
               attn_dtype_name(dt), tq, one[calls / 2] * 1e3, one[0] * 1e3, four[calls / 2] * 1e3,
               four[0] * 1e3);
    } else {
        fprintf(stderr, "kv_batch_route: %s\n", ctx.message);
    }
    attn_kv_cache_free(&ctx, c);
    attn_tensor_free(&ctx, &q), attn_tensor_free(&ctx, &o);
    attn_ctx_release(&ctx);
    free(kv);
    return rc;
}

int main(int argc, char **argv)
{
    const int calls = argc > 1 ? atoi(argv[1]) : 30, tq = argc > 2 ? atoi(argv[2]) : 1;
    if (calls < 1 || calls > MAX_CALLS || tq < 1 || tq > 1024) {
        fprintf(stderr, "kv_batch_route: CALLS must be 1 .. %d, TQ 1 .. 1024\n", MAX_CALLS);
        return 2;
    }
    const attn_dtype dts[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    for (int round = 0; round < 3; round++) {
        printf("# round %d\n", round + 1);
        for (int i = 0; i < 3; i++)
            if (round_of(dts[i], calls, tq) != ATTN_OK)
                return 1;
    }
    return 0;
}
