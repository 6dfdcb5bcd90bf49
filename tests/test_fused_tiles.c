/*
 * test_fused_tiles.c - the fused kernel's tile sizes, chosen per microarchitecture
 * at dispatch (src/runtime/dispatch.c) and forced with ATTN_TILE=BRxBC, keep the
 * kernel within the reference's bound, and never make the result depend on the
 * thread count.
 *
 * The tiles are decided once per process, so each ATTN_TILE value is tried in a
 * child process (fork) that sets the variable before its first call. In each child
 * a handful of awkward problems (Tq and Tk in {17, 113, 200}, D in {3, 64}, no mask,
 * causal, a padding mask and a sliding window) run on every instruction set the
 * machine has, with 1 and 2 threads (under a sanitizer without T = 200), and are
 * held to test_fused_sweep.c's bound:
 *
 *     max |fused - oracle| <= 2 * max |reference - oracle| + 2e-6
 *
 * against a float64 oracle; the 2-thread output must equal the 1-thread one bit for
 * bit.
 *
 * The bfloat16 path on AMX plans tiles of its own (128 x 128, attn__amx_tiles) unless
 * ATTN_TILE forces both: where the CPU has AMX, a bfloat16 call's workspace size with
 * the default tiles must equal ATTN_TILE=128x128's and differ from 64x64's (the
 * scratch per worker grows with br x bc), and the reason must name them; elsewhere
 * that check is announced as skipped.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FLOOR 2e-6

/* Under a sanitizer (CI runs this test under AddressSanitizer, 10 to 20 times
 * slower) the longest sequence is left out: 17 and 113 still make several query
 * and key tiles under every override. */
#define TILES_QUICK CHECK_SANITIZED

enum { MASK_NONE, MASK_CAUSAL, MASK_PADDING, MASK_WINDOW, MASK_KINDS };
static const char *mask_names[MASK_KINDS] = {"none", "causal", "padding", "window"};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uni(void) /* uniform in [0, 1), xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

/* Whether query i may see key j under the problem's mask kind (window: 20 keys back,
 * causal top-left). */
static int visible(int kind, int64_t Tk, int64_t i, int64_t j, int64_t b)
{
    switch (kind) {
    case MASK_CAUSAL:
        return j <= i;
    case MASK_PADDING:
        return b == 0 || j < Tk - Tk / 4;
    case MASK_WINDOW:
        return j <= i && j >= i - 20;
    }
    return 1;
}

/* One problem [B=2, H=2, T, T, D] on every path and both thread counts; returns the
 * number of failures. */
