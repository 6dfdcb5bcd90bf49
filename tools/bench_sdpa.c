/*
 * bench_sdpa.c - `attn bench`'s main benchmark: scaled dot-product attention on one
 * shape (SPEC section 5's S1-S8 or a custom one, with grouped-query heads, causal
 * alignment, a window or a softcap), on the path or paths --impl names. With
 * --bandwidth it also says how close the decode steps S5 and S7 come to streaming
 * their K and V; then each call reads the next of several copies of K and V, so
 * that, like the bandwidth probe, it reads them from memory and not from the
 * last-level cache (bench_cold_copies in bench_probes.h).
 */
#include "bench.h"
#include "bench_probes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sdpa_arg {
    attn_ctx ctx;
    attn_tensor q, k, v, out, mask;
    attn_sdpa_params p;
    int use_ref;
    /* --bandwidth: K and V rotate through `copies` copies, copy 0 the tensors'
     * own data (k0, v0) and the others in kc and vc, [copies - 1][kv_floats]. */
    int copies, next;
    int64_t kv_floats;
    float *kc, *vc;
    void *k0, *v0;
} sdpa_arg;

static int sdpa_call(void *p)
{
    sdpa_arg *a = p;
    if (a->copies > 1) {
        const int c = a->next++ % a->copies;
        a->k.data = c ? a->kc + (c - 1) * a->kv_floats : a->k0;
        a->v.data = c ? a->vc + (c - 1) * a->kv_floats : a->v0;
    }
    if (a->use_ref)
        return attn_sdpa_ref(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, NULL);
    return attn_sdpa(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, NULL);
}

/* Frees what bench_sdpa allocated; tensors never allocated are all zero, which
 * attn_tensor_free accepts. */
static void sdpa_arg_free(sdpa_arg *a)
{
    if (a->copies > 1)
        a->k.data = a->k0, a->v.data = a->v0;
    free(a->kc);
    free(a->vc);
    attn_tensor_free(&a->ctx, &a->q);
    attn_tensor_free(&a->ctx, &a->k);
    attn_tensor_free(&a->ctx, &a->v);
    attn_tensor_free(&a->ctx, &a->out);
    attn_tensor_free(&a->ctx, &a->mask);
    attn_ctx_release(&a->ctx); /* the kept workspace */
}

