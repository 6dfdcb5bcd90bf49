/*
 * safetensors.c - the .safetensors format (Hugging Face): read and write named
 * tensors.
 *
 * The format (huggingface/safetensors, README "Format"):
 *
 *   bytes 0..7   N, the header size, u64 little-endian
 *   bytes 8..    the header: N bytes of UTF-8 JSON, an object mapping each tensor
 *                name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
 *                plus an optional "__metadata__" object of strings; writers pad it
 *                with spaces
 *   then         the data section; tensor bytes [b, e) relative to its start,
 *                little-endian, C order. Tensors must cover the data section
 *                exactly: no gaps, no overlaps.
 *
 * The header is read with the text cursor that the .npy reader also uses
 * (text_cursor.h, in its JSON dialect), accepting what Python's safetensors package
 * accepts: "__metadata__" may be null or an object of strings, the whole header is
 * UTF-8, numbers have no leading zeros. Every entry is checked (dtype known, shape
 * product without overflow, offsets inside the data section and consistent with the
 * shape, no overlap, no gap) before any tensor is read. Two deliberate differences:
 * a name given twice and a name holding a NUL character are refused (Python keeps the
 * last of two; attn's names are C strings). Data is
 * read on demand, so opening a large checkpoint to take one layer costs one layer.
 */
#include "io_internal.h"
#include "text_cursor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER 100000000ull

/* ---- dtypes ---------------------------------------------------------------------- */

typedef struct st_dtype {
    const char *name;  /* the format's name */
    size_t size;
    int readable;      /* converts to an attn dtype */
    attn__elem elem;   /* when readable */
    const char *words; /* in numpy's words, for attn_array.file_dtype */
} st_dtype;

/* Every dtype of the format that has a whole number of bytes per element, so offsets
 * can be checked even for tensors attn does not read. */
static const st_dtype st_dtypes[] = {
    {"F32", 4, 1, ATTN__EL_F32, "float32"},   {"F16", 2, 1, ATTN__EL_F16, "float16"},
    {"BF16", 2, 1, ATTN__EL_BF16, "bfloat16"}, {"F64", 8, 1, ATTN__EL_F64, "float64"},
    {"I32", 4, 1, ATTN__EL_I32, "int32"},     {"I64", 8, 1, ATTN__EL_I64, "int64"},
    {"BOOL", 1, 1, ATTN__EL_U8, "bool"},      {"U8", 1, 1, ATTN__EL_U8, "uint8"},
    {"I8", 1, 0, ATTN__EL_U8, "int8"},        {"I16", 2, 0, ATTN__EL_U8, "int16"},
    {"U16", 2, 0, ATTN__EL_U8, "uint16"},     {"U32", 4, 0, ATTN__EL_U8, "uint32"},
    {"U64", 8, 0, ATTN__EL_U8, "uint64"},     {"F8_E4M3", 1, 0, ATTN__EL_U8, "float8_e4m3"},
    {"F8_E5M2", 1, 0, ATTN__EL_U8, "float8_e5m2"},
    {"F8_E8M0", 1, 0, ATTN__EL_U8, "float8_e8m0"},
    {"C64", 8, 0, ATTN__EL_U8, "complex64"},
};
#define ST_NDTYPES ((int)(sizeof(st_dtypes) / sizeof(st_dtypes[0])))

