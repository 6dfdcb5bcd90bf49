/*
 * kv_cache.c - the KV cache for decoding: the keys and values of earlier tokens,
 * appended to as tokens arrive, attended to by the new queries, rolled back on
 * demand.
 *
 * Memory: one block, laid out as
 *
 *   the attn_kv_cache struct                      (padded to 64 bytes)
 *   len   [B]                   int64             (padded to 64 bytes)
 *   K     [B, Hkv, capacity, D]  the dtype         (padded to 64 bytes)
 *   V     [B, Hkv, capacity, Dv] the dtype         (padded to 64 bytes)
 *   stage [Hkv, D]               float32           (16-bit caches only)
 *
 * allocated once by attn_kv_cache_create or handed in by the caller. A sequence's
 * positions 0 .. len[b] - 1 are stored; the rest is room.
 *
 * The dtype is float32, bfloat16 or float16 (SPEC section 10): a 16-bit cache
 * holds K and V in half the bytes, which is what a decoding step streams. Keys
 * and values arrive in float32 (rounded once, to nearest even, with the
 * converters of src/kernels/half.h) or in the cache's dtype (copied bit for bit).
 * RoPE turns a position's keys in float32, in the stage rows, and rounds them
 * once. Attention against a 16-bit cache is attn_sdpa's 16-bit call on the
 * cache's own views (src/kernels/half_stage.h), with a float32 q or out where the
 * caller gives one (attn__sdpa_prepare_cache): the same kernel, the same bits as
 * attn_sdpa on those views.
 *
 * Attention against the cache is one attention call per sequence, because each
 * sequence has its own key length (with several sequences and no weights, the
 * calls are planned one by one and their work runs as one parallel job, so that
 * a batched decoding step keeps every core busy to its end): the queries are the last Tq positions of their
 * sequence, so the causal alignment is the bottom-right one, and with Tk = len[b]
 * every option of the contract (window, ALiBi) counts positions from the
 * sequence's start. Each call goes through the contract (attn__sdpa_prepare), is
 * planned (attn__sdpa_plan_for_ctx) and runs unchecked (attn__sdpa_run) in one
 * block of scratch taken once per attend call as attn_ctx says. The block is sized
 * for a full cache as well as for the current lengths, so that a caller's
 * workspace of attn_kv_cache_workspace_size bytes, or the context's kept buffer,
 * serves every later step: a decoding loop allocates nothing per step.
 */
#include "dispatch.h"
#include "half.h"
#include "rope.h"
#include "sdpa_contract.h"
#include "sdpa_fused.h"

#include <stdalign.h>
#include <string.h>

/* Scratch up to this many bytes lives on the stack (as in sdpa.c). */
#define KV_STACK_SCRATCH 4096

struct attn_kv_cache {
    int64_t B, Hkv, cap, D, Dv;
    attn_dtype dtype;  /* of K and V: F32, BF16 or F16 */
    size_t esize;      /* bytes of one element of K or V */
    int64_t *len;      /* [B] */
    unsigned char *k;  /* [B, Hkv, cap, D] of dtype */
    unsigned char *v;  /* [B, Hkv, cap, Dv] of dtype */
    float *stage;      /* [Hkv, D]: a 16-bit cache's keys of one position, turned by
                          RoPE in float32 before they are rounded; NULL in float32 */
    void *owned;  /* the block when the library allocated it; NULL in caller memory */
    attn_allocator allocator;
    int has_allocator;
};

/* Offsets of the parts of a cache's block, in bytes. */
typedef struct kv_layout {
    size_t len_off, k_off, v_off, stage_off, bytes;
} kv_layout;

static int kv_layout_of(attn_ctx *ctx, const attn_kv_cache_config *cfg, int64_t *Dv,
                        kv_layout *lay)
{
    if (!cfg)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "KV cache config is NULL");
    if (cfg->dtype != ATTN_DTYPE_F32 && cfg->dtype != ATTN_DTYPE_BF16 &&
        cfg->dtype != ATTN_DTYPE_F16)
        return attn__fail(ctx, ATTN_STATUS_DTYPE,
                          "KV cache config dtype %d (%s): a cache stores float32, bfloat16 "
                          "or float16",
                          (int)cfg->dtype, attn_dtype_name(cfg->dtype));
    const size_t es = attn_dtype_size(cfg->dtype);
    *Dv = cfg->value_dim == 0 ? cfg->head_dim : cfg->value_dim;
    if (cfg->batch < 1 || cfg->kv_heads < 1 || cfg->capacity < 1 || cfg->head_dim < 1 ||
        *Dv < 1)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "KV cache config batch=%lld, kv_heads=%lld, capacity=%lld, "
                          "head_dim=%lld, value_dim=%lld: each must be at least 1 "
                          "(value_dim may be 0 for head_dim)",
                          (long long)cfg->batch, (long long)cfg->kv_heads,
                          (long long)cfg->capacity, (long long)cfg->head_dim,
                          (long long)cfg->value_dim);
    int64_t rows, nk, nv, ns = 0;
    size_t lb, kb, vb, sb = 0;
    if (!attn__mul_i64(cfg->batch, cfg->kv_heads, &rows) ||
        !attn__mul_i64(rows, cfg->capacity, &rows) || !attn__mul_i64(rows, cfg->head_dim, &nk) ||
        !attn__mul_i64(rows, *Dv, &nv) || !attn__bytes(cfg->batch, sizeof(int64_t), &lb) ||
        !attn__bytes(nk, es, &kb) || !attn__bytes(nv, es, &vb) ||
        (cfg->dtype != ATTN_DTYPE_F32 &&
         (!attn__mul_i64(cfg->kv_heads, cfg->head_dim, &ns) ||
          !attn__bytes(ns, sizeof(float), &sb))))
        goto overflow;
    lay->len_off = attn__align64(sizeof(attn_kv_cache));
    lb = attn__align64(lb);
    kb = attn__align64(kb);
    vb = attn__align64(vb);
    if (!lb || !kb || !vb || lb > SIZE_MAX - lay->len_off)
        goto overflow;
    lay->k_off = lay->len_off + lb;
    if (kb > SIZE_MAX - lay->k_off)
        goto overflow;
    lay->v_off = lay->k_off + kb;
    if (vb > SIZE_MAX - lay->v_off)
        goto overflow;
    lay->stage_off = lay->v_off + vb;
    if (sb > SIZE_MAX - lay->stage_off)
        goto overflow;
    lay->bytes = lay->stage_off + sb;
    return ATTN_OK;
