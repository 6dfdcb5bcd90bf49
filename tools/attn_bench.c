/*
 * attn_bench.c - `attn bench`: times scaled dot-product attention on SPEC §5's
 * shapes (S1-S6) or a custom one, and the pieces around it: the machine's FMA
 * peak, multi-head attention end to end, the projection GEMM, and the memory
 * bandwidth of streaming K and V.
 *
 * Method: inputs are filled once (uniform in [-1, 1)), each measurement does two
 * warm-up calls and then at least --runs timed samples (default 10); a sample of a
 * very short call repeats it enough times to last about a millisecond and divides.
 * The figure is the median sample. FLOPs are SPEC §5's: 4·B·H·Tq·Tk·D, halved for
 * causal shapes; multi-head attention adds 2·B·T·E·4E for the projections.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "attn_cmds.h"

static void bench_usage(FILE *f)
{
    fprintf(f,
"Usage: attn bench [--shape NAME | --batch B --heads H --query-len Tq --key-len Tk\n"
"                   --head-dim D] [--causal] [--padding] [--threads N] [--impl NAME]\n"
"                   [--runs N] [--json]\n"
"       attn bench --peak [--threads N] [--json]\n"
"       attn bench --mha [--seq-len T] [--embed-dim E] [--num-heads H] [--causal]\n"
"       attn bench --gemm [--size N]\n"
"       attn bench --bandwidth\n"
"\n"
"Times scaled dot-product attention and reports, for each measurement, the median\n"
"of at least --runs timed calls after two warm-up calls, in milliseconds, the\n"
"GFLOP/s that gives, the fraction of this machine's FP32 FMA peak (measured at\n"
"start, as --peak does) and the process's peak resident memory so far.\n"
"\n"
"Shapes (SPEC section 5; FLOPs 4*B*H*Tq*Tk*D, half of that for causal shapes):\n"
"  S1  B=2 H=4  Tq=Tk=5    D=4    none     the chapter's toy size\n"
"  S2  B=1 H=12 Tq=Tk=1024 D=64   causal   a GPT-2 small layer\n"
"  S3  B=4 H=12 Tq=Tk=1024 D=64   causal\n"
"  S4  B=1 H=16 Tq=Tk=4096 D=64   causal\n"
"  S5  B=1 H=32 Tq=1 Tk=4096 D=128 none    one decode step against a cache\n"
"  S6  B=8 H=8  Tq=Tk=512  D=64   padding  samples b >= B/2 pad their last quarter\n"
"Without --shape or sizes, all six run in turn.\n"
"\n"
"Options:\n"
"  --shape NAME      S1 .. S6, or all (the default)\n"
"  --batch B --heads H --query-len Tq --key-len Tk --head-dim D\n"
"                    a custom shape (Tk defaults to Tq, H and B to 1)\n"
"  --causal          the causal mask (needs Tq == Tk)\n"
"  --padding         S6's padding mask on a custom shape\n"
"  --threads N       worker threads (default: one per online core)\n"
"  --impl NAME       default: the library's default path only (what attn_sdpa runs,\n"
"                    see ATTN_ARCH); ref: the reference; fused: the fused kernel\n"
"                    on the selected ISA; scalar, avx2, avx512: the fused kernel on\n"
"                    that ISA; all: the reference and every ISA this CPU runs\n"
"  --runs N          timed samples per measurement (default 10, at least 1; the\n"
"                    reference on the large shapes is capped at 3, which --json says)\n"
"  --json            one JSON object per line instead of the table\n"
"  --peak            only measure the FP32 FMA peak: 16 independent FMA chains per\n"
"                    thread, 1 thread and --threads threads\n"
"  --mha             multi-head attention end to end, projections included\n"
"                    (default T=1024, E=768, H=12, B=1), and its parts\n"
"  --gemm            the projection GEMM alone (y = x W^T, N x N x N, default 1024)\n"
"  --bandwidth       the read bandwidth of streaming S5's K and V (GB/s), and S5's\n"
"                    attention time as a fraction of it\n"
"\n"
"JSON fields: impl, arch, B, H, Tq, Tk, D, mask, threads, runs, median_ms, min_ms,\n"
"gflops, peak_frac, peak_rss_mib (and for --mha/--gemm/--bandwidth their own).\n"
"\n"
"Environment: ATTN_ARCH=ref|scalar|avx2|avx512 forces the default path; the\n"
"header line (or the \"reason\" field of the first JSON line) says which ran and why.\n"
"\n"
"Example: attn bench --shape S2 --threads 2 --impl all --json\n");
}

/* ------------------------------------------------------------------------------
 * Timing
 * ---------------------------------------------------------------------------- */

