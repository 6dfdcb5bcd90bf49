/*
 * compat_files.h - reads tests/data/compat/EXPECTED and VERDICTS (written by
 * tests/golden/compat_python.py with numpy and safetensors) and checks attn against
 * them: the arrays Python wrote load with Python's values, bit for bit, and the edge
 * cases of the formats are accepted or refused as the VERDICTS file says. Used by
 * test_npy.c ("npy" lines) and test_safetensors.c ("st" lines); needs check.h and
 * io_test_util.h first.
 */
#ifndef ATTN_COMPAT_FILES_H
#define ATTN_COMPAT_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Splits line at tabs into at most max fields; returns how many. */
static inline int compat_fields(char *line, char **f, int max)
{
    int n = 0;
    f[n++] = line;
    for (char *p = line; *p && n < max; p++) {
        if (*p == '\t') {
            *p = '\0';
            f[n++] = p + 1;
        }
    }
    return n;
}

/* Undoes the escapes of a tensor name in EXPECTED (\\, \n, \t), in place. */
static inline void compat_unescape(char *s)
{
    char *o = s;
    for (; *s; s++) {
        if (*s == '\\' && s[1]) {
            s++;
            *o++ = *s == 'n' ? '\n' : *s == 't' ? '\t' : *s;
        } else {
            *o++ = *s;
        }
    }
    *o = '\0';
}

/* Loads one array as the line's kind says (an .npy file, or a tensor of a
 * .safetensors file). Returns the status; on failure prints the message. */
static inline int compat_load(attn_ctx *ctx, const char *kind, const char *file,
                              const char *tensor, attn_array *a)
{
    char rel[600];
    snprintf(rel, sizeof(rel), "compat/%s", file);
    memset(a, 0, sizeof(*a));
    int rc;
    if (strcmp(kind, "npy") == 0) {
        rc = attn_npy_load(ctx, io_data(rel), a);
    } else {
        attn_safetensors *st = NULL;
        rc = attn_safetensors_open(ctx, io_data(rel), &st);
        if (!rc)
            rc = attn_safetensors_get(ctx, st, tensor, a);
        attn_safetensors_close(ctx, st);
    }
    if (rc)
        fprintf(stderr, "  %s: %s\n", file, ctx->message);
    return rc;
}

/* Compares a loaded array with the line's dtype names, shape and values; prints the
 * first differences with both values. Returns the number of differences. */
static inline int compat_compare(const attn_array *a, char **f)
{
    int bad = 0;
    const char *file_dtype = f[3], *dtype = f[4];
    if (!a->file_dtype || strcmp(a->file_dtype, file_dtype) != 0) {
        fprintf(stderr, "  %s %s: file dtype '%s', expected '%s'\n", f[1], f[2],
                a->file_dtype ? a->file_dtype : "(null)", file_dtype);
        bad++;
    }
    attn_dtype want = strcmp(dtype, "f32") == 0   ? ATTN_DTYPE_F32
                      : strcmp(dtype, "i32") == 0 ? ATTN_DTYPE_I32
                      : strcmp(dtype, "i64") == 0 ? ATTN_DTYPE_I64
                                                  : ATTN_DTYPE_BOOL;
    if (a->tensor.dtype != want) {
        fprintf(stderr, "  %s %s: dtype %s, expected %s\n", f[1], f[2],
                attn_dtype_name(a->tensor.dtype), attn_dtype_name(want));
        return bad + 1;
    }
    char shape[128];
    shape[0] = '\0';
    for (int d = 0; d < a->tensor.ndim; d++)
        snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), "%s%lld",
                 d ? "," : "", (long long)a->tensor.shape[d]);
    if (strcmp(shape, f[5]) != 0) {
        fprintf(stderr, "  %s %s: shape %s, expected %s\n", f[1], f[2], shape, f[5]);
        return bad + 1;
    }
    int64_t n = attn_tensor_numel(&a->tensor), i = 0;
    char *p = f[6];
    for (; i < n; i++) {
        char *end;
        if (want == ATTN_DTYPE_F32) {
            float w = strtof(p, &end), g = ((const float *)a->tensor.data)[i];
            int same = isnan(w) ? isnan(g) : memcmp(&w, &g, sizeof(float)) == 0;
            if (!same && bad++ < 3)
                fprintf(stderr, "  %s %s[%lld] = %a, expected %a\n", f[1], f[2], (long long)i,
                        (double)g, (double)w);
        } else {
            long long w = strtoll(p, &end, 10), g;
            if (want == ATTN_DTYPE_I32)
                g = ((const int32_t *)a->tensor.data)[i];
            else if (want == ATTN_DTYPE_I64)
                g = ((const int64_t *)a->tensor.data)[i];
            else
                g = ((const uint8_t *)a->tensor.data)[i];
            if (g != w && bad++ < 3)
                fprintf(stderr, "  %s %s[%lld] = %lld, expected %lld\n", f[1], f[2],
                        (long long)i, g, w);
        }
        if (end == p)
            break;
        p = end;
    }
    if (i != n) {
        fprintf(stderr, "  %s %s: EXPECTED holds %lld values for %lld elements\n", f[1],
                f[2], (long long)i, (long long)n);
        bad++;
    }
    return bad;
}