overflow:
    return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                      "a KV cache of batch=%lld, kv_heads=%lld, capacity=%lld, head_dim=%lld, "
                      "value_dim=%lld in %s does not fit in memory",
                      (long long)cfg->batch, (long long)cfg->kv_heads, (long long)cfg->capacity,
                      (long long)cfg->head_dim, (long long)*Dv, attn_dtype_name(cfg->dtype));
}

int attn_kv_cache_bytes(attn_ctx *ctx, const attn_kv_cache_config *cfg, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    int64_t Dv = 0;
    kv_layout lay = {0, 0, 0, 0, 0};
    int rc = kv_layout_of(ctx, cfg, &Dv, &lay);
    if (rc == ATTN_OK)
        *bytes = lay.bytes;
    return rc;
}

int attn_kv_cache_create(attn_ctx *ctx, const attn_kv_cache_config *cfg, void *memory,
                         size_t memory_size, attn_kv_cache **out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    int64_t Dv = 0;
    kv_layout lay = {0, 0, 0, 0, 0};
    int rc = kv_layout_of(ctx, cfg, &Dv, &lay);
    if (rc != ATTN_OK)
        return rc;
    char *block = memory;
    void *raw = NULL;
    if (memory) {
        if ((uintptr_t)memory % 64 != 0)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "KV cache memory %p is not 64-byte aligned", memory);
        if (memory_size < lay.bytes)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "KV cache memory of %zu bytes is too small: this config needs "
                              "%zu (attn_kv_cache_bytes)",
                              memory_size, lay.bytes);
    } else {
        /* The allocator's alignment is not known: ask for 64 bytes more and start
         * the block at the first 64-byte boundary. */
        if (lay.bytes > SIZE_MAX - 64)
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "a KV cache of %zu bytes overflows",
                              lay.bytes);
        raw = attn__alloc(ctx, lay.bytes + 64, "the KV cache");
        if (!raw)
            return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
        block = (char *)raw + (64 - (uintptr_t)raw % 64) % 64;
    }
    memset(block, 0, lay.bytes);
    attn_kv_cache *c = (attn_kv_cache *)block;
    c->B = cfg->batch;
    c->Hkv = cfg->kv_heads;
    c->cap = cfg->capacity;
    c->D = cfg->head_dim;
    c->Dv = Dv;
    c->dtype = cfg->dtype;
    c->esize = attn_dtype_size(cfg->dtype);
    c->len = (int64_t *)(block + lay.len_off);
    c->k = (unsigned char *)block + lay.k_off;
    c->v = (unsigned char *)block + lay.v_off;
    c->stage = cfg->dtype == ATTN_DTYPE_F32 ? NULL : (float *)(block + lay.stage_off);
    c->owned = raw;
    if (raw && ctx) {
        c->allocator = ctx->allocator;
        c->has_allocator = 1;
    }
    *out = c;
    return ATTN_OK;
}

void attn_kv_cache_free(attn_ctx *ctx, attn_kv_cache *cache)
{
    (void)ctx;
    if (!cache || !cache->owned)
        return;
    /* The struct lives in the block it frees: read what is needed first. */
    attn_ctx with;
    attn_ctx_init(&with);
    if (cache->has_allocator)
        with.allocator = cache->allocator;
    void *raw = cache->owned;
    attn__free(&with, raw);
}

int64_t attn_kv_cache_length(const attn_kv_cache *cache, int64_t seq)
{
    if (!cache || seq < 0 || seq >= cache->B)
        return -1;
    return cache->len[seq];
}

static int check_cache(attn_ctx *ctx, const attn_kv_cache *cache, const char *fn)
{
    if (!cache)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s: cache is NULL", fn);
    return ATTN_OK;
}

/* Checks a range of sequences first .. first + n - 1. */
static int check_range(attn_ctx *ctx, const attn_kv_cache *c, const char *fn, int64_t first,
                       int64_t n)
{
    if (first < 0 || first >= c->B || n > c->B - first) {
        /* The last sequence named, first + n - 1, may not fit in int64 (first comes
         * from the caller): it is printed only when it does. */
        if (n >= 1 && first <= INT64_MAX - (n - 1))
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s: sequences %lld .. %lld are not all in the cache's batch of "
                              "%lld",
                              fn, (long long)first, (long long)(first + (n - 1)), (long long)c->B);
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s: %lld sequences from %lld are not all in the cache's batch of %lld",
                          fn, (long long)n, (long long)first, (long long)c->B);
    }
    return ATTN_OK;
}

/* t is float32 or `also` (the cache's dtype; ATTN_DTYPE_F32 for float32 only). */
static int check_dtype(attn_ctx *ctx, const attn_tensor *t, const char *fn, const char *name,
                       attn_dtype also)
{
    if (!t)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
    int rc = attn_tensor_check(ctx, t, name);
    if (rc)
        return rc;
    if (t->dtype == ATTN_DTYPE_F32 || t->dtype == also)
        return ATTN_OK;
    if (also == ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s: %s must be float32, not %s", fn, name,
                          attn_dtype_name(t->dtype));
    return attn__fail(ctx, ATTN_STATUS_DTYPE,
                      "%s: %s must be float32 or %s (the cache's dtype), not %s", fn, name,
                      attn_dtype_name(also), attn_dtype_name(t->dtype));
}

static int check_f32(attn_ctx *ctx, const attn_tensor *t, const char *fn, const char *name)
{
    return check_dtype(ctx, t, fn, name, ATTN_DTYPE_F32);
}