static double now_s(void)
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

static double peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

typedef int (*bench_fn)(void *arg);

typedef struct timing {
    double median_s, min_s;
    int runs;
    int status;
} timing;

/* Two warm-up calls, then `runs` samples; each sample repeats the call so that it
 * lasts at least ~1 ms. */
static timing time_call(bench_fn fn, void *arg, int runs)
{
    timing t = {0, 0, runs, 0};
    double t0 = now_s();
    if ((t.status = fn(arg)) != 0)
        return t;
    double once = now_s() - t0;
    t0 = now_s();
    if ((t.status = fn(arg)) != 0)
        return t;
    double again = now_s() - t0;
    if (again < once)
        once = again;
    int reps = once > 1e-3 ? 1 : (int)(1e-3 / (once > 1e-7 ? once : 1e-7)) + 1;
    double *samples = malloc((size_t)runs * sizeof *samples);
    for (int r = 0; r < runs; r++) {
        t0 = now_s();
        for (int k = 0; k < reps; k++)
            if ((t.status = fn(arg)) != 0) {
                free(samples);
                return t;
            }
        samples[r] = (now_s() - t0) / reps;
    }
    qsort(samples, (size_t)runs, sizeof *samples, cmp_double);
    t.median_s = runs % 2 ? samples[runs / 2]
                          : 0.5 * (samples[runs / 2 - 1] + samples[runs / 2]);
    t.min_s = samples[0];
    free(samples);
    return t;
}

/* ------------------------------------------------------------------------------
 * FMA peak: 16 independent chains of vector FMAs per thread. The chains live in
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
    float sink;
} peak_arg;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
__attribute__((target("avx512f"))) static void peak_avx512(peak_arg *a)
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
__attribute__((target("avx2,fma"))) static void peak_avx2(peak_arg *a)
{
    __m256 acc[16];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < 16; c++)
        acc[c] = _mm256_set1_ps((float)c);
    for (int64_t i = 0; i < a->iters; i++)
        for (int c = 0; c < 16; c++)
            acc[c] = _mm256_fmadd_ps(acc[c], x, y);
    __m256 s = acc[0];
    for (int c = 1; c < 16; c++)
        s = _mm256_add_ps(s, acc[c]);
    float out[8];
    _mm256_storeu_ps(out, s);
    a->sink = out[0];
    a->flops = (double)a->iters * 16 * 8 * 2;
}
#define BENCH_HAVE_X86_PEAK 1
#endif

static void peak_scalar(peak_arg *a)
{
    float acc[16];
    for (int c = 0; c < 16; c++)
        acc[c] = (float)c;
    for (int64_t i = 0; i < a->iters; i++)
        for (int c = 0; c < 16; c++)
            acc[c] = acc[c] * 0.999999f + 1e-7f;
    float s = 0;
    for (int c = 0; c < 16; c++)
        s += acc[c];
    a->sink = s;
    a->flops = (double)a->iters * 16 * 2;
}

static void *peak_thread(void *p)
{
    peak_arg *a = p;
    /* Start together: a thread that is still being created would otherwise let
     * the first one run alone, and the figure would be one core's. */
    atomic_fetch_add(a->ready, 1);
    while (!atomic_load(a->go))
        ;
    double t0 = now_s();
#ifdef BENCH_HAVE_X86_PEAK
    if (attn_arch_supported(ATTN_ARCH_AVX512))
        peak_avx512(a);
    else if (attn_arch_supported(ATTN_ARCH_AVX2))
        peak_avx2(a);
    else
