/*
 * bench_decode.c - `attn bench`'s decoding benchmarks, both through the KV cache
 * (include/attn.h, attn_kv_cache_*):
 *
 *   S9        one batched decode step, B = 4 sequences of 1024, 2048, 3072 and
 *             4096 cached positions, H = Hkv = 16, D = 64, one query row each
 *             (SPEC section 5): attn_kv_cache_attend on all four at once. Its
 *             figure is the rate at which it reads the K and V the sequences hold,
 *             against the streaming bandwidth when --bandwidth measured it.
 *   --decode  a decoding loop on S5's, S7's and S9's head shapes: --prefill
 *             tokens (default 4096) appended to a cache for every sequence, then
 *             --steps steps (default 128), each appending --tq tokens' k and v
 *             (default 1) and attending their --tq query rows per sequence (more
 *             than one: a speculative-decoding step, or a chunk of a chunked
 *             prefill). The figure is the median
 *             step (after one untimed attend on the prefilled cache, the warm-up
 *             every benchmark here does); the loop runs with the context's workspace set to
 *             attn_kv_cache_workspace_size bytes and a counting allocator, and
 *             prints how many allocations the steps made (the target is zero).
 *
 * With --dtype bf16|f16 the cache stores K and V in that dtype, and the queries,
 * the outputs and the steps' new keys and values are stored in it too (a 16-bit
 * model's decoder); the K/V rate counts the bytes the cache holds, 2 per element.
 */
#include "bench.h"
#include "bench_probes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A head shape of a decoding benchmark. */
typedef struct decode_shape {
    const char *name;
    int64_t B, H, Hkv, D;
} decode_shape;

static const decode_shape decode_shapes[] = {
    {"S5", 1, 32, 32, 128},
    {"S7", 1, 32, 8, 128},
    {"S9", 4, 16, 16, 64},
};

/* The allocator the decode loop runs under: malloc and free, counted. */
typedef struct counting {
    long long allocs;
} counting;

static void *count_alloc(void *user, size_t size)
{
    ((counting *)user)->allocs++;
    return malloc(size);
}

static void count_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A cache of B sequences, capacity cap, K and V stored in dt, filled to len[b]
 * positions with uniform keys and values (appended in float32, so rounded once
 * into a 16-bit cache, one sequence at a time, in blocks of 512 tokens). */
static int cache_make(attn_ctx *ctx, int64_t B, int64_t Hkv, int64_t D, int64_t cap,
                      const int64_t *len, attn_dtype dt, attn_kv_cache **out)
{
    attn_kv_cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = B;
    cfg.kv_heads = Hkv;
    cfg.capacity = cap;
    cfg.head_dim = D;
    cfg.value_dim = D;
    cfg.dtype = dt;
    int rc = attn_kv_cache_create(ctx, &cfg, NULL, 0, out);
    if (rc)
        return rc;
    const int64_t blk = 512;
    float *k = malloc((size_t)(Hkv * blk * D) * sizeof(float));
    float *v = malloc((size_t)(Hkv * blk * D) * sizeof(float));
    if (!k || !v) {
        free(k), free(v);
        return ATTN_STATUS_NO_MEMORY;
    }
    for (int64_t b = 0; b < B && rc == ATTN_OK; b++)
        for (int64_t t = 0; t < len[b] && rc == ATTN_OK; t += blk) {
            const int64_t n = len[b] - t < blk ? len[b] - t : blk;
            bench_fill_uniform(k, Hkv * n * D, 100 + (uint64_t)(b * 7919 + t));
            bench_fill_uniform(v, Hkv * n * D, 200 + (uint64_t)(b * 7919 + t));
            const int64_t sh[4] = {1, Hkv, n, D};
            attn_tensor tk, tv;
            attn_tensor_init(NULL, &tk, ATTN_DTYPE_F32, k, 4, sh);
            attn_tensor_init(NULL, &tv, ATTN_DTYPE_F32, v, 4, sh);
            rc = attn_kv_cache_append(ctx, *out, b, &tk, &tv, NULL);
        }
    free(k), free(v);
    return rc;
}

