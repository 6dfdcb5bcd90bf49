/*
 * bench_gemm.c - `attn bench --gemm`: the projection GEMM alone, y = x W^T with
 * x, W and y all [N, N] (attn_linear without a bias), against the FMA peak.
 */
#include "bench.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct gemm_arg {
    attn_ctx ctx;
    attn_tensor x, w, y;
} gemm_arg;

static int gemm_call(void *p)
{
    gemm_arg *a = p;
    return attn_linear(&a->ctx, &a->x, &a->w, NULL, &a->y);
}

static void gemm_arg_free(gemm_arg *a)
{
    attn_tensor_free(&a->ctx, &a->x);
    attn_tensor_free(&a->ctx, &a->w);
    attn_tensor_free(&a->ctx, &a->y);
    attn_ctx_release(&a->ctx); /* the kept workspace */
}

int bench_gemm(int64_t n, const bench_opts *o)
{
    gemm_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
    a.ctx.keep_workspace = 1;
    const int64_t s[2] = {n, n};
    if (attn_tensor_alloc(&a.ctx, &a.x, ATTN_DTYPE_F32, 2, s) ||
        attn_tensor_alloc(&a.ctx, &a.w, ATTN_DTYPE_F32, 2, s) ||
        attn_tensor_alloc(&a.ctx, &a.y, ATTN_DTYPE_F32, 2, s)) {
        fprintf(stderr, "attn bench: %s\n", a.ctx.message);
        gemm_arg_free(&a);
        return 1;
    }
    bench_fill_uniform(a.x.data, n * n, 21);
    bench_fill_uniform(a.w.data, n * n, 22);
    int status = 0;
    for (int x = 0; x < 2; x++) {
        if (x == 1 && strcmp(o->impl, "all") && strcmp(o->impl, "ref"))
            continue;
        if (x == 0 && !strcmp(o->impl, "ref"))
            continue;
        a.ctx.arch = x == 1 ? ATTN_ARCH_REF : ATTN_ARCH_AUTO;
        bench_timing t = bench_time_call(gemm_call, &a, x == 1 && o->runs > 3 ? 3 : o->runs);
        if (t.status) {
            fprintf(stderr, "attn bench: gemm failed: %s\n", a.ctx.message);
            status = 1;
            continue;
        }
        double gf = 2.0 * (double)n * (double)n * (double)n / t.median_s / 1e9;
        const char *impl = x == 1 ? "ref" : attn_arch_name(attn_arch_selected(&a.ctx));
        if (o->json) {
            /* A GEMM has no attention shape or mask: those fields are null, and
             * M, N, K say its size. */
            const bench_fields f = {"gemm", impl, 0, 0, 0, 0, 0, NULL,
                                    attn_threads_resolve(&a.ctx), t.median_s * 1e3, gf};
            bench_json_begin(o, &f);
            printf(",\"M\":%lld,\"N\":%lld,\"K\":%lld,\"runs\":%d,\"peak_frac\":%.4f",
                   (long long)n, (long long)n, (long long)n, t.runs,
                   o->peakn > 0 ? gf / o->peakn : 0);
            bench_json_end();
        } else
            printf("gemm   %-8s %lld x %lld x %lld: %.3f ms, %.2f GFLOP/s (%.1f%% of peak)\n",
                   impl, (long long)n, (long long)n, (long long)n, t.median_s * 1e3, gf,
                   o->peakn > 0 ? 100 * gf / o->peakn : 0);
    }
    gemm_arg_free(&a);
    return status;
}
