/*
 * test_golden.c - attn against PyTorch, on the cases of tests/data/golden/ (made by
 * tests/golden/gen_golden.py; MANIFEST records the torch version).
 *
 * kind=mha cases: the weights load (by the case's name set, prefix and stored dtype)
 * to exactly the fused weights PyTorch used, and attn_mha_forward's output and
 * attention weights match nn.MultiheadAttention's.
 * kind=sdpa cases: attn_sdpa matches plain-PyTorch attention.
 * Both kernels (the reference and the default one) are checked.
 * kind=gqa cases (tests/data/golden_gqa/, made by tests/golden/gen_gqa.py): a
 * Llama-style block with separate projections and Hkv key/value heads loads with
 * attn_weights_load_gqa, and attn_gqa_forward's output, attention weights and
 * log-sum-exp match PyTorch's; the same weights packed by attn_gqa_pack give the
 * same bits through attn_mha_forward_packed.
 *
 * Tolerance: |attn - torch| <= ATOL + RTOL * |torch|, with ATOL = 2e-6, RTOL = 1e-5.
 * The expected values are float64 results rounded once to float32, so the difference
 * is attn's own float32 rounding. Here E <= 20 and T <= 9: a float32 dot product of n
 * terms carries at most about n * 2^-24 * sum|terms| (n = 20, sum|terms| ~ 5: ~6e-6)
 * and typically sqrt(n) times less (~1e-6); the chain projection -> softmax ->
 * weighted sum -> projection adds a few such errors of outputs of size O(1). The
 * worst difference seen with torch 2.15 is 2.4e-7 (printed for every case), so
 * 2e-6 leaves a margin of about 8 while any real mistake (a swapped head, a wrong
 * scale, a mask off by one) moves outputs by 1e-2 or more.
 */
#include "attn.h"
#include "check.h"
#include "io_test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 2e-6
#define RTOL 1e-5

typedef struct kv {
    char key[64];
    char val[256];
} kv;

typedef struct gcase {
    char name[256];
    char dir[600];
    kv items[32];
    int n;
} gcase;

static const char *get(const gcase *c, const char *key)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->items[i].key, key) == 0)
            return c->items[i].val;
    return "";
}

static const char *path_of(const gcase *c, const char *key, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", c->dir, get(c, key));
    return buf;
}

static int read_case(gcase *c, const char *folder, const char *name)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "%s", name);
    snprintf(c->dir, sizeof(c->dir), "%s/%s/%s", ATTN_TEST_DATA_DIR, folder, name);
    char p[1200];
    snprintf(p, sizeof(p), "%s/case.txt", c->dir);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    char line[400];
    while (fgets(line, sizeof(line), f) && c->n < 32) {
        line[strcspn(line, "\n")] = '\0';
        char *eq = strchr(line, '=');
        if (line[0] == '#' || !eq)
            continue;
        *eq = '\0';
        if (strlen(line) >= sizeof(c->items[0].key) || strlen(eq + 1) >= sizeof(c->items[0].val))
            continue;
        memcpy(c->items[c->n].key, line, strlen(line) + 1);
        memcpy(c->items[c->n].val, eq + 1, strlen(eq + 1) + 1);
        c->n++;
    }
    fclose(f);
    return 0;
}

/* Compares a float32 result with an expected .npy; returns the worst |diff|. */
static double compare(const gcase *c, const char *what, const attn_tensor *got,
                      const char *key)
{
    char p[1200];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array e;
    int rc = attn_npy_load(&ctx, path_of(c, key, p, sizeof(p)), &e);
    CHECK_INT(rc, 0);
    if (rc)
        return INFINITY;
    int64_t n = attn_tensor_numel(&e.tensor);
    CHECK_INT(attn_tensor_numel(got), n);
    double worst = 0;
    int bad = 0;
    const float *g = got->data, *x = e.tensor.data;
    for (int64_t i = 0; i < n && attn_tensor_numel(got) == n; i++) {
        double d = g[i] == x[i] ? 0.0 : fabs((double)g[i] - (double)x[i]); /* -inf lse */
        if (!(d <= ATOL + RTOL * fabs((double)x[i]))) {
            if (bad++ < 3)
                fprintf(stderr, "  %s %s[%lld]: attn %.9g, torch %.9g\n", c->name, what,
                        (long long)i, g[i], x[i]);
        }
        if (!(d <= worst))
            worst = d;
    }
    CHECK_INT(bad, 0);
    attn_array_free(&ctx, &e);
    return worst;
}

