/*
 * attn_internal.h - helpers shared by the library's source files; not installed.
 *
 * Names here start with attn__ (two underscores): internal, may change at any time.
 */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include "attn.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define ATTN__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ATTN__PRINTF(a, b)
#endif

/* Records status and a formatted message in ctx (when ctx is not NULL) and returns
 * status, so a failing check reads `return attn__fail(ctx, ATTN_STATUS_..., "...")`. */
int attn__fail(attn_ctx *ctx, int status, const char *fmt, ...) ATTN__PRINTF(3, 4);

/* Allocation through ctx's allocator (malloc/free when ctx is NULL, or when both
 * of its functions are NULL). attn__alloc records ATTN_STATUS_NO_MEMORY with
 * `what` in the message when it fails, and refuses an allocator with one of its
 * two functions set and not the other (INVALID_ARGUMENT, attn__allocator_check)
 * before it asks anyone for memory. attn__alloc never returns memory for size 0:
 * it asks for 1 byte instead. After a failed attn__alloc or attn__scratch_get,
 * return attn__alloc_status(ctx): the status it recorded. */
void *attn__alloc(attn_ctx *ctx, size_t size, const char *what);
void attn__free(attn_ctx *ctx, void *ptr);
int attn__allocator_check(attn_ctx *ctx, const attn_allocator *a);
static inline int attn__alloc_status(const attn_ctx *ctx)
{
    return ctx ? ctx->status : ATTN_STATUS_NO_MEMORY;
}

/* Scratch for one call, `bytes` long and 64-byte aligned, taken as attn_ctx
 * describes: the caller's workspace, the context's kept buffer, or a fresh
 * allocation. NULL (NO_MEMORY recorded, naming `what`) on failure. Give it back
 * with attn__scratch_put before the call returns; only a fresh allocation is
 * freed. Public entry points take their scratch once and hand slices of it to the
 * unchecked kernels, which never allocate. */
void *attn__scratch_get(attn_ctx *ctx, size_t bytes, const char *what);
void attn__scratch_put(attn_ctx *ctx, void *scratch);

/* Rounds a byte count up to a multiple of 64 (0 when that overflows). */
size_t attn__align64(size_t bytes);

/* Memory shared between tensors (src/core/overlap.c).
 * attn__overlap: 1 when a and b share at least one byte (exact for views of
 * ordinary arrays: slices, transposes, column blocks; a view that overlaps itself
 * counts as overlapping anything its byte range meets). NULL or dataless: 0.
 * attn__same_view: 1 when a and b describe exactly the same elements in the same
 * order (same data, dtype, shape and strides).
 * attn__no_overlap: OK, or INVALID_ARGUMENT with "FN: OUT and IN share memory ..."
 * when they overlap - unless same_view_ok and they are the same view (an in-place
 * call the function supports). */
int attn__overlap(const attn_tensor *a, const attn_tensor *b);
int attn__same_view(const attn_tensor *a, const attn_tensor *b);
int attn__no_overlap(attn_ctx *ctx, const char *fn, const attn_tensor *out,
                     const char *out_name, const attn_tensor *in, const char *in_name,
                     int same_view_ok);
/* The three outputs of an attention call (out, weights, lse; NULL entries skipped)
 * against n_in inputs (NULL entries skipped), then against each other, so that a
 * message names an input whenever one is involved; out may be ins[0] itself (the
 * in-place call). OK, or the first overlap's attn__no_overlap failure. */
int attn__outputs_apart(attn_ctx *ctx, const char *fn, const attn_tensor *const outs[3],
                        const char *const out_names[3], const attn_tensor *const *ins,
                        const char *const *in_names, int n_in);

/* a * b into *out, or 0 if it overflows int64 (a, b >= 0). Returns 1 on success. */
int attn__mul_i64(int64_t a, int64_t b, int64_t *out);
/* Bytes for n elements of `elem` bytes, or 0 if that overflows size_t. */
int attn__bytes(int64_t n, size_t elem, size_t *out);

/* The shape of t as a Python tuple, in a caller buffer of at least 96 bytes. */
const char *attn__shape_str(const attn_tensor *t, char *buf, size_t size);

/* Views t as 4-D by prepending sizes of 1 (stride 0 is never used for them since the
 * size is 1). t must have 1 to 4 dims. */
void attn__as4d(const attn_tensor *t, int64_t shape[4], int64_t stride[4]);

/* Element offset of index (i0, i1, i2, i3) for a 4-D view. */
static inline int64_t attn__off4(const int64_t stride[4], int64_t i0, int64_t i1,
                                 int64_t i2, int64_t i3)
{
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
}

/* A mask [.., Tq, Tk] broadcast to [B, H, Tq, Tk] as a 4-D view whose broadcast axes
 * have stride 0, so mask(b, h, i, j) = data[attn__off4(stride, b, h, i, j)]. */
typedef struct attn__mask4 {
    const uint8_t *data; /* NULL when there is no explicit mask */
    int64_t stride[4];
} attn__mask4;

/* Checks that `mask` (may be NULL) broadcasts to [B, H, Tq, Tk] and fills m. */
int attn__mask4_init(attn_ctx *ctx, const attn_tensor *mask, int64_t B, int64_t H,
                     int64_t Tq, int64_t Tk, attn__mask4 *m);

/* Checks attn_linear's arguments (dtypes, shapes, strides); shared by every
 * implementation of the projection. */
int attn__linear_check(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W,
                       const attn_tensor *b, const attn_tensor *y);

#endif /* ATTN_INTERNAL_H */
