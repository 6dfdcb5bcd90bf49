/*
 * test_rng.c - libattn draws PyTorch's random numbers, and the chapter's module on
 * them gives PyTorch's output and attention weights.
 *
 * The golden files in tests/data/rng/ were written by tests/golden/gen_rng.py with
 * torch 2.15.0 from PyPI (tests/data/rng/version.txt); manifest.txt says what each
 * file holds. Tolerances:
 *   - every drawn number must be within 1e-6 of PyTorch's (the contract);
 *   - draws that use no C library function (MT19937 bits, uniform_, nn.Linear init,
 *     and randn of 16 or more elements in the avx2 flavor: only +, *, fma and sqrt,
 *     all correctly rounded) must be bit-identical, since nothing may legitimately
 *     differ there. The double Box-Muller path (fewer than 16 elements) and the
 *     'default' flavor call log1p/sin/cos or logf/sinf/cosf, so another C library
 *     may move a last bit: those are held to 1e-6 only.
 *   - the forward pass runs in float32 in a different summation order from
 *     PyTorch's (MKL) matmuls, so output and attention are compared with 1e-6
 *     absolute (values are O(1); float32 rounding of sums of <= 20 terms stays
 *     well below that; the largest difference seen is printed).
 */
#include "attn.h"
#include "check.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATA ATTN_TEST_DATA_DIR "/rng"

static double max_seen_forward = 0.0;

/* Reads exactly n float32 values from DATA/rel; returns NULL (and fails a check)
 * when the file is missing or has another size. */
static float *read_f32(const char *rel, int64_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", DATA, rel);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    float *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    size_t got = fread(buf, sizeof(float), (size_t)n, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    CHECK_INT(got, n);
    CHECK(!extra);
    if (got != (size_t)n || extra) {
        fprintf(stderr, "%s: expected %" PRId64 " floats\n", path, n);
        free(buf);
        return NULL;
    }
    /* The files are little-endian; convert if this machine is not. */
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe == 0) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &buf[i], 4);
            u = (u >> 24) | ((u >> 8) & 0xff00u) | ((u << 8) & 0xff0000u) | (u << 24);
            memcpy(&buf[i], &u, 4);
        }
    }
    return buf;
}

/* Compares n values; `exact` also demands the same bits. Prints the first few
 * misses with their index. */
static void compare(const char *what, const float *got, const float *want, int64_t n,
                    double atol, int exact)
{
    int64_t misses = 0, bit_misses = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > worst)
            worst = d;
        if (!(d <= atol)) {
            if (misses < 5)
                fprintf(stderr, "  %s[%" PRId64 "]: %.9g vs torch %.9g (diff %.3g)\n", what,
                        i, (double)got[i], (double)want[i], d);
            misses++;
        }
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            bit_misses++;
    }
    CHECK_INT(misses, 0);
    if (exact) {
        if (bit_misses)
            fprintf(stderr, "  %s: %" PRId64 " of %" PRId64 " values differ in their bits\n",
                    what, bit_misses, n);
        CHECK_INT(bit_misses, 0);
    }
    if (misses)
        fprintf(stderr, "  %s: %" PRId64 " of %" PRId64 " values off by more than %g (worst %.3g)\n",
                what, misses, n, atol, worst);
}