typedef struct st_entry {
    char *name;
    int dtype; /* index into st_dtypes */
    int ndim;  /* any rank in the file; attn reads 1..4 */
    int64_t shape[ATTN_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* relative to the data section */
} st_entry;

struct attn_safetensors {
    attn__rfile rf;
    char *path;
    uint64_t data_start;
    uint64_t data_size;
    int64_t count;
    int64_t cap;
    st_entry *entries; /* sorted by begin once the header is checked */
    int64_t *by_name;  /* entry indices sorted by name, for lookups */
    attn_allocator alloc; /* the opening context's: all of the handle's memory is its */
};

/* ---- the handle ------------------------------------------------------------------ */

/* Frees the handle with the allocator that opened it (st->alloc), whatever
 * context the program closes it with: another context's free, or libc's, would be
 * handed memory of the wrong heap. */
static void st_free(attn_safetensors *st)
{
    if (!st)
        return;
    attn_ctx own;
    attn_ctx_init(&own);
    own.allocator = st->alloc;
    attn_ctx *ctx = &own;
    for (int64_t i = 0; i < st->count; i++)
        attn__free(ctx, st->entries[i].name);
    attn__free(ctx, st->entries);
    attn__free(ctx, st->by_name);
    attn__rfile_close(&st->rf);
    attn__free(ctx, st->path);
    attn__free(ctx, st);
}

void attn_safetensors_close(attn_ctx *ctx, attn_safetensors *st)
{
    (void)ctx; /* the handle knows its allocator */
    st_free(st);
}

static st_entry *st_push(attn_ctx *ctx, attn_safetensors *st)
{
    if (st->count == st->cap) {
        int64_t cap = st->cap ? st->cap * 2 : 16;
        st_entry *e = attn__alloc(ctx, (size_t)cap * sizeof(*e), "safetensors entries");
        if (!e)
            return NULL;
        if (st->count)
            memcpy(e, st->entries, (size_t)st->count * sizeof(*e));
        attn__free(ctx, st->entries);
        st->entries = e;
        st->cap = cap;
    }
    st_entry *e = &st->entries[st->count++];
    memset(e, 0, sizeof(*e));
    return e;
}

/* Binary search in the name index (built once the header is parsed), so a hostile
 * header with a million names costs n log n, not n^2. */
static int64_t st_find(const attn_safetensors *st, const char *name)
{
    int64_t lo = 0, hi = st->by_name ? st->count : 0;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->entries[st->by_name[mid]].name, name);
        if (c == 0)
            return st->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* The index is sorted as (name, entry) pairs, so the comparator needs no context. */
typedef struct st_named {
    const char *name;
    int64_t idx;
} st_named;

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_named *)a)->name, ((const st_named *)b)->name);
}

/* Builds st->by_name and refuses a name given twice. */
static int st_index_names(attn_ctx *ctx, attn_safetensors *st)
{
    size_t n = st->count > 0 ? (size_t)st->count : 1;
    st_named *tmp = attn__alloc(ctx, n * sizeof(*tmp), "safetensors name index");
    if (!tmp)
        return attn__alloc_status(ctx);
    for (int64_t i = 0; i < st->count; i++) {
        tmp[i].name = st->entries[i].name;
        tmp[i].idx = i;
    }
    if (st->count > 1)
        qsort(tmp, (size_t)st->count, sizeof(*tmp), st_cmp_name);
    for (int64_t i = 1; i < st->count; i++) {
        if (strcmp(tmp[i - 1].name, tmp[i].name) == 0) {
            char nb[96];
            int rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                                "%s: tensor '%s' appears twice in the header", st->path,
                                attn__printable(tmp[i].name, nb, sizeof(nb)));
            attn__free(ctx, tmp);
            return rc;
        }
    }
    st->by_name = attn__alloc(ctx, n * sizeof(int64_t), "safetensors name index");
    if (st->by_name)
        for (int64_t i = 0; i < st->count; i++)
            st->by_name[i] = tmp[i].idx;
    attn__free(ctx, tmp);
    return st->by_name ? ATTN_OK : attn__alloc_status(ctx);
}

/* ---- the header ------------------------------------------------------------------ */

/* The one rule for a tensor name, shared by the reader and the writer, so that attn
 * never writes a name that it, or Python's safetensors, would refuse to read: valid
 * UTF-8 (the package refuses a header that is not, whole) and no NUL character
 * (attn's names are C strings; JSON could spell one as \u0000). len is the name's
 * length as decoded. Returns NULL for a good name, else the problem. */
static const char *st_name_problem(const char *name, size_t len)
{
    if (strlen(name) != len)
        return "holds a NUL character";
    if (attn__utf8_invalid_at((const unsigned char *)name, len) != len)
        return "is not valid UTF-8";
    return NULL;
}