static int run_problem(int64_t T, int64_t D, int kind)
{
    const int64_t B = 2, H = 2, n = B * H * T * D;
    float *q = malloc(sizeof(float) * n), *k = malloc(sizeof(float) * n);
    float *v = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
    float *o1 = malloc(sizeof(float) * n), *o2 = malloc(sizeof(float) * n);
    double *oracle = malloc(sizeof(double) * n), *w = malloc(sizeof(double) * T);
    uint8_t *mask = malloc((size_t)(B * T));
    for (int64_t e = 0; e < n; e++) {
        q[e] = (float)(2 * uni() - 1);
        k[e] = (float)(2 * uni() - 1);
        v[e] = (float)(2 * uni() - 1);
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < T; j++)
            mask[b * T + j] = (uint8_t)visible(MASK_PADDING, T, 0, j, b);
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < T; i++) {
            const float *qi = q + (bh * T + i) * D;
            double mx = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j < T; j++) {
                w[j] = -INFINITY;
                if (!visible(kind, T, i, j, bh / H))
                    continue;
                double s = 0.0;
                for (int64_t d = 0; d < D; d++)
                    s += (double)qi[d] * (double)k[(bh * T + j) * D + d];
                w[j] = s * scale;
                mx = w[j] > mx ? w[j] : mx;
            }
            for (int64_t j = 0; j < T; j++)
                sum += w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
            for (int64_t d = 0; d < D; d++) {
                double acc = 0.0;
                for (int64_t j = 0; j < T; j++)
                    acc += w[j] * (double)v[(bh * T + j) * D + d];
                oracle[(bh * T + i) * D + d] = acc / sum;
            }
        }

    const int64_t shape[4] = {B, H, T, D}, mshape[4] = {B, 1, 1, T};
    attn_tensor tq, tk, tv, tr, t1, t2, tm;
    attn_tensor_init(NULL, &tq, ATTN_DTYPE_F32, q, 4, shape);
    attn_tensor_init(NULL, &tk, ATTN_DTYPE_F32, k, 4, shape);
    attn_tensor_init(NULL, &tv, ATTN_DTYPE_F32, v, 4, shape);
    attn_tensor_init(NULL, &tr, ATTN_DTYPE_F32, ref, 4, shape);
    attn_tensor_init(NULL, &t1, ATTN_DTYPE_F32, o1, 4, shape);
    attn_tensor_init(NULL, &t2, ATTN_DTYPE_F32, o2, 4, shape);
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, mask, 4, mshape);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    if (kind == MASK_CAUSAL || kind == MASK_WINDOW)
        p.causal = ATTN_CAUSAL_TOP_LEFT;
    if (kind == MASK_WINDOW) {
        p.has_window = 1;
        p.window_left = 20;
        p.window_right = 0;
    }
    if (kind == MASK_PADDING)
        p.mask = &tm;

    int failures = 0;
    double ref_err = 0.0;
    if (attn_sdpa_ref(NULL, &tq, &tk, &tv, &p, &tr, NULL) != ATTN_OK)
        failures++;
    for (int64_t e = 0; e < n; e++)
        ref_err = fmax(ref_err, fabs((double)ref[e] - oracle[e]));
    const double bound = 2.0 * ref_err + FLOOR;
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = archs[a];
        ctx.threads = 1;
        const int r1 = attn_sdpa(&ctx, &tq, &tk, &tv, &p, &t1, NULL);
        ctx.threads = 2;
        const int r2 = attn_sdpa(&ctx, &tq, &tk, &tv, &p, &t2, NULL);
        double err = 0.0;
        for (int64_t e = 0; e < n; e++)
            err = fmax(err, fabs((double)o1[e] - oracle[e]));
        const int same = memcmp(o1, o2, sizeof(float) * n) == 0;
        if (r1 != ATTN_OK || r2 != ATTN_OK || !(err <= bound) || !same) {
            failures++;
            fprintf(stderr,
                    "  T=%lld D=%lld mask=%s arch=%s: status %d/%d, error %.3g (bound %.3g), "
                    "1 and 2 threads %s\n",
                    (long long)T, (long long)D, mask_names[kind], attn_arch_name(archs[a]), r1,
                    r2, err, bound, same ? "agree" : "DIFFER");
        }
    }
    free(q), free(k), free(v), free(ref), free(o1), free(o2), free(oracle), free(w), free(mask);
    return failures;
}

/* In a child: set ATTN_TILE, check that the reason names it (or says it was ignored)
 * and, when `run` is set, run every problem. Exit 0 when all pass. The parent makes no library call
 * before these children, so each child decides its tiles afresh. */