/* The loaded weights must equal, bit for bit, the float32 weights PyTorch used (the
 * stored F16/BF16 values are exact in float32, and separate q/k/v concatenate). */
static void compare_exact(const gcase *c, const char *file, const attn_tensor *got)
{
    char p[1200];
    snprintf(p, sizeof(p), "%s/%s", c->dir, file);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array e;
    CHECK_INT(attn_npy_load(&ctx, p, &e), 0);
    int64_t n = attn_tensor_numel(&e.tensor);
    CHECK_INT(attn_tensor_numel(got), n);
    CHECK_INT(got->ndim, e.tensor.ndim);
    if (e.buffer && attn_tensor_numel(got) == n)
        CHECK(memcmp(got->data, e.tensor.data, (size_t)n * 4) == 0);
    attn_array_free(&ctx, &e);
}

static void run_mha(const gcase *c, attn_impl impl)
{
    char p[1200];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    int64_t H = atoll(get(c, "num_heads"));
    attn_mha_weights w;
    int rc = attn_weights_load(&ctx, path_of(c, "weights", p, sizeof(p)), get(c, "prefix"), H,
                               &w);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", c->name, ctx.message);
        return;
    }
    compare_exact(c, "w_qkv.npy", &w.w_qkv);
    compare_exact(c, "b_qkv.npy", &w.b_qkv);
    compare_exact(c, "w_o.npy", &w.w_o);
    compare_exact(c, "b_o.npy", &w.b_o);

    attn_array x = {0}, ids = {0}, m = {0};
    attn_tensor pad = {0}, both = {0}, out = {0}, att = {0};
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "input", p, sizeof(p)), &x), 0);
    int single = x.tensor.ndim == 2;
    int64_t E = w.w_o.shape[0];
    int64_t B = single ? 1 : x.tensor.shape[0], T = x.tensor.shape[x.tensor.ndim - 2];
    attn_tensor x3;
    const int64_t s3[3] = {B, T, E};
    CHECK_INT(attn_tensor_init(&ctx, &x3, ATTN_DTYPE_F32, x.tensor.data, 3, s3), 0);

    const attn_tensor *mask = NULL;
    if (get(c, "token_ids")[0]) {
        CHECK_INT(attn_npy_load(&ctx, path_of(c, "token_ids", p, sizeof(p)), &ids), 0);
        attn_tensor ids2;
        const int64_t si[2] = {B, T}, sp[4] = {B, 1, 1, T};
        attn_tensor_init(&ctx, &ids2, ids.tensor.dtype, ids.tensor.data, 2, si);
        CHECK_INT(attn_tensor_alloc(&ctx, &pad, ATTN_DTYPE_BOOL, 4, sp), 0);
        CHECK_INT(attn_mask_padding(&ctx, &ids2, atoll(get(c, "pad_id")), &pad), 0);
        mask = &pad;
    }
    if (get(c, "mask")[0]) {
        CHECK_INT(attn_npy_load(&ctx, path_of(c, "mask", p, sizeof(p)), &m), 0);
        mask = &m.tensor;
        if (pad.data) {
            int nd;
            int64_t sb[4];
            CHECK_INT(attn_broadcast_shape(&ctx, 4, pad.shape, m.tensor.ndim, m.tensor.shape,
                                           &nd, sb), 0);
            CHECK_INT(attn_tensor_alloc(&ctx, &both, ATTN_DTYPE_BOOL, nd, sb), 0);
            CHECK_INT(attn_mask_and(&ctx, &pad, &m.tensor, &both), 0);
            mask = &both;
        }
    }
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.mask = mask;
    prm.causal = atoi(get(c, "causal"));
    const int64_t sa[4] = {B, H, T, T};
    CHECK_INT(attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 3, s3), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, 4, sa), 0);
    rc = attn_mha_forward(&ctx, &w, H, &x3, &prm, &out, &att);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", c->name, ctx.message);
    } else {
        double e1 = compare(c, "output", &out, "output");
        double e2 = compare(c, "attention", &att, "attention");
        fprintf(stderr, "   %-26s %-5s worst |diff| output %.2e, weights %.2e\n", c->name,
                impl == ATTN_IMPL_REF ? "ref" : "auto", e1, e2);
    }
    attn_weights_free(&ctx, &w);
    attn_array_free(&ctx, &x);
    attn_array_free(&ctx, &ids);
    attn_array_free(&ctx, &m);
    attn_tensor_free(&ctx, &pad);
    attn_tensor_free(&ctx, &both);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
}