/* A shape: [] or [n, ...], each size a JSON integer up to INT64_MAX. */
static int st_parse_shape(attn__cursor *c, st_entry *e)
{
    int rc = attn__cursor_expect(c, '[');
    if (rc || attn__cursor_accept(c, ']'))
        return rc;
    for (;;) {
        uint64_t v;
        if ((rc = attn__cursor_uint(c, (uint64_t)INT64_MAX, &v, "the shape")))
            return rc;
        /* A product above INT64_MAX is reported once the entry is read, naming
         * the tensor; the rank is counted (up to a bound) for the same message. */
        if (e->numel >= 0 && !attn__mul_i64(e->numel, (int64_t)v, &e->numel))
            e->numel = -1;
        if (e->ndim < ATTN_MAX_DIMS)
            e->shape[e->ndim] = (int64_t)v;
        if (e->ndim < 1000000)
            e->ndim++;
        if (attn__cursor_accept(c, ']'))
            return ATTN_OK;
        if (!attn__cursor_accept(c, ','))
            return attn__cursor_fail(c, "expected ',' or ']' in a shape");
    }
}

/* One tensor entry: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}. Other
 * keys are skipped (their values must still be JSON), as Python's reader does. The
 * entry's own checks (sizes, offsets) follow in st_check_entry. */
static int st_parse_entry(attn__cursor *c, st_entry *e)
{
    char nb[96];
    const char *nm = attn__printable(e->name, nb, sizeof(nb));
    int rc = attn__cursor_expect(c, '{');
    if (rc)
        return rc;
    int has_dtype = 0, has_shape = 0, has_offsets = 0;
    e->numel = 1;
    while (!attn__cursor_accept(c, '}')) {
        char *key = NULL;
        if ((rc = attn__cursor_string_alloc(c, &key, NULL)))
            return rc;
        int *seen = strcmp(key, "dtype") == 0          ? &has_dtype
                    : strcmp(key, "shape") == 0        ? &has_shape
                    : strcmp(key, "data_offsets") == 0 ? &has_offsets
                                                       : NULL;
        if (seen && *seen)
            rc = attn__cursor_fail(c, "'%s' given twice", key);
        attn__free(c->ctx, key);
        if (rc || (rc = attn__cursor_expect(c, ':')))
            return rc;
        if (seen)
            *seen = 1;
        if (seen == &has_dtype) {
            char *dt = NULL;
            if ((rc = attn__cursor_string_alloc(c, &dt, NULL)))
                return rc;
            e->dtype = -1;
            for (int k = 0; k < ST_NDTYPES; k++)
                if (strcmp(dt, st_dtypes[k].name) == 0)
                    e->dtype = k;
            if (e->dtype < 0) {
                char db[96];
                rc = attn__fail(c->ctx, ATTN_STATUS_DTYPE,
                                "%s: tensor '%s' has an unknown dtype '%s'", c->path, nm,
                                attn__printable(dt, db, sizeof(db)));
            }
            attn__free(c->ctx, dt);
        } else if (seen == &has_shape) {
            rc = st_parse_shape(c, e);
        } else if (seen == &has_offsets) {
            if (!(rc = attn__cursor_expect(c, '[')) &&
                !(rc = attn__cursor_uint(c, UINT64_MAX, &e->begin, "data_offsets")) &&
                !(rc = attn__cursor_expect(c, ',')) &&
                !(rc = attn__cursor_uint(c, UINT64_MAX, &e->end, "data_offsets")))
                rc = attn__cursor_expect(c, ']');
        } else {
            rc = attn__cursor_skip_json(c);
        }
        if (rc)
            return rc;
        if (attn__cursor_accept(c, '}'))
            break;
        if (!attn__cursor_accept(c, ','))
            return attn__cursor_fail(c, "expected ',' or '}'");
    }
    if (!has_dtype || !has_shape || !has_offsets)
        return attn__fail(c->ctx, ATTN_STATUS_FORMAT,
                          "%s: tensor '%s' lacks '%s' in the header", c->path, nm,
                          !has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets");
    return ATTN_OK;
}

/* The checks of one entry against itself and the data section. */
static int st_check_entry(attn__cursor *c, const attn_safetensors *st, const st_entry *e)
{
    char nb[96];
    const char *nm = attn__printable(e->name, nb, sizeof(nb));
    if (e->numel < 0)
        return attn__fail(c->ctx, ATTN_STATUS_OVERFLOW,
                          "%s: tensor '%s': the product of its shape overflows 64 bits",
                          c->path, nm);
    if (e->begin > e->end)
        return attn__fail(c->ctx, ATTN_STATUS_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] end before they "
                          "begin",
                          c->path, nm, (unsigned long long)e->begin,
                          (unsigned long long)e->end);
    if (e->end > st->data_size)
        return attn__fail(c->ctx, ATTN_STATUS_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] are out of range "
                          "(the data section has %llu bytes)",
                          c->path, nm, (unsigned long long)e->begin,
                          (unsigned long long)e->end, (unsigned long long)st->data_size);
    size_t es = st_dtypes[e->dtype].size;
    if ((uint64_t)e->numel > UINT64_MAX / es || (uint64_t)e->numel * es != e->end - e->begin)
        return attn__fail(c->ctx, ATTN_STATUS_FORMAT,
                          "%s: tensor '%s': %lld elements of %s need %llu bytes but "
                          "data_offsets [%llu, %llu] hold %llu",
                          c->path, nm, (long long)e->numel, st_dtypes[e->dtype].name,
                          (unsigned long long)((uint64_t)e->numel * es),
                          (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)(e->end - e->begin));
    return ATTN_OK;
}

