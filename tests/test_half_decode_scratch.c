/*
 * test_half_decode_scratch.c - the 16-bit row path's float32 copies of K and V
 * (src/kernels/sdpa_fused.c, half_kv_rows) are sized so that the scratch planned
 * for a 16-bit KV cache's full capacity also serves every shorter step.
 *
 * What it protects: a 16-bit decoding step widens its keys into per-worker copies
 * of one chunk (HALF_CHUNK_BYTES of K and V: 512 keys at D = Dv = 64) on the
 * split-key form, but into one copy of all its keys when it is not split (fewer
 * than two chunks of keys, and (batch, key/value head) pairs enough that the
 * float32 planner does not split either). With one thread, a plan for the
 * capacity (split) would hold one chunk's copy, 512 keys, while a step at 1000
 * keys (not split) needs 1000: attn_kv_cache_workspace_size, asked at the first
 * step, must cover both, so the step at 1000 keys takes no allocation. Since
 * issue 16 a split call whose items read the cache in place (AVX-512, AVX2) plans
 * no copy at all, so the capacity's plan covers even less: the cache plans the
 * longest unsplit length too (src/attention/kv_cache.c, longest_unsplit).
 *
 * And the same for batched steps of many query rows (a speculative-decoding step
 * of 12 tokens over 3 sequences, the 16-bit tile path run as one parallel job:
 * src/kernels/sdpa_fused.c, half_head_item), and for one sequence's such steps
 * (its items widen one key/value head each into a copy per worker, sized by the
 * keys): the workspace asked for at the first step serves every later one, whose
 * keys (and workers' copies of them) grow.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>

static void test_unsplit_step_fits(attn_dtype dt)
{
    /* 64 key/value heads: as many pairs as the float32 planner's split target, so
     * a step under two chunks of keys is not split. */
    enum { HKV = 64, CAP = 1100, D = 64, LATER = 999 };
    char what[240];
    snprintf(what, sizeof what,
             "%s cache, 1 thread: the workspace asked for at 1 key serves a step at 1000 "
             "keys (unsplit, more keys than one chunk) without an allocation",
             attn_dtype_name(dt));
    TEST(what);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 1;
    ctx.impl = ATTN_IMPL_FUSED;
    const attn_kv_cache_config cfg = {1, HKV, CAP, D, D, dt};
    attn_kv_cache *c = NULL;
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_OK);
    float *kv = malloc((size_t)HKV * LATER * D * sizeof(float));
    float *qb = malloc((size_t)HKV * D * sizeof(float));
    if (!c || !kv || !qb) {
        CHECK(!"the cache and the test's arrays are allocated");
        free(kv), free(qb), attn_kv_cache_free(&ctx, c);
        return;
    }
    tu_fill(kv, (int64_t)HKV * D, 3);
    attn_tensor k1 = tu_tensor4(kv, 1, HKV, 1, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k1, &k1, NULL), ATTN_OK);
    tu_fill(qb, (int64_t)HKV * D, 4);
    attn_tensor q = tu_tensor4(qb, 1, HKV, 1, D), qh, oh;
    CHECK_INT(attn_tensor_alloc(&ctx, &qh, dt, 4, q.shape), ATTN_OK);
    CHECK_INT(attn_tensor_convert(&ctx, &q, &qh), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &oh, dt, 4, q.shape), ATTN_OK);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    size_t bytes = 0;
    CHECK_INT(attn_kv_cache_workspace_size(&ctx, c, 0, &qh, &p, NULL, &oh, NULL, &bytes),
              ATTN_OK);
    /* The planned bytes, rounded up to the multiple of 64 aligned_alloc wants:
     * under AddressSanitizer a write past them fails the test. */
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    tu_fill(kv, (int64_t)HKV * LATER * D, 5);
    attn_tensor kl = tu_tensor4(kv, 1, HKV, LATER, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &kl, &kl, NULL), ATTN_OK);

    ctx.workspace = ws;
    ctx.workspace_size = bytes;
    tu_counting count = {0};
    const attn_allocator orig = ctx.allocator;
    ctx.allocator.alloc = tu_count_alloc;
    ctx.allocator.free = tu_count_free;
    ctx.allocator.user = &count;
    CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qh, &p, NULL, &oh, NULL), ATTN_OK);
    if (count.allocs != 0)
        fprintf(stderr, "   %lld allocations at 1000 keys with a workspace of %zu bytes\n",
                count.allocs, bytes);
    CHECK_INT(count.allocs, 0);
    ctx.allocator = orig;
    ctx.workspace = NULL;
    ctx.workspace_size = 0;
    free(ws), free(kv), free(qb);
    attn_tensor_free(&ctx, &qh), attn_tensor_free(&ctx, &oh);
    attn_kv_cache_free(&ctx, c);
    attn_ctx_release(&ctx);
}