#endif
        peak_scalar(a);
    a->seconds = now_s() - t0;
    return NULL;
}

/* GFLOP/s of `threads` threads running the FMA chains at once (best of 5). Each
 * thread runs about 20 ms of chains once all have started; the rate is the total
 * work over the slowest thread's time. */
static double measure_peak(int threads)
{
    double best = 0;
    pthread_t tid[256];
    peak_arg args[256];
    if (threads > 256)
        threads = 256;
    for (int rep = 0; rep < 5; rep++) {
        atomic_int ready = 0, go = 0;
        for (int t = 0; t < threads; t++) {
            args[t] = (peak_arg){.iters = 10000000, .ready = &ready, .go = &go, .threads = threads};
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

/* ------------------------------------------------------------------------------
 * Attention
 * ---------------------------------------------------------------------------- */

typedef struct shape {
    const char *name;
    int64_t B, H, Tq, Tk, D;
    int causal, padding;
} shape;

static const shape spec_shapes[] = {
    {"S1", 2, 4, 5, 5, 4, 0, 0},          {"S2", 1, 12, 1024, 1024, 64, 1, 0},
    {"S3", 4, 12, 1024, 1024, 64, 1, 0},  {"S4", 1, 16, 4096, 4096, 64, 1, 0},
    {"S5", 1, 32, 1, 4096, 128, 0, 0},    {"S6", 8, 8, 512, 512, 64, 0, 1},
};

typedef struct sdpa_arg {
    attn_ctx ctx;
    attn_tensor q, k, v, out, mask;
    attn_sdpa_params p;
    int use_ref;
} sdpa_arg;

static int sdpa_call(void *p)
{
    sdpa_arg *a = p;
    if (a->use_ref)
        return attn_sdpa_ref(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, NULL);
    return attn_sdpa(&a->ctx, &a->q, &a->k, &a->v, &a->p, &a->out, NULL);
}

static void fill_uniform(float *p, int64_t n, uint64_t seed)
{
    attn_rng rng;
    attn_rng_seed(&rng, seed);
    attn_rng_uniform(&rng, p, n, -1.0f, 1.0f);
}

static double sdpa_flops(const shape *s)
{
    double f = 4.0 * (double)s->B * (double)s->H * (double)s->Tq * (double)s->Tk * (double)s->D;
    return s->causal ? f / 2 : f;
}

typedef struct options {
    int threads, runs, json;
    const char *impl;
    double peak1, peakn; /* GFLOP/s with 1 and with `threads` threads */
    double stream_gbs;   /* K/V streaming bandwidth when measured, else 0 */
} options;

static int header_done = 0;

/* s as the inside of a JSON string (quotes, backslashes and control characters
 * escaped; the reason may echo an ATTN_ARCH value the user typed). */
static const char *json_escape(const char *s, char *buf, size_t size)
{
    size_t n = 0;
    for (; *s && n + 7 < size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            n += (size_t)snprintf(buf + n, size - n, "\\%c", c);
        else if (c < 0x20)
            n += (size_t)snprintf(buf + n, size - n, "\\u%04x", c);
        else
            buf[n++] = (char)c;
    }
    buf[n] = 0;
    return buf;
}

static void print_header(const options *o)
{
    if (header_done++)
        return;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o->threads;
    char reason[1024];
    if (o->json) {
        printf("{\"kind\":\"setup\",\"default_arch\":\"%s\",\"reason\":\"%s\",\"threads\":%d,"
               "\"peak_gflops_1t\":%.1f,\"peak_gflops\":%.1f}\n",
               attn_arch_name(attn_arch_selected(&ctx)),
               json_escape(attn_arch_reason(&ctx), reason, sizeof reason),
               attn_threads_resolve(&ctx), o->peak1, o->peakn);
        return;
    }
    printf("# default path: %s (%s)\n", attn_arch_name(attn_arch_selected(&ctx)),
           attn_arch_reason(&ctx));
    printf("# threads: %d; FP32 FMA peak: %.1f GFLOP/s with 1 thread, %.1f with %d\n",
           attn_threads_resolve(&ctx), o->peak1, o->peakn, attn_threads_resolve(&ctx));
    printf("%-6s %-14s %5s %4s %6s %6s %5s %-8s %3s %10s %9s %6s %8s\n", "shape", "impl", "B",
           "H", "Tq", "Tk", "D", "mask", "thr", "median_ms", "GFLOP/s", "%peak", "rss_MiB");
}

static const char *mask_name(const shape *s)
{
    return s->causal ? "causal" : s->padding ? "padding" : "none";
}

/* Times one shape on one implementation; prints one line. */
static int bench_sdpa_impl(const shape *s, const options *o, sdpa_arg *a, const char *impl,
                           int use_ref, attn_impl ki, attn_arch arch, int runs)
{
    a->use_ref = use_ref;
    a->ctx.impl = ki;
    a->ctx.arch = arch;
    timing t = time_call(sdpa_call, a, runs);
    if (t.status != 0) {
        fprintf(stderr, "attn bench: %s on %s failed: %s\n", impl, s->name, a->ctx.message);
        return 1;
    }
    const int threads = attn_threads_resolve(&a->ctx);
    const double gf = sdpa_flops(s) / t.median_s / 1e9;
    const double frac = o->peakn > 0 ? gf / o->peakn : 0;
    /* Bytes of K and V read once: what bounds a decoding step such as S5. */
    const double kv_gbs = 2.0 * (double)(s->B * s->H * s->Tk * s->D) * 4 / t.median_s / 1e9;
    if (o->stream_gbs > 0 && o->json)
        printf("{\"kind\":\"kv_stream\",\"shape\":\"%s\",\"impl\":\"%s\",\"kv_gbs\":%.3f,"
               "\"stream_gbs\":%.3f,\"fraction\":%.4f}\n",
               s->name, impl, kv_gbs, o->stream_gbs, kv_gbs / o->stream_gbs);
    else if (o->stream_gbs > 0)
        printf("# %s on %s reads K and V at %.1f GB/s: %.0f%% of the streaming bandwidth\n",
               impl, s->name, kv_gbs, 100 * kv_gbs / o->stream_gbs);
    if (o->json)
        printf("{\"kind\":\"sdpa\",\"shape\":\"%s\",\"impl\":\"%s\",\"B\":%lld,\"H\":%lld,"
               "\"Tq\":%lld,\"Tk\":%lld,\"D\":%lld,\"mask\":\"%s\",\"threads\":%d,"
               "\"runs\":%d,\"median_ms\":%.6f,\"min_ms\":%.6f,\"gflops\":%.3f,"
               "\"peak_frac\":%.4f,\"peak_rss_mib\":%.1f}\n",
               s->name, impl, (long long)s->B, (long long)s->H, (long long)s->Tq,
               (long long)s->Tk, (long long)s->D, mask_name(s), threads, t.runs,
               t.median_s * 1e3, t.min_s * 1e3, gf, frac, peak_rss_mib());
    else
        printf("%-6s %-14s %5lld %4lld %6lld %6lld %5lld %-8s %3d %10.4f %9.2f %5.1f%% %8.1f\n",
               s->name, impl, (long long)s->B, (long long)s->H, (long long)s->Tq,
               (long long)s->Tk, (long long)s->D, mask_name(s), threads, t.median_s * 1e3, gf,
               100 * frac, peak_rss_mib());
    fflush(stdout);
    return 0;
}

static int bench_sdpa(const shape *s, const options *o)
{
    sdpa_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
    const int64_t B = s->B, H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->D;
    const int64_t qs[4] = {B, H, Tq, D}, ks[4] = {B, H, Tk, D}, ms[4] = {B, 1, 1, Tk};
    int rc;
    if ((rc = attn_tensor_alloc(&a.ctx, &a.q, ATTN_DTYPE_F32, 4, qs)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.k, ATTN_DTYPE_F32, 4, ks)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.v, ATTN_DTYPE_F32, 4, ks)) ||
        (rc = attn_tensor_alloc(&a.ctx, &a.out, ATTN_DTYPE_F32, 4, qs))) {
        fprintf(stderr, "attn bench: %s\n", a.ctx.message);
        return 1;
    }
    fill_uniform(a.q.data, B * H * Tq * D, 1);
    fill_uniform(a.k.data, B * H * Tk * D, 2);
    fill_uniform(a.v.data, B * H * Tk * D, 3);
    attn_sdpa_params_init(&a.p);
    a.p.causal = s->causal;
    if (s->padding) {
        if ((rc = attn_tensor_alloc(&a.ctx, &a.mask, ATTN_DTYPE_BOOL, 4, ms))) {
            fprintf(stderr, "attn bench: %s\n", a.ctx.message);
            return 1;
        }
        uint8_t *m = a.mask.data;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Tk; j++)
                m[b * Tk + j] = !(b >= B / 2 && j >= Tk - Tk / 4);
        a.p.mask = &a.mask;
    }
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
        int runs = sdpa_flops(s) > 2e9 && o->runs > 3 ? 3 : o->runs;
        status |= bench_sdpa_impl(s, o, &a, "ref", 1, ATTN_IMPL_REF, ATTN_ARCH_AUTO, runs);
    }
    if (!strcmp(impl, "fused"))
        status |= bench_sdpa_impl(s, o, &a, "fused", 0, ATTN_IMPL_FUSED, ATTN_ARCH_AUTO, o->runs);
    static const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int x = 0; x < 3; x++) {
        const char *n = attn_arch_name(archs[x]);
        if (!(want_all || !strcmp(impl, n)) || !attn_arch_supported(archs[x]))
            continue;
        char name[32];
        snprintf(name, sizeof name, "fused:%s", n);
        status |= bench_sdpa_impl(s, o, &a, name, 0, ATTN_IMPL_FUSED, archs[x], o->runs);
    }
    attn_tensor_free(&a.ctx, &a.q);
    attn_tensor_free(&a.ctx, &a.k);
    attn_tensor_free(&a.ctx, &a.v);
    attn_tensor_free(&a.ctx, &a.out);
    if (s->padding)
        attn_tensor_free(&a.ctx, &a.mask);
    return status;
}