/* The cache's whole K (or V) block as a 1-D tensor, for overlap checks. */
static attn_tensor block_tensor(const attn_kv_cache *c, int values)
{
    attn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = values ? (void *)c->v : (void *)c->k;
    t.dtype = c->dtype;
    t.ndim = 1;
    t.shape[0] = c->B * c->Hkv * c->cap * (values ? c->Dv : c->D);
    for (int i = 0; i < ATTN_MAX_DIMS; i++)
        t.stride[i] = 1;
    for (int i = 1; i < ATTN_MAX_DIMS; i++)
        t.shape[i] = 1;
    return t;
}

/* The cache's whole block, from its struct to the end of its stage rows (or of V),
 * as a 1-D float32 tensor (every part's size is a multiple of 4 bytes), for
 * overlap checks: the bookkeeping and the stage are the cache's memory too. */
static attn_tensor whole_tensor(const attn_kv_cache *c)
{
    const unsigned char *end =
        c->stage ? (const unsigned char *)(c->stage + c->Hkv * c->D)
                 : c->v + (size_t)(c->B * c->Hkv * c->cap * c->Dv) * c->esize;
    attn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)c;
    t.dtype = ATTN_DTYPE_F32;
    t.ndim = 1;
    t.shape[0] = (int64_t)((size_t)(end - (const unsigned char *)c) / sizeof(float));
    for (int i = 0; i < ATTN_MAX_DIMS; i++)
        t.stride[i] = 1;
    for (int i = 1; i < ATTN_MAX_DIMS; i++)
        t.shape[i] = 1;
    return t;
}

/* A [1, Hkv, n, Dx] view of sequence seq's K (or V) from position `start`. */
static attn_tensor seq_tensor(const attn_kv_cache *c, int values, int64_t seq, int64_t start,
                              int64_t n)
{
    const int64_t Dx = values ? c->Dv : c->D;
    attn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (values ? c->v : c->k) + (size_t)((seq * c->Hkv * c->cap + start) * Dx) * c->esize;
    t.dtype = c->dtype;
    t.ndim = 4;
    t.shape[0] = 1;
    t.shape[1] = c->Hkv;
    t.shape[2] = n;
    t.shape[3] = Dx;
    t.stride[0] = c->Hkv * c->cap * Dx;
    t.stride[1] = c->cap * Dx;
    t.stride[2] = Dx;
    t.stride[3] = 1;
    return t;
}

/* n elements of a row of `sdt` at stride ss into a row of the 16-bit cache's dtype
 * `cdt` (unit stride): the cache's own dtype is copied bit for bit, float32 is
 * rounded once to nearest even (hk's converters on a unit-stride row; every
 * converter gives the portable ones' bits). */
static void store_half_row(const attn__half_kernels *hk, attn_dtype cdt, const void *src,
                           attn_dtype sdt, int64_t ss, uint16_t *dst, int64_t n)
{
    if (sdt == cdt) {
        const uint16_t *h = (const uint16_t *)src;
        if (ss == 1)
            memcpy(dst, h, (size_t)n * sizeof *dst);
        else
            for (int64_t d = 0; d < n; d++)
                dst[d] = h[d * ss];
        return;
    }
    const float *f = (const float *)src;
    if (ss == 1) {
        attn__half_narrow(hk, cdt, f, dst, n);
        return;
    }
    for (int64_t d = 0; d < n; d++)
        dst[d] = cdt == ATTN_DTYPE_BF16 ? attn__f32_to_bf16(f[d * ss])
                                        : attn__f32_to_f16(f[d * ss]);
}

/* One element of a 16-bit row of dtype dt, widened (exactly). */
static float widen_one(attn_dtype dt, uint16_t h)
{
    return dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
}

/* Appends to a 16-bit cache: sequence b's rows from position len on. kd and vd are
 * k[i] and v[i] (float32 or the cache's dtype, strides kst/vst of the head, row
 * and feature axes, in elements). With rope, each position's keys of every head
 * go through the stage rows: widened (or copied) to float32, turned there at the
 * position, rounded once into the cache. */
static void append_half(attn_kv_cache *c, const attn__half_kernels *hk, int64_t b,
                        int64_t len, int64_t Tnew, const void *kd, attn_dtype kdt,
                        const int64_t kst[3], const void *vd, attn_dtype vdt,
                        const int64_t vst[3], const attn_rope_params *rope)
{
    const size_t kes = attn_dtype_size(kdt), ves = attn_dtype_size(vdt);
    uint16_t *ck = (uint16_t *)c->k + (b * c->Hkv * c->cap + len) * c->D;
    uint16_t *cv = (uint16_t *)c->v + (b * c->Hkv * c->cap + len) * c->Dv;
    for (int64_t h = 0; h < c->Hkv; h++)
        for (int64_t t = 0; t < Tnew; t++) {
            const int64_t row = h * c->cap + t;
            const unsigned char *vr =
                (const unsigned char *)vd + (size_t)(h * vst[0] + t * vst[1]) * ves;
            store_half_row(hk, c->dtype, vr, vdt, vst[2], cv + row * c->Dv, c->Dv);
            if (!rope) {
                const unsigned char *kr =
                    (const unsigned char *)kd + (size_t)(h * kst[0] + t * kst[1]) * kes;
                store_half_row(hk, c->dtype, kr, kdt, kst[2], ck + row * c->D, c->D);
            }
        }
    if (!rope)
        return;
    const int64_t ss[3] = {c->D, c->D, 1};
    for (int64_t t = 0; t < Tnew; t++) {
        if (kdt == ATTN_DTYPE_F32) {
            attn__rope_run(rope, c->Hkv, 1, c->D, (const float *)kd + t * kst[1], kst, c->stage,
                           ss, len + t);
        } else {
            for (int64_t h = 0; h < c->Hkv; h++) {
                const uint16_t *kr = (const uint16_t *)kd + h * kst[0] + t * kst[1];
                for (int64_t d = 0; d < c->D; d++)
                    c->stage[h * c->D + d] = widen_one(kdt, kr[d * kst[2]]);
            }
            attn__rope_run(rope, c->Hkv, 1, c->D, c->stage, ss, c->stage, ss, len + t);
        }
        for (int64_t h = 0; h < c->Hkv; h++)
            attn__half_narrow(hk, c->dtype, c->stage + h * c->D, ck + (h * c->cap + t) * c->D,
                              c->D);
    }
}

