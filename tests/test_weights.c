/*
 * test_weights.c - attention weights from .safetensors by the three name sets of
 * SPEC section 3, under a prefix, checked against each other and against num_heads.
 * The files are written here with attn_safetensors_save, so each case states exactly
 * what is in its file.
 */
#include "attn.h"
#include "check.h"
#include "io_test_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "test_weights"
#define E 6

static const char *tmp(const char *name) { return io_tmp(PROG, name); }

/* Distinct values per tensor so a swapped or misplaced block shows. */
static float Wqkv[3 * E * E], Bqkv[3 * E], Wo[E * E], Bo[E];

static void fill(void)
{
    for (int i = 0; i < 3 * E * E; i++)
        Wqkv[i] = 1000.0f + (float)i;
    for (int i = 0; i < 3 * E; i++)
        Bqkv[i] = 2000.0f + (float)i;
    for (int i = 0; i < E * E; i++)
        Wo[i] = 3000.0f + (float)i;
    for (int i = 0; i < E; i++)
        Bo[i] = 4000.0f + (float)i;
}

typedef struct fileset {
    const char *names[16];
    attn_tensor t[16];
    int n;
} fileset;

static void add(fileset *fs, const char *name, float *data, int ndim, int64_t d0, int64_t d1)
{
    const int64_t shape[2] = {d0, d1};
    attn_tensor_init(NULL, &fs->t[fs->n], ATTN_DTYPE_F32, data, ndim, shape);
    fs->names[fs->n++] = name;
}

static int save(const char *file, fileset *fs)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int rc = attn_safetensors_save(&ctx, tmp(file), fs->names, fs->t, fs->n);
    if (rc)
        fprintf(stderr, "  save failed: %s\n", ctx.message);
    return rc;
}

/* Checks w against the module-level arrays; bias_q/k/v/o say which biases the file
 * had (a missing one must load as zeros). */
static void check_weights(const attn_mha_weights *w, int bq, int bk, int bv, int bo)
{
    CHECK_INT(w->w_qkv.ndim, 2);
    CHECK_INT(w->w_qkv.shape[0], 3 * E);
    CHECK_INT(w->w_qkv.shape[1], E);
    CHECK_INT(w->b_qkv.shape[0], 3 * E);
    CHECK_INT(w->w_o.shape[0], E);
    CHECK_INT(w->w_o.shape[1], E);
    CHECK_INT(w->b_o.shape[0], E);
    if (!w->w_qkv.data || !w->b_qkv.data || !w->w_o.data || !w->b_o.data) {
        CHECK(0);
        return;
    }
    int bad = 0;
    for (int i = 0; i < 3 * E * E; i++)
        bad += ((float *)w->w_qkv.data)[i] != Wqkv[i];
    const int has[3] = {bq, bk, bv};
    for (int i = 0; i < 3 * E; i++)
        bad += ((float *)w->b_qkv.data)[i] != (has[i / E] ? Bqkv[i] : 0.0f);
    for (int i = 0; i < E * E; i++)
        bad += ((float *)w->w_o.data)[i] != Wo[i];
    for (int i = 0; i < E; i++)
        bad += ((float *)w->b_o.data)[i] != (bo ? Bo[i] : 0.0f);
    CHECK_INT(bad, 0);
}