/* ------------------------------------------------------------------------------
 * Multi-head attention end to end, and the GEMM alone
 * ---------------------------------------------------------------------------- */

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

static int bench_mha(int64_t T, int64_t E, int64_t H, int causal, const options *o)
{
    mha_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
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
        return 1;
    }
    const float lim = 1.0f / sqrtf((float)E);
    fill_uniform(a.x.data, T * E, 11);
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
        timing t = time_call(mha_call, &a, x == 1 && o->runs > 3 ? 3 : o->runs);
        if (t.status) {
            fprintf(stderr, "attn bench: mha failed: %s\n", a.ctx.message);
            status = 1;
            continue;
        }
        double gf = (flops_att + flops_proj) / t.median_s / 1e9;
        if (o->json)
            printf("{\"kind\":\"mha\",\"impl\":\"%s\",\"arch\":\"%s\",\"B\":1,\"H\":%lld,"
                   "\"Tq\":%lld,\"Tk\":%lld,\"D\":%lld,\"E\":%lld,\"mask\":\"%s\","
                   "\"threads\":%d,\"runs\":%d,\"median_ms\":%.6f,\"gflops\":%.3f,"
                   "\"peak_frac\":%.4f,\"peak_rss_mib\":%.1f}\n",
                   impls[x], attn_arch_name(attn_arch_selected(&a.ctx)), (long long)H,
                   (long long)T, (long long)T, (long long)(E / H), (long long)E,
                   causal ? "causal" : "none", attn_threads_resolve(&a.ctx), t.runs,
                   t.median_s * 1e3, gf, o->peakn > 0 ? gf / o->peakn : 0, peak_rss_mib());
        else
            printf("mha    %-14s T=%lld E=%lld H=%lld %s: %.3f ms, %.2f GFLOP/s (%.1f%% of "
                   "peak), rss %.1f MiB\n",
                   impls[x], (long long)T, (long long)E, (long long)H,
                   causal ? "causal" : "no mask", t.median_s * 1e3, gf,
                   o->peakn > 0 ? 100 * gf / o->peakn : 0, peak_rss_mib());
    }
    attn_tensor_free(&a.ctx, &a.x);
    attn_tensor_free(&a.ctx, &a.out);
    attn_tensor_free(&a.ctx, &a.w.w_qkv);
    attn_tensor_free(&a.ctx, &a.w.b_qkv);
    attn_tensor_free(&a.ctx, &a.w.w_o);
    attn_tensor_free(&a.ctx, &a.w.b_o);
    return status;
}

