/*
 * bench_probes.c - the two probes of `attn bench`: the FP32 FMA peak and the
 * streaming read bandwidth (see bench_probes.h). They measure the machine, not the
 * library: their figures are the ceilings the attention benchmarks are read against.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_probes.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------
 * FMA peak: independent chains of vector FMAs per thread (16 with AVX-512, 12 with
 * AVX2, 64 multiply-adds in portable C; see each). The chains live in
 * plain C arrays that GCC and Clang keep in registers; the loop is compiled for the
 * best ISA by the target attribute and checked at run time with the dispatcher.
 * ---------------------------------------------------------------------------- */

typedef struct peak_arg {
    int64_t iters;
    double flops;
    double seconds;       /* this thread's own time for its chains */
    atomic_int *ready;    /* threads that have started */
    const atomic_int *go; /* set once every thread has started */
    int threads;
    const char *isa; /* the chains to run: "avx512", "avx2" or "scalar" */
    float sink;
} peak_arg;

/* The chains' arrays must stay in registers to measure the FMAs: AddressSanitizer
 * would give them redzones in memory and time loads and stores instead (12 s a
 * probe in the sanitizer build, 1.7 s without), so the probes are not instrumented. */
#if defined(__has_attribute)
#if __has_attribute(no_sanitize)
#define PEAK_NO_ASAN __attribute__((no_sanitize("address", "undefined")))
#endif
#endif
#ifndef PEAK_NO_ASAN
#define PEAK_NO_ASAN
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
PEAK_NO_ASAN __attribute__((target("avx512f"))) static void peak_avx512(peak_arg *a)
{
    __m512 acc[16];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < 16; c++)
        acc[c] = _mm512_set1_ps((float)c);
    for (int64_t i = 0; i < a->iters; i++)
        for (int c = 0; c < 16; c++)
            acc[c] = _mm512_fmadd_ps(acc[c], x, y);
    __m512 s = acc[0];
    for (int c = 1; c < 16; c++)
        s = _mm512_add_ps(s, acc[c]);
    a->sink = _mm512_reduce_add_ps(s);
    a->flops = (double)a->iters * 16 * 16 * 2;
}
/* 12 chains, not 16: AVX2 has 16 ymm registers, and 16 accumulators with the two
 * constants spilled three of them to the stack, whose store-to-load round trip
 * then bounded the loop (78 GFLOP/s on one Xeon core that runs 12 chains at 93).
 * Twelve still cover the FMA latency (4 cycles) on two FMA pipes. */
PEAK_NO_ASAN __attribute__((target("avx2,fma"))) static void peak_avx2(peak_arg *a)
{
    __m256 acc[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < 12; c++)
        acc[c] = _mm256_set1_ps((float)c);
    for (int64_t i = 0; i < a->iters; i++)
        for (int c = 0; c < 12; c++)
            acc[c] = _mm256_fmadd_ps(acc[c], x, y);
    __m256 s = acc[0];
    for (int c = 1; c < 12; c++)
        s = _mm256_add_ps(s, acc[c]);
    float out[8];
    _mm256_storeu_ps(out, s);
    a->sink = out[0];
    a->flops = (double)a->iters * 12 * 8 * 2;
}
#define BENCH_HAVE_X86_PEAK 1
#endif

/* The portable chains: 64 of them, so that a compiler that vectorizes the loop for
 * the baseline instruction set (SSE2 on x86-64: separate 4-wide multiplies and
 * adds, no FMA) still has enough independent vector chains to fill its pipes, as
 * the portable kernel, compiled the same way, could at best. */
PEAK_NO_ASAN static void peak_scalar(peak_arg *a)
{
    float acc[64];
    for (int c = 0; c < 64; c++)
        acc[c] = (float)c;
    for (int64_t i = 0; i < a->iters / 4; i++)
        for (int c = 0; c < 64; c++)
            acc[c] = acc[c] * 0.999999f + 1e-7f;
    float s = 0;
    for (int c = 0; c < 64; c++)
        s += acc[c];
    a->sink = s;
    a->flops = (double)(a->iters / 4) * 64 * 2;
}

const char *bench_probe_peak_isa(void)
{
#ifdef BENCH_HAVE_X86_PEAK
    if (attn_arch_supported(ATTN_ARCH_AVX512))
        return "avx512";
    if (attn_arch_supported(ATTN_ARCH_AVX2))
        return "avx2";
#endif
    return "scalar";
}