/* With --bandwidth, S9 rotates through several caches holding the same keys and
 * values, one a call, so that it reads them from memory and not from the
 * last-level cache (bench_cold_copies in bench_probes.h); else it uses one. */
#define S9_MAX_CACHES 64

/* A new cache of the same shape and capacity holding what `from` holds. */
static int cache_copy(attn_ctx *ctx, const attn_kv_cache *from, int64_t B, int64_t Hkv,
                      int64_t D, int64_t cap, attn_dtype dt, attn_kv_cache **out)
{
    const int64_t none[4] = {0, 0, 0, 0};
    int rc = cache_make(ctx, B, Hkv, D, cap, none, dt, out);
    for (int64_t b = 0; b < B && rc == ATTN_OK; b++) {
        attn_tensor k, v;
        rc = attn_kv_cache_view(ctx, from, b, &k, &v);
        if (rc == ATTN_OK)
            rc = attn_kv_cache_append(ctx, *out, b, &k, &v, NULL);
    }
    return rc;
}

typedef struct s9_arg {
    attn_ctx ctx;
    attn_kv_cache *cache[S9_MAX_CACHES];
    int caches, next;
    attn_tensor q, out;
    attn_sdpa_params p;
} s9_arg;

static int s9_call(void *arg)
{
    s9_arg *a = arg;
    attn_kv_cache *c = a->cache[a->next++ % a->caches];
    return attn_kv_cache_attend(&a->ctx, c, 0, &a->q, &a->p, NULL, &a->out, NULL);
}