int attn_kv_cache_append(attn_ctx *ctx, attn_kv_cache *cache, int64_t first,
                         const attn_tensor *k, const attn_tensor *v,
                         const attn_rope_params *rope)
{
    static const char fn[] = "attn_kv_cache_append";
    int rc;
    if ((rc = check_cache(ctx, cache, fn)) || (rc = check_dtype(ctx, k, fn, "k", cache->dtype)) ||
        (rc = check_dtype(ctx, v, fn, "v", cache->dtype)))
        return rc;
    const attn_kv_cache *c = cache;
    int64_t ks[4], kst[4], vs[4], vst[4];
    attn__as4d(k, ks, kst);
    attn__as4d(v, vs, vst);
    const int64_t want_k[4] = {ks[0], c->Hkv, ks[2], c->D};
    const int64_t want_v[4] = {ks[0], c->Hkv, ks[2], c->Dv};
    if (memcmp(ks, want_k, sizeof ks) != 0 || memcmp(vs, want_v, sizeof vs) != 0) {
        char a[128], b[128], e[128], f[128];
        attn_shape_format(e, sizeof e, 4, want_k);
        attn_shape_format(f, sizeof f, 4, want_v);
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "%s: k %s and v %s do not fit the cache (Hkv=%lld, D=%lld, "
                          "Dv=%lld): expected k %s and v %s",
                          fn, attn__shape_str(k, a, sizeof a), attn__shape_str(v, b, sizeof b),
                          (long long)c->Hkv, (long long)c->D, (long long)c->Dv, e, f);
    }
    const int64_t Bn = ks[0], Tnew = ks[2];
    if ((rc = check_range(ctx, c, fn, first, Bn)))
        return rc;
    if (rope && (rc = attn__rope_check(ctx, rope, c->D, 0)))
        return rc;
    /* Room for every sequence first: a full cache appends nothing anywhere. */
    for (int64_t i = 0; i < Bn; i++) {
        const int64_t len = c->len[first + i];
        if (Tnew > c->cap - len)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s: the KV cache is full: sequence %lld holds %lld of %lld "
                              "positions and cannot take %lld more (nothing was appended)",
                              fn, (long long)(first + i), (long long)len, (long long)c->cap,
                              (long long)Tnew);
    }
    const attn_tensor kb = block_tensor(c, 0), vb = block_tensor(c, 1);
    if ((rc = attn__no_overlap(ctx, fn, &kb, "the cache's keys", k, "k", 0)) ||
        (rc = attn__no_overlap(ctx, fn, &kb, "the cache's keys", v, "v", 0)) ||
        (rc = attn__no_overlap(ctx, fn, &vb, "the cache's values", k, "k", 0)) ||
        (rc = attn__no_overlap(ctx, fn, &vb, "the cache's values", v, "v", 0)))
        return rc;
    /* The rest of the cache's memory: a k in the stage rows would be read while
     * RoPE writes them. */
    const attn_tensor wb = whole_tensor(c);
    if ((rc = attn__no_overlap(ctx, fn, &wb, "the cache's memory", k, "k", 0)) ||
        (rc = attn__no_overlap(ctx, fn, &wb, "the cache's memory", v, "v", 0)))
        return rc;
    /* A 16-bit cache rounds with the converters of the call's instruction set
     * (every set gives the same bits); a context that forces a set this CPU
     * cannot run is refused here as attend refuses it. */
    const attn__half_kernels *hk = NULL;
    if (c->dtype != ATTN_DTYPE_F32) {
        attn_arch arch = ATTN_ARCH_REF;
        if ((rc = attn__arch_resolve(ctx, &arch)))
            return rc;
        hk = attn__half_for(arch);
    }

    for (int64_t i = 0; i < Bn; i++) {
        const int64_t b = first + i, len = c->len[b];
        if (hk) {
            const size_t kes = attn_dtype_size(k->dtype), ves = attn_dtype_size(v->dtype);
            append_half(cache, hk, b, len, Tnew,
                        (const unsigned char *)k->data + (size_t)(i * kst[0]) * kes, k->dtype,
                        kst + 1, (const unsigned char *)v->data + (size_t)(i * vst[0]) * ves,
                        v->dtype, vst + 1, rope);
            continue;
        }
        const float *kd = (const float *)k->data + i * kst[0];
        const float *vd = (const float *)v->data + i * vst[0];
        float *ck = (float *)c->k + (b * c->Hkv * c->cap + len) * c->D;
        float *cv = (float *)c->v + (b * c->Hkv * c->cap + len) * c->Dv;
        const int64_t cks[3] = {c->cap * c->D, c->D, 1}, cvs[3] = {c->cap * c->Dv, c->Dv, 1};
        if (rope)
            attn__rope_run(rope, c->Hkv, Tnew, c->D, kd, kst + 1, ck, cks, len);
        for (int64_t h = 0; h < c->Hkv; h++)
            for (int64_t t = 0; t < Tnew; t++) {
                if (!rope)
                    for (int64_t d = 0; d < c->D; d++)
                        ck[h * cks[0] + t * cks[1] + d] = kd[h * kst[1] + t * kst[2] + d * kst[3]];
                for (int64_t d = 0; d < c->Dv; d++)
                    cv[h * cvs[0] + t * cvs[1] + d] = vd[h * vst[1] + t * vst[2] + d * vst[3]];
            }
    }
    for (int64_t i = 0; i < Bn; i++)
        cache->len[first + i] += Tnew;
    return ATTN_OK;
}