static void run_sdpa(const gcase *c, attn_impl impl)
{
    char p[1200];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    attn_array q = {0}, k = {0}, v = {0}, m = {0};
    attn_tensor out = {0}, att = {0};
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "query", p, sizeof(p)), &q), 0);
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "key", p, sizeof(p)), &k), 0);
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "value", p, sizeof(p)), &v), 0);
    if (get(c, "mask")[0])
        CHECK_INT(attn_npy_load(&ctx, path_of(c, "mask", p, sizeof(p)), &m), 0);
    if (!q.buffer || !k.buffer || !v.buffer)
        return;
    int nd = q.tensor.ndim;
    int64_t so[4], sw[4];
    for (int i = 0; i < nd; i++)
        so[i] = sw[i] = q.tensor.shape[i];
    so[nd - 1] = v.tensor.shape[nd - 1];
    sw[nd - 1] = k.tensor.shape[nd - 2];
    CHECK_INT(attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, nd, so), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, nd, sw), 0);
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.mask = m.buffer ? &m.tensor : NULL;
    prm.causal = atoi(get(c, "causal"));
    if (get(c, "scale")[0]) {
        prm.has_scale = 1;
        prm.scale = strtof(get(c, "scale"), NULL);
    }
    int zero = strcmp(get(c, "empty_rows"), "zero") == 0;
    prm.empty_rows = zero ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
    int rc = attn_sdpa(&ctx, &q.tensor, &k.tensor, &v.tensor, &prm, &out, &att);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", c->name, ctx.message);
    } else {
        double e1 = compare(c, "output", &out, "output");
        double e2 = compare(c, "attention", &att, "attention");
        fprintf(stderr, "   %-26s %-5s worst |diff| output %.2e, weights %.2e\n", c->name,
                impl == ATTN_IMPL_REF ? "ref" : "auto", e1, e2);
    }
    if (zero) {
        /* The same case without 'zero' must refuse the fully masked row. */
        prm.empty_rows = ATTN_EMPTY_ROWS_ERROR;
        CHECK_INT(attn_sdpa(&ctx, &q.tensor, &k.tensor, &v.tensor, &prm, &out, &att),
                  ATTN_STATUS_EMPTY_ROW);
    }
    attn_array_free(&ctx, &q);
    attn_array_free(&ctx, &k);
    attn_array_free(&ctx, &v);
    attn_array_free(&ctx, &m);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
}

/* kind=sdpa_options (tests/golden/gen_options.py): every option of SPEC section 6,
 * with the output, the weights and the log-sum-exp checked; impl picks the kernel,
 * arch (when not AUTO) the instruction set. */