/* The scratch holds what the chosen path uses: S5's 16-bit decoding step (H 32,
 * 4096 keys, D 128, 2 threads) is split into chunks of 256 keys; the scalar
 * path widens each into its worker's float32 copy (2 workers' copies of 256 keys,
 * at least 2 x 256 x (128 + 128) x 4 bytes = 512 KiB), while avx2 and avx512 read
 * the chunks in place, so their plans hold no copy and ask for at least that much
 * less, the kernel's own scratch being the same for the three. */
static void test_direct_plans_no_copy(attn_dtype dt)
{
    enum { H = 32, TK = 4096, D = 128 };
    char what[260];
    snprintf(what, sizeof what,
             "%s decoding step on S5's shape: avx2 and avx512 (K and V read in place) plan at "
             "least 512 KiB less scratch than scalar (a float32 copy of each chunk)",
             attn_dtype_name(dt));
    TEST(what);
    const int64_t qs[4] = {1, H, 1, D}, ks[4] = {1, H, TK, D};
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = 2;
    ctx.impl = ATTN_IMPL_FUSED;
    attn_tensor q, k, o;
    CHECK_INT(attn_tensor_alloc(&ctx, &q, dt, 4, qs), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &o, dt, 4, qs), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &k, dt, 4, ks), ATTN_OK);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    size_t scalar = 0;
    ctx.arch = ATTN_ARCH_SCALAR;
    CHECK_INT(attn_sdpa_workspace_size(&ctx, &q, &k, &k, &p, &o, NULL, &scalar), ATTN_OK);
    static const attn_arch ARCHS[2] = {ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int ai = 0; ai < 2; ai++) {
        if (!attn_arch_supported(ARCHS[ai]))
            continue;
        ctx.arch = ARCHS[ai];
        size_t bytes = 0;
        CHECK_INT(attn_sdpa_workspace_size(&ctx, &q, &k, &k, &p, &o, NULL, &bytes), ATTN_OK);
        if (!(bytes + 512 * 1024 <= scalar))
            fprintf(stderr, "   %s: %zu bytes of scratch, scalar %zu\n", attn_arch_name(ARCHS[ai]),
                    bytes, scalar);
        CHECK(bytes + 512 * 1024 <= scalar);
    }
    attn_tensor_free(&ctx, &q), attn_tensor_free(&ctx, &o), attn_tensor_free(&ctx, &k);
    attn_ctx_release(&ctx);
}

/* one: the attends are sequence 0's alone (a single call of the tile path, whose
 * items widen one key/value head each into a copy per worker, planned for the
 * capacity); else the three sequences' batch. */