int attn_kv_cache_truncate(attn_ctx *ctx, attn_kv_cache *cache, int64_t seq, int64_t length)
{
    static const char fn[] = "attn_kv_cache_truncate";
    int rc;
    if ((rc = check_cache(ctx, cache, fn)))
        return rc;
    if (length < 0)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s: length %lld must be at least 0", fn, (long long)length);
    if (seq == -1) {
        for (int64_t b = 0; b < cache->B; b++)
            if (cache->len[b] > length)
                cache->len[b] = length;
        return ATTN_OK;
    }
    if ((rc = check_range(ctx, cache, fn, seq, 1)))
        return rc;
    if (length > cache->len[seq])
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s: sequence %lld holds %lld positions; it cannot be rolled back "
                          "to %lld (truncate only shortens)",
                          fn, (long long)seq, (long long)cache->len[seq], (long long)length);
    cache->len[seq] = length;
    return ATTN_OK;
}

int attn_kv_cache_view(attn_ctx *ctx, const attn_kv_cache *cache, int64_t seq, attn_tensor *k,
                       attn_tensor *v)
{
    static const char fn[] = "attn_kv_cache_view";
    int rc;
    if ((rc = check_cache(ctx, cache, fn)) || (rc = check_range(ctx, cache, fn, seq, 1)))
        return rc;
    if (cache->len[seq] == 0)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s: sequence %lld is empty; a view needs at least one position", fn,
                          (long long)seq);
    if (k)
        *k = seq_tensor(cache, 0, seq, 0, cache->len[seq]);
    if (v)
        *v = seq_tensor(cache, 1, seq, 0, cache->len[seq]);
    return ATTN_OK;
}

/* ---- attention against the cache ---------------------------------------------- */

/* Row i of a tensor whose first axis is the batch of Bn sequences: narrowed to
 * [i, i + 1) when it has `full` dims and a batch axis of Bn > 1 (a broadcast axis
 * of size 1, or a tensor with fewer dims, serves every sequence as it is). */
static attn_tensor batch_row(const attn_tensor *t, int full, int64_t Bn, int64_t i)
{
    attn_tensor r = *t;
    if (t->ndim == full && Bn > 1 && t->shape[0] == Bn) {
        r.data = (char *)t->data + i * t->stride[0] * (int64_t)attn_dtype_size(t->dtype);
        r.shape[0] = 1;
    }
    return r;
}

/* The first n entries of the last (key) axis, when it is not broadcast. */
static attn_tensor first_keys(const attn_tensor *t, int64_t n)
{
    attn_tensor r = *t;
    if (r.shape[r.ndim - 1] > 1)
        r.shape[r.ndim - 1] = n;
    return r;
}

/* Plans the call s with Tk keys, its queries the last Tq of them. */
static int plan_at(attn_ctx *ctx, attn__sdpa_shapes *s, int64_t Tk, attn__sdpa_plan *plan)
{
    s->Tk = Tk;
    s->offset = Tk - s->Tq;
    return attn__sdpa_plan_for_ctx(ctx, s, plan);
}

/* *out = the longest key count in [lo, cap) whose plan does not split the keys,
 * given that a full cache's (cap's) does; -1 when lo's plan splits them too. The
 * split depends on the shapes only and, for given heads and queries, sets in from
 * a key count on (src/kernels/sdpa_fused.c: job_layout, half_layout), so a
 * bisection finds it in about log2(cap) plans, each a few loops over Tq. */
static int longest_unsplit(attn_ctx *ctx, attn__sdpa_shapes *s, int64_t lo, int64_t *out)
{
    const int64_t cap = s->Tk;
    attn__sdpa_plan plan;
    int rc;
    *out = -1;
    if ((rc = plan_at(ctx, s, lo, &plan)) == ATTN_OK && plan.n_chunks == 0) {
        int64_t hi = cap; /* lo's plan is unsplit, hi's split */
        while (rc == ATTN_OK && hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            if ((rc = plan_at(ctx, s, mid, &plan)) == ATTN_OK && plan.n_chunks == 0)
                lo = mid;
            else
                hi = mid;
        }
        *out = lo;
    }
    return rc;
}

/* Everything attend checks beyond the per-sequence attention calls. */
typedef struct kv_attend {
    int64_t Bn, H, Tq;
    size_t q_bytes;   /* rotated queries of one sequence, in scratch (0 without RoPE) */
    int batched;      /* 1: the sequences' calls run as one parallel job (below) */
    size_t head;      /* batched: the plans and data pointers before the queries */
    size_t scratch;   /* one by one: q_bytes + the largest attention scratch;
                         batched: head + Bn * q_bytes + the batch's scratch */
} kv_attend;

/* No output may share memory with an input, the cache or another output; out may
 * be q itself. Checked on the whole tensors and the cache's whole K and V blocks
 * before anything runs: each sequence's own call checks only its rows against
 * its stored keys, so one sequence's output could land in a later sequence's
 * keys (or its room, or its weights) before that sequence's call refused it. */
static int attend_aliasing(attn_ctx *ctx, const attn_kv_cache *c, const attn_tensor *q,
                           const attn_sdpa_params *p, const attn_tensor *out,
                           const attn_tensor *weights)
{
    static const char fn[] = "attn_kv_cache_attend";
    const attn_tensor kb = block_tensor(c, 0), vb = block_tensor(c, 1), wb = whole_tensor(c);
    const attn_tensor *ins[8] = {q,       &kb,     &vb,    &wb,
                                 p->mask, p->bias, p->sinks, p->alibi_slopes};
    const char *in_names[8] = {"q",    "the cache's keys", "the cache's values",
                               "the cache's memory", "mask", "bias", "sinks", "alibi_slopes"};
    const attn_tensor *const outs[3] = {out, weights, p->lse};
    static const char *const out_names[3] = {"out", "weights", "lse"};
    int rc;
    /* The tensors the checks before this have not looked at as a whole. */
    for (int i = 6; i < 8; i++)
        if (ins[i] && (rc = attn_tensor_check(ctx, ins[i], in_names[i])))
            return rc;
    if (p->lse && (rc = attn_tensor_check(ctx, p->lse, "lse")))
        return rc;
    return attn__outputs_apart(ctx, fn, outs, out_names, ins, in_names, 8);
}

