/*
 * test_dispatch.c - the instruction-set dispatch: names, what the CPU supports,
 * ctx->arch, and the ATTN_ARCH environment variable.
 *
 * The process-wide choice is made once, on first use, so each ATTN_ARCH value is
 * tried in a child process (fork) that sets the variable before its first call.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_names(void)
{
    TEST("every arch has a name, and the name parses back to it");
    const attn_arch all[5] = {ATTN_ARCH_AUTO, ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                              ATTN_ARCH_AVX512};
    for (int a = 0; a < 5; a++) {
        attn_arch back = ATTN_ARCH_AUTO;
        CHECK_INT(attn_arch_parse(attn_arch_name(all[a]), &back), ATTN_OK);
        CHECK_INT(back, all[a]);
    }
    attn_arch x;
    CHECK_INT(attn_arch_parse("sse9", &x), ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_EQ(attn_arch_name((attn_arch)42), "unknown");
}

static void test_default(void)
{
    TEST("without ATTN_ARCH the selected path is the best one the CPU supports, and the "
         "reason names cpuid and xgetbv");
    CHECK(attn_arch_supported(ATTN_ARCH_REF));
    CHECK(attn_arch_supported(ATTN_ARCH_SCALAR));
    /* AVX-512 implies AVX2 in this dispatcher. */
    CHECK(!attn_arch_supported(ATTN_ARCH_AVX512) || attn_arch_supported(ATTN_ARCH_AVX2));
    const char *env = getenv("ATTN_ARCH");
    if (!env || !*env) {
        CHECK_INT(attn_arch_selected(NULL), attn_arch_best());
        CHECK_STR_CONTAINS(attn_arch_reason(NULL), "auto");
        /* A fast path is only ever chosen after asking the OS about its registers. */
        if (attn_arch_supported(ATTN_ARCH_AVX2))
            CHECK_STR_CONTAINS(attn_arch_reason(NULL), "xgetbv");
    }
    CHECK(attn_arch_selected(NULL) != ATTN_ARCH_AUTO);
}

/* The bfloat16 arch dispatch picks by itself: amx wherever the tiles are; avx512bf16
 * on AMD cores with AVX512-BF16 and no AMX, where vdpbf16ps measured faster than the
 * float32 kernel on widened copies; never avx512bf16 on an Intel core, where it
 * measured slower (src/runtime/dispatch.c, best_arch). The vendor is the one the
 * reason names from cpuid. */