/* Times one shape on one implementation; prints one line. */
static int bench_sdpa_impl(const bench_shape *s, const bench_opts *o, sdpa_arg *a, const char *impl,
                           int use_ref, attn_impl ki, attn_arch arch, int runs)
{
    a->use_ref = use_ref;
    a->ctx.impl = ki;
    a->ctx.arch = arch;
    bench_timing t = bench_time_call(sdpa_call, a, runs);
    if (t.status != 0) {
        fprintf(stderr, "attn bench: %s on %s failed: %s\n", impl, s->name, a->ctx.message);
        return 1;
    }
    const int threads = attn_threads_resolve(&a->ctx);
    const double gf = bench_sdpa_flops(s) / t.median_s / 1e9;
    /* %peak is of the peak of the instruction set the path runs on: an AVX2 core
     * (or the AVX2 build on an AVX-512 one) is judged by 256-bit FMAs. */
    const attn_arch ran = arch == ATTN_ARCH_AUTO ? attn_arch_selected(&a->ctx) : arch;
    const char *peak_isa = bench_peak_isa_of(use_ref ? ATTN_ARCH_REF : ran);
    const double peak = bench_peak_for(o, peak_isa, threads);
    const double frac = peak > 0 ? gf / peak : 0;
    /* Bytes of K and V read once: what bounds a decoding step such as S5 or S7
     * (with grouped-query heads, K and V have Hkv heads, each read once). */
    const double kv_gbs = 2.0 * (double)(s->B * bench_kv_heads(s) * s->Tk * s->D) *
                          (double)attn_dtype_size(o->dtype) / t.median_s / 1e9;
    const bench_fields f = {"sdpa", impl, s->B, s->H, s->Tq, s->Tk, s->D, bench_mask_name(s),
                            threads, t.median_s * 1e3, gf};
    bench_pair pr;
    int prc = 0;
    if (o->stream_gbs > 0 &&
        (prc = bench_paired_fraction(o, sdpa_call, a, kv_gbs * t.median_s * 1e9, runs, &pr)) != 0) {
        fprintf(stderr, "attn bench: %s on %s failed: %s\n", impl, s->name, bench_why(&a->ctx, prc));
        return 1;
    }
    if (o->stream_gbs > 0 && o->json) {
        bench_fields kv = f;
        kv.kind = "kv_stream";
        bench_json_begin(o, &kv);
        printf(",\"shape\":\"%s\",\"kv_gbs\":%.3f,\"stream_gbs\":%.3f,\"fraction\":%.4f,"
               "\"fraction_min\":%.4f,\"fraction_max\":%.4f,\"pairs\":%d,\"cold_copies\":%d",
               s->name, pr.kv_gbs, pr.stream_gbs, pr.fraction, pr.fraction_min,
               pr.fraction_max, pr.runs, a->copies);
        bench_json_end();
    } else if (o->stream_gbs > 0) {
        printf("# %s on %s reads K and V (rotating through %d copies) at %.1f GB/s while the "
               "stream reads %.1f GB/s: %.0f%% of the streaming bandwidth (median of %d "
               "interleaved pairs; %.0f-%.0f%%)\n",
               impl, s->name, a->copies, pr.kv_gbs, pr.stream_gbs, 100 * pr.fraction, pr.runs,
               100 * pr.fraction_min, 100 * pr.fraction_max);
    }
    if (o->json) {
        bench_json_begin(o, &f);
        printf(",\"shape\":\"%s\",\"runs\":%d,\"min_ms\":%.6f,\"peak_frac\":%.4f,"
               "\"peak_rss_mib\":%.1f,\"kv_heads\":%lld",
               s->name, t.runs, t.min_s * 1e3, frac, bench_peak_rss_mib(),
               (long long)bench_kv_heads(s));
        if (s->has_window)
            printf(",\"window\":[%lld,%lld]", (long long)s->window_left,
                   (long long)s->window_right);
        else
            printf(",\"window\":null");
        if (s->softcap > 0)
            printf(",\"softcap\":%.9g", (double)s->softcap);
        else
            printf(",\"softcap\":null");
        printf(",\"dtype\":\"%s\",\"peak_isa\":\"%s\",\"isa_peak_gflops\":%.3f",
               attn_dtype_name(o->dtype), peak_isa, peak);
        bench_json_end();
    } else {
        /* The options, when any, after the table's columns. */
        char extra[96] = "";
        size_t n = 0;
        if (bench_kv_heads(s) != s->H)
            n += (size_t)snprintf(extra + n, sizeof extra - n, " kv_heads=%lld",
                                  (long long)bench_kv_heads(s));
        if (s->has_window)
            n += (size_t)snprintf(extra + n, sizeof extra - n, " window=%lld,%lld",
                                  (long long)s->window_left, (long long)s->window_right);
        if (s->softcap > 0)
            n += (size_t)snprintf(extra + n, sizeof extra - n, " softcap=%g", (double)s->softcap);
        if (o->dtype != ATTN_DTYPE_F32)
            snprintf(extra + n, sizeof extra - n, " dtype=%s", attn_dtype_name(o->dtype));
        printf("%-6s %-18s %5lld %4lld %6lld %6lld %5lld %-8s %3d %10.4f %9.2f %5.1f%% %8.1f%s\n",
               s->name, impl, (long long)s->B, (long long)s->H, (long long)s->Tq,
               (long long)s->Tk, (long long)s->D, bench_mask_name(s), threads, t.median_s * 1e3, gf,
               100 * frac, bench_peak_rss_mib(), extra);
    }
    fflush(stdout);
    return 0;
}