/* Checks what the attention contract cannot see (the range, the cache's shapes,
 * mask and bias against the capacity, the causal value), then plans: each
 * sequence's attention with its own Tk, and a full cache, taking the largest
 * scratch. */
static int attend_prepare(attn_ctx *ctx, const attn_kv_cache *c, int64_t first,
                          const attn_tensor *q, const attn_sdpa_params *p,
                          const attn_rope_params *rope, const attn_tensor *out,
                          const attn_tensor *weights, kv_attend *a)
{
    static const char fn[] = "attn_kv_cache_attend";
    int rc;
    /* q and out: float32, or the dtype of a 16-bit cache (checked here, with the
     * cache's message; the contract's cache call then accepts the mix). */
    if ((rc = check_cache(ctx, c, fn)) || (rc = check_dtype(ctx, q, fn, "q", c->dtype)) ||
        (rc = check_dtype(ctx, out, fn, "out", c->dtype)))
        return rc;
    if (weights && (rc = check_f32(ctx, weights, fn, "weights")))
        return rc;
    int64_t qs[4], qst[4];
    attn__as4d(q, qs, qst);
    a->Bn = qs[0];
    a->H = qs[1];
    a->Tq = qs[2];
    if ((rc = check_range(ctx, c, fn, first, a->Bn)))
        return rc;
    /* With several sequences, out and lse need q's batch axis: each sequence's call
     * takes its row of them (batch_row), and one of batch 1, or with fewer dims,
     * would have every sequence write the same rows (from several threads at once
     * when the calls run as one job). */
    if (a->Bn > 1 && (out->ndim != 4 || out->shape[0] != a->Bn ||
                      (p->lse && (p->lse->ndim != 3 || p->lse->shape[0] != a->Bn)))) {
        const int bad_out = out->ndim != 4 || out->shape[0] != a->Bn;
        const attn_tensor *t = bad_out ? out : p->lse;
        char s1[128], s2[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "%s: %s has shape %s; q %s has a batch of %lld sequences, so %s "
                          "must be [%lld, %s] with one row per sequence",
                          fn, bad_out ? "out" : "lse", attn__shape_str(t, s1, sizeof s1),
                          attn__shape_str(q, s2, sizeof s2), (long long)a->Bn,
                          bad_out ? "out" : "lse", (long long)a->Bn,
                          bad_out ? "H, Tq, Dv" : "H, Tq");
    }
    if (qs[3] != c->D || a->H % c->Hkv != 0) {
        char s1[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "%s: q %s does not fit the cache: it needs D=%lld and a head count "
                          "that is a multiple of Hkv=%lld",
                          fn, attn__shape_str(q, s1, sizeof s1), (long long)c->D,
                          (long long)c->Hkv);
    }
    if (p->causal == ATTN_CAUSAL_TOP_LEFT)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s: the queries sit at the end of each sequence, so the causal mask "
                          "is bottom-right; causal = top-left is refused", fn);
    for (int64_t i = 0; i < a->Bn; i++)
        if (c->len[first + i] < a->Tq)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s: %lld queries but sequence %lld holds only %lld positions "
                              "(append the new keys before attending)",
                              fn, (long long)a->Tq, (long long)(first + i),
                              (long long)c->len[first + i]);
    if (weights) {
        int64_t ws[4], wst[4];
        attn__as4d(weights, ws, wst);
        const int64_t want[4] = {a->Bn, a->H, a->Tq, c->cap};
        if (memcmp(ws, want, sizeof ws) != 0) {
            char s1[128], s2[128];
            attn_shape_format(s2, sizeof s2, 4, want);
            return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                              "%s: weights has shape %s; expected %s (the key axis is the "
                              "cache's capacity)",
                              fn, attn__shape_str(weights, s1, sizeof s1), s2);
        }
    }
    if (p->mask && (rc = attn_mask_check(ctx, p->mask, a->Bn, a->H, a->Tq, c->cap)))
        return rc;
    if (p->bias) {
        if ((rc = check_f32(ctx, p->bias, fn, "bias")))
            return rc;
        int64_t bs[4], bst[4];
        attn__as4d(p->bias, bs, bst);
        const int64_t want[4] = {a->Bn, a->H, a->Tq, c->cap};
        for (int d = 0; d < 4; d++)
            if (bs[d] != 1 && bs[d] != want[d]) {
                char s1[128], s2[128];
                attn_shape_format(s2, sizeof s2, 4, want);
                return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                                  "%s: bias shape %s does not broadcast to %s (the key axis is "
                                  "the cache's capacity)",
                                  fn, attn__shape_str(p->bias, s1, sizeof s1), s2);
            }
    }
    if (rope && (rc = attn__rope_check(ctx, rope, c->D, 0)))
        return rc;
    if ((rc = attend_aliasing(ctx, c, q, p, out, weights)))
        return rc;

    /* The first sequence's call through the contract checks q, out and every option
     * once; the plans of the others differ in Tk only. */
    attn_sdpa_params pb = *p;
    pb.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    const int64_t len0 = c->len[first];
    attn_tensor q0 = batch_row(q, 4, a->Bn, 0), o0 = batch_row(out, 4, a->Bn, 0);
    attn_tensor k0 = seq_tensor(c, 0, first, 0, len0), v0 = seq_tensor(c, 1, first, 0, len0);
    attn_tensor m0, b0, l0, w0;
    if (p->mask) {
        m0 = first_keys(p->mask, len0);
        m0 = batch_row(&m0, 4, a->Bn, 0);
        pb.mask = &m0;
    }
    if (p->bias) {
        b0 = first_keys(p->bias, len0);
        b0 = batch_row(&b0, 4, a->Bn, 0);
        pb.bias = &b0;
    }
    if (p->lse) {
        l0 = batch_row(p->lse, 3, a->Bn, 0);
        pb.lse = &l0;
    }
    if (weights) {
        w0 = first_keys(weights, len0);
        w0 = batch_row(&w0, 4, a->Bn, 0);
    }
    attn__sdpa_shapes s;
    if ((rc = attn__sdpa_prepare_cache(ctx, &q0, &k0, &v0, &pb, &o0, weights ? &w0 : NULL,
                                       &s)))
        return rc;
    if (s.B != 1) {
        char s1[128];
        return attn__fail(ctx, ATTN_STATUS_SHAPE_MISMATCH,
                          "%s: q %s and out must have a batch axis of the same size", fn,
                          attn__shape_str(q, s1, sizeof s1));
    }
    /* With rope the calls run on the rotated queries, which are float32 whatever
     * q's dtype (attend_setup), so they are planned so: a 16-bit q would send a
     * call of many query rows to the bfloat16 kernel's plan (src/kernels/sdpa_bf16.c
     * takes bfloat16 q only), whose scratch is not what the widening path that
     * then runs needs. */
    if (rope && s.dtype != ATTN_DTYPE_F32)
        s.q_f32 = 1;
    size_t most = 0;
    /* The batch's scratch, for the current lengths and for a full cache. */
    attn__fused_batch_size now = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, full = now;
    /* The batch path runs the float32 kernel's items, or the 16-bit path's (row
     * or tile, src/kernels/sdpa_fused.c); a call with weights, or on the bfloat16
     * kernel's path, goes one sequence at a time, each parallel in itself
     * (now.one_by_one, below). */
    a->batched = !weights && a->Bn > 1;
    /* The lengths planned: a full cache, so that the scratch serves every later
     * step too; where a full cache's keys are split, also the longest length whose
     * keys are not (when a sequence is still that short), since a step's scratch
     * grows with its keys within each layout but may shrink where they come to be
     * split (a 16-bit call whose split items read the cache in place needs no
     * float32 copy of its keys, which the unsplit call before it does:
     * src/kernels/sdpa_fused.c, half_copy_rows); then each sequence's length. */
    int64_t shortest = c->cap, unsplit = -1;
    for (int64_t i = 0; i < a->Bn; i++)
        shortest = c->len[first + i] < shortest ? c->len[first + i] : shortest;
    for (int64_t i = -2; i < a->Bn; i++) {
        if (i == -1 && unsplit < 0)
            continue;
        const int64_t Tk = i == -2 ? c->cap : i == -1 ? unsplit : c->len[first + i];
        attn__sdpa_plan plan;
        if ((rc = plan_at(ctx, &s, Tk, &plan)))
            return rc;
        if (i == -2 && plan.n_chunks > 0 && (rc = longest_unsplit(ctx, &s, shortest, &unsplit)))
            return rc;
        if (plan.scratch_bytes > most)
            most = plan.scratch_bytes;
        /* The reference runs one call per sequence, unbatched: its plan has no
         * fused layout (no tiles) to add to a batch. */
        if (plan.use_ref)
            a->batched = 0;
        else if (i >= 0)
            attn__fused_batch_add(&now, &plan);
        else
            for (int64_t j = 0; j < a->Bn; j++)
                attn__fused_batch_add(&full, &plan);
    }
    a->q_bytes = 0;
    if (rope) {
        int64_t n;
        if (!attn__mul_i64(a->H, a->Tq, &n) || !attn__mul_i64(n, c->D, &n) || !attn__bytes(n, sizeof(float), &a->q_bytes) ||
            !(a->q_bytes = attn__align64(a->q_bytes)))
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: rotated queries overflow", fn);
    }
    if (most > SIZE_MAX - a->q_bytes)
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: scratch overflows", fn);
    a->scratch = a->q_bytes + most;
    if (now.one_by_one || full.one_by_one)
        a->batched = 0;
    if (a->batched) {
        /* One plan and one set of data pointers per sequence, then each sequence's
         * rotated queries, then the batch's scratch (the larger of now and full). */
        size_t b_now, b_full, qall;
        if ((rc = attn__fused_batch_bytes(ctx, &now, &b_now)) ||
            (rc = attn__fused_batch_bytes(ctx, &full, &b_full)))
            return rc;
        const size_t n = (size_t)a->Bn;
        if (n > SIZE_MAX / 4096 || (a->q_bytes && n > SIZE_MAX / a->q_bytes))
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: scratch overflows", fn);
        a->head = attn__align64(n * sizeof(attn__sdpa_plan)) +
                  attn__align64(n * sizeof(attn__fused_io));
        qall = n * a->q_bytes;
        const size_t need = b_now > b_full ? b_now : b_full;
        if (need > SIZE_MAX - a->head - qall)
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: scratch overflows", fn);
        a->scratch = a->head + qall + need;
    }
    return ATTN_OK;
}