static void test_tile_steps(attn_dtype dt, int one)
{
    enum { B = 3, H = 4, HKV = 2, CAP = 700, D = 48, TQ = 12, STEPS = 5 };
    static const int64_t pre[B] = {12, 300, 580};
    static const attn_arch ARCHS[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    static float kb[HKV * 580 * D], qb[B * H * TQ * D];
    char what[260];
    snprintf(what, sizeof what,
             "%s cache, 3 sequences of 12, 300 and 580 keys, steps of 12 tokens (the tile "
             "path, %s): the workspace asked for at the first step serves 5 steps "
             "without an allocation, scalar, avx2 and avx512, 1 and 2 threads",
             attn_dtype_name(dt), one ? "sequence 0 alone, from 12 keys" : "batched");
    TEST(what);
    for (int ai = 0; ai < 3; ai++)
        for (int threads = 1; threads <= 2; threads++) {
            if (!attn_arch_supported(ARCHS[ai]))
                continue;
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.threads = threads;
            ctx.impl = ATTN_IMPL_FUSED;
            ctx.arch = ARCHS[ai];
            const attn_kv_cache_config cfg = {B, HKV, CAP, D, D, dt};
            attn_kv_cache *c = NULL;
            CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_OK);
            for (int64_t b = 0; b < B && c; b++) {
                tu_fill(kb, HKV * pre[b] * D, 20 + (uint64_t)b);
                attn_tensor k = tu_tensor4(kb, 1, HKV, pre[b], D);
                CHECK_INT(attn_kv_cache_append(&ctx, c, b, &k, &k, NULL), ATTN_OK);
            }
            tu_fill(qb, B * H * TQ * D, 30);
            attn_tensor q = tu_tensor4(qb, one ? 1 : B, H, TQ, D), qh, oh;
            CHECK_INT(attn_tensor_alloc(&ctx, &qh, dt, 4, q.shape), ATTN_OK);
            CHECK_INT(attn_tensor_convert(&ctx, &q, &qh), ATTN_OK);
            CHECK_INT(attn_tensor_alloc(&ctx, &oh, dt, 4, q.shape), ATTN_OK);
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            size_t bytes = 0;
            CHECK_INT(attn_kv_cache_workspace_size(&ctx, c, 0, &qh, &p, NULL, &oh, NULL, &bytes),
                      ATTN_OK);
            /* The planned bytes, rounded up to the multiple of 64 aligned_alloc wants:
             * under AddressSanitizer a write past them fails the test. */
            void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
            ctx.workspace = ws;
            ctx.workspace_size = bytes;
            tu_counting count = {0};
            const attn_allocator orig = ctx.allocator;
            ctx.allocator.alloc = tu_count_alloc;
            ctx.allocator.free = tu_count_free;
            ctx.allocator.user = &count;
            for (int st = 0; st < STEPS && c; st++) {
                tu_fill(kb, B * HKV * TQ * D, 40 + (uint64_t)st);
                /* [B, HKV, TQ, D]: each sequence's 12 new tokens. */
                attn_tensor k = tu_tensor4(kb, B, HKV, TQ, D);
                CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k, &k, NULL), ATTN_OK);
                CHECK_INT(attn_kv_cache_attend(&ctx, c, 0, &qh, &p, NULL, &oh, NULL), ATTN_OK);
            }
            if (count.allocs != 0)
                fprintf(stderr, "   %s, %d threads: %lld allocations with a workspace of %zu bytes\n",
                        attn_arch_name(ARCHS[ai]), threads, count.allocs, bytes);
            CHECK_INT(count.allocs, 0);
            ctx.allocator = orig;
            ctx.workspace = NULL;
            ctx.workspace_size = 0;
            free(ws);
            attn_tensor_free(&ctx, &qh), attn_tensor_free(&ctx, &oh);
            attn_kv_cache_free(&ctx, c);
            attn_ctx_release(&ctx);
        }
}

int main(void)
{
    test_unsplit_step_fits(ATTN_DTYPE_BF16);
    test_unsplit_step_fits(ATTN_DTYPE_F16);
    test_direct_plans_no_copy(ATTN_DTYPE_BF16);
    test_direct_plans_no_copy(ATTN_DTYPE_F16);
    test_tile_steps(ATTN_DTYPE_BF16, 0);
    test_tile_steps(ATTN_DTYPE_F16, 0);
    test_tile_steps(ATTN_DTYPE_BF16, 1);
    test_tile_steps(ATTN_DTYPE_F16, 1);
    return check_summary("test_half_decode_scratch");
}