static int child_check(const char *value, const char *reason_part, int run)
{
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        setenv("ATTN_TILE", value, 1);
        int failures = 0;
        if (!strstr(attn_arch_reason(NULL), reason_part)) {
            failures++;
            fprintf(stderr, "  ATTN_TILE=%s: reason \"%s\" lacks \"%s\"\n", value,
                    attn_arch_reason(NULL), reason_part);
        }
        const int64_t Ts[3] = {17, 113, 200}, Ds[2] = {3, 64};
        const int n_t = TILES_QUICK ? 2 : 3;
        for (int t = 0; t < n_t * run; t++)
            for (int d = 0; d < 2; d++)
                for (int m = 0; m < MASK_KINDS; m++)
                    failures += run_problem(Ts[t], Ds[d], m);
        if (failures)
            fprintf(stderr, "  ATTN_TILE=%s: %d failures\n", value, failures);
        _exit(failures ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* In a child with ATTN_TILE=value (unset when empty): the workspace bytes of a bfloat16
 * attn_sdpa on the amx path (1 x 2 x 1024 x 1024, D 64, causal, 1 thread), sent back
 * through a pipe; 0 when this CPU, OS or build has no amx path, SIZE_MAX on an error
 * or a reason that does not say what the tiles are. */
static size_t amx_workspace(const char *value)
{
    int fd[2];
    if (pipe(fd) != 0)
        return SIZE_MAX;
    const pid_t pid = fork();
    if (pid < 0)
        return SIZE_MAX;
    if (pid == 0) {
        close(fd[0]);
        if (*value)
            setenv("ATTN_TILE", value, 1);
        else
            unsetenv("ATTN_TILE");
        size_t bytes = 0;
        if (attn_arch_supported(ATTN_ARCH_AMX)) {
            const char *reason = attn_arch_reason(NULL);
            const int names = strstr(reason, "bfloat16 on AMX: tiles 128x128") != NULL;
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = ATTN_ARCH_AMX;
            ctx.threads = 1;
            attn_tensor tq, tk, tv, to;
            const int64_t shape[4] = {1, 2, 1024, 64};
            uint16_t *buf = calloc(4 * 2 * 1024 * 64, sizeof *buf);
            attn_tensor_init(&ctx, &tq, ATTN_DTYPE_BF16, buf, 4, shape);
            attn_tensor_init(&ctx, &tk, ATTN_DTYPE_BF16, buf + 2 * 1024 * 64, 4, shape);
            attn_tensor_init(&ctx, &tv, ATTN_DTYPE_BF16, buf + 4 * 1024 * 64, 4, shape);
            attn_tensor_init(&ctx, &to, ATTN_DTYPE_BF16, buf + 6 * 1024 * 64, 4, shape);
            attn_sdpa_params prm;
            attn_sdpa_params_init(&prm);
            prm.causal = ATTN_CAUSAL_TOP_LEFT;
            if (attn_sdpa_workspace_size(&ctx, &tq, &tk, &tv, &prm, &to, NULL, &bytes) != ATTN_OK ||
                bytes == 0 || names != (*value == '\0')) {
                fprintf(stderr, "  ATTN_TILE=%s: %s; reason: %s\n", value, ctx.message, reason);
                bytes = SIZE_MAX;
            }
            attn_ctx_release(&ctx);
            free(buf);
        }
        _exit(write(fd[1], &bytes, sizeof bytes) == (ssize_t)sizeof bytes ? 0 : 1);
    }
    close(fd[1]);
    size_t bytes = SIZE_MAX;
    if (read(fd[0], &bytes, sizeof bytes) != (ssize_t)sizeof bytes)
        bytes = SIZE_MAX;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? bytes : SIZE_MAX;
}

int main(void)
{
    TEST("the tiles chosen for this machine, and every ATTN_TILE override, keep the fused "
         "kernel within twice the reference's error plus 2e-6 and the same bits for 1 and 2 "
         "threads, on every ISA path");
    CHECK(child_check("", "fused tiles", 1));
    CHECK(child_check("32x8", "forced by ATTN_TILE=32x8", 1));
    CHECK(child_check("96x40", "forced by ATTN_TILE=96x40", 1));
    CHECK(child_check("128x128", "forced by ATTN_TILE=128x128", 1));
    CHECK(child_check("256x512", "forced by ATTN_TILE=256x512", 1));
    TEST("an ATTN_TILE that is not BRxBC with br a multiple of 32 and bc of 8 is ignored, "
         "and the reason says so");
    CHECK(child_check("48x64", "ignored", 0));
    CHECK(child_check("64x", "ignored", 0));
    CHECK(child_check("64x12", "ignored", 0));
    /* strtol would take these (a leading blank, a sign); "BRxBC" has neither, and a
     * trailing blank was already refused. */
    CHECK(child_check(" 64x32", "ignored", 0));
    CHECK(child_check("+64x32", "ignored", 0));
    CHECK(child_check("64x 32", "ignored", 0));
    CHECK(child_check("64x+32", "ignored", 0));
    CHECK(child_check("64x32 ", "ignored", 0));
    TEST("bfloat16 on AMX plans 128x128 tiles of its own, which ATTN_TILE overrides, and the "
         "reason names them");
    const size_t ws_default = amx_workspace(""), ws_128 = amx_workspace("128x128"),
                 ws_64 = amx_workspace("64x64");
    if (ws_default == 0 && ws_128 == 0 && ws_64 == 0) {
        fprintf(stderr, "-- skipped: this CPU, OS or build has no amx path\n");
    } else {
        CHECK(ws_default != SIZE_MAX && ws_128 != SIZE_MAX && ws_64 != SIZE_MAX);
        CHECK(ws_default == ws_128);
        CHECK(ws_default != ws_64);
    }
    return check_summary("test_fused_tiles");
}
