/*
 * bench_backward.c - `attn bench --backward`: the gradients of scaled dot-product
 * attention (attn_sdpa_backward) on SPEC section 5's training shapes S2, S3, S4
 * and S8, or one --shape of them, or a custom shape. For each path --impl names it
 * prints two measurements: the backward alone (kind sdpa_backward, the forward's
 * output and log-sum-exp computed once beforehand) and a training step's attention,
 * forward with log-sum-exp then backward (kind sdpa_fwd_bwd).
 *
 * FLOPs: the backward counts 2.5 times the forward's SPEC section 5 count
 * (FlashAttention-2's convention, SPEC section 5), forward + backward 3.5 times.
 * The peak resident memory is the whole process's so far, so S4's figure is the
 * process's when S4 runs alone (`attn bench --backward --shape S4`).
 */
#include "bench.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct bwd_arg {
    attn_ctx ctx;
    attn_tensor q, k, v, out, lse, dout, dq, dk, dv, mask;
    attn_sdpa_params p;
    attn_sdpa_grads g;
    int use_ref;
} bwd_arg;

static int bwd_forward(bwd_arg *a)
{
    a->p.lse = &a->lse;
    const int rc = a->use_ref ? attn_sdpa_ref(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, NULL)
                              : attn_sdpa(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, NULL);
    a->p.lse = NULL; /* the backward takes the log-sum-exp as its own argument */
    return rc;
}

static int bwd_backward(bwd_arg *a)
{
    if (a->use_ref)
        return attn_sdpa_backward_ref(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, &a->lse,
                                      &a->dout, &a->g);
    return attn_sdpa_backward(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, &a->lse, &a->dout,
                              &a->g);
}

static int bwd_call(void *p) { return bwd_backward(p); }

static int fwd_bwd_call(void *p)
{
    int rc = bwd_forward(p);
    return rc ? rc : bwd_backward(p);
}

static void bwd_arg_free(bwd_arg *a)
{
    attn_tensor *t[] = {&a->q,    &a->k,  &a->v,  &a->out, &a->lse,
                        &a->dout, &a->dq, &a->dk, &a->dv,  &a->mask};
    for (size_t x = 0; x < sizeof t / sizeof t[0]; x++)
        attn_tensor_free(&a->ctx, t[x]);
}

/* Prints one measurement's line (JSON or the table's row). */
static void bwd_report(const bench_shape *s, const bench_opts *o, bwd_arg *a, const char *kind,
                       const char *impl, double flops, bench_timing t)
{
    const int threads = attn_threads_resolve(&a->ctx);
    const double gf = flops / t.median_s / 1e9;
    const double frac = o->peakn > 0 ? gf / o->peakn : 0;
    const bench_fields f = {kind, impl, s->B, s->H, s->Tq, s->Tk, s->D, bench_mask_name(s),
                            threads, t.median_s * 1e3, gf};
    if (o->json) {
        bench_json_begin(o, &f);
        printf(",\"shape\":\"%s\",\"runs\":%d,\"min_ms\":%.6f,\"peak_frac\":%.4f,"
               "\"peak_rss_mib\":%.1f,\"kv_heads\":%lld,\"flop_factor\":%.1f",
               s->name, t.runs, t.min_s * 1e3, frac, bench_peak_rss_mib(),
               (long long)bench_kv_heads(s), flops / bench_sdpa_flops(s));
        bench_json_end();
    } else {
        /* The table's columns, then which of the two measurements this is. */
        printf("%-6s %-18s %5lld %4lld %6lld %6lld %5lld %-8s %3d %10.4f %9.2f %5.1f%% %8.1f %s\n",
               s->name, impl, (long long)s->B, (long long)s->H, (long long)s->Tq,
               (long long)s->Tk, (long long)s->D, bench_mask_name(s), threads, t.median_s * 1e3,
               gf, 100 * frac, bench_peak_rss_mib(),
               strcmp(kind, "sdpa_backward") ? "forward+backward" : "backward");
    }
    fflush(stdout);
}