int bench_kv_s9(const bench_opts *o)
{
    enum { B = 4, H = 16, D = 64 };
    static const int64_t len[B] = {1024, 2048, 3072, 4096};
    s9_arg a;
    memset(&a, 0, sizeof a);
    attn_ctx_init(&a.ctx);
    a.ctx.threads = o->threads;
    a.ctx.keep_workspace = 1;
    const int64_t qs[4] = {B, H, 1, D};
    int64_t keys = 0;
    for (int b = 0; b < B; b++)
        keys += len[b];
    const attn_dtype dt = o->dtype;
    const double kv_bytes = 2.0 * (double)(keys * H * D) * (double)attn_dtype_size(dt);
    a.caches = o->stream_gbs > 0 ? bench_cold_copies(kv_bytes) : 1;
    if (a.caches > S9_MAX_CACHES)
        a.caches = S9_MAX_CACHES;
    float *q = malloc(B * H * D * sizeof(float));
    int rc = q ? ATTN_OK : ATTN_STATUS_NO_MEMORY;
    if (rc == ATTN_OK)
        rc = cache_make(&a.ctx, B, H, D, 4096, len, dt, &a.cache[0]);
    /* The other caches hold the same keys and values, appended from views of the
     * first (one copy each, no random numbers drawn again). */
    for (int c = 1; c < a.caches && rc == ATTN_OK; c++)
        rc = cache_copy(&a.ctx, a.cache[0], B, H, D, 4096, dt, &a.cache[c]);
    /* q and out in the cache's dtype: q holds the uniform values rounded once. */
    attn_tensor q32;
    if (rc == ATTN_OK) {
        bench_fill_uniform(q, B * H * D, 1);
        attn_tensor_init(NULL, &q32, ATTN_DTYPE_F32, q, 4, qs);
        rc = attn_tensor_alloc(&a.ctx, &a.q, dt, 4, qs);
        if (rc == ATTN_OK)
            rc = attn_tensor_convert(&a.ctx, &q32, &a.q);
        if (rc == ATTN_OK)
            rc = attn_tensor_alloc(&a.ctx, &a.out, dt, 4, qs);
    }
    if (rc) {
        fprintf(stderr, "attn bench: S9's caches: %s\n", bench_why(&a.ctx, rc));
        free(q);
        attn_tensor_free(&a.ctx, &a.q), attn_tensor_free(&a.ctx, &a.out);
        for (int c = 0; c < a.caches; c++)
            attn_kv_cache_free(&a.ctx, a.cache[c]);
        return 1;
    }
    attn_sdpa_params_init(&a.p);
    a.p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    char impl[32];
    snprintf(impl, sizeof impl, "kv:%s", attn_arch_name(attn_arch_selected(&a.ctx)));
    const bench_timing t = bench_time_call(s9_call, &a, o->runs);
    int status = 0;
    if (t.status) {
        fprintf(stderr, "attn bench: S9 failed: %s\n", bench_why(&a.ctx, t.status));
        status = 1;
    } else {
        const double flops = 4.0 * H * D * (double)keys;
        const double gf = flops / t.median_s / 1e9;
        const double kv_gbs = kv_bytes / t.median_s / 1e9;
        const int threads = attn_threads_resolve(&a.ctx);
        const bench_fields f = {"sdpa", impl, B, H, 1, 4096, D, "causal_bottom_right",
                                threads, t.median_s * 1e3, gf};
        bench_pair pr;
        int prc = 0;
        if (o->stream_gbs > 0 &&
            (prc = bench_paired_fraction(o, s9_call, &a, kv_bytes, o->runs, &pr)) != 0) {
            fprintf(stderr, "attn bench: S9 failed: %s\n", bench_why(&a.ctx, prc));
            status = 1;
        } else if (o->stream_gbs > 0 && o->json) {
            bench_fields kv = f;
            kv.kind = "kv_stream";
            bench_json_begin(o, &kv);
            printf(",\"shape\":\"S9\",\"kv_gbs\":%.3f,\"stream_gbs\":%.3f,\"fraction\":%.4f,"
                   "\"fraction_min\":%.4f,\"fraction_max\":%.4f,\"pairs\":%d,"
                   "\"cold_copies\":%d",
                   pr.kv_gbs, pr.stream_gbs, pr.fraction, pr.fraction_min, pr.fraction_max,
                   pr.runs, a.caches);
            bench_json_end();
        } else if (o->stream_gbs > 0) {
            printf("# %s on S9 reads K and V (rotating through %d caches) at %.1f GB/s while "
                   "the stream reads %.1f GB/s: %.0f%% of the streaming bandwidth (median of "
                   "%d interleaved pairs; %.0f-%.0f%%)\n",
                   impl, a.caches, pr.kv_gbs, pr.stream_gbs, 100 * pr.fraction, pr.runs,
                   100 * pr.fraction_min, 100 * pr.fraction_max);
        }
        if (o->json) {
            bench_json_begin(o, &f);
            printf(",\"shape\":\"S9\",\"runs\":%d,\"min_ms\":%.6f,\"peak_frac\":%.4f,"
                   "\"peak_rss_mib\":%.1f,\"kv_heads\":%d,\"lengths\":[1024,2048,3072,4096],"
                   "\"kv_gbs\":%.3f,\"dtype\":\"%s\"",
                   t.runs, t.min_s * 1e3, o->peakn > 0 ? gf / o->peakn : 0.0,
                   bench_peak_rss_mib(), H, kv_gbs, attn_dtype_name(dt));
            bench_json_end();
        } else {
            printf("%-6s %-18s %5d %4d %6d %6d %5d %-8s %3d %10.4f %9.2f %5.1f%% %8.1f "
                   "lengths=1024,2048,3072,4096 kv_gbs=%.1f%s%s\n",
                   "S9", impl, B, H, 1, 4096, D, "causal_bottom_right", threads,
                   t.median_s * 1e3, gf, o->peakn > 0 ? 100 * gf / o->peakn : 0.0,
                   bench_peak_rss_mib(), kv_gbs, dt != ATTN_DTYPE_F32 ? " dtype=" : "",
                   dt != ATTN_DTYPE_F32 ? attn_dtype_name(dt) : "");
        }
        fflush(stdout);
    }
    for (int c = 0; c < a.caches; c++)
        attn_kv_cache_free(&a.ctx, a.cache[c]);
    attn_tensor_free(&a.ctx, &a.q), attn_tensor_free(&a.ctx, &a.out);
    attn_ctx_release(&a.ctx);
    free(q);
    return status;
}

