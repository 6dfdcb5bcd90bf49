/*
 * bench_common.c - what every benchmark of `attn bench` shares: timing, SPEC
 * section 5's shapes, the text header and the JSON line (see bench.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

const bench_shape bench_spec_shapes[BENCH_N_SPEC_SHAPES] = {
    /* name  B   H   Tq    Tk    D    causal  padding  Hkv  window  softcap */
    {"S1", 2, 4, 5, 5, 4, 0, 0, 0, 0, 0, 0, 0.0f},
    {"S2", 1, 12, 1024, 1024, 64, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0.0f},
    {"S3", 4, 12, 1024, 1024, 64, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0.0f},
    {"S4", 1, 16, 4096, 4096, 64, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0.0f},
    {"S5", 1, 32, 1, 4096, 128, 0, 0, 0, 0, 0, 0, 0.0f},
    {"S6", 8, 8, 512, 512, 64, 0, 1, 0, 0, 0, 0, 0.0f},
    /* S7: one grouped-query decode step against a cache (Llama-3-8B-like); S8: its
     * prefill. */
    {"S7", 1, 32, 1, 8192, 128, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 8, 0, 0, 0, 0.0f},
    {"S8", 1, 32, 2048, 2048, 128, ATTN_CAUSAL_TOP_LEFT, 0, 8, 0, 0, 0, 0.0f},
};

/* Wall-clock time, or with ATTN_BENCH_CLOCK=cpu the calling thread's CPU time: on a
 * machine shared with other jobs a 1-thread figure is then the time the work itself
 * took, not the time it waited for a core. It counts the calling thread only, so
 * it means something with --threads 1 alone (bench/compare_torch.py --cpu-time
 * enforces that). */