int attn_kv_cache_workspace_size(attn_ctx *ctx, const attn_kv_cache *cache, int64_t first,
                                 const attn_tensor *q, const attn_sdpa_params *p,
                                 const attn_rope_params *rope, const attn_tensor *out,
                                 const attn_tensor *weights, size_t *bytes)
{
    if (!bytes)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    kv_attend a;
    int rc = attend_prepare(ctx, cache, first, q, p, rope, out, weights, &a);
    if (rc == ATTN_OK)
        *bytes = a.scratch;
    return rc;
}

/* Checks and plans one sequence's attention: sequence b = first + i, its queries
 * (rotated into `qrot` when rope is given); *io gets its data and *wi its weights
 * view (when weights is given). */
static int attend_setup(attn_ctx *ctx, const attn_kv_cache *c, int64_t first, int64_t i,
                        const kv_attend *a, const attn_tensor *q, const attn_sdpa_params *p,
                        const attn_rope_params *rope, attn_tensor *out, attn_tensor *weights,
                        float *qrot, attn__sdpa_plan *plan, attn__fused_io *io, attn_tensor *wi)
{
    const int64_t b = first + i, len = c->len[b];
    attn_sdpa_params pb = *p;
    pb.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_tensor qi = batch_row(q, 4, a->Bn, i), oi = batch_row(out, 4, a->Bn, i);
    attn_tensor ki = seq_tensor(c, 0, b, 0, len), vi = seq_tensor(c, 1, b, 0, len);
    attn_tensor mi, bi, li;
    if (p->mask) {
        mi = first_keys(p->mask, len);
        mi = batch_row(&mi, 4, a->Bn, i);
        pb.mask = &mi;
    }
    if (p->bias) {
        bi = first_keys(p->bias, len);
        bi = batch_row(&bi, 4, a->Bn, i);
        pb.bias = &bi;
    }
    if (p->lse) {
        li = batch_row(p->lse, 3, a->Bn, i);
        pb.lse = &li;
    }
    if (weights) {
        *wi = first_keys(weights, len);
        *wi = batch_row(wi, 4, a->Bn, i);
    }
    if (rope) {
        /* The queries sit at the last Tq positions of the sequence. A 16-bit q is
         * widened into qrot first and turned there: the rotated queries stay
         * float32 (nothing stores them, so nothing rounds them). */
        int64_t qsh[4], qst[4];
        attn__as4d(&qi, qsh, qst);
        const int64_t rs[3] = {a->Tq * c->D, c->D, 1};
        const float *qsrc = qi.data;
        const int64_t *qss = qst + 1;
        if (qi.dtype != ATTN_DTYPE_F32) {
            const uint16_t *qh = qi.data;
            for (int64_t h = 0; h < a->H; h++)
                for (int64_t t = 0; t < a->Tq; t++)
                    for (int64_t d = 0; d < c->D; d++)
                        qrot[(h * a->Tq + t) * c->D + d] =
                            widen_one(qi.dtype, qh[h * qst[1] + t * qst[2] + d * qst[3]]);
            qsrc = qrot;
            qss = rs;
        }
        attn__rope_run(rope, a->H, a->Tq, c->D, qsrc, qss, qrot, rs, len - a->Tq);
        const int64_t shape[4] = {1, a->H, a->Tq, c->D};
        attn_tensor_init(NULL, &qi, ATTN_DTYPE_F32, qrot, 4, shape);
    }
    attn__sdpa_shapes s;
    int rc = attn__sdpa_prepare_cache(ctx, &qi, &ki, &vi, &pb, &oi, weights ? wi : NULL, &s);
    if (rc == ATTN_OK)
        rc = attn__sdpa_plan_for_ctx(ctx, &s, plan);
    io->q = qi.data;
    io->k = ki.data;
    io->v = vi.data;
    io->out = oi.data;
    return rc;
}

