/*
 * npy.c - numpy's .npy format: read and write.
 *
 * The format (numpy's NEP 1, "A Simple File Format for NumPy Arrays", and
 * numpy/lib/format.py's documentation):
 *
 *   bytes 0..5   "\x93NUMPY"
 *   byte  6, 7   major and minor version (1.0, 2.0 or 3.0)
 *   then         the header length, u16 little-endian (version 1) or u32 (2 and 3)
 *   then         the header: a Python dict literal, e.g.
 *                {'descr': '<f4', 'fortran_order': False, 'shape': (2, 5, 16), }
 *                padded with spaces and ended by '\n' (version 3 allows UTF-8)
 *   then         the data, numel * itemsize bytes, in C or Fortran order
 *
 * This reader parses that dict with the text cursor that the .safetensors reader also
 * uses (text_cursor.h, in its Python dialect; no eval), takes what numpy's np.load
 * takes (versions 1.0, 2.0 and 3.0 only; exactly the three keys; a 1-tuple written
 * "(n,)"), checks the header against the file's size before it allocates anything,
 * and refuses anything it does not understand with a message "PATH: problem".
 */
#include "io_internal.h"
#include "text_cursor.h"

#include <stdio.h>
#include <string.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
/* numpy's own reader refuses headers above 10000 bytes unless told otherwise; we
 * allow far more but still keep a lying header length from allocating gigabytes. */
#define NPY_MAX_HEADER (1u << 20)
/* More dimensions than this are refused while parsing; attn itself takes 4. */
#define NPY_PARSE_DIMS 32

/* ---- the header dict ------------------------------------------------------------ */

typedef struct npy_header {
    char descr[64];
    int fortran_order;
    int ndim;
    int64_t shape[NPY_PARSE_DIMS];
    int has_descr, has_order, has_shape;
} npy_header;

static int npy_shape(attn__cursor *c, npy_header *h)
{
    int st = attn__cursor_expect(c, '(');
    if (st)
        return st;
    h->ndim = 0;
    while (!attn__cursor_accept(c, ')')) {
        if (h->ndim == NPY_PARSE_DIMS)
            return attn__cursor_fail(c, "more than %d dimensions", NPY_PARSE_DIMS);
        uint64_t v;
        if ((st = attn__cursor_uint(c, INT64_MAX, &v, "the shape")))
            return st;
        h->shape[h->ndim++] = (int64_t)v;
        /* Python writes a 1-tuple as "(n,)"; "(n)" would be a plain integer. */
        if (attn__cursor_accept(c, ','))
            continue;
        if (h->ndim == 1)
            return attn__cursor_fail(c, "expected ',' after the only size of the shape");
        if ((st = attn__cursor_expect(c, ')')))
            return st;
        break;
    }
    return ATTN_OK;
}

/* The header: a dict of exactly 'descr', 'fortran_order' and 'shape', as numpy's
 * reader requires (numpy/lib/format.py, _read_array_header). */
static int npy_parse_header(attn__cursor *c, npy_header *h)
{
    memset(h, 0, sizeof(*h));
    int st = attn__cursor_expect(c, '{');
    if (st)
        return st;
    while (!attn__cursor_accept(c, '}')) {
        char key[32];
        if ((st = attn__cursor_string(c, key, sizeof(key), NULL)) ||
            (st = attn__cursor_expect(c, ':')))
            return st;
        if (strcmp(key, "descr") == 0) {
            if (h->has_descr)
                return attn__cursor_fail(c, "'descr' given twice");
            if (attn__cursor_peek(c) == '[')
                return attn__fail(c->ctx, ATTN_STATUS_DTYPE,
                                  "%s: structured dtypes (a list as 'descr') are not "
                                  "supported",
                                  c->path);
            if ((st = attn__cursor_string(c, h->descr, sizeof(h->descr), NULL)))
                return st;
            h->has_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (h->has_order)
                return attn__cursor_fail(c, "'fortran_order' given twice");
            attn__literal lit = attn__cursor_literal(c);
            if (lit != ATTN__LITERAL_TRUE && lit != ATTN__LITERAL_FALSE)
                return attn__cursor_fail(c, "'fortran_order' must be True or False");
            h->fortran_order = lit == ATTN__LITERAL_TRUE;
            h->has_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (h->has_shape)
                return attn__cursor_fail(c, "'shape' given twice");
            if ((st = npy_shape(c, h)))
                return st;
            h->has_shape = 1;
        } else {
            char kb[48];
            return attn__cursor_fail(c, "unexpected key '%s'",
                                     attn__printable(key, kb, sizeof(kb)));
        }
        if (attn__cursor_accept(c, '}'))
            break;
        if (!attn__cursor_accept(c, ','))
            return attn__cursor_fail(c, "expected ',' or '}'");
    }
    if (!attn__cursor_at_end(c))
        return attn__cursor_fail(c, "unexpected text after the dict");
    if (!h->has_descr || !h->has_order || !h->has_shape)
        return attn__fail(c->ctx, ATTN_STATUS_FORMAT,
                          "%s: bad .npy header: it lacks '%s'", c->path,
                          !h->has_descr ? "descr"
                                        : !h->has_order ? "fortran_order" : "shape");
    return ATTN_OK;
}