static void test_mt19937_reference(void)
{
    TEST("MT19937 seeded with 5489 gives 4123659995 as its 10000th output (the value "
         "C++ requires of std::mt19937)");
    attn_rng rng;
    attn_rng_seed(&rng, 5489);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++)
        v = attn_rng_u32(&rng);
    CHECK_INT(v, 4123659995u);

    TEST("random64 puts the first 32-bit draw in the high half");
    attn_rng a, b;
    attn_rng_seed(&a, 77);
    attn_rng_seed(&b, 77);
    uint64_t hi = attn_rng_u32(&b), lo = attn_rng_u32(&b);
    CHECK(attn_rng_u64(&a) == ((hi << 32) | lo));

    TEST("only the low 32 bits of a seed count, as in torch.manual_seed");
    attn_rng_seed(&a, (UINT64_C(1) << 32) + 5);
    attn_rng_seed(&b, 5);
    int same = 1;
    for (int i = 0; i < 700; i++)
        same &= attn_rng_u32(&a) == attn_rng_u32(&b);
    CHECK(same);

    TEST("reseeding forgets the cached Box-Muller normal");
    float first[3], again[3];
    attn_rng_seed(&a, 3);
    attn_rng_randn(&a, first, 3); /* leaves a cached normal */
    CHECK(a.has_next_normal);
    attn_rng_seed(&a, 3);
    CHECK(!a.has_next_normal);
    attn_rng_randn(&a, again, 3);
    CHECK(memcmp(first, again, sizeof first) == 0);

    TEST("randn of zero elements draws nothing");
    attn_rng_seed(&a, 9);
    attn_rng_seed(&b, 9);
    attn_rng_randn(&a, NULL, 0);
    CHECK(attn_rng_u32(&a) == attn_rng_u32(&b));
}

static attn_rng_flavor parse_flavor(const char *s)
{
    return strcmp(s, "default") == 0 ? ATTN_RNG_TORCH_DEFAULT : ATTN_RNG_TORCH_AVX2;
}

static void seeded(attn_rng *rng, uint64_t seed, attn_rng_flavor flavor)
{
    attn_rng_seed(rng, seed);
    rng->flavor = flavor;
}

static void case_randn(const char *file, const char *flavor_s, uint64_t seed, char *sizes)
{
    int64_t n[32], count = 0, total = 0;
    for (char *tok = strtok(sizes, ","); tok && count < 32; tok = strtok(NULL, ","))
        total += n[count++] = strtoll(tok, NULL, 10);
    float *want = read_f32(file, total);
    if (!want)
        return;
    float *got = malloc((size_t)total * sizeof(float));
    attn_rng rng;
    attn_rng_flavor flavor = parse_flavor(flavor_s);
    seeded(&rng, seed, flavor);
    int64_t at = 0;
    for (int64_t i = 0; i < count; i++) {
        attn_rng_randn(&rng, got + at, n[i]);
        char what[400];
        snprintf(what, sizeof what, "%s call %" PRId64 " (randn(%" PRId64 "))", file, i, n[i]);
        compare(what, got + at, want + at, n[i], 1e-6,
                flavor == ATTN_RNG_TORCH_AVX2 && n[i] >= 16);
        at += n[i];
    }
    free(got);
    free(want);
}

static void case_uniform(const char *file, const char *flavor_s, uint64_t seed, int64_t n,
                         double lo, double hi)
{
    float *want = read_f32(file, n);
    if (!want)
        return;
    float *got = malloc((size_t)n * sizeof(float));
    attn_rng rng;
    seeded(&rng, seed, parse_flavor(flavor_s));
    attn_rng_uniform(&rng, got, n, (float)lo, (float)hi);
    compare(file, got, want, n, 1e-6, 1);
    free(got);
    free(want);
}

static void case_linear(const char *file, const char *flavor_s, uint64_t seed, int64_t in,
                        int64_t out)
{
    int64_t n = out * in + out;
    float *want = read_f32(file, n);
    if (!want)
        return;
    float *got = malloc((size_t)n * sizeof(float));
    attn_rng rng;
    seeded(&rng, seed, parse_flavor(flavor_s));
    attn_rng_linear_init(&rng, got, got + out * in, out, in);
    compare(file, got, want, n, 1e-6, 1);
    free(got);
    free(want);
}

/* Draws like the chapter (x, then the two nn.Linear layers), runs the module with the
 * SPEC's masks and compares everything with PyTorch. */