/* One sequence's attention, run on its own in `scratch`. */
static int attend_one(attn_ctx *ctx, const attn_kv_cache *c, int64_t first, int64_t i,
                      const kv_attend *a, const attn_tensor *q, const attn_sdpa_params *p,
                      const attn_rope_params *rope, attn_tensor *out, attn_tensor *weights,
                      float *qrot, void *scratch)
{
    const int64_t len = c->len[first + i];
    attn__sdpa_plan plan;
    attn__fused_io io;
    attn_tensor wi;
    int rc = attend_setup(ctx, c, first, i, a, q, p, rope, out, weights, qrot, &plan, &io, &wi);
    if (rc == ATTN_OK)
        rc = attn__sdpa_run(ctx, &plan, io.q, io.k, io.v, io.out, weights ? wi.data : NULL,
                            scratch);
    if (rc == ATTN_OK && weights && len < c->cap) {
        /* Positions the sequence does not hold get weight 0. */
        float *w = (float *)wi.data;
        int64_t wsh[4], wst[4];
        attn__as4d(&wi, wsh, wst);
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t r = 0; r < a->Tq; r++)
                for (int64_t j = len; j < c->cap; j++)
                    w[h * wst[1] + r * wst[2] + j * wst[3]] = 0.0f;
    }
    return rc;
}

int attn_kv_cache_attend(attn_ctx *ctx, const attn_kv_cache *cache, int64_t first,
                         const attn_tensor *q, const attn_sdpa_params *p,
                         const attn_rope_params *rope, attn_tensor *out, attn_tensor *weights)
{
    attn_sdpa_params defaults;
    if (!p) {
        attn_sdpa_params_init(&defaults);
        p = &defaults;
    }
    kv_attend a;
    int rc = attend_prepare(ctx, cache, first, q, p, rope, out, weights, &a);
    if (rc != ATTN_OK)
        return rc;
    alignas(64) unsigned char small[KV_STACK_SCRATCH];
    unsigned char *scratch = small;
    if (a.scratch > sizeof small &&
        !(scratch = attn__scratch_get(ctx, a.scratch, "KV cache attention scratch")))
        return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
    if (a.batched) {
        /* Every sequence planned, then all their work items as one parallel job
         * (src/kernels/sdpa_fused.c, attn__sdpa_fused_run_batch). */
        attn__sdpa_plan *plans = (attn__sdpa_plan *)scratch;
        attn__fused_io *io =
            (attn__fused_io *)(scratch + attn__align64((size_t)a.Bn * sizeof(attn__sdpa_plan)));
        unsigned char *qrot = scratch + a.head;
        for (int64_t i = 0; i < a.Bn && rc == ATTN_OK; i++)
            rc = attend_setup(ctx, cache, first, i, &a, q, p, rope, out, NULL,
                              (float *)(qrot + (size_t)i * a.q_bytes), &plans[i], &io[i], NULL);
        if (rc == ATTN_OK)
            rc = attn__sdpa_fused_run_batch(ctx, plans, a.Bn, io,
                                            qrot + (size_t)a.Bn * a.q_bytes);
    } else {
        for (int64_t i = 0; i < a.Bn && rc == ATTN_OK; i++)
            rc = attend_one(ctx, cache, first, i, &a, q, p, rope, out, weights,
                            (float *)scratch, scratch + a.q_bytes);
    }
    if (scratch != small)
        attn__scratch_put(ctx, scratch);
    return rc;
}