const char *bench_peak_isa_of(attn_arch arch)
{
    switch (arch) {
    case ATTN_ARCH_REF:
    case ATTN_ARCH_SCALAR:
        return "scalar";
    case ATTN_ARCH_AVX2:
        return attn_arch_supported(ATTN_ARCH_AVX2) ? "avx2" : bench_probe_peak_isa();
    default:
        return bench_probe_peak_isa();
    }
}

static void *peak_thread(void *p)
{
    peak_arg *a = p;
    /* Start together: a thread that is still being created would otherwise let
     * the first one run alone, and the figure would be one core's. */
    atomic_fetch_add(a->ready, 1);
    while (!atomic_load(a->go))
        ;
    double t0 = bench_now_s();
#ifdef BENCH_HAVE_X86_PEAK
    if (!strcmp(a->isa, "avx512"))
        peak_avx512(a);
    else if (!strcmp(a->isa, "avx2"))
        peak_avx2(a);
    else
#endif
        peak_scalar(a);
    a->seconds = bench_now_s() - t0;
    return NULL;
}

/* GFLOP/s of `threads` threads running the FMA chains at once (best of 5). Each
 * thread runs about 20 ms of chains once all have started; the rate is the total
 * work over the slowest thread's time. */
double bench_probe_peak(int threads) { return bench_probe_peak_on(bench_probe_peak_isa(), threads); }

double bench_probe_peak_on(const char *isa, int threads)
{
    double best = 0;
    pthread_t tid[256];
    peak_arg args[256];
    if (threads > 256)
        threads = 256;
    for (int rep = 0; rep < 5; rep++) {
        atomic_int ready = 0, go = 0;
        for (int t = 0; t < threads; t++) {
            args[t] = (peak_arg){.iters = 10000000, .ready = &ready, .go = &go, .threads = threads,
                               .isa = isa};
            if (t > 0 && pthread_create(&tid[t], NULL, peak_thread, &args[t]) != 0) {
                threads = t; /* measure with the threads we could start */
                break;
            }
        }
        while (atomic_load(&ready) < threads - 1) /* the others have started */
            ;
        atomic_store(&go, 1);
        peak_thread(&args[0]);
        double slowest = 0, flops = 0;
        for (int t = 0; t < threads; t++) {
            if (t > 0)
                pthread_join(tid[t], NULL);
            flops += args[t].flops;
            if (args[t].seconds > slowest)
                slowest = args[t].seconds;
        }
        if (slowest > 0 && flops / slowest > best)
            best = flops / slowest;
    }
    return best / 1e9;
}

double bench_peak_for(const bench_opts *o, const char *isa, int threads)
{
    /* The run's own peak when it is the same probe; others measured once each. */
    static struct {
        const char *isa;
        int threads;
        double gflops;
    } seen[8];
    static int n_seen = 0;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o->threads;
    if (!strcmp(isa, bench_probe_peak_isa()) && threads == attn_threads_resolve(&ctx))
        return o->peakn;
    if (!strcmp(isa, bench_probe_peak_isa()) && threads == 1)
        return o->peak1;
    for (int i = 0; i < n_seen; i++)
        if (!strcmp(seen[i].isa, isa) && seen[i].threads == threads)
            return seen[i].gflops;
    const double g = bench_probe_peak_on(isa, threads);
    if (n_seen < 8)
        seen[n_seen].isa = isa, seen[n_seen].threads = threads, seen[n_seen++].gflops = g;
    return g;
}

/* ------------------------------------------------------------------------------
 * Streaming bandwidth: read S5's K and V (2 x 64 MiB) once, split over threads,
 * each thread its slice of K then its slice of V (XOR of the words, so nothing
 * is computed that could bound the loop but the reads themselves).
 *
 * 128 MiB is smaller than the last-level cache of some machines (a Xeon of the
 * Sapphire/Emerald Rapids kind reports 260 MiB to its guests), and a read of data
 * the LLC still holds measures the cache, not memory. So every call reads the next
 * of bench_cold_copies() copies, round robin: between two reads of one copy, the
 * others - at least twice the LLC - pass through the cache, and the copy a call
 * reads comes from memory. The decode benchmarks that are judged against this
 * figure rotate their K and V the same way (bench_sdpa.c, bench_decode.c).
 * ---------------------------------------------------------------------------- */