static int st_cmp(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* "__metadata__": null, or an object whose values are strings, as Python's reader
 * requires (its type is Option<HashMap<String, String>>). attn keeps none of it. */
static int st_parse_metadata(attn__cursor *c)
{
    if (attn__cursor_literal(c) == ATTN__LITERAL_NULL)
        return ATTN_OK;
    if (attn__cursor_peek(c) != '{')
        return attn__cursor_fail(c, "'__metadata__' must be an object of strings or null");
    c->i++;
    int rc;
    while (!attn__cursor_accept(c, '}')) {
        if ((rc = attn__cursor_string_alloc(c, NULL, NULL)) ||
            (rc = attn__cursor_expect(c, ':')))
            return rc;
        if (attn__cursor_peek(c) != '"')
            return attn__cursor_fail(c, "a value in '__metadata__' is not a string");
        if ((rc = attn__cursor_string_alloc(c, NULL, NULL)))
            return rc;
        if (attn__cursor_accept(c, '}'))
            break;
        if (!attn__cursor_accept(c, ','))
            return attn__cursor_fail(c, "expected ',' or '}'");
    }
    return ATTN_OK;
}

static int st_parse_header(attn_ctx *ctx, attn_safetensors *st, const unsigned char *h,
                           size_t n)
{
    /* The header is UTF-8 JSON; the cursor refuses a string that is not valid UTF-8,
     * as Python's reader refuses the whole header. */
    attn__cursor c;
    attn__cursor_init(&c, ctx, st->path, "bad safetensors header", ATTN__SYNTAX_JSON, 1, h,
                      n);
    int rc = attn__cursor_expect(&c, '{');
    if (rc)
        return rc;
    int has_meta = 0;
    while (!attn__cursor_accept(&c, '}')) {
        char *name = NULL;
        size_t len;
        if ((rc = attn__cursor_string_alloc(&c, &name, &len)))
            return rc;
        const char *problem = st_name_problem(name, len);
        if (problem) {
            char nb[96];
            rc = attn__cursor_fail(&c, "the tensor name '%s' %s",
                                   attn__printable(name, nb, sizeof(nb)), problem);
            attn__free(ctx, name);
            return rc;
        }
        if ((rc = attn__cursor_expect(&c, ':'))) {
            attn__free(ctx, name);
            return rc;
        }
        if (strcmp(name, "__metadata__") == 0) {
            attn__free(ctx, name);
            if (has_meta)
                return attn__cursor_fail(&c, "'__metadata__' given twice");
            has_meta = 1;
            if ((rc = st_parse_metadata(&c)))
                return rc;
        } else {
            st_entry *e = st_push(ctx, st);
            if (!e) {
                attn__free(ctx, name);
                return attn__alloc_status(ctx);
            }
            e->name = name;
            if ((rc = st_parse_entry(&c, e)) || (rc = st_check_entry(&c, st, e)))
                return rc;
        }
        if (attn__cursor_accept(&c, '}'))
            break;
        if (!attn__cursor_accept(&c, ','))
            return attn__cursor_fail(&c, "expected ',' or '}'");
    }
    if (!attn__cursor_at_end(&c))
        return attn__cursor_fail(&c, "unexpected text after the header object");

    /* The tensors must tile the data section: sorted by offset, each begins where
     * the previous one ended, and the last ends at the end of the file. */
    if (st->count > 1)
        qsort(st->entries, (size_t)st->count, sizeof(st_entry), st_cmp);
    if ((rc = st_index_names(ctx, st)))
        return rc;
    uint64_t at = 0;
    for (int64_t i = 0; i < st->count; i++) {
        const st_entry *e = &st->entries[i];
        char a[96], b[96];
        if (e->begin < at)
            return attn__fail(ctx, ATTN_STATUS_FORMAT,
                              "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                              st->path, attn__printable(st->entries[i - 1].name, a, sizeof(a)),
                              (unsigned long long)st->entries[i - 1].begin,
                              (unsigned long long)st->entries[i - 1].end,
                              attn__printable(e->name, b, sizeof(b)), (unsigned long long)e->begin,
                              (unsigned long long)e->end);
        if (e->begin > at)
            return attn__fail(ctx, ATTN_STATUS_FORMAT,
                              "%s: bytes [%llu, %llu) of the data section belong to no "
                              "tensor",
                              st->path, (unsigned long long)at,
                              (unsigned long long)e->begin);
        at = e->end;
    }
    if (at != st->data_size)
        return attn__fail(ctx, ATTN_STATUS_FORMAT,
                          "%s: bytes [%llu, %llu) of the data section belong to no tensor",
                          st->path, (unsigned long long)at,
                          (unsigned long long)st->data_size);
    return ATTN_OK;
}

int attn_safetensors_open(attn_ctx *ctx, const char *path, attn_safetensors **out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_safetensors_open: out is NULL");
    *out = NULL;
    if (!path)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "no file name given");
    attn_safetensors *st = attn__alloc(ctx, sizeof(*st), "safetensors handle");
    if (!st)
        return attn__alloc_status(ctx);
    memset(st, 0, sizeof(*st));
    if (ctx)
        st->alloc = ctx->allocator;
    size_t plen = strlen(path);
    st->path = attn__alloc(ctx, plen + 1, "file name");
    if (!st->path) {
        st_free(st);
        return attn__alloc_status(ctx);
    }
    memcpy(st->path, path, plen + 1);

    unsigned char *header = NULL;
    int rc = attn__rfile_open(ctx, &st->rf, st->path);
    if (rc)
        goto fail;
    if (st->rf.size < 8) {
        rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: not a safetensors file: %llu bytes is shorter than the 8-byte "
                        "header length",
                        path, (unsigned long long)st->rf.size);
        goto fail;
    }
    unsigned char len8[8];
    if ((rc = attn__rfile_read(ctx, &st->rf, 0, len8, 8, "header length")))
        goto fail;
    uint64_t n = attn__load_le64(len8);
    if (n > st->rf.size - 8) {
        rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: truncated or not a safetensors file: the header length %llu "
                        "runs past the end of the file (%llu bytes)",
                        path, (unsigned long long)n, (unsigned long long)st->rf.size);
        goto fail;
    }
    if (n > ST_MAX_HEADER) {
        rc = attn__fail(ctx, ATTN_STATUS_FORMAT,
                        "%s: the header length %llu is above the %llu bytes this reader "
                        "accepts",
                        path, (unsigned long long)n, ST_MAX_HEADER);
        goto fail;
    }
    st->data_start = 8 + n;
    st->data_size = st->rf.size - st->data_start;
    header = attn__alloc(ctx, (size_t)n + 1, "safetensors header");
    if (!header) {
        rc = attn__alloc_status(ctx);
        goto fail;
    }
    if ((rc = attn__rfile_read(ctx, &st->rf, 8, header, n, "header")))
        goto fail;
    if ((rc = st_parse_header(ctx, st, header, (size_t)n)))
        goto fail;
    attn__free(ctx, header);
    *out = st;
    return ATTN_OK;