static void run_sdpa_options(const gcase *c, attn_impl impl, attn_arch arch, int threads)
{
    char p[1200];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    attn_array q = {0}, k = {0}, v = {0}, m = {0}, bias = {0}, slopes = {0}, sinks = {0};
    attn_tensor out = {0}, att = {0}, lse = {0};
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "query", p, sizeof(p)), &q), 0);
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "key", p, sizeof(p)), &k), 0);
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "value", p, sizeof(p)), &v), 0);
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    if (get(c, "mask")[0] && attn_npy_load(&ctx, path_of(c, "mask", p, sizeof(p)), &m) == 0)
        prm.mask = &m.tensor;
    if (get(c, "bias")[0] && attn_npy_load(&ctx, path_of(c, "bias", p, sizeof(p)), &bias) == 0)
        prm.bias = &bias.tensor;
    if (get(c, "sinks")[0] && attn_npy_load(&ctx, path_of(c, "sinks", p, sizeof(p)), &sinks) == 0)
        prm.sinks = &sinks.tensor;
    const char *alibi = get(c, "alibi");
    if (strcmp(alibi, "1") == 0)
        prm.alibi = 1;
    else if (alibi[0] && strcmp(alibi, "0") != 0 &&
             attn_npy_load(&ctx, path_of(c, "alibi", p, sizeof(p)), &slopes) == 0)
        prm.alibi_slopes = &slopes.tensor;
    prm.causal = atoi(get(c, "causal"));
    if (get(c, "scale")[0]) {
        prm.has_scale = 1;
        prm.scale = strtof(get(c, "scale"), NULL);
    }
    if (get(c, "window")[0]) {
        long long l, r;
        CHECK_INT(sscanf(get(c, "window"), "%lld,%lld", &l, &r), 2);
        prm.has_window = 1;
        prm.window_left = l;
        prm.window_right = r;
    }
    if (get(c, "softcap")[0])
        prm.softcap = strtof(get(c, "softcap"), NULL);
    const int zero = strcmp(get(c, "empty_rows"), "zero") == 0;
    prm.empty_rows = zero ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
    if (!q.buffer || !k.buffer || !v.buffer)
        return;
    const int64_t *qs = q.tensor.shape, *ks = k.tensor.shape, *vs = v.tensor.shape;
    const int64_t so[4] = {qs[0], qs[1], qs[2], vs[3]}, sw[4] = {qs[0], qs[1], qs[2], ks[2]};
    CHECK_INT(attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 4, so), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, 4, sw), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, 3, so), 0);
    prm.lse = &lse;
    int rc = attn_sdpa(&ctx, &q.tensor, &k.tensor, &v.tensor, &prm, &out, &att);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", c->name, ctx.message);
    } else {
        double e1 = compare(c, "output", &out, "output");
        double e2 = compare(c, "attention", &att, "attention");
        double e3 = compare(c, "lse", &lse, "lse");
        fprintf(stderr, "   %-26s %-6s %dt worst |diff| output %.2e, weights %.2e, lse %.2e\n",
                c->name, impl == ATTN_IMPL_REF ? "ref" : attn_arch_name(attn_arch_selected(&ctx)),
                threads, e1, e2, e3);
    }
    if (zero && !prm.sinks) {
        /* The same case without 'zero' must refuse the row that sees nothing. */
        prm.empty_rows = ATTN_EMPTY_ROWS_ERROR;
        CHECK_INT(attn_sdpa(&ctx, &q.tensor, &k.tensor, &v.tensor, &prm, &out, &att),
                  ATTN_STATUS_EMPTY_ROW);
    }
    attn_array_free(&ctx, &q);
    attn_array_free(&ctx, &k);
    attn_array_free(&ctx, &v);
    attn_array_free(&ctx, &m);
    attn_array_free(&ctx, &bias);
    attn_array_free(&ctx, &slopes);
    attn_array_free(&ctx, &sinks);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
    attn_tensor_free(&ctx, &lse);
}

/* kind=gqa: attn_weights_load_gqa + attn_gqa_forward against the Llama-style block
 * of gen_gqa.py, then attn_gqa_pack + attn_mha_forward_packed against that, bit for
 * bit. impl picks the kernel, arch (when not AUTO) the instruction set. */
