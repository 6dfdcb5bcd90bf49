/*
 * io_common.c - what the file-format modules share: a size-aware reader, element
 * conversion and the owned array. The writer is src/io/output.c.
 */
#define _POSIX_C_SOURCE 200809L

#include "half.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- the owned array ---------------------------------------------------------- */

void attn_array_free(attn_ctx *ctx, attn_array *a)
{
    if (!a)
        return;
    if (a->buffer)
        attn__free(ctx, a->buffer);
    memset(a, 0, sizeof(*a));
}

int attn__array_alloc(attn_ctx *ctx, attn_array *a, attn_dtype dtype, int ndim,
                      const int64_t *shape, const char *path)
{
    memset(a, 0, sizeof(*a));
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (!attn__mul_i64(n, shape[i], &n))
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "%s: the number of elements overflows 64 bits", path);
    }
    size_t bytes;
    if (!attn__bytes(n, attn_dtype_size(dtype), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "%s: %lld elements of %s do not fit in memory", path,
                          (long long)n, attn_dtype_name(dtype));
    void *buf = attn__alloc(ctx, bytes, path);
    if (!buf)
        return attn__alloc_status(ctx);
    int st = attn_tensor_init(ctx, &a->tensor, dtype, buf, ndim, shape);
    if (st != ATTN_OK) {
        attn__free(ctx, buf);
        memset(a, 0, sizeof(*a));
        return st;
    }
    a->buffer = buf;
    return ATTN_OK;
}

/* ---- reading ------------------------------------------------------------------ */

int attn__rfile_open(attn_ctx *ctx, attn__rfile *rf, const char *path)
{
    memset(rf, 0, sizeof(*rf));
    rf->path = path;
    if (!path)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "no file name given");
    /* O_NONBLOCK so that opening a FIFO nobody writes to returns at once instead of
     * waiting for a writer forever: only regular files are read (the readers seek),
     * so a FIFO is refused just below, and for a regular file the flag changes
     * nothing. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot open: %s", path,
                          strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        /* The C library could not allocate the stream: out of memory, not a bad file. */
        if (e == ENOMEM)
            return attn__fail(ctx, ATTN_STATUS_NO_MEMORY,
                              "%s: out of memory opening a stream on it", path);
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot open: %s", path, strerror(e));
    }
    rf->f = f;
    rf->size = (uint64_t)sb.st_size;
    return ATTN_OK;
}

int attn__rfile_read(attn_ctx *ctx, attn__rfile *rf, uint64_t offset, void *buf,
                     uint64_t n, const char *what)
{
    /* Checked before any read: a lying header never makes us read (or allocate)
     * more than the file holds. */
    if (offset > rf->size || n > rf->size - offset)
        return attn__fail(ctx, ATTN_STATUS_FORMAT,
                          "%s: truncated: the %s needs bytes %llu..%llu but the file "
                          "has %llu bytes",
                          rf->path, what, (unsigned long long)offset,
                          (unsigned long long)(offset + n > offset ? offset + n : UINT64_MAX),
                          (unsigned long long)rf->size);
    if (n == 0)
        return ATTN_OK;
    if (offset > (uint64_t)INT64_MAX || fseeko(rf->f, (off_t)offset, SEEK_SET) != 0)
        return attn__fail(ctx, ATTN_STATUS_IO, "%s: cannot seek to byte %llu: %s",
                          rf->path, (unsigned long long)offset, strerror(errno));
    unsigned char *p = buf;
    uint64_t left = n;
    while (left > 0) {
        size_t chunk = left > ((uint64_t)1 << 30) ? ((size_t)1 << 30) : (size_t)left;
        size_t got = fread(p, 1, chunk, rf->f);
        if (got != chunk) {
            if (ferror(rf->f))
                return attn__fail(ctx, ATTN_STATUS_IO, "%s: read error in the %s: %s",
                                  rf->path, what, strerror(errno));
            return attn__fail(ctx, ATTN_STATUS_FORMAT,
                              "%s: truncated: the file ended inside the %s", rf->path,
                              what);
        }
        p += got;
        left -= got;
    }
    return ATTN_OK;
}