/* Checks every line of EXPECTED of this kind; returns how many lines were checked. */
static inline int compat_check_expected(const char *kind)
{
    FILE *fp = fopen(io_data("compat/EXPECTED"), "r");
    CHECK(fp != NULL);
    if (!fp)
        return 0;
    static char line[1 << 16];
    int count = 0;
    while (fgets(line, sizeof(line), fp)) {
        if (line[0] == '#')
            continue;
        line[strcspn(line, "\n")] = '\0';
        char *f[7];
        if (compat_fields(line, f, 7) != 7 || strcmp(f[0], kind) != 0)
            continue;
        compat_unescape(f[2]);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        attn_array a;
        int rc = compat_load(&ctx, kind, f[1], f[2], &a);
        CHECK_INT(rc, 0);
        if (!rc)
            CHECK_INT(compat_compare(&a, f), 0);
        attn_array_free(&ctx, &a);
        count++;
    }
    fclose(fp);
    return count;
}

/* Checks every line of VERDICTS of this kind: attn accepts (opens the file and reads
 * every tensor) or refuses with the phrase. Returns how many lines were checked. */
static inline int compat_check_verdicts(const char *kind)
{
    FILE *fp = fopen(io_data("compat/VERDICTS"), "r");
    CHECK(fp != NULL);
    if (!fp)
        return 0;
    char line[2048];
    int count = 0;
    while (fgets(line, sizeof(line), fp)) {
        if (line[0] == '#')
            continue;
        line[strcspn(line, "\n")] = '\0';
        char *f[7];
        if (compat_fields(line, f, 7) < 5 || strcmp(f[0], kind) != 0)
            continue;
        char rel[600];
        snprintf(rel, sizeof(rel), "compat/%s", f[1]);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        int rc;
        if (strcmp(kind, "npy") == 0) {
            attn_array a;
            rc = attn_npy_load(&ctx, io_data(rel), &a);
            attn_array_free(&ctx, &a);
        } else {
            attn_safetensors *st = NULL;
            rc = attn_safetensors_open(&ctx, io_data(rel), &st);
            for (int64_t i = 0; !rc && i < attn_safetensors_count(st); i++) {
                attn_array a;
                rc = attn_safetensors_get(&ctx, st, attn_safetensors_name(st, i), &a);
                attn_array_free(&ctx, &a);
            }
            attn_safetensors_close(&ctx, st);
        }
        const char *got = rc ? "refuse" : "accept";
        if (strcmp(got, f[3]) != 0)
            fprintf(stderr, "  %s: attn would %s it (%s), VERDICTS says %s (Python: %s)\n",
                    f[1], got, rc ? ctx.message : "no error", f[3], f[2]);
        CHECK_STR_EQ(got, f[3]);
        if (rc) {
            CHECK_STR_CONTAINS(ctx.message, f[1]);
            if (strcmp(f[4], "-") != 0)
                CHECK_STR_CONTAINS(ctx.message, f[4]);
            CHECK(strchr(ctx.message, '\n') == NULL);
        }
        count++;
    }
    fclose(fp);
    return count;
}

#endif /* ATTN_COMPAT_FILES_H */
