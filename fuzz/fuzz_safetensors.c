/*
 * fuzz_safetensors.c - libFuzzer target for the .safetensors reader
 * (attn_safetensors_open / count / name / has / get) and, for what it accepts, the
 * writer (attn_safetensors_save).
 *
 * The input is the whole file. Open must return a status for any input (never crash,
 * leak or read outside its buffers), with a message on failure. For a file it opens:
 * every name is found again by attn_safetensors_has, names past the count are NULL,
 * and every tensor is read with attn_safetensors_get, which either fails with a
 * message or gives a C-contiguous array whose bytes are all readable. The readable
 * tensors are then saved with attn_safetensors_save, and reopening that file must
 * give the same names, shapes and bytes. Half of the inputs run with one allocation
 * failing (see fuzz_ctx_init): every call must then fail cleanly or succeed.
 */
/* fuzz_util.h first: it asks for _GNU_SOURCE (memfd_create) before any header. */
#include "fuzz_util.h"

#include "attn.h"

#include <string.h>

/* The most tensors one input round-trips; more only costs time. */
#define MAX_KEEP 64

static void round_trip(const char **names, const attn_array *arrays, int n)
{
    static char path[4200];
    if (!path[0])
        snprintf(path, sizeof(path), "%s/st_round_trip.safetensors", fuzz_work_dir());
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_tensor t[MAX_KEEP];
    for (int i = 0; i < n; i++)
        t[i] = arrays[i].tensor;
    int st = attn_safetensors_save(&ctx, path, names, t, n);
    if (st != ATTN_OK) {
        /* An empty name is legal in the format but refused by the writer. */
        int empty = 0;
        for (int i = 0; i < n; i++)
            empty |= names[i][0] == '\0';
        FUZZ_ASSERT(empty && st == ATTN_STATUS_INVALID_ARGUMENT);
        return;
    }
    attn_safetensors *back = NULL;
    st = attn_safetensors_open(&ctx, path, &back);
    FUZZ_ASSERT(st == ATTN_OK);
    FUZZ_ASSERT(attn_safetensors_count(back) == n);
    for (int i = 0; i < n; i++) {
        FUZZ_ASSERT(strcmp(attn_safetensors_name(back, i), names[i]) == 0);
        attn_array b = {0};
        FUZZ_ASSERT(attn_safetensors_get(&ctx, back, names[i], &b) == ATTN_OK);
        FUZZ_ASSERT(b.tensor.dtype == t[i].dtype && b.tensor.ndim == t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++)
            FUZZ_ASSERT(b.tensor.shape[d] == t[i].shape[d]);
        size_t bytes = (size_t)attn_tensor_numel(&t[i]) * attn_dtype_size(t[i].dtype);
        FUZZ_ASSERT(memcmp(b.tensor.data, t[i].data, bytes) == 0);
        attn_array_free(&ctx, &b);
    }
    attn_safetensors_close(&ctx, back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_bytes_as_file(data, size);
    attn_ctx ctx;
    fuzz_alloc fa;
    fuzz_ctx_init(&ctx, &fa, data, size);
    attn_safetensors *st = NULL;
    int rc = attn_safetensors_open(&ctx, path, &st);
    if (rc != ATTN_OK) {
        FUZZ_CHECK_FAILURE(ctx, rc);
        FUZZ_ASSERT(st == NULL);
        FUZZ_ASSERT(rc != ATTN_STATUS_NO_MEMORY || fa.failed);
        return 0;
    }
    int64_t n = attn_safetensors_count(st);
    FUZZ_ASSERT(n >= 0);
    FUZZ_ASSERT(attn_safetensors_name(st, -1) == NULL);
    FUZZ_ASSERT(attn_safetensors_name(st, n) == NULL);
    const char *keep_names[MAX_KEEP];
    attn_array keep[MAX_KEEP];
    int nkeep = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name = attn_safetensors_name(st, i);
        FUZZ_ASSERT(name != NULL);
        FUZZ_ASSERT(attn_safetensors_has(st, name) == 1);
        attn_array a;
        rc = attn_safetensors_get(&ctx, st, name, &a);
        if (rc != ATTN_OK) {
            FUZZ_CHECK_FAILURE(ctx, rc);
            FUZZ_ASSERT(a.buffer == NULL);
            FUZZ_ASSERT(rc != ATTN_STATUS_NO_MEMORY || fa.failed);
            continue;
        }
        const attn_tensor *t = &a.tensor;
        FUZZ_ASSERT(t->ndim >= 1 && t->ndim <= ATTN_MAX_DIMS);
        FUZZ_ASSERT(attn_tensor_is_contiguous(t));
        int64_t numel = attn_tensor_numel(t);
        FUZZ_ASSERT(numel >= 1 && (uint64_t)numel <= (uint64_t)size);
        fuzz_sink(fuzz_touch(t->data, (size_t)numel * attn_dtype_size(t->dtype)));
        if (nkeep < MAX_KEEP) {
            keep_names[nkeep] = name;
            keep[nkeep++] = a;
        } else {
            attn_array_free(&ctx, &a);
        }
    }
    /* A name that is not in the file is refused with a message. */
    attn_array none;
    rc = attn_safetensors_get(&ctx, st, "attn fuzz: no such tensor \x01", &none);
    if (!attn_safetensors_has(st, "attn fuzz: no such tensor \x01"))
        FUZZ_CHECK_FAILURE(ctx, rc);
    else if (rc == ATTN_OK)
        attn_array_free(&ctx, &none);
    if (nkeep > 0 && !fa.failed)
        round_trip(keep_names, keep, nkeep);
    for (int i = 0; i < nkeep; i++)
        attn_array_free(&ctx, &keep[i]);
    attn_safetensors_close(&ctx, st);
    return 0;
}