fail:
    attn__free(ctx, header);
    st_free(st);
    return rc;
}

int64_t attn_safetensors_count(const attn_safetensors *st)
{
    return st ? st->count : 0;
}

const char *attn_safetensors_name(const attn_safetensors *st, int64_t i)
{
    if (!st || i < 0 || i >= st->count)
        return NULL;
    return st->entries[i].name;
}

int attn_safetensors_has(const attn_safetensors *st, const char *name)
{
    return st && name && st_find(st, name) >= 0;
}

int attn_safetensors_get(attn_ctx *ctx, const attn_safetensors *st, const char *name,
                         attn_array *out)
{
    return attn_safetensors_get_flags(ctx, st, name, 0, out);
}

int attn_safetensors_get_flags(attn_ctx *ctx, const attn_safetensors *st, const char *name,
                               unsigned flags, attn_array *out)
{
    if (!out)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_safetensors_get: out is NULL");
    memset(out, 0, sizeof(*out));
    if (!st || !name)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_safetensors_get: NULL handle or name");
    char nb[96];
    int64_t idx = st_find(st, name);
    if (idx < 0)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s: no tensor named '%s'",
                          st->path, attn__printable(name, nb, sizeof(nb)));
    if (flags & ~(unsigned)ATTN_LOAD_HALF)
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "attn_safetensors_get_flags: unknown flags 0x%x (ATTN_LOAD_HALF is "
                          "0x%x)",
                          flags, (unsigned)ATTN_LOAD_HALF);
    const st_entry *e = &st->entries[idx];
    const st_dtype *dt = &st_dtypes[e->dtype];
    const attn__elem elem = attn__elem_for_flags(dt->elem, flags);
    const char *nm = attn__printable(name, nb, sizeof(nb));
    if (!dt->readable)
        return attn__fail(ctx, ATTN_STATUS_DTYPE,
                          "%s: tensor '%s' has dtype %s; attn reads F32, F16, BF16, F64, "
                          "I32, I64, BOOL and U8",
                          st->path, nm, dt->name);
    if (e->ndim < 1 || e->ndim > ATTN_MAX_DIMS)
        return attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                          "%s: tensor '%s' has %d dimensions; attn takes 1 to 4", st->path,
                          nm, e->ndim);
    if (e->numel == 0)
        return attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                          "%s: tensor '%s' is empty; attn needs every size >= 1", st->path,
                          nm);
    int rc = attn__array_alloc(ctx, out, attn__elem_dtype(elem), e->ndim, e->shape,
                               st->path);
    if (rc)
        return rc;
    attn__rfile rf = st->rf; /* reading moves the stream, not the handle's facts */
    rc = attn__rfile_read_elems(ctx, &rf, st->data_start + e->begin, elem, 0,
                                e->numel, out->buffer);
    if (rc)
        attn_array_free(ctx, out);
    else
        out->file_dtype = dt->words;
    return rc;
}