/* Maps a descr such as '<f4' to an element kind, byte order and the dtype's name in
 * numpy's words (what the file holds, for messages: a uint8 file loads as
 * ATTN_DTYPE_BOOL but is still called "uint8"). */
static int npy_descr(attn_ctx *ctx, const char *path, const char *descr, attn__elem *e,
                     int *big_endian, const char **name)
{
    const char *t = descr;
    *big_endian = 0;
    if (*t == '<' || *t == '|' || *t == '=') {
        t++;
    } else if (*t == '>') {
        *big_endian = 1;
        t++;
    }
    static const struct {
        const char *code;
        attn__elem e;
        const char *name;
    } table[] = {
        {"f4", ATTN__EL_F32, "float32"}, {"f8", ATTN__EL_F64, "float64"},
        {"f2", ATTN__EL_F16, "float16"}, {"i4", ATTN__EL_I32, "int32"},
        {"i8", ATTN__EL_I64, "int64"},   {"b1", ATTN__EL_U8, "bool"},
        {"u1", ATTN__EL_U8, "uint8"},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (strcmp(t, table[i].code) == 0) {
            *e = table[i].e;
            *name = table[i].name;
            if (attn__elem_size(*e) == 1)
                *big_endian = 0;
            return ATTN_OK;
        }
    }
    char db[96];
    return attn__fail(ctx, ATTN_STATUS_DTYPE,
                      "%s: dtype '%s' is not supported (attn reads float32, float64, "
                      "float16, int32, int64, bool and uint8)",
                      path, attn__printable(descr, db, sizeof(db)));
}

/* ---- loading ------------------------------------------------------------------- */

int attn_npy_load(attn_ctx *ctx, const char *path, attn_array *out)
{
    return attn_npy_load_flags(ctx, path, 0, out);
}

