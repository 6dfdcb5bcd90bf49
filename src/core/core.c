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

/* An allocator is both functions or neither (malloc and free): memory from the
 * program's alloc given to libc's free, or malloc's to the program's free, would
 * corrupt either heap, so a half-set one is refused before anything is allocated. */
int attn__allocator_check(attn_ctx *ctx, const attn_allocator *a)
{
    if (!a || (a->alloc == NULL) == (a->free == NULL))
        return ATTN_OK;
    return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                      "ctx->allocator has %s but no %s: set both, or neither for malloc and "
                      "free",
                      a->alloc ? "alloc" : "free", a->alloc ? "free" : "alloc");
}

void *attn__alloc(attn_ctx *ctx, size_t size, const char *what)
{
    if (ctx && attn__allocator_check(ctx, &ctx->allocator) != ATTN_OK)
        return NULL;
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

/* The kept buffer (keep_workspace) starts with a copy of the allocator that gave
 * it, and goes back to that one: the program may change ctx->allocator between
 * calls (to another one, or to a half-set one that no call allocates with), and
 * the buffer must not reach a free of another heap. */
#define KEPT_HEAD sizeof(attn_allocator)

static void kept_free(void *kept)
{
    if (!kept)
        return;
    attn_allocator a;
    memcpy(&a, kept, sizeof a);
    if (a.free)
        a.free(a.user, kept);
    else
        free(kept);
}

void attn_ctx_release(attn_ctx *ctx)
{
    if (!ctx)
        return;
    kept_free(ctx->kept_);
    ctx->kept_ = NULL;
    ctx->kept_size_ = 0;
}

size_t attn__align64(size_t bytes)
{
    return bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) & ~(size_t)63;
}

/* Scratch from the allocator is over-allocated by SCRATCH_PAD bytes so that it can
 * start on a 64-byte boundary whatever the allocator returns, with the distance
 * back to the allocator's pointer stored just before it (a fresh allocation needs
 * it to free). */
#define SCRATCH_PAD (64 + sizeof(size_t))

static char *scratch_align(void *raw)
{
    uintptr_t a = ((uintptr_t)raw + sizeof(size_t) + 63) & ~(uintptr_t)63;
    char *p = (char *)raw + (a - (uintptr_t)raw);
    size_t back = (size_t)(p - (char *)raw);
    memcpy(p - sizeof back, &back, sizeof back);
    return p;
}

void *attn__scratch_get(attn_ctx *ctx, size_t bytes, const char *what)
{
    if (bytes == 0)
        bytes = 1;
    if (ctx && ctx->workspace && ctx->workspace_size >= bytes &&
        (uintptr_t)ctx->workspace % 64 == 0)
        return ctx->workspace;
    if (bytes > SIZE_MAX - SCRATCH_PAD - KEPT_HEAD) {
        attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s of %zu bytes overflows",
                   what ? what : "scratch", bytes);
        return NULL;
    }
    if (ctx && ctx->keep_workspace) {
        if (!ctx->kept_ || ctx->kept_size_ < bytes) {
            void *raw = attn__alloc(ctx, KEPT_HEAD + bytes + SCRATCH_PAD, what);
            if (!raw)
                return NULL;
            memcpy(raw, &ctx->allocator, sizeof ctx->allocator);
            kept_free(ctx->kept_);
            ctx->kept_ = raw;
            ctx->kept_size_ = bytes;
        }
        return scratch_align((char *)ctx->kept_ + KEPT_HEAD);
    }
    void *raw = attn__alloc(ctx, bytes + SCRATCH_PAD, what);
    return raw ? scratch_align(raw) : NULL;
}

void attn__scratch_put(attn_ctx *ctx, void *scratch)
{
    if (!scratch || (ctx && scratch == ctx->workspace))
        return;
    char *p = scratch;
    size_t back;
    memcpy(&back, p - sizeof back, sizeof back);
    if (ctx && ctx->kept_ && p - back == (char *)ctx->kept_ + KEPT_HEAD)
        return;
    attn__free(ctx, p - back);
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