static void case_model(const char *dir, uint64_t seed, int64_t B, int64_t T, int64_t E,
                       int64_t H)
{
    char rel[512];
    const int64_t nx = B * T * E, nw = 3 * E * E, nb = 3 * E, nwo = E * E, nbo = E;
    const int64_t na = B * H * T * T;
    float *want[7] = {0};
    const char *names[7] = {"x", "qkv_weight", "qkv_bias", "output_weight",
                            "output_bias", "output", "attention"};
    const int64_t sizes[7] = {nx, nw, nb, nwo, nbo, nx, na};
    for (int i = 0; i < 7; i++) {
        snprintf(rel, sizeof rel, "%s/%s.f32", dir, names[i]);
        want[i] = read_f32(rel, sizes[i]);
        if (!want[i])
            goto done;
    }

    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_tensor x = {0}, wq = {0}, bq = {0}, wo = {0}, bo = {0}, ids = {0}, pad = {0},
                causal = {0}, comb = {0}, out = {0}, att = {0};
    const int64_t xs[3] = {B, T, E}, wqs[2] = {3 * E, E}, bqs[1] = {3 * E}, wos[2] = {E, E},
                  bos[1] = {E}, ids_s[2] = {B, T}, pads[4] = {B, 1, 1, T},
                  cs[4] = {1, 1, T, T}, combs[4] = {B, 1, T, T}, as[4] = {B, H, T, T};
    int rc = 0;
    rc |= attn_tensor_alloc(&ctx, &x, ATTN_DTYPE_F32, 3, xs);
    rc |= attn_tensor_alloc(&ctx, &wq, ATTN_DTYPE_F32, 2, wqs);
    rc |= attn_tensor_alloc(&ctx, &bq, ATTN_DTYPE_F32, 1, bqs);
    rc |= attn_tensor_alloc(&ctx, &wo, ATTN_DTYPE_F32, 2, wos);
    rc |= attn_tensor_alloc(&ctx, &bo, ATTN_DTYPE_F32, 1, bos);
    rc |= attn_tensor_alloc(&ctx, &ids, ATTN_DTYPE_I64, 2, ids_s);
    rc |= attn_tensor_alloc(&ctx, &pad, ATTN_DTYPE_BOOL, 4, pads);
    rc |= attn_tensor_alloc(&ctx, &causal, ATTN_DTYPE_BOOL, 4, cs);
    rc |= attn_tensor_alloc(&ctx, &comb, ATTN_DTYPE_BOOL, 4, combs);
    rc |= attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 3, xs);
    rc |= attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, 4, as);
    CHECK_INT(rc, ATTN_OK);
    if (rc)
        goto free_tensors;

    attn_rng rng;
    attn_rng_seed(&rng, seed);
    attn_rng_randn(&rng, x.data, nx);
    attn_rng_linear_init(&rng, wq.data, bq.data, 3 * E, E);
    attn_rng_linear_init(&rng, wo.data, bo.data, E, E);

    char what[600];