int attn__rfile_read_elems(attn_ctx *ctx, attn__rfile *rf, uint64_t offset, attn__elem e,
                         int big_endian, int64_t n, void *dst)
{
    size_t es = attn__elem_size(e);
    size_t ds = attn_dtype_size(attn__elem_dtype(e));
    int host_big = 0;
    {
        const uint16_t one = 1;
        unsigned char b;
        memcpy(&b, &one, 1);
        host_big = b == 0;
    }
    /* Same layout as the host: read straight into the result. */
    if ((e == ATTN__EL_F32 || e == ATTN__EL_I32 || e == ATTN__EL_I64 ||
         e == ATTN__EL_U8 || e == ATTN__EL_F16_KEEP || e == ATTN__EL_BF16_KEEP) &&
        big_endian == host_big)
        return attn__rfile_read(ctx, rf, offset, dst, (uint64_t)n * es, "array data");

    /* Otherwise convert through a staging buffer of at most 1 MiB. */
    int64_t chunk = (int64_t)((1u << 20) / es);
    if (chunk > n)
        chunk = n;
    unsigned char *stage = attn__alloc(ctx, (size_t)chunk * es, "staging buffer");
    if (!stage)
        return attn__alloc_status(ctx);
    int st = ATTN_OK;
    for (int64_t done = 0; done < n && st == ATTN_OK; done += chunk) {
        int64_t m = n - done < chunk ? n - done : chunk;
        st = attn__rfile_read(ctx, rf, offset + (uint64_t)done * es, stage,
                              (uint64_t)m * es, "array data");
        if (st == ATTN_OK)
            attn__elem_convert(e, big_endian, stage, (unsigned char *)dst + done * ds,
                               m);
    }
    attn__free(ctx, stage);
    return st;
}

void attn__rfile_close(attn__rfile *rf)
{
    if (rf && rf->f) {
        fclose(rf->f);
        rf->f = NULL;
    }
}

/* ---- numbers ------------------------------------------------------------------ */

size_t attn__elem_size(attn__elem e)
{
    switch (e) {
    case ATTN__EL_F16:
    case ATTN__EL_BF16:
    case ATTN__EL_F16_KEEP:
    case ATTN__EL_BF16_KEEP:
        return 2;
    case ATTN__EL_F32:
    case ATTN__EL_I32:
        return 4;
    case ATTN__EL_F64:
    case ATTN__EL_I64:
        return 8;
    case ATTN__EL_U8:
        return 1;
    }
    return 0;
}

attn_dtype attn__elem_dtype(attn__elem e)
{
    switch (e) {
    case ATTN__EL_I32:
        return ATTN_DTYPE_I32;
    case ATTN__EL_I64:
        return ATTN_DTYPE_I64;
    case ATTN__EL_U8:
        return ATTN_DTYPE_BOOL;
    case ATTN__EL_F16_KEEP:
        return ATTN_DTYPE_F16;
    case ATTN__EL_BF16_KEEP:
        return ATTN_DTYPE_BF16;
    default:
        return ATTN_DTYPE_F32;
    }
}

/* Loads an element of `size` bytes in the file's byte order as an unsigned number. */
static uint64_t load_uint(const unsigned char *p, size_t size, int big_endian)
{
    uint64_t v = 0;
    for (size_t b = 0; b < size; b++) {
        size_t k = big_endian ? b : size - 1 - b;
        v = (v << 8) | p[k];
    }
    return v;
}

void attn__elem_convert(attn__elem e, int big_endian, const unsigned char *src,
                        void *dst, int64_t n)
{
    size_t es = attn__elem_size(e);
    if (e == ATTN__EL_U8) {
        memcpy(dst, src, (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint64_t v = load_uint(src + (size_t)i * es, es, big_endian);
        switch (e) {
        case ATTN__EL_F16:
            ((float *)dst)[i] = attn__f16_to_f32((uint16_t)v);
            break;
        case ATTN__EL_BF16:
            ((float *)dst)[i] = attn__bf16_to_f32((uint16_t)v);
            break;
        case ATTN__EL_F32: {
            uint32_t b32 = (uint32_t)v;
            memcpy((float *)dst + i, &b32, 4);
            break;
        }
        case ATTN__EL_F64: {
            double d;
            memcpy(&d, &v, 8);
            ((float *)dst)[i] = (float)d; /* round to nearest; overflow gives inf */
            break;
        }
        case ATTN__EL_I32: {
            uint32_t b32 = (uint32_t)v;
            memcpy((int32_t *)dst + i, &b32, 4);
            break;
        }
        case ATTN__EL_I64:
            memcpy((int64_t *)dst + i, &v, 8);
            break;
        case ATTN__EL_F16_KEEP:
        case ATTN__EL_BF16_KEEP:
            ((uint16_t *)dst)[i] = (uint16_t)v;
            break;
        case ATTN__EL_U8:
            break;
        }
    }
}