/* ---- saving ---------------------------------------------------------------------- */

typedef struct st_buf {
    char *p;
    size_t cap, len; /* len counts even past cap, to measure */
} st_buf;

static void st_put(st_buf *b, const char *s, size_t n)
{
    if (b->p && b->len + n <= b->cap)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void st_puts(st_buf *b, const char *s)
{
    st_put(b, s, strlen(s));
}

/* A JSON string literal: quotes, backslashes and control bytes escaped. */
static void st_put_json_string(st_buf *b, const char *s)
{
    st_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            st_put(b, e, 2);
        } else if (*c < 0x20) {
            char e[8];
            snprintf(e, sizeof(e), "\\u%04x", *c);
            st_put(b, e, 6);
        } else {
            st_put(b, (const char *)c, 1);
        }
    }
    st_put(b, "\"", 1);
}

static const char *st_save_dtype(attn_dtype d)
{
    switch (d) {
    case ATTN_DTYPE_F32: return "F32";
    case ATTN_DTYPE_I32: return "I32";
    case ATTN_DTYPE_I64: return "I64";
    case ATTN_DTYPE_BOOL: return "BOOL";
    case ATTN_DTYPE_BF16: return "BF16";
    case ATTN_DTYPE_F16: return "F16";
    }
    return NULL;
}