#define CMP(i, ptr, exact)                                                      \
    do {                                                                        \
        snprintf(what, sizeof what, "%s/%s", dir, names[i]);                     \
        compare(what, (const float *)(ptr), want[i], sizes[i], 1e-6, exact);      \
    } while (0)
    CMP(0, x.data, nx >= 16);
    CMP(1, wq.data, 1);
    CMP(2, bq.data, 1);
    CMP(3, wo.data, 1);
    CMP(4, bo.data, 1);

    /* SPEC section 2's demo token ids, pad id 0. */
    int64_t *id = ids.data;
    for (int64_t b = 0; b < B; b++) {
        int64_t m = T < 3 ? T : 3;
        int64_t real_len = T - 1 - (b % (m < 1 ? 1 : m));
        if (real_len < 1)
            real_len = 1;
        for (int64_t t = 0; t < T; t++)
            id[b * T + t] = t < real_len ? t + 1 + b * T : 0;
    }
    CHECK_INT(attn_mask_padding(&ctx, &ids, 0, &pad), ATTN_OK);
    CHECK_INT(attn_mask_causal(&ctx, T, &causal), ATTN_OK);
    CHECK_INT(attn_mask_and(&ctx, &pad, &causal, &comb), ATTN_OK);

    attn_mha_weights w = {wq, bq, wo, bo};
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &comb;
    const attn_impl impls[2] = {ATTN_IMPL_REF, ATTN_IMPL_AUTO};
    for (int k = 0; k < 2; k++) {
        ctx.impl = impls[k];
        memset(out.data, 0, (size_t)nx * sizeof(float));
        memset(att.data, 0, (size_t)na * sizeof(float));
        rc = attn_mha_forward(&ctx, &w, H, &x, &p, &out, &att);
        CHECK_INT(rc, ATTN_OK);
        if (rc) {
            fprintf(stderr, "  %s: %s\n", dir, ctx.message);
            continue;
        }
        for (int i = 5; i < 7; i++) {
            const float *got = i == 5 ? out.data : att.data;
            snprintf(what, sizeof what, "%s/%s (impl %s)", dir, names[i],
                     k == 0 ? "ref" : "auto");
            compare(what, got, want[i], sizes[i], 1e-6, 0);
            for (int64_t j = 0; j < sizes[i]; j++) {
                double d = fabs((double)got[j] - (double)want[i][j]);
                if (d > max_seen_forward)
                    max_seen_forward = d;
            }
        }
    }
#undef CMP

free_tensors:;
    attn_tensor *all[] = {&x, &wq, &bq, &wo, &bo, &ids, &pad, &causal, &comb, &out, &att};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attn_tensor_free(&ctx, all[i]);
done:
    for (int i = 0; i < 7; i++)
        free(want[i]);
}

static void test_golden(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/manifest.txt", DATA);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return;
    }
    char line[1024];
    int models = 0, draws = 0;
    while (fgets(line, sizeof line, f)) {
        char kind[32], a[256], b[64], c[256], d[64], e[64];
        uint64_t seed;
        line[strcspn(line, "\r\n")] = '\0';
        int got = sscanf(line, "%31s", kind);
        if (got != 1)
            continue;
        if (!strcmp(kind, "model")) {
            int64_t B, T, E, H;
            CHECK(sscanf(line, "%*s %255s %" SCNu64 " %" SCNd64 " %" SCNd64 " %" SCNd64
                               " %" SCNd64, a, &seed, &B, &T, &E, &H) == 6);
            TEST(line);
            case_model(a, seed, B, T, E, H);
            models++;
        } else if (!strcmp(kind, "randn")) {
            CHECK(sscanf(line, "%*s %255s %63s %" SCNu64 " %255s", a, b, &seed, c) == 4);
            TEST(line);
            case_randn(a, b, seed, c);
            draws++;
        } else if (!strcmp(kind, "uniform")) {
            int64_t n;
            CHECK(sscanf(line, "%*s %255s %63s %" SCNu64 " %" SCNd64 " %63s %63s", a, b,
                         &seed, &n, d, e) == 6);
            TEST(line);
            case_uniform(a, b, seed, n, strtod(d, NULL), strtod(e, NULL));
            draws++;
        } else if (!strcmp(kind, "linear")) {
            int64_t in, out;
            CHECK(sscanf(line, "%*s %255s %63s %" SCNu64 " %" SCNd64 " %" SCNd64, a, b,
                         &seed, &in, &out) == 5);
            TEST(line);
            case_linear(a, b, seed, in, out);
            draws++;
        } else {
            fprintf(stderr, "unknown manifest line: %s\n", line);
            CHECK(0);
        }
    }
    fclose(f);
    /* The manifest must not silently shrink. */
    CHECK(models >= 6);
    CHECK(draws >= 14);
    fprintf(stderr, "largest output/attention difference from torch: %.3g (limit 1e-6)\n",
            max_seen_forward);
}

int main(void)
{
    test_mt19937_reference();
    test_golden();
    return check_summary("test_rng");
}
