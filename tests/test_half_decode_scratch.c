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
 * step, must cover both, so the step at 1000 keys takes no allocation.
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
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
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

int main(void)
{
    test_unsplit_step_fits(ATTN_DTYPE_BF16);
    test_unsplit_step_fits(ATTN_DTYPE_F16);
    return check_summary("test_half_decode_scratch");
}