int bench_sdpa(const bench_shape *s, const bench_opts *o)
{
    sdpa_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
    /* The scratch is kept from call to call, as a model's loop keeps it (and as
     * PyTorch's caching allocator does): a fresh one per call would time its page
     * faults, several milliseconds for the 16-bit paths' copies on S4. */
    a.ctx.keep_workspace = 1;
    const int64_t B = s->B, H = s->H, Hkv = bench_kv_heads(s), Tq = s->Tq, Tk = s->Tk, D = s->D;
    const int64_t qs[4] = {B, H, Tq, D}, ks[4] = {B, Hkv, Tk, D}, ms[4] = {B, 1, 1, Tk};
    int rc;
    if ((rc = attn_tensor_alloc(&a.ctx, &a.q, ATTN_DTYPE_F32, 4, qs)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.k, ATTN_DTYPE_F32, 4, ks)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.v, ATTN_DTYPE_F32, 4, ks)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.out, o->dtype, 4, qs)) ||
        (s->padding && (rc = attn_tensor_alloc(&a.ctx, &a.mask, ATTN_DTYPE_BOOL, 4, ms)))) {
        fprintf(stderr, "attn bench: %s\n", a.ctx.message);
        sdpa_arg_free(&a);
        return 1;
    }
    bench_fill_uniform(a.q.data, B * H * Tq * D, 1);
    bench_fill_uniform(a.k.data, B * Hkv * Tk * D, 2);
    bench_fill_uniform(a.v.data, B * Hkv * Tk * D, 3);
    /* --dtype bf16|f16: the same values rounded to 16 bits, stored as such. */
    attn_tensor *f32s[3] = {&a.q, &a.k, &a.v};
    for (int i = 0; i < 3 && o->dtype != ATTN_DTYPE_F32; i++) {
        attn_tensor h;
        if ((rc = attn_tensor_alloc(&a.ctx, &h, o->dtype, 4, f32s[i]->shape)) ||
            (rc = attn_tensor_convert(&a.ctx, f32s[i], &h))) {
            fprintf(stderr, "attn bench: %s\n", a.ctx.message);
            attn_tensor_free(&a.ctx, &h);
            sdpa_arg_free(&a);
            return 1;
        }
        attn_tensor_free(&a.ctx, f32s[i]);
        *f32s[i] = h;
    }
    if (o->stream_gbs > 0) {
        /* In float units: a 16-bit K holds n / 2 floats' bytes (D is even on every
         * shape), which is what the copies and the rotation move. */
        const int64_t n = B * Hkv * Tk * D * (int64_t)attn_dtype_size(o->dtype) / 4;
        a.copies = bench_cold_copies(2.0 * (double)n * sizeof(float));
        a.kv_floats = n;
        a.k0 = a.k.data, a.v0 = a.v.data;
        a.kc = malloc((size_t)(n * (a.copies - 1)) * sizeof(float));
        a.vc = malloc((size_t)(n * (a.copies - 1)) * sizeof(float));
        if (!a.kc || !a.vc) {
            fprintf(stderr, "attn bench: out of memory for %d copies of %s's K and V\n",
                    a.copies, s->name);
            sdpa_arg_free(&a);
            return 1;
        }
        for (int c = 0; c < a.copies - 1; c++) {
            memcpy(a.kc + c * n, a.k0, (size_t)n * sizeof(float));
            memcpy(a.vc + c * n, a.v0, (size_t)n * sizeof(float));
        }
    }
    bench_sdpa_params(s, B, Tk, &a.mask, &a.p);
    const char *impl = o->impl;
    int status = 0;
    const int want_all = !strcmp(impl, "all");
    if (!strcmp(impl, "default") || want_all) {
        char name[32];
        snprintf(name, sizeof name, "default:%s", attn_arch_name(attn_arch_selected(&a.ctx)));
        status |= bench_sdpa_impl(s, o, &a, name, 0, ATTN_IMPL_AUTO, ATTN_ARCH_AUTO, o->runs);
    }
    if (!strcmp(impl, "ref") || want_all) {
        /* The reference materialises [Tq, Tk]; on large shapes a call takes seconds. */
        int runs = bench_sdpa_flops(s) > 2e9 && o->runs > 3 ? 3 : o->runs;
        status |= bench_sdpa_impl(s, o, &a, "ref", 1, ATTN_IMPL_REF, ATTN_ARCH_AUTO, runs);
    }
    if (!strcmp(impl, "fused"))
        status |= bench_sdpa_impl(s, o, &a, "fused", 0, ATTN_IMPL_FUSED, ATTN_ARCH_AUTO, o->runs);
    /* avx512bf16 and amx differ from avx512 in bfloat16 only, so "all" times them
     * there alone. */
    static const attn_arch archs[5] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512,
                                       ATTN_ARCH_AVX512_BF16, ATTN_ARCH_AMX};
    for (int x = 0; x < 5; x++) {
        const char *n = attn_arch_name(archs[x]);
        const int own_bf16 = archs[x] == ATTN_ARCH_AVX512_BF16 || archs[x] == ATTN_ARCH_AMX;
        if (!(!strcmp(impl, n) || (want_all && (!own_bf16 || o->dtype == ATTN_DTYPE_BF16))) ||
            !attn_arch_supported(archs[x]))
            continue;
        char name[32];
        snprintf(name, sizeof name, "fused:%s", n);
        status |= bench_sdpa_impl(s, o, &a, name, 0, ATTN_IMPL_FUSED, archs[x], o->runs);
    }
    sdpa_arg_free(&a);
    return status;
}

void bench_sdpa_params(const bench_shape *s, int64_t B, int64_t Tk, attn_tensor *mask,
                       attn_sdpa_params *p)
{
    attn_sdpa_params_init(p);
    p->causal = s->causal;
    p->has_window = s->has_window;
    p->window_left = s->window_left;
    p->window_right = s->window_right;
    p->softcap = s->softcap;
    if (s->padding) {
        uint8_t *m = mask->data;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Tk; j++)
                m[b * Tk + j] = !(b >= B / 2 && j >= Tk - Tk / 4);
        p->mask = mask;
    }
}
