/*
 * bench_mha.c - `attn bench --mha`: multi-head self-attention end to end
 * (attn_mha_forward: both projections, the attention core, the head split and
 * merge) on one sequence [1, T, E], the library's default path and, with
 * --impl ref or all, the reference.
 */
#include "bench.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct mha_arg {
    attn_ctx ctx;
    attn_mha_weights w;
    attn_tensor x, out;
    attn_sdpa_params p;
    int64_t H;
} mha_arg;

static int mha_call(void *p)
{
    mha_arg *a = p;
    return attn_mha_forward(&a->ctx, &a->w, a->H, &a->x, &a->p, &a->out, NULL);
}

/* Frees what bench_mha allocated (a tensor never allocated is zero and is fine). */
static void mha_arg_free(mha_arg *a)
{
    attn_tensor *all[6] = {&a->x, &a->out, &a->w.w_qkv, &a->w.b_qkv, &a->w.w_o, &a->w.b_o};
    for (int i = 0; i < 6; i++)
        attn_tensor_free(&a->ctx, all[i]);
    attn_ctx_release(&a->ctx); /* the kept workspace */
}

int bench_mha(int64_t T, int64_t E, int64_t H, int causal, const bench_opts *o)
{
    mha_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
    a.ctx.keep_workspace = 1;
    a.H = H;
    const int64_t xs[3] = {1, T, E}, wq[2] = {3 * E, E}, bq[1] = {3 * E}, wo[2] = {E, E},
                  bo[1] = {E};
    if (attn_tensor_alloc(&a.ctx, &a.x, ATTN_DTYPE_F32, 3, xs) ||
        attn_tensor_alloc(&a.ctx, &a.out, ATTN_DTYPE_F32, 3, xs) ||
        attn_tensor_alloc(&a.ctx, &a.w.w_qkv, ATTN_DTYPE_F32, 2, wq) ||
        attn_tensor_alloc(&a.ctx, &a.w.b_qkv, ATTN_DTYPE_F32, 1, bq) ||
        attn_tensor_alloc(&a.ctx, &a.w.w_o, ATTN_DTYPE_F32, 2, wo) ||
        attn_tensor_alloc(&a.ctx, &a.w.b_o, ATTN_DTYPE_F32, 1, bo)) {
        fprintf(stderr, "attn bench: %s\n", a.ctx.message);
        mha_arg_free(&a);
        return 1;
    }
    const float lim = 1.0f / sqrtf((float)E);
    bench_fill_uniform(a.x.data, T * E, 11);
    attn_rng rng;
    attn_rng_seed(&rng, 12);
    attn_rng_uniform(&rng, a.w.w_qkv.data, 3 * E * E, -lim, lim);
    attn_rng_uniform(&rng, a.w.b_qkv.data, 3 * E, -lim, lim);
    attn_rng_uniform(&rng, a.w.w_o.data, E * E, -lim, lim);
    attn_rng_uniform(&rng, a.w.b_o.data, E, -lim, lim);
    attn_sdpa_params_init(&a.p);
    a.p.causal = causal;

    const double D = (double)(E / H);
    double flops_att = 4.0 * (double)H * (double)T * (double)T * D / (causal ? 2 : 1);
    double flops_proj = 2.0 * (double)T * (double)E * 4.0 * (double)E;
    int status = 0;
    const char *impls[2] = {"default", "ref"};
    for (int x = 0; x < 2; x++) {
        if (x == 1 && strcmp(o->impl, "all") && strcmp(o->impl, "ref"))
            continue;
        if (x == 0 && !strcmp(o->impl, "ref"))
            continue;
        a.ctx.arch = x == 1 ? ATTN_ARCH_REF : ATTN_ARCH_AUTO;
        a.ctx.impl = x == 1 ? ATTN_IMPL_REF : ATTN_IMPL_AUTO;
        bench_timing t = bench_time_call(mha_call, &a, x == 1 && o->runs > 3 ? 3 : o->runs);
        if (t.status) {
            fprintf(stderr, "attn bench: mha failed: %s\n", a.ctx.message);
            status = 1;
            continue;
        }
        double gf = (flops_att + flops_proj) / t.median_s / 1e9;
        if (o->json) {
            const bench_fields f = {"mha", impls[x], 1, H, T, T, E / H,
                                    causal ? "causal" : "none", attn_threads_resolve(&a.ctx),
                                    t.median_s * 1e3, gf};
            bench_json_begin(o, &f);
            printf(",\"arch\":\"%s\",\"E\":%lld,\"runs\":%d,\"peak_frac\":%.4f,"
                   "\"peak_rss_mib\":%.1f",
                   attn_arch_name(attn_arch_selected(&a.ctx)), (long long)E, t.runs,
                   o->peakn > 0 ? gf / o->peakn : 0, bench_peak_rss_mib());
            bench_json_end();
        } else
            printf("mha    %-14s T=%lld E=%lld H=%lld %s: %.3f ms, %.2f GFLOP/s (%.1f%% of "
                   "peak), rss %.1f MiB\n",
                   impls[x], (long long)T, (long long)E, (long long)H,
                   causal ? "causal" : "no mask", t.median_s * 1e3, gf,
                   o->peakn > 0 ? 100 * gf / o->peakn : 0, bench_peak_rss_mib());
    }
    mha_arg_free(&a);
    return status;
}