int attn_npy_load_flags(attn_ctx *ctx, const char *path, unsigned flags, attn_array *out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_npy_load: out is NULL");
    memset(out, 0, sizeof(*out));
    if (flags & ~(unsigned)ATTN_LOAD_HALF)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_npy_load_flags: unknown flags 0x%x (ATTN_LOAD_HALF is 0x%x)",
                          flags, (unsigned)ATTN_LOAD_HALF);
    attn__rfile rf;
    int st = attn__rfile_open(ctx, &rf, path);
    if (st)
        return st;

    char *htext = NULL;
    attn_array raw = {0};
    unsigned char pre[12];
    if (rf.size < 10) {
        st = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: not a .npy file: %llu bytes is shorter than the 10-byte "
                        "preamble",
                        path, (unsigned long long)rf.size);
        goto done;
    }
    if ((st = attn__rfile_read(ctx, &rf, 0, pre, 8, "preamble")))
        goto done;
    if (memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) != 0) {
        st = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: not a .npy file (it does not start with \\x93NUMPY)", path);
        goto done;
    }
    /* numpy reads versions 1.0, 2.0 and 3.0 and refuses any other, 1.1 included
     * (numpy/lib/format.py, _check_version); so does attn. */
    int major = pre[6], minor = pre[7];
    uint64_t hlen, prefix;
    if (minor != 0) {
        st = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: .npy format version %d.%d is not supported (1.0, 2.0 and "
                        "3.0 are)",
                        path, major, minor);
        goto done;
    } else if (major == 1) {
        if ((st = attn__rfile_read(ctx, &rf, 8, pre + 8, 2, "header length")))
            goto done;
        hlen = attn__load_le16(pre + 8);
        prefix = 10;
    } else if (major == 2 || major == 3) {
        if ((st = attn__rfile_read(ctx, &rf, 8, pre + 8, 4, "header length")))
            goto done;
        hlen = attn__load_le32(pre + 8);
        prefix = 12;
    } else {
        st = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: .npy format version %d.%d is not supported (1.0, 2.0 and "
                        "3.0 are)",
                        path, major, minor);
        goto done;
    }
    if (hlen > rf.size - prefix) {
        st = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: truncated or lying header: the header length %llu runs past "
                        "the end of the file (%llu bytes)",
                        path, (unsigned long long)hlen, (unsigned long long)rf.size);
        goto done;
    }
    if (hlen > NPY_MAX_HEADER) {
        st = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: the header length %llu is above the %u bytes this reader "
                        "accepts",
                        path, (unsigned long long)hlen, NPY_MAX_HEADER);
        goto done;
    }
    htext = attn__alloc(ctx, (size_t)hlen + 1, "npy header");
    if (!htext) {
        st = attn__alloc_status(ctx);
        goto done;
    }
    if ((st = attn__rfile_read(ctx, &rf, prefix, htext, hlen, "header")))
        goto done;

    /* Versions 1.0 and 2.0 store the header in latin-1, version 3.0 in UTF-8; files
     * from Python 2 may write sizes as 5L, which numpy still reads in 1.0 and 2.0. */
    attn__cursor cur;
    attn__cursor_init(&cur, ctx, path, "bad .npy header", ATTN__SYNTAX_PYTHON, major == 3,
                      htext, (size_t)hlen);
    cur.long_suffix = major < 3;
    npy_header h;
    if ((st = npy_parse_header(&cur, &h)))
        goto done;
    attn__elem e = ATTN__EL_F32;
    int big_endian = 0;
    const char *file_dtype = NULL;
    if ((st = npy_descr(ctx, path, h.descr, &e, &big_endian, &file_dtype)))
        goto done;
    e = attn__elem_for_flags(e, flags);

    char shape_s[NPY_PARSE_DIMS * 22 + 8];
    attn_shape_format(shape_s, sizeof(shape_s), h.ndim, h.shape);
    int64_t numel = 1;
    for (int i = 0; i < h.ndim; i++) {
        if (!attn__mul_i64(numel, h.shape[i], &numel)) {
            st = attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                            "%s: the number of elements of shape %s overflows 64 bits",
                            path, shape_s);
            goto done;
        }
    }
    uint64_t data_bytes;
    if ((uint64_t)numel > UINT64_MAX / attn__elem_size(e)) {
        st = attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                        "%s: the data size of shape %s overflows 64 bits", path, shape_s);
        goto done;
    }
    data_bytes = (uint64_t)numel * attn__elem_size(e);
    uint64_t after = rf.size - prefix - hlen;
    if (data_bytes != after) {
        st = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        data_bytes > after
                            ? "%s: truncated: the header promises %llu bytes of data "
                              "(%lld elements of '%s') but the file has %llu after the "
                              "header"
                            : "%s: the header promises %llu bytes of data (%lld elements "
                              "of '%s') but the file has %llu after the header",
                        path, (unsigned long long)data_bytes, (long long)numel, h.descr,
                        (unsigned long long)after);
        goto done;
    }
    if (h.ndim == 0) {
        st = attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                        "%s: a 0-dimensional (scalar) array is not supported; attn takes "
                        "1 to 4 dimensions",
                        path);
        goto done;
    }
    if (h.ndim > ATTN_MAX_DIMS) {
        st = attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                        "%s: an array of %d dimensions is not supported; attn takes 1 to "
                        "4",
                        path, h.ndim);
        goto done;
    }
    if (numel == 0) {
        st = attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                        "%s: the array of shape %s is empty; attn needs every size >= 1",
                        path, shape_s);
        goto done;
    }

    /* A Fortran-order file holds the transpose of a C-order array of the reversed
     * shape: read that, then copy it into C order. */
    int64_t file_shape[ATTN_MAX_DIMS];
    for (int i = 0; i < h.ndim; i++)
        file_shape[i] = h.fortran_order ? h.shape[h.ndim - 1 - i] : h.shape[i];
    attn_dtype dt = attn__elem_dtype(e);
    if ((st = attn__array_alloc(ctx, &raw, dt, h.ndim, file_shape, path)))
        goto done;
    if ((st = attn__rfile_read_elems(ctx, &rf, prefix + hlen, e, big_endian, numel,
                                         raw.buffer)))
        goto done;
    if (!h.fortran_order || h.ndim == 1) {
        if (h.ndim == 1)
            raw.tensor.shape[0] = h.shape[0];
        *out = raw;
        out->file_dtype = file_dtype;
        raw.buffer = NULL;
        goto done;
    }
    attn_tensor view = raw.tensor; /* the C-order view of the file's transpose */
    for (int i = 0; i < h.ndim; i++) {
        view.shape[i] = h.shape[i];
        view.stride[i] = raw.tensor.stride[h.ndim - 1 - i];
    }
    if ((st = attn__array_alloc(ctx, out, dt, h.ndim, h.shape, path)))
        goto done;
    if ((st = attn_tensor_copy(ctx, &view, &out->tensor)))
        attn_array_free(ctx, out);
    else
        out->file_dtype = file_dtype;

