/*
 * fuzz_npy.c - libFuzzer target for the .npy reader (attn_npy_load).
 *
 * The input is the whole file. For any input the loader must return a status (never
 * crash, leak or read outside its buffers); a failure must leave a message in ctx.
 * An array it accepts must be what the header says it is (1..4 dims, sizes >= 1,
 * C-contiguous) with every byte readable, and must survive a round trip through
 * attn_npy_save and attn_npy_load bit for bit. Half of the inputs run with one
 * allocation failing (see fuzz_ctx_init): the loader must then fail cleanly.
 */
/* fuzz_util.h first: it asks for _GNU_SOURCE (memfd_create) before any header. */
#include "fuzz_util.h"

#include "attn.h"

#include <string.h>

static void round_trip(const attn_array *a)
{
    static char path[4200];
    if (!path[0])
        snprintf(path, sizeof(path), "%s/npy_round_trip.npy", fuzz_work_dir());
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st = attn_npy_save(&ctx, path, &a->tensor);
    FUZZ_ASSERT(st == ATTN_OK);
    attn_array b = {0};
    st = attn_npy_load(&ctx, path, &b);
    FUZZ_ASSERT(st == ATTN_OK);
    FUZZ_ASSERT(b.tensor.dtype == a->tensor.dtype);
    FUZZ_ASSERT(b.tensor.ndim == a->tensor.ndim);
    for (int i = 0; i < a->tensor.ndim; i++)
        FUZZ_ASSERT(b.tensor.shape[i] == a->tensor.shape[i]);
    size_t bytes = (size_t)attn_tensor_numel(&a->tensor) * attn_dtype_size(a->tensor.dtype);
    FUZZ_ASSERT(memcmp(a->tensor.data, b.tensor.data, bytes) == 0);
    attn_array_free(&ctx, &b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_bytes_as_file(data, size);
    attn_ctx ctx;
    fuzz_alloc fa;
    fuzz_ctx_init(&ctx, &fa, data, size);
    attn_array a;
    int st = attn_npy_load(&ctx, path, &a);
    if (st != ATTN_OK) {
        FUZZ_CHECK_FAILURE(ctx, st);
        FUZZ_ASSERT(a.buffer == NULL);
        FUZZ_ASSERT(st != ATTN_STATUS_NO_MEMORY || fa.failed);
        return 0;
    }
    const attn_tensor *t = &a.tensor;
    FUZZ_ASSERT(t->ndim >= 1 && t->ndim <= ATTN_MAX_DIMS);
    for (int i = 0; i < t->ndim; i++)
        FUZZ_ASSERT(t->shape[i] >= 1);
    FUZZ_ASSERT(attn_tensor_is_contiguous(t));
    FUZZ_ASSERT(attn_tensor_check(&ctx, t, "loaded") == ATTN_OK);
    int64_t n = attn_tensor_numel(t);
    FUZZ_ASSERT(n >= 1);
    size_t es = attn_dtype_size(t->dtype);
    FUZZ_ASSERT(es > 0);
    /* The data can be no larger than the file (float16 widens to float32: 2x). */
    FUZZ_ASSERT((uint64_t)n <= (uint64_t)size);
    fuzz_sink(fuzz_touch(t->data, (size_t)n * es));
    round_trip(&a);
    attn_array_free(&ctx, &a);
    FUZZ_ASSERT(a.buffer == NULL);
    return 0;
}