int64_t bench_llc_bytes(void)
{
#ifdef _SC_LEVEL3_CACHE_SIZE
    const long n = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (n > 0)
        return n;
#endif
    /* sysfs says "266240K"; a machine without a level-3 cache has no such file. */
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    long long v = 0;
    char unit = 0;
    if (f) {
        if (fscanf(f, "%lld%c", &v, &unit) < 1)
            v = 0;
        fclose(f);
    }
    return unit == 'K' ? v * 1024 : unit == 'M' ? v * 1048576 : v;
}

int bench_cold_copies(double bytes)
{
    /* Without a figure for the LLC, assume a large one rather than a small one. */
    const int64_t llc = bench_llc_bytes();
    const double other = 2.0 * (double)(llc > 0 ? llc : 256 * 1048576LL);
    const double n = bytes > 0 ? 1.0 + ceil(other / bytes) : 2.0;
    return n > 64 ? 64 : (int)n;
}

typedef struct stream_arg {
    const uint64_t *p;
    int64_t n;
    uint64_t sink;
} stream_arg;

#ifdef BENCH_HAVE_X86_PEAK
/* 64 bytes a load, four independent accumulators: as many reads in flight as the
 * attention kernel's own streaming loop has. */
__attribute__((target("avx512f"))) static uint64_t stream_avx512(const uint64_t *p, int64_t n)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_xor_si512(a0, _mm512_loadu_si512((const void *)(p + i)));
        a1 = _mm512_xor_si512(a1, _mm512_loadu_si512((const void *)(p + i + 8)));
        a2 = _mm512_xor_si512(a2, _mm512_loadu_si512((const void *)(p + i + 16)));
        a3 = _mm512_xor_si512(a3, _mm512_loadu_si512((const void *)(p + i + 24)));
    }
    uint64_t out[8], acc = 0;
    _mm512_storeu_si512((void *)out,
                        _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)));
    for (int k = 0; k < 8; k++)
        acc ^= out[k];
    for (; i < n; i++)
        acc ^= p[i];
    return acc;
}
#endif

static void *stream_thread(void *p)
{
    stream_arg *a = p;
#ifdef BENCH_HAVE_X86_PEAK
    if (attn_arch_supported(ATTN_ARCH_AVX512)) {
        a->sink = stream_avx512(a->p, a->n);
        return NULL;
    }
#endif
    uint64_t acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
    int64_t i = 0;
    for (; i + 4 <= a->n; i += 4) {
        acc0 ^= a->p[i];
        acc1 ^= a->p[i + 1];
        acc2 ^= a->p[i + 2];
        acc3 ^= a->p[i + 3];
    }
    for (; i < a->n; i++)
        acc0 ^= a->p[i];
    a->sink = acc0 ^ acc1 ^ acc2 ^ acc3;
    return NULL;
}

/* A thread's slice of K, then its slice of V (p points at two stream_args). */
static void *stream_pair(void *p)
{
    stream_arg *a = p;
    stream_thread(&a[0]);
    stream_thread(&a[1]);
    return NULL;
}

typedef struct bw_arg {
    const uint64_t *k, *v; /* [copies][words] each */
    int64_t words;
    int threads, copies, next;
} bw_arg;

static int bw_call(void *p)
{
    bw_arg *a = p;
    const int64_t off = (int64_t)(a->next++ % a->copies) * a->words;
    pthread_t tid[64];
    stream_arg sa[128];
    int n = a->threads > 64 ? 64 : a->threads < 1 ? 1 : a->threads;
    for (int t = 0; t < n; t++) {
        int64_t lo = a->words * t / n, hi = a->words * (t + 1) / n;
        sa[2 * t] = (stream_arg){a->k + off + lo, hi - lo, 0};
        sa[2 * t + 1] = (stream_arg){a->v + off + lo, hi - lo, 0};
    }
    /* A thread that cannot be started leaves its slices to this one, so every
     * byte is still read once. */
    int started = 1;
    for (int t = 1; t < n; t++)
        if (pthread_create(&tid[t], NULL, stream_pair, &sa[2 * t]) == 0)
            started = t + 1;
        else
            break;
    for (int t = 0; t < n; t++)
        if (t == 0 || t >= started)
            stream_pair(&sa[2 * t]);
    for (int t = 1; t < started; t++)
        pthread_join(tid[t], NULL);
    return 0;
}

/* The probe's copies, kept after bench_bandwidth for bench_paired_fraction. */
typedef struct bench_stream {
    float *k, *v;
    bw_arg a;
    double bytes;
} bench_stream;