typedef struct gemm_arg {
    attn_ctx ctx;
    attn_tensor x, w, y;
} gemm_arg;

static int gemm_call(void *p)
{
    gemm_arg *a = p;
    return attn_linear(&a->ctx, &a->x, &a->w, NULL, &a->y);
}

static int bench_gemm(int64_t n, const options *o)
{
    gemm_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
    const int64_t s[2] = {n, n};
    if (attn_tensor_alloc(&a.ctx, &a.x, ATTN_DTYPE_F32, 2, s) ||
        attn_tensor_alloc(&a.ctx, &a.w, ATTN_DTYPE_F32, 2, s) ||
        attn_tensor_alloc(&a.ctx, &a.y, ATTN_DTYPE_F32, 2, s)) {
        fprintf(stderr, "attn bench: %s\n", a.ctx.message);
        return 1;
    }
    fill_uniform(a.x.data, n * n, 21);
    fill_uniform(a.w.data, n * n, 22);
    int status = 0;
    for (int x = 0; x < 2; x++) {
        if (x == 1 && strcmp(o->impl, "all") && strcmp(o->impl, "ref"))
            continue;
        if (x == 0 && !strcmp(o->impl, "ref"))
            continue;
        a.ctx.arch = x == 1 ? ATTN_ARCH_REF : ATTN_ARCH_AUTO;
        timing t = time_call(gemm_call, &a, x == 1 && o->runs > 3 ? 3 : o->runs);
        if (t.status) {
            fprintf(stderr, "attn bench: gemm failed: %s\n", a.ctx.message);
            status = 1;
            continue;
        }
        double gf = 2.0 * (double)n * (double)n * (double)n / t.median_s / 1e9;
        const char *impl = x == 1 ? "ref" : attn_arch_name(attn_arch_selected(&a.ctx));
        if (o->json)
            printf("{\"kind\":\"gemm\",\"impl\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,"
                   "\"threads\":%d,\"runs\":%d,\"median_ms\":%.6f,\"gflops\":%.3f,"
                   "\"peak_frac\":%.4f}\n",
                   impl, (long long)n, (long long)n, (long long)n,
                   attn_threads_resolve(&a.ctx), t.runs, t.median_s * 1e3, gf,
                   o->peakn > 0 ? gf / o->peakn : 0);
        else
            printf("gemm   %-8s %lld x %lld x %lld: %.3f ms, %.2f GFLOP/s (%.1f%% of peak)\n",
                   impl, (long long)n, (long long)n, (long long)n, t.median_s * 1e3, gf,
                   o->peakn > 0 ? 100 * gf / o->peakn : 0);
    }
    attn_tensor_free(&a.ctx, &a.x);
    attn_tensor_free(&a.ctx, &a.w);
    attn_tensor_free(&a.ctx, &a.y);
    return status;
}