static void run_gqa(const gcase *c, attn_impl impl, attn_arch arch, int threads)
{
    char p[1200];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    const int64_t H = atoll(get(c, "num_heads")), Hkv = atoll(get(c, "num_kv_heads"));
    attn_gqa_weights w;
    int rc = attn_weights_load_gqa(&ctx, path_of(c, "weights", p, sizeof(p)), get(c, "prefix"),
                                   H, Hkv, &w);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", c->name, ctx.message);
        return;
    }
    /* A projection has a bias exactly when the file has one. */
    const char *biases = strcmp(get(c, "biases"), "none") == 0 ? "" : get(c, "biases");
    const attn_tensor *bt[4] = {&w.b_q, &w.b_k, &w.b_v, &w.b_o};
    for (int i = 0; i < 4; i++)
        CHECK_INT(bt[i]->data != NULL, strchr(biases, "qkvo"[i]) != NULL);
    int64_t E = 0, D = 0;
    CHECK_INT(attn_gqa_weights_check(&ctx, &w, H, Hkv, &E, &D), 0);
    CHECK_INT(D, atoll(get(c, "head_dim")));

    attn_array x = {0}, ids = {0};
    attn_tensor pad = {0}, out = {0}, att = {0}, lse = {0}, out2 = {0}, att2 = {0}, lse2 = {0};
    attn_mha_packed *pw = NULL;
    CHECK_INT(attn_npy_load(&ctx, path_of(c, "input", p, sizeof(p)), &x), 0);
    if (!x.buffer)
        goto done;
    const int single = x.tensor.ndim == 2;
    const int64_t B = single ? 1 : x.tensor.shape[0], T = x.tensor.shape[x.tensor.ndim - 2];
    attn_tensor x3;
    const int64_t s3[3] = {B, T, E}, sa[4] = {B, H, T, T}, sl[3] = {B, H, T};
    CHECK_INT(attn_tensor_init(&ctx, &x3, ATTN_DTYPE_F32, x.tensor.data, 3, s3), 0);
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    if (get(c, "token_ids")[0]) {
        CHECK_INT(attn_npy_load(&ctx, path_of(c, "token_ids", p, sizeof(p)), &ids), 0);
        attn_tensor ids2;
        const int64_t si[2] = {B, T}, sp[4] = {B, 1, 1, T};
        attn_tensor_init(&ctx, &ids2, ids.tensor.dtype, ids.tensor.data, 2, si);
        CHECK_INT(attn_tensor_alloc(&ctx, &pad, ATTN_DTYPE_BOOL, 4, sp), 0);
        CHECK_INT(attn_mask_padding(&ctx, &ids2, atoll(get(c, "pad_id")), &pad), 0);
        prm.mask = &pad;
    }
    prm.causal = atoi(get(c, "causal"));
    CHECK_INT(attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 3, s3), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, 4, sa), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, 3, sl), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &out2, ATTN_DTYPE_F32, 3, s3), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &att2, ATTN_DTYPE_F32, 4, sa), 0);
    CHECK_INT(attn_tensor_alloc(&ctx, &lse2, ATTN_DTYPE_F32, 3, sl), 0);
    prm.lse = &lse;
    rc = attn_gqa_forward(&ctx, &w, H, Hkv, &x3, &prm, &out, &att);
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", c->name, ctx.message);
        goto done;
    }
    double e1 = compare(c, "output", &out, "output");
    double e2 = compare(c, "attention", &att, "attention");
    double e3 = compare(c, "lse", &lse, "lse");
    fprintf(stderr, "   %-28s %-6s %dt worst |diff| output %.2e, weights %.2e, lse %.2e\n",
            c->name, impl == ATTN_IMPL_REF ? "ref" : attn_arch_name(attn_arch_selected(&ctx)),
            threads, e1, e2, e3);

    CHECK_INT(attn_gqa_pack(&ctx, &w, H, Hkv, &pw), 0);
    prm.lse = &lse2;
    CHECK_INT(attn_mha_forward_packed(&ctx, pw, H, &x3, &prm, &out2, &att2), 0);
    const size_t no = (size_t)attn_tensor_numel(&out) * 4, na = (size_t)attn_tensor_numel(&att) * 4;
    const size_t nl = (size_t)attn_tensor_numel(&lse) * 4;
    if (memcmp(out.data, out2.data, no) != 0 || memcmp(att.data, att2.data, na) != 0 ||
        memcmp(lse.data, lse2.data, nl) != 0) {
        check_failures_++;
        fprintf(stderr, "  %s: packed weights do not give attn_gqa_forward's bits: out[0] %.9g "
                "vs %.9g\n", c->name, ((float *)out.data)[0], ((float *)out2.data)[0]);
    }