/* The decode loop on one head shape; prints one line. */
static int decode_one(const decode_shape *s, int64_t prefill, int64_t steps, int64_t tq,
                      const bench_opts *o)
{
    const int64_t B = s->B, H = s->H, Hkv = s->Hkv, D = s->D, cap = prefill + steps * tq;
    const attn_dtype sdt = o->dtype; /* the cache's, the queries', the outputs' */
    counting count = {0};
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o->threads;
    int64_t len[4];
    for (int64_t b = 0; b < B; b++)
        len[b] = prefill;
    attn_kv_cache *cache = NULL;
    const int64_t qs[4] = {B, H, tq, D}, kvs[4] = {steps * B, Hkv, tq, D};
    float *q = malloc((size_t)(B * H * tq * D) * sizeof(float));
    float *k = malloc((size_t)(steps * B * Hkv * tq * D) * sizeof(float));
    float *v = malloc((size_t)(steps * B * Hkv * tq * D) * sizeof(float));
    double *dt = malloc((size_t)steps * sizeof(double));
    void *ws = NULL;
    int rc = q && k && v && dt ? cache_make(&ctx, B, Hkv, D, cap, len, sdt, &cache)
                               : ATTN_STATUS_NO_MEMORY;
    /* The queries, outputs and the steps' keys and values [steps * B, Hkv, tq, D], in
     * the dtype (rounded once from the uniform float32 values when 16-bit). */
    attn_tensor qt, to, tk, tv, f32;
    memset(&qt, 0, sizeof qt), memset(&to, 0, sizeof to);
    memset(&tk, 0, sizeof tk), memset(&tv, 0, sizeof tv);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    if (rc == ATTN_OK) {
        bench_fill_uniform(q, B * H * tq * D, 1);
        bench_fill_uniform(k, steps * B * Hkv * tq * D, 2);
        bench_fill_uniform(v, steps * B * Hkv * tq * D, 3);
        if ((rc = attn_tensor_alloc(&ctx, &qt, sdt, 4, qs)) ||
            (rc = attn_tensor_init(&ctx, &f32, ATTN_DTYPE_F32, q, 4, qs)) ||
            (rc = attn_tensor_convert(&ctx, &f32, &qt)) ||
            (rc = attn_tensor_alloc(&ctx, &to, sdt, 4, qs)) ||
            (rc = attn_tensor_alloc(&ctx, &tk, sdt, 4, kvs)) ||
            (rc = attn_tensor_init(&ctx, &f32, ATTN_DTYPE_F32, k, 4, kvs)) ||
            (rc = attn_tensor_convert(&ctx, &f32, &tk)) ||
            (rc = attn_tensor_alloc(&ctx, &tv, sdt, 4, kvs)) ||
            (rc = attn_tensor_init(&ctx, &f32, ATTN_DTYPE_F32, v, 4, kvs)) ||
            (rc = attn_tensor_convert(&ctx, &f32, &tv)))
            goto planned;
        /* The workspace, planned for the full cache, serves every step. */
        size_t bytes = 0;
        rc = attn_kv_cache_workspace_size(&ctx, cache, 0, &qt, &p, NULL, &to, NULL, &bytes);
        if (rc == ATTN_OK && bytes && !(ws = aligned_alloc(64, (bytes + 63) / 64 * 64)))
            rc = ATTN_STATUS_NO_MEMORY;
        ctx.workspace = ws;
        ctx.workspace_size = bytes;
    }
planned:
    /* One untimed step's attention on the prefilled cache (it changes nothing):
     * the workspace's pages and the thread pool are then warm, as in a running
     * decoder. */
    if (rc == ATTN_OK)
        rc = attn_kv_cache_attend(&ctx, cache, 0, &qt, &p, NULL, &to, NULL);
    const attn_allocator plain = ctx.allocator;
    ctx.allocator.alloc = count_alloc;
    ctx.allocator.free = count_free;
    ctx.allocator.user = &count;
    for (int64_t st = 0; st < steps && rc == ATTN_OK; st++) {
        attn_tensor sk, sv;
        attn_tensor_narrow(&ctx, &tk, 0, st * B, B, &sk);
        attn_tensor_narrow(&ctx, &tv, 0, st * B, B, &sv);
        const double t0 = bench_now_s();
        rc = attn_kv_cache_append(&ctx, cache, 0, &sk, &sv, NULL);
        if (rc == ATTN_OK)
            rc = attn_kv_cache_attend(&ctx, cache, 0, &qt, &p, NULL, &to, NULL);
        dt[st] = bench_now_s() - t0;
    }
    ctx.allocator = plain;
    int status = 0;
    if (rc != ATTN_OK) {
        fprintf(stderr, "attn bench: decode %s failed: %s\n", s->name, bench_why(&ctx, rc));
        status = 1;
    } else {
        qsort(dt, (size_t)steps, sizeof *dt, cmp_double);
        const double med = steps % 2 ? dt[steps / 2] : (dt[steps / 2 - 1] + dt[steps / 2]) / 2;
        /* The K and V of a middle step: prefill + (steps / 2 + 1) * tq positions per
         * sequence, in the bytes the cache stores them in; each of its tq query rows
         * sees all but the later of that step's tq keys (bottom-right causal). */
        const double keys = (double)(prefill + (steps / 2 + 1) * tq);
        const double kv_bytes = 2.0 * (double)(B * Hkv * D) * keys * (double)attn_dtype_size(sdt);
        const double pairs = (double)tq * keys - (double)(tq * (tq - 1) / 2);
        const double gf = 4.0 * (double)(B * H * D) * pairs / med / 1e9;
        const int threads = attn_threads_resolve(&ctx);
        const double per_step = (double)count.allocs / (double)steps;
        if (o->json) {
            const bench_fields f = {"decode", "kv:default", B, H, tq, cap, D,
                                    "causal_bottom_right", threads, med * 1e3, gf};
            bench_json_begin(o, &f);
            printf(",\"shape\":\"%s\",\"kv_heads\":%lld,\"prefill\":%lld,\"steps\":%lld,"
                   "\"min_ms\":%.6f,\"kv_gbs\":%.3f,\"allocs\":%lld,\"allocs_per_step\":%.3f,"
                   "\"dtype\":\"%s\"",
                   s->name, (long long)Hkv, (long long)prefill, (long long)steps,
                   dt[0] * 1e3, kv_bytes / med / 1e9, count.allocs, per_step,
                   attn_dtype_name(sdt));
            bench_json_end();
        } else {
            printf("decode %-3s B=%lld H=%lld Hkv=%lld D=%lld prefill %lld, %lld steps of %lld "
                   "token%s, %d threads, K/V %s: median step %.4f ms (min %.4f), K/V read at "
                   "%.1f GB/s, %.1f GFLOP/s, %lld allocations in the steps (%.3f per step)\n",
                   s->name, (long long)B, (long long)H, (long long)Hkv, (long long)D,
                   (long long)prefill, (long long)steps, (long long)tq, tq == 1 ? "" : "s",
                   threads, attn_dtype_name(sdt), med * 1e3, dt[0] * 1e3, kv_bytes / med / 1e9,
                   gf, count.allocs, per_step);
        }
        fflush(stdout);
    }
    attn_kv_cache_free(&ctx, cache);
    attn_tensor_free(&ctx, &qt), attn_tensor_free(&ctx, &to);
    attn_tensor_free(&ctx, &tk), attn_tensor_free(&ctx, &tv);
    attn_ctx_release(&ctx);
    free(ws), free(q), free(k), free(v), free(dt);
    return status;
}

int bench_decode(int64_t prefill, int64_t steps, int64_t tq, const bench_opts *o)
{
    int status = 0;
    for (size_t x = 0; x < sizeof decode_shapes / sizeof decode_shapes[0]; x++)
        status |= decode_one(&decode_shapes[x], prefill, steps, tq, o);
    return status;
}