done:
    if (raw.buffer)
        attn_array_free(ctx, &raw);
    if (htext)
        attn__free(ctx, htext);
    attn__rfile_close(&rf);
    return st;
}

/* ---- saving -------------------------------------------------------------------- */

int attn__npy_write(attn_ctx *ctx, attn__wfile *wf, const attn_tensor *t)
{
    const char *path = wf->path;
    if (!t)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_npy_save: tensor is NULL");
    int st = attn_tensor_check(ctx, t, path ? path : "npy output");
    if (st)
        return st;
    const char *descr;
    switch (t->dtype) {
    case ATTN_DTYPE_F32:
        descr = "<f4";
        break;
    case ATTN_DTYPE_I32:
        descr = "<i4";
        break;
    case ATTN_DTYPE_I64:
        descr = "<i8";
        break;
    case ATTN_DTYPE_BOOL:
        descr = "|b1";
        break;
    case ATTN_DTYPE_F16:
        descr = "<f2";
        break;
    case ATTN_DTYPE_BF16:
        /* numpy has no bfloat16: the values go out as float32, exactly. */
        descr = "<f4";
        break;
    default:
        return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s: cannot save dtype %d as .npy",
                          path ? path : "(null)", (int)t->dtype);
    }
    char shape[160];
    attn_shape_format(shape, sizeof(shape), t->ndim, t->shape);

    /* numpy pads the header with spaces so that the data starts at a multiple of 64
     * bytes, and ends it with '\n'. A version 1 header fits any 4-D shape. */
    char header[256];
    int len = snprintf(header, sizeof(header),
                       "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
                       shape);
    size_t total = 10 + (size_t)len + 1;
    size_t padded = (total + 63) / 64 * 64;
    size_t hlen = padded - 10;
    memset(header + len, ' ', hlen - 1 - (size_t)len);
    header[hlen - 1] = '\n';

    unsigned char pre[10];
    memcpy(pre, NPY_MAGIC, NPY_MAGIC_LEN);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(hlen & 0xff);
    pre[9] = (unsigned char)(hlen >> 8);
    if ((st = attn__wfile_write(ctx, wf, pre, sizeof(pre))) ||
        (st = attn__wfile_write(ctx, wf, header, hlen)))
        return st;
    if (t->dtype != ATTN_DTYPE_BF16)
        return attn__wfile_write_tensor(ctx, wf, t);
    attn_tensor wide;
    if ((st = attn_tensor_alloc(ctx, &wide, ATTN_DTYPE_F32, t->ndim, t->shape)))
        return st;
    if (!(st = attn_tensor_convert(ctx, t, &wide)))
        st = attn__wfile_write_tensor(ctx, wf, &wide);
    attn_tensor_free(ctx, &wide);
    return st;
}

int attn_npy_save(attn_ctx *ctx, const char *path, const attn_tensor *t)
{
    if (!t)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "attn_npy_save: tensor is NULL");
    int st = attn_tensor_check(ctx, t, path ? path : "npy output");
    if (st)
        return st;
    /* One file is an output set of one (src/io/output.c). */
    attn_output_set *set;
    if ((st = attn_output_set_create(ctx, &set)))
        return st;
    st = attn_output_set_add_npy(ctx, set, path, t);
    if (!st)
        st = attn_output_set_commit(ctx, set);
    attn_output_set_free(ctx, set);
    return st;
}