/* The backward, then forward + backward, on one path. */
static int bwd_impl(const bench_shape *s, const bench_opts *o, bwd_arg *a, const char *impl,
                    int use_ref, attn_impl ki, attn_arch arch, int runs)
{
    a->use_ref = use_ref;
    a->ctx.impl = ki;
    a->ctx.arch = arch;
    if (bwd_forward(a)) {
        fprintf(stderr, "attn bench: the forward on %s failed: %s\n", s->name, a->ctx.message);
        return 1;
    }
    bench_timing t = bench_time_call(bwd_call, a, runs);
    if (t.status == 0) {
        bwd_report(s, o, a, "sdpa_backward", impl, 2.5 * bench_sdpa_flops(s), t);
        t = bench_time_call(fwd_bwd_call, a, runs);
    }
    if (t.status != 0) {
        fprintf(stderr, "attn bench: %s backward on %s failed: %s\n", impl, s->name,
                a->ctx.message);
        return 1;
    }
    bwd_report(s, o, a, "sdpa_fwd_bwd", impl, 3.5 * bench_sdpa_flops(s), t);
    return 0;
}

int bench_backward(const bench_shape *s, const bench_opts *o)
{
    bwd_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
    const int64_t B = s->B, H = s->H, Hkv = bench_kv_heads(s), Tq = s->Tq, Tk = s->Tk, D = s->D;
    const int64_t qs[4] = {B, H, Tq, D}, ks[4] = {B, Hkv, Tk, D}, ls[3] = {B, H, Tq};
    const int64_t ms[4] = {B, 1, 1, Tk};
    int rc;
    if ((rc = attn_tensor_alloc(&a.ctx, &a.q, ATTN_DTYPE_F32, 4, qs)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.k, ATTN_DTYPE_F32, 4, ks)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.v, ATTN_DTYPE_F32, 4, ks)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.out, ATTN_DTYPE_F32, 4, qs)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.lse, ATTN_DTYPE_F32, 3, ls)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.dout, ATTN_DTYPE_F32, 4, qs)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.dq, ATTN_DTYPE_F32, 4, qs)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.dk, ATTN_DTYPE_F32, 4, ks)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.dv, ATTN_DTYPE_F32, 4, ks)) ||
        (s->padding && (rc = attn_tensor_alloc(&a.ctx, &a.mask, ATTN_DTYPE_BOOL, 4, ms)))) {
        fprintf(stderr, "attn bench: %s\n", a.ctx.message);
        bwd_arg_free(&a);
        return 1;
    }
    bench_fill_uniform(a.q.data, B * H * Tq * D, 1);
    bench_fill_uniform(a.k.data, B * Hkv * Tk * D, 2);
    bench_fill_uniform(a.v.data, B * Hkv * Tk * D, 3);
    bench_fill_uniform(a.dout.data, B * H * Tq * D, 4);
    /* S6's padding mask as bench_sdpa applies it; without it the backward ran
     * unmasked under a mask's name. */
    bench_sdpa_params(s, B, Tk, &a.mask, &a.p);
    a.g.dq = &a.dq;
    a.g.dk = &a.dk;
    a.g.dv = &a.dv;
    const char *impl = o->impl;
    const int want_all = !strcmp(impl, "all");
    int status = 0;
    if (!strcmp(impl, "default") || want_all) {
        char name[32];
        snprintf(name, sizeof name, "default:%s", attn_arch_name(attn_arch_selected(&a.ctx)));
        status |= bwd_impl(s, o, &a, name, 0, ATTN_IMPL_AUTO, ATTN_ARCH_AUTO, o->runs);
    }
    if (!strcmp(impl, "ref") || want_all) {
        /* The reference keeps two [Tq, Tk] blocks per head; a call takes seconds. */
        const int runs = o->runs > 3 ? 3 : o->runs;
        status |= bwd_impl(s, o, &a, "ref", 1, ATTN_IMPL_REF, ATTN_ARCH_AUTO, runs);
    }
    if (!strcmp(impl, "fused"))
        status |= bwd_impl(s, o, &a, "fused", 0, ATTN_IMPL_FUSED, ATTN_ARCH_AUTO, o->runs);
    static const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int x = 0; x < 3; x++) {
        const char *n = attn_arch_name(archs[x]);
        if (!(want_all || !strcmp(impl, n)) || !attn_arch_supported(archs[x]))
            continue;
        char name[32];
        snprintf(name, sizeof name, "fused:%s", n);
        status |= bwd_impl(s, o, &a, name, 0, ATTN_IMPL_FUSED, archs[x], o->runs);
    }
    bwd_arg_free(&a);
    return status;
}