int bench_bandwidth(bench_opts *o)
{
    const bench_shape *s5 = &bench_spec_shapes[4];
    const int64_t n = s5->B * s5->H * s5->Tk * s5->D; /* floats in K, and in V */
    const double bytes = 2.0 * (double)n * sizeof(float);
    const int copies = bench_cold_copies(bytes);
    bench_stream *st = calloc(1, sizeof *st);
    float *k = malloc((size_t)(n * copies) * sizeof(float));
    float *v = malloc((size_t)(n * copies) * sizeof(float));
    if (!st || !k || !v) {
        fprintf(stderr, "attn bench: out of memory for the bandwidth test (%d copies of %.0f MiB)\n",
                copies, bytes / 1048576.0);
        free(st);
        free(k);
        free(v);
        return 1;
    }
    bench_fill_uniform(k, n, 31);
    bench_fill_uniform(v, n, 32);
    for (int c = 1; c < copies; c++) {
        memcpy(k + c * n, k, (size_t)n * sizeof(float));
        memcpy(v + c * n, v, (size_t)n * sizeof(float));
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o->threads;
    bw_arg a = {(const uint64_t *)k, (const uint64_t *)v, n / 2, attn_threads_resolve(&ctx),
                copies, 0};
    bench_timing t = bench_time_call(bw_call, &a, o->runs);
    const double gbs = bytes / t.median_s / 1e9;
    if (o->json) {
        /* Memory traffic, not arithmetic: no attention shape, mask or GFLOP/s. */
        const bench_fields f = {"bandwidth", "stream", 0, 0, 0, 0, 0, NULL, a.threads,
                                t.median_s * 1e3, -1};
        bench_json_begin(o, &f);
        printf(",\"what\":\"stream S5 K and V\",\"bytes\":%.0f,\"runs\":%d,\"gbs\":%.3f,"
               "\"cold_copies\":%d,\"llc_bytes\":%lld",
               bytes, t.runs, gbs, copies, (long long)bench_llc_bytes());
        bench_json_end();
    } else
        printf("stream S5's K and V (%.0f MiB, rotating through %d copies, LLC %.0f MiB) with "
               "%d threads: %.3f ms, %.1f GB/s\n",
               bytes / 1048576.0, copies, (double)bench_llc_bytes() / 1048576.0, a.threads,
               t.median_s * 1e3, gbs);
    o->stream_gbs = gbs;
    st->k = k, st->v = v, st->a = a, st->bytes = bytes;
    o->stream = st;
    return 0;
}

void bench_stream_free(bench_opts *o)
{
    bench_stream *st = o->stream;
    if (st) {
        free(st->k);
        free(st->v);
        free(st);
    }
    o->stream = NULL;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

int bench_paired_fraction(const bench_opts *o, bench_fn fn, void *arg, double bytes, int runs,
                          bench_pair *out)
{
    bench_stream *st = o->stream;
    memset(out, 0, sizeof *out);
    if (!st)
        return 0;
    runs = runs < 5 ? 5 : runs;
    double *x = malloc(3 * (size_t)runs * sizeof *x);
    if (!x)
        return ATTN_STATUS_NO_MEMORY;
    double *frac = x, *gbs = x + runs, *sgbs = x + 2 * runs;
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now_s();
        bw_call(&st->a);
        const double ts = bench_now_s() - t0;
        t0 = bench_now_s();
        const int rc = fn(arg);
        const double tc = bench_now_s() - t0;
        if (rc) {
            free(x);
            return rc;
        }
        sgbs[r] = st->bytes / ts / 1e9;
        gbs[r] = bytes / tc / 1e9;
        frac[r] = gbs[r] / sgbs[r];
    }
    out->runs = runs;
    out->fraction = median_of(frac, runs);
    out->fraction_min = frac[0];
    out->fraction_max = frac[runs - 1];
    out->kv_gbs = median_of(gbs, runs);
    out->stream_gbs = median_of(sgbs, runs);
    free(x);
    return 0;
}

void bench_report_peak(const bench_opts *o, int threads)
{
    if (o->json) {
        /* The FMA chains run a fixed time, best of five: a rate, not a call to time. */
        char impl[32];
        snprintf(impl, sizeof impl, "fma:%s", bench_probe_peak_isa());
        const bench_fields f = {"peak", impl, 0, 0, 0, 0, 0, NULL, threads, -1, o->peakn};
        bench_json_begin(o, &f);
        bench_json_end();
    } else {
        printf("FP32 FMA peak (independent FMA chains a thread, %s): %.1f GFLOP/s with 1 "
               "thread, %.1f GFLOP/s with %d\n",
               bench_probe_peak_isa(), o->peak1, o->peakn, threads);
    }
}