static void test_best_bf16(void)
{
    TEST("the automatic choice is amx with AMX-BF16, avx512bf16 on AMD with AVX512-BF16 "
         "and no AMX, and never avx512bf16 on Intel");
    const unsigned x = attn_cpu_features();
    const attn_arch best = attn_arch_best();
    const char *reason = attn_arch_reason(NULL);
    const int avx512 = attn_arch_supported(ATTN_ARCH_AVX512);
    printf("  best %s, cpu features %s\n", attn_arch_name(best), attn_cpu_features_string());
    if (!avx512) {
        CHECK(best != ATTN_ARCH_AVX512_BF16 && best != ATTN_ARCH_AMX);
        return;
    }
    if (attn_arch_supported(ATTN_ARCH_AMX) && (x & ATTN_CPU_AMX_BF16)) {
        CHECK_INT(best, ATTN_ARCH_AMX);
    } else if (strstr(reason, "AuthenticAMD") && (x & ATTN_CPU_AVX512_BF16)) {
        CHECK_INT(best, ATTN_ARCH_AVX512_BF16);
    } else {
        CHECK_INT(best, ATTN_ARCH_AVX512);
    }
    /* Whichever it is, float32 still runs the avx512 kernels: the same bits as a
     * context forced to avx512. */
    attn_ctx a, b;
    attn_ctx_init(&a);
    attn_ctx_init(&b);
    a.threads = b.threads = 1;
    b.arch = ATTN_ARCH_AVX512;
    enum { T = 37, D = 24 };
    static float q[T * D], k[T * D], v[T * D], o1[T * D], o2[T * D];
    for (int i = 0; i < T * D; i++) {
        q[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        k[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
        v[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
    }
    const int64_t shape[4] = {1, 1, T, D};
    attn_tensor tq, tk, tv, t1, t2;
    CHECK_INT(attn_tensor_init(&a, &tq, ATTN_DTYPE_F32, q, 4, shape), ATTN_OK);
    CHECK_INT(attn_tensor_init(&a, &tk, ATTN_DTYPE_F32, k, 4, shape), ATTN_OK);
    CHECK_INT(attn_tensor_init(&a, &tv, ATTN_DTYPE_F32, v, 4, shape), ATTN_OK);
    CHECK_INT(attn_tensor_init(&a, &t1, ATTN_DTYPE_F32, o1, 4, shape), ATTN_OK);
    CHECK_INT(attn_tensor_init(&a, &t2, ATTN_DTYPE_F32, o2, 4, shape), ATTN_OK);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = 1;
    CHECK_INT(attn_sdpa(&a, &tq, &tk, &tv, &p, &t1, NULL), ATTN_OK);
    CHECK_INT(attn_sdpa(&b, &tq, &tk, &tv, &p, &t2, NULL), ATTN_OK);
    CHECK(memcmp(o1, o2, sizeof o1) == 0);
}

static void test_ctx(void)
{
    TEST("ctx->arch forces the path for that context, and one the CPU lacks is an "
         "UNSUPPORTED error that names it");
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = ATTN_ARCH_SCALAR;
    CHECK_INT(attn_arch_selected(&ctx), ATTN_ARCH_SCALAR);
    CHECK_STR_CONTAINS(attn_arch_reason(&ctx), "ctx->arch");
    const attn_arch fast[2] = {ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 2; a++) {
        if (attn_arch_supported(fast[a]))
            continue;
        float q[4] = {1, 2, 3, 4}, o[4];
        const int64_t s[4] = {1, 1, 1, 4};
        attn_tensor tq, to;
        attn_tensor_init(NULL, &tq, ATTN_DTYPE_F32, q, 4, s);
        attn_tensor_init(NULL, &to, ATTN_DTYPE_F32, o, 4, s);
        ctx.arch = fast[a];
        CHECK_INT(attn_sdpa(&ctx, &tq, &tq, &tq, NULL, &to, NULL), ATTN_STATUS_UNSUPPORTED);
        CHECK_STR_CONTAINS(ctx.message, attn_arch_name(fast[a]));
    }
}

/* In a child: set ATTN_ARCH, then check what the library chose. Exit 0 if right.
 * want = ATTN_ARCH_AUTO means "the best path"; for avx2/avx512 a CPU that lacks them
 * must fall back to the best path and say that it cannot run them. The parent
 * makes no library call before these children, so each child decides afresh. */
static int child_check(const char *value, attn_arch want, const char *reason_part)
{
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        setenv("ATTN_ARCH", value, 1);
        if (want == ATTN_ARCH_AUTO)
            want = attn_arch_best();
        if (!attn_arch_supported(want)) {
            want = attn_arch_best();
            reason_part = "cannot run it";
        }
        int ok = attn_arch_selected(NULL) == want &&
                 strstr(attn_arch_reason(NULL), reason_part) != NULL;
        if (!ok)
            fprintf(stderr, "  ATTN_ARCH=%s: selected %s, reason \"%s\"\n", value,
                    attn_arch_name(attn_arch_selected(NULL)), attn_arch_reason(NULL));
        if (ok && want == ATTN_ARCH_REF) {
            /* ref makes attn_sdpa the reference: the same bits as attn_sdpa_ref. */
            float q[2 * 3 * 5], o1[2 * 3 * 5], o2[2 * 3 * 5];
            attn_rng rng;
            attn_rng_seed(&rng, 7);
            attn_rng_uniform(&rng, q, 30, -1, 1);
            const int64_t s[4] = {1, 2, 3, 5};
            attn_tensor tq, t1, t2;
            attn_tensor_init(NULL, &tq, ATTN_DTYPE_F32, q, 4, s);
            attn_tensor_init(NULL, &t1, ATTN_DTYPE_F32, o1, 4, s);
            attn_tensor_init(NULL, &t2, ATTN_DTYPE_F32, o2, 4, s);
            ok = attn_sdpa(NULL, &tq, &tq, &tq, NULL, &t1, NULL) == ATTN_OK &&
                 attn_sdpa_ref(NULL, &tq, &tq, &tq, NULL, &t2, NULL) == ATTN_OK &&
                 memcmp(o1, o2, sizeof o1) == 0;
        }
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void test_env(void)
{
    TEST("ATTN_ARCH forces a path the CPU runs, says so in the reason, falls back to "
         "the best path (and says why) for one it cannot run or a bad name");
    CHECK(child_check("scalar", ATTN_ARCH_SCALAR, "ATTN_ARCH=scalar"));
    CHECK(child_check("ref", ATTN_ARCH_REF, "ATTN_ARCH=ref"));
    CHECK(child_check("auto", ATTN_ARCH_AUTO, "ATTN_ARCH=auto"));
    CHECK(child_check("nonsense", ATTN_ARCH_AUTO, "not one of"));
    CHECK(child_check("avx2", ATTN_ARCH_AVX2, "forced by ATTN_ARCH=avx2"));
    CHECK(child_check("avx512", ATTN_ARCH_AVX512, "forced by ATTN_ARCH=avx512"));
    CHECK(child_check("avx512bf16", ATTN_ARCH_AVX512_BF16, "forced by ATTN_ARCH=avx512bf16"));
    CHECK(child_check("amx", ATTN_ARCH_AMX, "forced by ATTN_ARCH=amx"));
    /* ATTN_BF16_EMULATE=1 lets avx512bf16 run on any AVX-512 CPU, and says so; the
     * children inherit it. */
    setenv("ATTN_BF16_EMULATE", "1", 1);
    CHECK(child_check("avx512bf16", ATTN_ARCH_AVX512_BF16, "forced by ATTN_ARCH=avx512bf16"));
    unsetenv("ATTN_BF16_EMULATE");
}

int main(void)
{
    test_env(); /* first: before this process makes its own choice */
    test_names();
    test_default();
    test_best_bf16();
    test_ctx();
    return check_summary("test_dispatch");
}