static void test_chapter(void)
{
    TEST("the chapter's names (qkv.weight, qkv.bias, output.weight, output.bias) load as "
         "they are");
    fileset fs = {0};
    add(&fs, "qkv.weight", Wqkv, 2, 3 * E, E);
    add(&fs, "qkv.bias", Bqkv, 1, 3 * E, 0);
    add(&fs, "output.weight", Wo, 2, E, E);
    add(&fs, "output.bias", Bo, 1, E, 0);
    CHECK_INT(save("chapter.safetensors", &fs), 0);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_mha_weights w;
    int rc = attn_weights_load(&ctx, tmp("chapter.safetensors"), NULL, 2, &w);
    CHECK_INT(rc, 0);
    if (rc)
        fprintf(stderr, "  %s\n", ctx.message);
    check_weights(&w, 1, 1, 1, 1);
    attn_weights_free(&ctx, &w);
    CHECK(w.w_qkv.data == NULL);

    TEST("the chapter's module always has biases: a missing qkv.bias is an error that "
         "names it");
    fs.n = 0;
    add(&fs, "qkv.weight", Wqkv, 2, 3 * E, E);
    add(&fs, "output.weight", Wo, 2, E, E);
    add(&fs, "output.bias", Bo, 1, E, 0);
    CHECK_INT(save("chapter_nobias.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("chapter_nobias.safetensors"), "", 2, &w),
              ATTN_STATUS_FORMAT);
    CHECK_STR_CONTAINS(ctx.message, "'qkv.bias' is missing");
    CHECK(w.w_qkv.data == NULL);
}

static void test_torch_prefix(void)
{
    TEST("nn.MultiheadAttention's names load under a prefix such as 'layers.0.attn.'");
    fileset fs = {0};
    add(&fs, "layers.0.attn.in_proj_weight", Wqkv, 2, 3 * E, E);
    add(&fs, "layers.0.attn.in_proj_bias", Bqkv, 1, 3 * E, 0);
    add(&fs, "layers.0.attn.out_proj.weight", Wo, 2, E, E);
    add(&fs, "layers.0.attn.out_proj.bias", Bo, 1, E, 0);
    add(&fs, "layers.0.norm.weight", Bo, 1, E, 0); /* other tensors are ignored */
    CHECK_INT(save("torch.safetensors", &fs), 0);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_mha_weights w;
    CHECK_INT(attn_weights_load(&ctx, tmp("torch.safetensors"), "layers.0.attn.", 3, &w), 0);
    check_weights(&w, 1, 1, 1, 1);
    attn_weights_free(&ctx, &w);

    TEST("without the prefix, the message lists the names looked for and suggests the "
         "prefix the file has");
    CHECK_INT(attn_weights_load(&ctx, tmp("torch.safetensors"), NULL, 3, &w),
              ATTN_STATUS_FORMAT);
    CHECK_STR_CONTAINS(ctx.message, "no attention weights under the prefix ''");
    CHECK_STR_CONTAINS(ctx.message, "'in_proj_weight'");
    CHECK_STR_CONTAINS(ctx.message, "try the prefix 'layers.0.attn.'");
    CHECK_STR_CONTAINS(ctx.message, "torch.safetensors");

    TEST("nn.MultiheadAttention(bias=False) has no bias tensors: they load as zeros");
    fs.n = 0;
    add(&fs, "in_proj_weight", Wqkv, 2, 3 * E, E);
    add(&fs, "out_proj.weight", Wo, 2, E, E);
    CHECK_INT(save("torch_nobias.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("torch_nobias.safetensors"), NULL, 1, &w), 0);
    check_weights(&w, 0, 0, 0, 0);
    attn_weights_free(&ctx, &w);

    TEST("add_bias_kv (bias_k, bias_v) is refused: the chapter's module has no such rows");
    fs.n = 0;
    add(&fs, "in_proj_weight", Wqkv, 2, 3 * E, E);
    add(&fs, "out_proj.weight", Wo, 2, E, E);
    add(&fs, "bias_k", Bo, 1, E, 0);
    CHECK_INT(save("torch_biaskv.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("torch_biaskv.safetensors"), NULL, 1, &w),
              ATTN_STATUS_UNSUPPORTED);
    CHECK_STR_CONTAINS(ctx.message, "add_bias_kv");
}

static void test_separate(void)
{
    TEST("separate q/k/v projections are concatenated into w_qkv in the order q, k, v; "
         "o_proj becomes w_o");
    fileset fs = {0};
    add(&fs, "m.v_proj.weight", Wqkv + 2 * E * E, 2, E, E); /* file order is irrelevant */
    add(&fs, "m.q_proj.weight", Wqkv, 2, E, E);
    add(&fs, "m.k_proj.weight", Wqkv + E * E, 2, E, E);
    add(&fs, "m.o_proj.weight", Wo, 2, E, E);
    add(&fs, "m.q_proj.bias", Bqkv, 1, E, 0);
    add(&fs, "m.v_proj.bias", Bqkv + 2 * E, 1, E, 0);
    CHECK_INT(save("separate.safetensors", &fs), 0);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_mha_weights w;
    int rc = attn_weights_load(&ctx, tmp("separate.safetensors"), "m.", 2, &w);
    CHECK_INT(rc, 0);
    if (rc)
        fprintf(stderr, "  %s\n", ctx.message);
    TEST("a missing separate bias (here k_proj.bias and o_proj.bias) loads as zeros");
    check_weights(&w, 1, 0, 1, 0);
    attn_weights_free(&ctx, &w);

    TEST("a separate set without v_proj.weight is an error naming it");
    fs.n = 0;
    add(&fs, "q_proj.weight", Wqkv, 2, E, E);
    add(&fs, "k_proj.weight", Wqkv + E * E, 2, E, E);
    add(&fs, "o_proj.weight", Wo, 2, E, E);
    CHECK_INT(save("separate_nov.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("separate_nov.safetensors"), NULL, 2, &w),
              ATTN_STATUS_FORMAT);
    CHECK_STR_CONTAINS(ctx.message, "'v_proj.weight' is missing");

    TEST("a separate k_proj.weight whose shape differs from q_proj's is refused with "
         "both shapes");
    fs.n = 0;
    add(&fs, "q_proj.weight", Wqkv, 2, E, E);
    add(&fs, "k_proj.weight", Wqkv, 2, E, E - 1);
    add(&fs, "v_proj.weight", Wqkv, 2, E, E);
    add(&fs, "o_proj.weight", Wo, 2, E, E);
    CHECK_INT(save("separate_bad.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("separate_bad.safetensors"), NULL, 2, &w),
              ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "'k_proj.weight' has shape (6, 5); expected (E, E) = (6, 6)");
}

static void test_checks(void)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_mha_weights w;
    TEST("embed_dim not divisible by num_heads is refused with both numbers");
    CHECK_INT(attn_weights_load(&ctx, tmp("chapter.safetensors"), NULL, 4, &w),
              ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "embed_dim 6");
    CHECK_STR_CONTAINS(ctx.message, "num_heads 4");
    CHECK(w.w_qkv.data == NULL);
    CHECK_INT(attn_weights_load(&ctx, tmp("chapter.safetensors"), NULL, 0, &w),
              ATTN_STATUS_INVALID_ARGUMENT);

    TEST("output.weight of the wrong shape, and qkv.weight not (3E, E), are refused with "
         "the tensor's name and shape");
    fileset fs = {0};
    add(&fs, "qkv.weight", Wqkv, 2, 3 * E, E);
    add(&fs, "qkv.bias", Bqkv, 1, 3 * E, 0);
    add(&fs, "output.weight", Wo, 2, E - 1, E);
    add(&fs, "output.bias", Bo, 1, E, 0);
    CHECK_INT(save("chapter_bad.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("chapter_bad.safetensors"), NULL, 2, &w),
              ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "'output.weight' has shape (5, 6); expected (E, E) = (6, 6)");
    fs.n = 0;
    add(&fs, "qkv.weight", Wqkv, 2, 2 * E, E);
    add(&fs, "qkv.bias", Bqkv, 1, 3 * E, 0);
    add(&fs, "output.weight", Wo, 2, E, E);
    add(&fs, "output.bias", Bo, 1, E, 0);
    CHECK_INT(save("chapter_bad2.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("chapter_bad2.safetensors"), NULL, 2, &w),
              ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "'qkv.weight' has shape (12, 6); expected (3*E, E)");

    TEST("a file with two name sets under the same prefix is ambiguous and refused");
    fs.n = 0;
    add(&fs, "qkv.weight", Wqkv, 2, 3 * E, E);
    add(&fs, "qkv.bias", Bqkv, 1, 3 * E, 0);
    add(&fs, "output.weight", Wo, 2, E, E);
    add(&fs, "output.bias", Bo, 1, E, 0);
    add(&fs, "in_proj_weight", Wqkv + 1, 2, 3 * E, E - 1);
    CHECK_INT(save("two_sets.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("two_sets.safetensors"), NULL, 2, &w),
              ATTN_STATUS_FORMAT);
    CHECK_STR_CONTAINS(ctx.message, "ambiguous");

    TEST("integer weights are refused by name; a missing file is an IO error");
    int64_t iw[3 * E * E] = {0};
    const int64_t s[2] = {3 * E, E};
    attn_tensor_init(NULL, &fs.t[0], ATTN_DTYPE_I64, iw, 2, s);
    fs.n = 1;
    fs.names[0] = "qkv.weight";
    CHECK_INT(save("int.safetensors", &fs), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("int.safetensors"), NULL, 2, &w), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "'qkv.weight' is int64");

    TEST("a U8 weight is refused as uint8, the file's dtype, not as the bool it would "
         "load as");
    /* attn writes no U8, so the file is written by hand: one [3E, E] U8 tensor. */
    char hdr[160];
    int hl = snprintf(hdr, sizeof(hdr),
                      "{\"qkv.weight\":{\"dtype\":\"U8\",\"shape\":[%d,%d],"
                      "\"data_offsets\":[0,%d]}}",
                      3 * E, E, 3 * E * E);
    unsigned char u8file[8 + 160 + 3 * E * E] = {0};
    for (int k = 0; k < 8; k++)
        u8file[k] = (unsigned char)(((uint64_t)hl >> (8 * k)) & 0xff);
    memcpy(u8file + 8, hdr, (size_t)hl);
    CHECK_INT(io_write(tmp("u8.safetensors"), u8file, 8 + (size_t)hl + 3 * E * E), 0);
    CHECK_INT(attn_weights_load(&ctx, tmp("u8.safetensors"), NULL, 2, &w), ATTN_STATUS_DTYPE);
    CHECK_STR_CONTAINS(ctx.message, "'qkv.weight' is uint8");
    CHECK_INT(attn_weights_load(&ctx, tmp("nope.safetensors"), NULL, 2, &w), ATTN_STATUS_IO);
    CHECK_STR_CONTAINS(ctx.message, "nope.safetensors");
}

static void test_out_of_memory(void)
{
    TEST("an allocation failure at any point of a load returns NO_MEMORY and frees "
         "everything");
    const char *files[2] = {"separate.safetensors", "torch_nobias.safetensors"};
    const char *prefix[2] = {"m.", ""};
    for (int f = 0; f < 2; f++) {
        int done = 0;
        for (long k = 1; k < 200 && !done; k++) {
            attn_ctx ctx;
            io_failing_alloc fa;
            io_fa_ctx(&ctx, &fa, k);
            attn_mha_weights w;
            int rc = attn_weights_load(&ctx, tmp(files[f]), prefix[f], 2, &w);
            if (rc == 0) {
                done = 1;
                attn_weights_free(&ctx, &w);
            } else {
                CHECK_INT(rc, ATTN_STATUS_NO_MEMORY);
            }
            CHECK_INT(fa.live, 0);
        }
        CHECK(done);
    }
}

int main(void)
{
    fill();
    test_chapter();
    test_torch_prefix();
    test_separate();
    test_checks();
    test_out_of_memory();
    return check_summary(PROG);
}
