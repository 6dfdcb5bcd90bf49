/*
 * core.c - status names, the context, the allocator and error messages.
 */
#include "attn_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *attn_status_name(int status)
{
    switch (status) {
    case ATTN_OK: return "OK";
    case ATTN_STATUS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case ATTN_STATUS_SHAPE_MISMATCH: return "SHAPE_MISMATCH";
    case ATTN_STATUS_MASK_BROADCAST: return "MASK_BROADCAST";
    case ATTN_STATUS_EMPTY_ROW: return "EMPTY_ROW";
    case ATTN_STATUS_OVERFLOW: return "OVERFLOW";
    case ATTN_STATUS_NO_MEMORY: return "NO_MEMORY";
    case ATTN_STATUS_DTYPE: return "DTYPE";
    case ATTN_STATUS_IO: return "IO";
    case ATTN_STATUS_FORMAT: return "FORMAT";
    case ATTN_STATUS_UNSUPPORTED: return "UNSUPPORTED";
    default: return "UNKNOWN";
    }
}

const char *attn_strerror(int status)
{
    switch (status) {
    case ATTN_OK: return "success";
    case ATTN_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case ATTN_STATUS_SHAPE_MISMATCH: return "shapes do not fit together";
    case ATTN_STATUS_MASK_BROADCAST: return "mask does not broadcast to the scores";
    case ATTN_STATUS_EMPTY_ROW: return "a query row has all its keys masked";
    case ATTN_STATUS_OVERFLOW: return "sizes overflow";
    case ATTN_STATUS_NO_MEMORY: return "out of memory";
    case ATTN_STATUS_DTYPE: return "unsupported element type";
    case ATTN_STATUS_IO: return "input/output error";
    case ATTN_STATUS_FORMAT: return "malformed file";
    case ATTN_STATUS_UNSUPPORTED: return "not supported by this build";
    default: return "unknown status";
    }
}

static void *default_alloc(void *user, size_t size)
{
    (void)user;
    return malloc(size);
}

static void default_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

void attn_ctx_init(attn_ctx *ctx)
{
    if (!ctx)
        return;
    memset(ctx, 0, sizeof *ctx);
    ctx->allocator.alloc = default_alloc;
    ctx->allocator.free = default_free;
    ctx->threads = 0;
    ctx->impl = ATTN_IMPL_AUTO;
    ctx->arch = ATTN_ARCH_AUTO;
    ctx->status = ATTN_OK;
}

int attn__fail(attn_ctx *ctx, int status, const char *fmt, ...)
{
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->message, sizeof ctx->message, fmt, ap);
        va_end(ap);
        ctx->status = status;
    }
    return status;
}

void *attn__alloc(attn_ctx *ctx, size_t size, const char *what)
{
    if (size == 0)
        size = 1;
    void *p;
    if (ctx && ctx->allocator.alloc)
        p = ctx->allocator.alloc(ctx->allocator.user, size);
    else
        p = malloc(size);
    if (!p)
        attn__fail(ctx, ATTN_STATUS_NO_MEMORY, "out of memory allocating %zu bytes for %s",
                   size, what ? what : "a buffer");
    return p;
}

void attn__free(attn_ctx *ctx, void *ptr)
{
    if (!ptr)
        return;
    if (ctx && ctx->allocator.free)
        ctx->allocator.free(ctx->allocator.user, ptr);
    else
        free(ptr);
}

int attn__mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0)
        return 0;
    if (a != 0 && b > INT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

int attn__bytes(int64_t n, size_t elem, size_t *out)
{
    if (n < 0 || elem == 0)
        return 0;
    if ((uint64_t)n > (uint64_t)SIZE_MAX / elem)
        return 0;
    *out = (size_t)n * elem;
    return 1;
}