static void st_build_header(st_buf *b, const char *const *names, const attn_tensor *t,
                            int64_t n)
{
    uint64_t off = 0;
    st_puts(b, "{");
    for (int64_t i = 0; i < n; i++) {
        char num[64];
        if (i)
            st_puts(b, ",");
        st_put_json_string(b, names[i]);
        st_puts(b, ":{\"dtype\":\"");
        st_puts(b, st_save_dtype(t[i].dtype));
        st_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++) {
            snprintf(num, sizeof(num), "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
            st_puts(b, num);
        }
        uint64_t bytes = (uint64_t)attn_tensor_numel(&t[i]) * attn_dtype_size(t[i].dtype);
        snprintf(num, sizeof(num), "],\"data_offsets\":[%llu,%llu]}",
                 (unsigned long long)off, (unsigned long long)(off + bytes));
        st_puts(b, num);
        off += bytes;
    }
    st_puts(b, "}");
    /* Pad with spaces so the data section starts 8-byte aligned, as the reference
     * writer does. */
    while ((8 + b->len) % 8)
        st_puts(b, " ");
}

int attn__safetensors_write(attn_ctx *ctx, attn__wfile *wf, const char *const *names,
                            const attn_tensor *tensors, int64_t n)
{
    const char *where = wf && wf->path ? wf->path : "(null)";
    if (n < 0 || (n > 0 && (!names || !tensors)))
        return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                          "%s: attn_safetensors_save needs %lld names and tensors", where,
                          (long long)n);
    char nb[96];
    for (int64_t i = 0; i < n; i++) {
        if (!names[i] || !names[i][0] || strcmp(names[i], "__metadata__") == 0)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s: tensor %lld has an empty or reserved name", where,
                              (long long)i);
        const char *problem = st_name_problem(names[i], strlen(names[i]));
        if (problem)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "%s: the name of tensor %lld, '%s', %s (Python's safetensors "
                              "would refuse the file)",
                              where, (long long)i, attn__printable(names[i], nb, sizeof(nb)),
                              problem);
        for (int64_t j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                                  "%s: the name '%s' is given twice", where,
                                  attn__printable(names[i], nb, sizeof(nb)));
        int rc = attn_tensor_check(ctx, &tensors[i], names[i]);
        if (rc)
            return rc;
        if (!st_save_dtype(tensors[i].dtype))
            return attn__fail(ctx, ATTN_STATUS_DTYPE, "%s: tensor '%s' has dtype %d", where,
                              attn__printable(names[i], nb, sizeof(nb)), (int)tensors[i].dtype);
        size_t bytes;
        if (!attn__bytes(attn_tensor_numel(&tensors[i]), attn_dtype_size(tensors[i].dtype),
                         &bytes))
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "%s: tensor '%s' is too large",
                              where, attn__printable(names[i], nb, sizeof(nb)));
    }
    st_buf b = {NULL, 0, 0};
    st_build_header(&b, names, tensors, n);
    size_t hlen = b.len;
    b.p = attn__alloc(ctx, hlen, "safetensors header");
    if (!b.p)
        return attn__alloc_status(ctx);
    b.cap = hlen;
    b.len = 0;
    st_build_header(&b, names, tensors, n);

    unsigned char len8[8];
    for (int k = 0; k < 8; k++)
        len8[k] = (unsigned char)(((uint64_t)hlen >> (8 * k)) & 0xff);
    int rc = attn__wfile_write(ctx, wf, len8, 8);
    if (!rc)
        rc = attn__wfile_write(ctx, wf, b.p, hlen);
    for (int64_t i = 0; i < n && !rc; i++)
        rc = attn__wfile_write_tensor(ctx, wf, &tensors[i]);
    attn__free(ctx, b.p);
    return rc;
}

int attn_safetensors_save(attn_ctx *ctx, const char *path, const char *const *names,
                          const attn_tensor *tensors, int64_t n)
{
    /* One file is an output set of one (src/io/output.c). */
    attn_output_set *set;
    int rc = attn_output_set_create(ctx, &set);
    if (rc)
        return rc;
    rc = attn_output_set_add_safetensors(ctx, set, path, names, tensors, n);
    if (!rc)
        rc = attn_output_set_commit(ctx, set);
    attn_output_set_free(ctx, set);
    return rc;
}