done:
    attn_mha_packed_free(&ctx, pw);
    attn_gqa_weights_free(&ctx, &w);
    attn_array_free(&ctx, &x);
    attn_array_free(&ctx, &ids);
    attn_tensor_free(&ctx, &pad);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
    attn_tensor_free(&ctx, &lse);
    attn_tensor_free(&ctx, &out2);
    attn_tensor_free(&ctx, &att2);
    attn_tensor_free(&ctx, &lse2);
}

/* The cases of tests/data/golden_gqa/ on the reference and on every instruction set
 * the machine has, 1 and 2 threads. */
static int gqa_cases(void)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/golden_gqa/MANIFEST", ATTN_TEST_DATA_DIR);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL);
    if (!f)
        return 0;
    TEST("a Llama-style block with Hkv = H, H/2 and 1 key/value heads (separate "
         "projections, with and without biases, padding and causal masks, H*D != E) "
         "agrees with PyTorch 2.x within 2e-6 + 1e-5 * |torch| on every path, and its "
         "packed weights give the same bits");
    const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#') {
            fprintf(stderr, "   %s\n", line);
            continue;
        }
        if (!line[0])
            continue;
        gcase c;
        CHECK_INT(read_case(&c, "golden_gqa", line), 0);
        CHECK_STR_EQ(get(&c, "kind"), "gqa");
        run_gqa(&c, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1);
        for (int a = 0; a < 3; a++)
            for (int t = 1; t <= 2; t++)
                if (attn_arch_supported(archs[a]))
                    run_gqa(&c, ATTN_IMPL_AUTO, archs[a], t);
        n++;
    }
    fclose(f);
    return n;
}

/* The cases of tests/data/golden_options/ on the reference and on attn_sdpa with
 * every instruction set the machine has, 1 and 2 threads. */
static int options_cases(void)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/golden_options/MANIFEST", ATTN_TEST_DATA_DIR);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL);
    if (!f)
        return 0;
    TEST("every option of current models (GQA, causal alignment, windows, softcap, "
         "ALiBi, bias, sinks, log-sum-exp) agrees with PyTorch 2.x within 2e-6 + "
         "1e-5 * |torch|, on every path with 1 and 2 threads");
    const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#') {
            fprintf(stderr, "   %s\n", line);
            continue;
        }
        if (!line[0])
            continue;
        gcase c;
        CHECK_INT(read_case(&c, "golden_options", line), 0);
        CHECK_STR_EQ(get(&c, "kind"), "sdpa_options");
        run_sdpa_options(&c, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1);
        for (int a = 0; a < 3; a++)
            for (int t = 1; t <= 2; t++)
                if (attn_arch_supported(archs[a]))
                    run_sdpa_options(&c, ATTN_IMPL_AUTO, archs[a], t);
        n++;
    }
    fclose(f);
    return n;
}

int main(void)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/golden/MANIFEST", ATTN_TEST_DATA_DIR);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL);
    if (!f)
        return check_summary("test_golden");
    char line[256];
    int mha = 0, sdpa = 0;
    TEST("every golden case agrees with PyTorch within 2e-6 + 1e-5 * |torch| (both "
         "kernels), and every weight name set loads to PyTorch's exact weights");
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#') {
            fprintf(stderr, "   %s\n", line);
            continue;
        }
        if (!line[0])
            continue;
        gcase c;
        CHECK_INT(read_case(&c, "golden", line), 0);
        const char *kind = get(&c, "kind");
        for (int impl = 0; impl < 2; impl++) {
            attn_impl which = impl ? ATTN_IMPL_REF : ATTN_IMPL_AUTO;
            if (strcmp(kind, "mha") == 0)
                run_mha(&c, which);
            else if (strcmp(kind, "sdpa") == 0)
                run_sdpa(&c, which);
            else
                CHECK(0);
        }
        mha += strcmp(kind, "mha") == 0;
        sdpa += strcmp(kind, "sdpa") == 0;
    }
    fclose(f);
    CHECK(mha >= 6);
    CHECK(sdpa >= 5);
    CHECK(options_cases() >= 14);
    CHECK(gqa_cases() >= 5);
    return check_summary("test_golden");
}
