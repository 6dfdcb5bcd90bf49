/*
 * io_internal.h - helpers shared by the file-format modules (npy.c, safetensors.c,
 * weights.c); not installed.
 *
 *   - the byte sink the format writers append to; the output set that owns it
 *     (output.c) writes every output of a run whole, or none of them;
 *   - a reader that knows the file's size, so a header that promises more bytes than
 *     the file holds is refused before anything is allocated from it;
 *   - float16 / bfloat16 to float32 conversion and little-endian loads and stores.
 *
 * Every message names the file, as "PATH: problem".
 */
#ifndef ATTN_IO_INTERNAL_H
#define ATTN_IO_INTERNAL_H

#include "attn_internal.h"

#include <stdint.h>
#include <stdio.h>

/* ---- reading ---------------------------------------------------------------- */

typedef struct attn__rfile {
    FILE *f;
    const char *path; /* the caller's string, for messages */
    uint64_t size;    /* bytes in the file when it was opened */
} attn__rfile;

/* Opens path for reading and records its size. IO error naming the file on failure. */
int attn__rfile_open(attn_ctx *ctx, attn__rfile *rf, const char *path);
/* Reads exactly n bytes at byte offset `offset`. A read that would pass the size
 * recorded at open time fails with FORMAT ("truncated: ... needs bytes A..B but the
 * file has S"), `what` naming the part being read. */
int attn__rfile_read(attn_ctx *ctx, attn__rfile *rf, uint64_t offset, void *buf,
                     uint64_t n, const char *what);
void attn__rfile_close(attn__rfile *rf);

/* ---- writing: the byte sink of one output of an output set (output.c) ----- */

/* Where an output's bytes go while its set is open: the temporary file beside a
 * regular target, or memory for a device, FIFO or standard output (written at the
 * commit). The format writers below only append bytes; the set decides where they
 * end up and when. */
typedef struct attn__wfile {
    const char *path;            /* the caller's name for the output, for messages */
    FILE *f;                     /* the temporary file, or NULL for a memory sink */
    unsigned char *mem;          /* memory sink: the bytes so far */
    size_t len, cap;
    const attn_allocator *alloc; /* the set's allocator, for mem */
    int failed;                  /* a write failed; the output is dropped */
} attn__wfile;

/* Appends n bytes. IO (or NO_MEMORY) naming wf->path on failure. */
int attn__wfile_write(attn_ctx *ctx, attn__wfile *wf, const void *buf, size_t n);

/* Writes the elements of t (any strides) in C order, little-endian, through wf. */
int attn__wfile_write_tensor(attn_ctx *ctx, attn__wfile *wf, const attn_tensor *t);

/* Writes t as a complete .npy file (preamble, header, data) through wf; what
 * attn_output_set_add_npy writes. */
int attn__npy_write(attn_ctx *ctx, attn__wfile *wf, const attn_tensor *t);

/* Writes a complete .safetensors file of n named tensors through wf (checking the
 * names and tensors first); what attn_output_set_add_safetensors writes. */
int attn__safetensors_write(attn_ctx *ctx, attn__wfile *wf, const char *const *names,
                            const attn_tensor *tensors, int64_t n);

/* ---- numbers ---------------------------------------------------------------- */


static inline uint16_t attn__load_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t attn__load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static inline uint64_t attn__load_le64(const unsigned char *p)
{
    return (uint64_t)attn__load_le32(p) | ((uint64_t)attn__load_le32(p + 4) << 32);
}

/* Converts n elements of a file's element type, stored at `src` in the given byte
 * order, into a host array of dst_dtype. `kind` is one of the ATTN__EL_* codes. */
typedef enum attn__elem {
    ATTN__EL_F16,
    ATTN__EL_BF16,
    ATTN__EL_F32,
    ATTN__EL_F64,
    ATTN__EL_I32,
    ATTN__EL_I64,
    ATTN__EL_U8, /* bool and uint8: one byte each, copied as they are */
    ATTN__EL_F16_KEEP, /* float16 and bfloat16 loaded as they are (ATTN_LOAD_HALF): */
    ATTN__EL_BF16_KEEP /* ATTN_DTYPE_F16 / ATTN_DTYPE_BF16, bytes in host order */
} attn__elem;

/* The element kind to load e as under the loaders' flags (ATTN_LOAD_HALF keeps
 * float16 and bfloat16 in 16 bits). */
static inline attn__elem attn__elem_for_flags(attn__elem e, unsigned flags)
{
    if (flags & ATTN_LOAD_HALF) {
        if (e == ATTN__EL_F16)
            return ATTN__EL_F16_KEEP;
        if (e == ATTN__EL_BF16)
            return ATTN__EL_BF16_KEEP;
    }
    return e;
}

/* Bytes per element of a file element kind. */
size_t attn__elem_size(attn__elem e);
/* The attn dtype an element kind loads as: floats -> F32 (the _KEEP kinds -> F16,
 * BF16), I32, I64, U8 -> BOOL. */
attn_dtype attn__elem_dtype(attn__elem e);
/* Converts n elements from src (file bytes, big_endian or little) into dst (host
 * array of attn__elem_dtype(e)). */
void attn__elem_convert(attn__elem e, int big_endian, const unsigned char *src,
                        void *dst, int64_t n);

/* Reads n elements of kind e stored at `offset` (in the given byte order) and
 * converts them into dst, a host array of attn__elem_dtype(e). */
int attn__rfile_read_elems(attn_ctx *ctx, attn__rfile *rf, uint64_t offset, attn__elem e,
                           int big_endian, int64_t n, void *dst);

/* An owned array: the loaders' result. */
/* Fills a with an allocated C-contiguous tensor of dtype and shape (contents
 * undefined). `path` labels the message. */
int attn__array_alloc(attn_ctx *ctx, attn_array *a, attn_dtype dtype, int ndim,
                      const int64_t *shape, const char *path);

#endif /* ATTN_IO_INTERNAL_H */