double bench_now_s(void)
{
    static int clock_id = -1;
    if (clock_id < 0) {
        const char *env = getenv("ATTN_BENCH_CLOCK");
        clock_id = env && strcmp(env, "cpu") == 0 ? 1 : 0;
    }
    struct timespec ts;
    clock_gettime(clock_id ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

bench_timing bench_time_call(bench_fn fn, void *arg, int runs)
{
    bench_timing t = {0, 0, runs, 0};
    double t0 = bench_now_s();
    if ((t.status = fn(arg)) != 0)
        return t;
    double once = bench_now_s() - t0;
    t0 = bench_now_s();
    if ((t.status = fn(arg)) != 0)
        return t;
    double again = bench_now_s() - t0;
    if (again < once)
        once = again;
    int reps = once > 1e-3 ? 1 : (int)(1e-3 / (once > 1e-7 ? once : 1e-7)) + 1;
    double *samples = malloc((size_t)runs * sizeof *samples);
    if (!samples) {
        t.status = -1; /* no room for the samples: report a failed measurement */
        return t;
    }
    for (int r = 0; r < runs; r++) {
        t0 = bench_now_s();
        for (int k = 0; k < reps; k++)
            if ((t.status = fn(arg)) != 0) {
                free(samples);
                return t;
            }
        samples[r] = (bench_now_s() - t0) / reps;
    }
    qsort(samples, (size_t)runs, sizeof *samples, cmp_double);
    t.median_s = runs % 2 ? samples[runs / 2]
                          : 0.5 * (samples[runs / 2 - 1] + samples[runs / 2]);
    t.min_s = samples[0];
    free(samples);
    return t;
}

void bench_fill_uniform(float *p, int64_t n, uint64_t seed)
{
    attn_rng rng;
    attn_rng_seed(&rng, seed);
    attn_rng_uniform(&rng, p, n, -1.0f, 1.0f);
}

double bench_sdpa_flops(const bench_shape *s)
{
    const double per_pair = 4.0 * (double)s->B * (double)s->H * (double)s->D;
    if (!s->has_window && (!s->causal || s->Tq == s->Tk)) {
        const double f = per_pair * (double)s->Tq * (double)s->Tk;
        return s->causal ? f / 2 : f;
    }
    /* Count the visible keys of each query row: query i sits at key position
     * i' = i + Tk - Tq (include/attn.h). */
    double pairs = 0;
    for (int64_t i = 0; i < s->Tq; i++) {
        const int64_t ip = i + s->Tk - s->Tq;
        int64_t lo = 0, hi = s->Tk - 1;
        if (s->causal == ATTN_CAUSAL_TOP_LEFT && i < hi)
            hi = i;
        if (s->causal == ATTN_CAUSAL_BOTTOM_RIGHT && ip < hi)
            hi = ip;
        if (s->has_window && s->window_left >= 0 && ip - s->window_left > lo)
            lo = ip - s->window_left;
        if (s->has_window && s->window_right >= 0 && ip + s->window_right < hi)
            hi = ip + s->window_right;
        if (hi >= lo)
            pairs += (double)(hi - lo + 1);
    }
    return per_pair * pairs;
}

const char *bench_mask_name(const bench_shape *s)
{
    /* A custom shape may take both --causal and --padding: the name says both. */
    if (s->causal == ATTN_CAUSAL_BOTTOM_RIGHT)
        return s->padding ? "causal_bottom_right_padding" : "causal_bottom_right";
    if (s->causal)
        return s->padding ? "causal_padding" : "causal";
    return s->padding ? "padding" : "none";
}

const char *bench_why(const attn_ctx *ctx, int rc)
{
    /* The library's calls leave a message; the benchmark's own allocations do not. */
    if (ctx->message[0])
        return ctx->message;
    return rc == ATTN_STATUS_NO_MEMORY ? "out of memory for the benchmark's tensors or caches"
                                       : attn_status_name(rc);
}

int64_t bench_kv_heads(const bench_shape *s)
{
    return s->Hkv > 0 ? s->Hkv : s->H;
}

void bench_print_header(const bench_opts *o)
{
    static int done = 0;
    if (o->json || done++)
        return;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o->threads;
    printf("# default path: %s (%s)\n", attn_arch_name(attn_arch_selected(&ctx)),
           attn_arch_reason(&ctx));
    printf("# cpu 16-bit features: %s\n", attn_cpu_features_string());
    printf("# threads: %d; FP32 FMA peak: %.1f GFLOP/s with 1 thread, %.1f with %d\n",
           attn_threads_resolve(&ctx), o->peak1, o->peakn, attn_threads_resolve(&ctx));
    printf("# attention %%peak: of the peak of the ISA each line runs on (avx2: 256-bit FMA "
           "chains; scalar, ref: portable C chains)\n");
    printf("%-6s %-18s %5s %4s %6s %6s %5s %-8s %3s %10s %9s %6s %8s\n", "shape", "impl", "B",
           "H", "Tq", "Tk", "D", "mask", "thr", "median_ms", "GFLOP/s", "%peak", "rss_MiB");
}

static void json_size(const char *key, int64_t v)
{
    if (v > 0)
        printf(",\"%s\":%lld", key, (long long)v);
    else
        printf(",\"%s\":null", key);
}

void bench_json_begin(const bench_opts *o, const bench_fields *f)
{
    printf("{\"kind\":\"%s\",\"impl\":\"%s\"", f->kind, f->impl);
    const int has_shape = f->B > 0;
    json_size("B", has_shape ? f->B : 0);
    json_size("H", has_shape ? f->H : 0);
    json_size("Tq", has_shape ? f->Tq : 0);
    json_size("Tk", has_shape ? f->Tk : 0);
    json_size("D", has_shape ? f->D : 0);
    if (f->mask)
        printf(",\"mask\":\"%s\"", f->mask);
    else
        printf(",\"mask\":null");
    printf(",\"threads\":%d", f->threads);
    if (f->median_ms >= 0)
        printf(",\"median_ms\":%.6f", f->median_ms);
    else
        printf(",\"median_ms\":null");
    if (f->gflops >= 0)
        printf(",\"gflops\":%.3f", f->gflops);
    else
        printf(",\"gflops\":null");
    printf(",\"default_arch\":\"%s\",\"reason\":\"%s\",\"peak_gflops_1t\":%.3f,"
           "\"peak_gflops\":%.3f",
           o->default_arch, o->reason_json, o->peak1, o->peakn);
}

void bench_json_end(void)
{
    printf("}\n");
    fflush(stdout);
}