/* ------------------------------------------------------------------------------
 * Streaming bandwidth: read S5's K and V (2 x 64 MiB) once, split over threads,
 * each thread its slice of K then its slice of V (XOR of the words, so nothing
 * is computed that could bound the loop but the reads themselves).
 * ---------------------------------------------------------------------------- */

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
    const uint64_t *k, *v;
    int64_t words;
    int threads;
} bw_arg;

static int bw_call(void *p)
{
    bw_arg *a = p;
    pthread_t tid[64];
    stream_arg sa[128];
    int n = a->threads > 64 ? 64 : a->threads < 1 ? 1 : a->threads;
    for (int t = 0; t < n; t++) {
        int64_t lo = a->words * t / n, hi = a->words * (t + 1) / n;
        sa[2 * t] = (stream_arg){a->k + lo, hi - lo, 0};
        sa[2 * t + 1] = (stream_arg){a->v + lo, hi - lo, 0};
    }
    for (int t = 1; t < n; t++)
        pthread_create(&tid[t], NULL, stream_pair, &sa[2 * t]);
    stream_pair(&sa[0]);
    for (int t = 1; t < n; t++)
        pthread_join(tid[t], NULL);
    return 0;
}

static int bench_bandwidth(options *o)
{
    const shape *s5 = &spec_shapes[4];
    const int64_t n = s5->B * s5->H * s5->Tk * s5->D; /* floats in K, and in V */
    float *k = malloc((size_t)n * sizeof(float)), *v = malloc((size_t)n * sizeof(float));
    if (!k || !v) {
        fprintf(stderr, "attn bench: out of memory for the bandwidth test\n");
        free(k);
        free(v);
        return 1;
    }
    fill_uniform(k, n, 31);
    fill_uniform(v, n, 32);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o->threads;
    bw_arg a = {(const uint64_t *)k, (const uint64_t *)v, n / 2, attn_threads_resolve(&ctx)};
    timing t = time_call(bw_call, &a, o->runs);
    free(k);
    free(v);
    const double bytes = 2.0 * (double)n * sizeof(float);
    const double gbs = bytes / t.median_s / 1e9;
    if (o->json)
        printf("{\"kind\":\"bandwidth\",\"what\":\"stream S5 K and V\",\"bytes\":%.0f,"
               "\"threads\":%d,\"runs\":%d,\"median_ms\":%.6f,\"gbs\":%.3f}\n",
               bytes, a.threads, t.runs, t.median_s * 1e3, gbs);
    else
        printf("stream S5's K and V (%.0f MiB) with %d threads: %.3f ms, %.1f GB/s\n",
               bytes / 1048576.0, a.threads, t.median_s * 1e3, gbs);
    o->stream_gbs = gbs;
    return 0;
}

