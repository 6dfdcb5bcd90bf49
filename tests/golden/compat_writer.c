/*
 * compat_writer.c - writes .npy and .safetensors files with the attn library, for
 * tests/golden/compat_python.py to load with numpy and safetensors.
 *
 * Usage: compat_writer DIR. Writes the files into DIR and, to standard output, one
 * line per array in the format of tests/data/compat/EXPECTED (kind, file, tensor,
 * file dtype, attn dtype, shape, values), so the Python side compares what numpy
 * reads with what attn wrote, bit for bit. Floats are printed with %a, which is
 * exact. Not part of the build: the script compiles it against the built library.
 */
#include "attn.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static char dir[1024];

static const char *at(const char *name)
{
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

/* Prints an EXPECTED line for t (contiguous or not; C order of the view). */
static void describe(const char *kind, const char *file, const char *tensor,
                     const attn_tensor *t)
{
    static const char *const file_names[] = {"float32", "int32", "int64", "bool"};
    static const char *const short_names[] = {"f32", "i32", "i64", "bool"};
    int d = t->dtype == ATTN_DTYPE_F32 ? 0 : t->dtype == ATTN_DTYPE_I32 ? 1
            : t->dtype == ATTN_DTYPE_I64 ? 2 : 3;
    /* A tensor name may hold a tab or a newline: the line shows it as a JSON-style
     * escape, which the reader of EXPECTED undoes. */
    printf("%s\t%s\t", kind, file);
    for (const char *c = tensor; *c; c++) {
        if (*c == '\n')
            fputs("\\n", stdout);
        else if (*c == '\t')
            fputs("\\t", stdout);
        else if (*c == '\\')
            fputs("\\\\", stdout);
        else
            putchar(*c);
    }
    printf("\t%s\t%s\t", file_names[d], short_names[d]);
    for (int i = 0; i < t->ndim; i++)
        printf("%s%" PRId64, i ? "," : "", t->shape[i]);
    putchar('\t');
    int64_t idx[ATTN_MAX_DIMS] = {0};
    int64_t n = attn_tensor_numel(t);
    for (int64_t e = 0; e < n; e++) {
        int64_t off = 0;
        for (int i = 0; i < t->ndim; i++)
            off += idx[i] * t->stride[i];
        const char *p = (const char *)t->data + off * (int64_t)attn_dtype_size(t->dtype);
        if (e)
            putchar(' ');
        if (d == 0) {
            float v;
            memcpy(&v, p, 4);
            if (isnan(v))
                printf("nan");
            else
                printf("%a", (double)v);
        } else if (d == 1) {
            int32_t v;
            memcpy(&v, p, 4);
            printf("%" PRId32, v);
        } else if (d == 2) {
            int64_t v;
            memcpy(&v, p, 8);
            printf("%" PRId64, v);
        } else {
            printf("%d", (int)*(const unsigned char *)p);
        }
        for (int i = t->ndim - 1; i >= 0; i--) {
            if (++idx[i] < t->shape[i])
                break;
            idx[i] = 0;
        }
    }
    putchar('\n');
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: compat_writer DIR\n");
        return 2;
    }
    snprintf(dir, sizeof(dir), "%s", argv[1]);
    attn_ctx ctx;
    attn_ctx_init(&ctx);

    float f[2 * 3 * 4 * 5];
    for (int i = 0; i < 120; i++)
        f[i] = (float)sin(i * 0.37) * 1e3f / (float)(i + 1);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MIN / 8, FLT_MAX,
                             1.0f / 3.0f};
    memcpy(f, special, sizeof(special));
    int32_t i32[6] = {0, -1, INT32_MAX, INT32_MIN, 42, 7};
    int64_t i64[6] = {0, -1, INT64_MAX, INT64_MIN, 42, 7};
    uint8_t b[6] = {1, 0, 0, 1, 1, 0};
    const int64_t s4[4] = {2, 3, 4, 5}, s2[2] = {2, 3}, s1[1] = {7};

    attn_tensor t4, t1, tb, ti32, ti64, tbool, tt;
    attn_tensor_init(&ctx, &t4, ATTN_DTYPE_F32, f, 4, s4);
    attn_tensor_init(&ctx, &t1, ATTN_DTYPE_F32, f + 5, 1, s1);
    attn_tensor_init(&ctx, &tb, ATTN_DTYPE_F32, f, 2, s2);
    attn_tensor_transpose(&ctx, &tb, 0, 1, &tt); /* (3, 2), strided */
    attn_tensor_init(&ctx, &ti32, ATTN_DTYPE_I32, i32, 2, s2);
    attn_tensor_init(&ctx, &ti64, ATTN_DTYPE_I64, i64, 2, s2);
    attn_tensor_init(&ctx, &tbool, ATTN_DTYPE_BOOL, b, 2, s2);

    const struct {
        const char *file;
        const attn_tensor *t;
    } npys[] = {{"attn_f32_4d.npy", &t4}, {"attn_f32_1d.npy", &t1},
                {"attn_f32_transposed.npy", &tt}, {"attn_i32.npy", &ti32},
                {"attn_i64.npy", &ti64}, {"attn_bool.npy", &tbool}};
    for (size_t k = 0; k < sizeof(npys) / sizeof(npys[0]); k++) {
        if (attn_npy_save(&ctx, at(npys[k].file), npys[k].t)) {
            fprintf(stderr, "compat_writer: %s\n", ctx.message);
            return 1;
        }
        describe("npy", npys[k].file, "-", npys[k].t);
    }

    const char *names[6] = {"layers.0.attn.qkv.weight", "quote\"s and back\\slash",
                            "line\nbreak\ttab", "caf\xc3\xa9 \xe2\x88\x9a",
                            "\xf0\x9f\x98\x80 four bytes", "mask"};
    attn_tensor ts[6] = {t4, tt, ti32, ti64, t1, tbool};
    if (attn_safetensors_save(&ctx, at("attn_named.safetensors"), names, ts, 6)) {
        fprintf(stderr, "compat_writer: %s\n", ctx.message);
        return 1;
    }
    for (int k = 0; k < 6; k++)
        describe("st", "attn_named.safetensors", names[k], &ts[k]);
    return 0;
}