/* ------------------------------------------------------------------------------
 * Command line
 * ---------------------------------------------------------------------------- */

static int parse_i64(const char *opt, const char *s, int64_t *out)
{
    char *end;
    long long v = strtoll(s ? s : "", &end, 10);
    if (!s || !*s || *end || v < 1) {
        fprintf(stderr, "attn bench: %s needs a positive integer, got '%s'\n", opt,
                s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

int attn_cmd_bench(int argc, char **argv)
{
    options o = {0, 10, 0, "default", 0, 0, 0};
    shape custom = {"custom", 1, 1, 0, 0, 0, 0, 0};
    const char *shape_name = NULL;
    int want_peak = 0, want_mha = 0, want_gemm = 0, want_bw = 0, causal = 0, padding = 0;
    int64_t T = 1024, E = 768, NH = 12, gemm_n = 1024, v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_INT(dst)                                                                    \
    do {                                                                                 \
        if (!parse_i64(a, next, &v))                                                     \
            return 2;                                                                    \
        dst = v;                                                                         \
        i++;                                                                             \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--shape") && next) {
            shape_name = next, i++;
        } else if (!strcmp(a, "--batch")) {
            NEED_INT(custom.B);
        } else if (!strcmp(a, "--heads")) {
            NEED_INT(custom.H);
        } else if (!strcmp(a, "--query-len")) {
            NEED_INT(custom.Tq);
        } else if (!strcmp(a, "--key-len")) {
            NEED_INT(custom.Tk);
        } else if (!strcmp(a, "--head-dim")) {
            NEED_INT(custom.D);
        } else if (!strcmp(a, "--threads")) {
            NEED_INT(o.threads);
        } else if (!strcmp(a, "--runs")) {
            NEED_INT(o.runs);
        } else if (!strcmp(a, "--seq-len")) {
            NEED_INT(T);
        } else if (!strcmp(a, "--embed-dim")) {
            NEED_INT(E);
        } else if (!strcmp(a, "--num-heads")) {
            NEED_INT(NH);
        } else if (!strcmp(a, "--size")) {
            NEED_INT(gemm_n);
        } else if (!strcmp(a, "--impl") && next) {
            o.impl = next, i++;
        } else if (!strcmp(a, "--causal")) {
            causal = 1;
        } else if (!strcmp(a, "--padding")) {
            padding = 1;
        } else if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--peak")) {
            want_peak = 1;
        } else if (!strcmp(a, "--mha")) {
            want_mha = 1;
        } else if (!strcmp(a, "--gemm")) {
            want_gemm = 1;
        } else if (!strcmp(a, "--bandwidth")) {
            want_bw = 1;
        } else {
            fprintf(stderr, "attn bench: unknown or incomplete option '%s' (see attn bench "
                            "--help)\n", a);
            return 2;
        }
#undef NEED_INT
    }
    static const char *impls[] = {"default", "ref", "fused", "scalar", "avx2", "avx512", "all"};
    int impl_ok = 0;
    for (size_t x = 0; x < sizeof impls / sizeof impls[0]; x++)
        impl_ok |= !strcmp(o.impl, impls[x]);
    if (!impl_ok) {
        fprintf(stderr, "attn bench: --impl must be default, ref, fused, scalar, avx2, "
                        "avx512 or all, not '%s'\n", o.impl);
        return 2;
    }
    if (E % NH != 0) {
        fprintf(stderr, "attn bench: --embed-dim %lld is not divisible by --num-heads %lld\n",
                (long long)E, (long long)NH);
        return 2;
    }
    const int is_custom = custom.Tq || custom.Tk || custom.D;
    if (is_custom) {
        if (!custom.Tq || !custom.D) {
            fprintf(stderr, "attn bench: a custom shape needs --query-len and --head-dim\n");
            return 2;
        }
        if (!custom.Tk)
            custom.Tk = custom.Tq;
        custom.causal = causal;
        custom.padding = padding;
        if (causal && custom.Tq != custom.Tk) {
            fprintf(stderr, "attn bench: --causal needs Tq == Tk, got %lld and %lld\n",
                    (long long)custom.Tq, (long long)custom.Tk);
            return 2;
        }
    }
    if (shape_name && strcmp(shape_name, "all")) {
        int known = 0;
        for (size_t x = 0; x < sizeof spec_shapes / sizeof spec_shapes[0]; x++)
            known |= !strcmp(shape_name, spec_shapes[x].name);
        if (!known) {
            fprintf(stderr, "attn bench: unknown shape '%s' (S1 .. S6 or all)\n", shape_name);
            return 2;
        }
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o.threads;
    const int threads = attn_threads_resolve(&ctx);
    o.peak1 = measure_peak(1);
    o.peakn = threads == 1 ? o.peak1 : measure_peak(threads);
    if (want_peak) {
        if (o.json)
            printf("{\"kind\":\"peak\",\"threads\":%d,\"peak_gflops_1t\":%.3f,"
                   "\"peak_gflops\":%.3f}\n", threads, o.peak1, o.peakn);
        else
            printf("FP32 FMA peak (16 independent FMA chains a thread): %.1f GFLOP/s with 1 "
                   "thread, %.1f GFLOP/s with %d\n", o.peak1, o.peakn, threads);
        return 0;
    }
    print_header(&o);
    if (want_mha)
        return bench_mha(T, E, NH, causal, &o);
    if (want_gemm)
        return bench_gemm(gemm_n, &o);
    if (want_bw) {
        int rc = bench_bandwidth(&o);
        return rc ? rc : bench_sdpa(&spec_shapes[4], &o);
    }
    if (is_custom)
        return bench_sdpa(&custom, &o) ? 1 : 0;
    int status = 0;
    for (size_t x = 0; x < sizeof spec_shapes / sizeof spec_shapes[0]; x++) {
        if (shape_name && strcmp(shape_name, "all") && strcmp(shape_name, spec_shapes[x].name))
            continue;
        status |= bench_sdpa(&spec_shapes[x], &o);
    }
    return status ? 1 : 0;
}
