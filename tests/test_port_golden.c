/*
 * test_port_golden.c - random combinations of SPEC section 6's options, forward and
 * backward, against a float64 oracle written in PyTorch (tests/data/port/, made by
 * tools/port_check.py --golden; MANIFEST records the torch version and the seed).
 *
 * Each problem draws GQA, a causal form, a window, softcap, ALiBi, an additive bias
 * and a boolean mask of broadcast shapes, sinks, a scale and an empty-rows mode at
 * once, on awkward sizes (1, 2, 3, 5, 17, 33, 113 rows or keys; head dims 1 to 256,
 * odd ones among them): what a port of a current model hits first. Each one runs on
 * the reference and on every instruction set the machine has, with 1 and 2 threads:
 *
 * - the output, the log-sum-exp and the gradients dq, dk, dv, dbias, dsinks (the
 *   backward from attn's own output and log-sum-exp, as a trainer calls it) are
 *   within the problem's stored elementwise bound of the oracle, and equal it
 *   exactly where it is infinite (the log-sum-exp of a row that sees no key);
 * - a problem whose row sees no key in error mode (without sinks) is refused with
 *   ATTN_STATUS_EMPTY_ROW by the forward and by the backward;
 * - 1 and 2 threads give the same bits on each path.
 *
 * The bound (tools/port_check.py, Report.compare): 4 x the error of the same formula
 * evaluated by torch in float32, plus 2^-18 of the oracle's largest magnitude, plus
 * 2^-20 of the sum of the absolute terms behind each element (the size of what
 * cancels: a row with one visible key has dq = 0 exactly, a sum of terms of the size
 * of dO.v). attn's worst error is printed per path; with torch 2.15 it is below 0.2
 * of the bound, while a planted mistake (the window's offset ignored when Tq != Tk,
 * the bias scaled under softcap) breaks the bound on many problems.
 */
#include "attn.h"
#include "check.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct problem {
    char name[32];
    long long B, H, Hkv, Tq, Tk, D, Dv;
    int causal, has_window, alibi, bias, mask, sinks, zero, refused;
    long long left, right;
    double scale, softcap;
} problem;

/* One problem's arrays, loaded from its safetensors file. */
typedef struct arrays {
    attn_array q, k, v, dout, out, lse, dq, dk, dv, dbias, dsinks;
    attn_array tol_out, tol_lse, tol_dq, tol_dk, tol_dv, tol_dbias, tol_dsinks;
    attn_array bias, sinks, mask, slopes;
} arrays;

static int parse_line(const char *line, problem *p)
{
    memset(p, 0, sizeof(*p));
    int n = sscanf(line, "%31s %lld %lld %lld %lld %lld %lld %lld %d %lf %d %lld %lld %lf %d %d %d "
                   "%d %d %d",
                   p->name, &p->B, &p->H, &p->Hkv, &p->Tq, &p->Tk, &p->D, &p->Dv, &p->causal,
                   &p->scale, &p->has_window, &p->left, &p->right, &p->softcap, &p->alibi,
                   &p->bias, &p->mask, &p->sinks, &p->zero, &p->refused);
    return n == 20 ? 0 : -1;
}

static int get(attn_ctx *ctx, attn_safetensors *st, const char *name, attn_array *a)
{
    if (!attn_safetensors_has(st, name))
        return 0;
    int rc = attn_safetensors_get(ctx, st, name, a);
    CHECK_INT(rc, 0);
    return rc;
}

static void load(attn_ctx *ctx, const problem *p, arrays *a)
{
    memset(a, 0, sizeof(*a));
    char path[1024];
    snprintf(path, sizeof(path), "%s/port/%s.safetensors", ATTN_TEST_DATA_DIR, p->name);
    attn_safetensors *st = NULL;
    CHECK_INT(attn_safetensors_open(ctx, path, &st), 0);
    if (!st)
        return;
    struct {
        const char *name;
        attn_array *a;
    } all[] = {{"q", &a->q},         {"k", &a->k},          {"v", &a->v},
               {"dout", &a->dout},   {"out", &a->out},      {"lse", &a->lse},
               {"dq", &a->dq},       {"dk", &a->dk},        {"dv", &a->dv},
               {"dbias", &a->dbias}, {"dsinks", &a->dsinks}, {"tol_out", &a->tol_out},
               {"tol_lse", &a->tol_lse}, {"tol_dq", &a->tol_dq}, {"tol_dk", &a->tol_dk},
               {"tol_dv", &a->tol_dv}, {"tol_dbias", &a->tol_dbias},
               {"tol_dsinks", &a->tol_dsinks}, {"bias", &a->bias}, {"sinks", &a->sinks},
               {"mask", &a->mask},   {"slopes", &a->slopes}};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        get(ctx, st, all[i].name, all[i].a);
    attn_safetensors_close(ctx, st);
}

static void unload(attn_ctx *ctx, arrays *a)
{
    attn_array *all[] = {&a->q,       &a->k,       &a->v,      &a->dout,      &a->out,
                         &a->lse,     &a->dq,      &a->dk,     &a->dv,        &a->dbias,
                         &a->dsinks,  &a->tol_out, &a->tol_lse, &a->tol_dq,   &a->tol_dk,
                         &a->tol_dv,  &a->tol_dbias, &a->tol_dsinks, &a->bias, &a->sinks,
                         &a->mask,    &a->slopes};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i]->buffer)
            attn_array_free(ctx, all[i]);
}

static void params_of(const problem *p, const arrays *a, attn_sdpa_params *prm)
{
    attn_sdpa_params_init(prm);
    prm->causal = p->causal;
    if (p->scale != 0.0) {
        prm->has_scale = 1;
        prm->scale = (float)p->scale;
    }
    if (p->has_window) {
        prm->has_window = 1;
        prm->window_left = p->left;
        prm->window_right = p->right;
    }
    prm->softcap = (float)p->softcap;
    prm->alibi = p->alibi == 1;
    prm->alibi_slopes = p->alibi == 2 ? &a->slopes.tensor : NULL;
    prm->bias = p->bias ? &a->bias.tensor : NULL;
    prm->mask = p->mask ? &a->mask.tensor : NULL;
    prm->sinks = p->sinks ? &a->sinks.tensor : NULL;
    prm->empty_rows = p->zero ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
}

/* The largest |got - want| / bound over the tensor; infinities must be equal.
 * Prints the first element past its bound with both values. */
static double worst_ratio(const char *what, const char *label, const attn_tensor *got,
                          const attn_array *want, const attn_array *tol)
{
    const int64_t n = attn_tensor_numel(got);
    CHECK_INT(n, attn_tensor_numel(&want->tensor));
    if (n != attn_tensor_numel(&want->tensor) || !tol->buffer)
        return INFINITY;
    const float *g = got->data, *w = want->tensor.data, *t = tol->tensor.data;
    double worst = 0.0;
    int reported = 0;
    for (int64_t i = 0; i < n; i++) {
        double r;
        if (!isfinite(w[i]))
            r = g[i] == w[i] ? 0.0 : INFINITY;
        else
            r = fabs((double)g[i] - (double)w[i]) / (double)t[i];
        if (!(r <= 1.0) && !reported) {
            fprintf(stderr, "  %s: %s[%lld] is %.9g, the oracle %.9g (bound %.3g)\n", label,
                    what, (long long)i, g[i], w[i], t[i]);
            reported = 1;
        }
        if (!(r <= worst))
            worst = r;
    }
    CHECK(worst <= 1.0);
    return worst;
}

static int same_bits(const attn_tensor *a, const attn_tensor *b)
{
    return memcmp(a->data, b->data, (size_t)attn_tensor_numel(a) * sizeof(float)) == 0;
}

/* The results of one run: out, lse and the gradients. */
typedef struct results {
    attn_tensor out, lse, dq, dk, dv, dbias, dsinks;
} results;

static void results_alloc(attn_ctx *ctx, const problem *p, const arrays *a, results *r)
{
    memset(r, 0, sizeof(*r));
    const int64_t so[4] = {p->B, p->H, p->Tq, p->Dv};
    CHECK_INT(attn_tensor_alloc(ctx, &r->out, ATTN_DTYPE_F32, 4, so), 0);
    CHECK_INT(attn_tensor_alloc(ctx, &r->lse, ATTN_DTYPE_F32, 3, so), 0);
    CHECK_INT(attn_tensor_alloc(ctx, &r->dq, ATTN_DTYPE_F32, 4, a->q.tensor.shape), 0);
    CHECK_INT(attn_tensor_alloc(ctx, &r->dk, ATTN_DTYPE_F32, 4, a->k.tensor.shape), 0);
    CHECK_INT(attn_tensor_alloc(ctx, &r->dv, ATTN_DTYPE_F32, 4, a->v.tensor.shape), 0);
    if (p->bias)
        CHECK_INT(attn_tensor_alloc(ctx, &r->dbias, ATTN_DTYPE_F32, a->bias.tensor.ndim,
                                    a->bias.tensor.shape),
                  0);
    if (p->sinks)
        CHECK_INT(attn_tensor_alloc(ctx, &r->dsinks, ATTN_DTYPE_F32, 1, a->sinks.tensor.shape),
                  0);
}

static void results_free(attn_ctx *ctx, results *r)
{
    attn_tensor *all[] = {&r->out, &r->lse, &r->dq, &r->dk, &r->dv, &r->dbias, &r->dsinks};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i]->data)
            attn_tensor_free(ctx, all[i]);
}

/* Runs problem p forward and backward under (impl, arch, threads); checks it against
 * the oracle and returns the worst error / bound (0 for a refused problem). */
static double run(const problem *p, const arrays *a, attn_impl impl, attn_arch arch,
                  int threads, results *r)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    char label[160];
    snprintf(label, sizeof(label), "%s %s %dt", p->name,
             impl == ATTN_IMPL_REF ? "ref" : attn_arch_name(attn_arch_selected(&ctx)), threads);
    attn_sdpa_params prm;
    params_of(p, a, &prm);
    prm.lse = &r->lse;
    int rc = attn_sdpa(&ctx, &a->q.tensor, &a->k.tensor, &a->v.tensor, &prm, &r->out, NULL);
    if (p->refused) {
        /* A row sees no key and there is no sink: both passes refuse the call. */
        CHECK_INT(rc, ATTN_STATUS_EMPTY_ROW);
        prm.lse = NULL;
        attn_sdpa_grads g = {&r->dq, &r->dk, &r->dv, p->bias ? &r->dbias : NULL,
                             p->sinks ? &r->dsinks : NULL};
        CHECK_INT(attn_sdpa_backward(&ctx, &a->q.tensor, &a->k.tensor, &a->v.tensor, &prm,
                                     &a->out.tensor, &a->lse.tensor, &a->dout.tensor, &g),
                  ATTN_STATUS_EMPTY_ROW);
        attn_ctx_release(&ctx);
        return 0.0;
    }
    CHECK_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", label, ctx.message);
        attn_ctx_release(&ctx);
        return INFINITY;
    }
    prm.lse = NULL;
    attn_sdpa_grads g = {&r->dq, &r->dk, &r->dv, p->bias ? &r->dbias : NULL,
                         p->sinks ? &r->dsinks : NULL};
    rc = attn_sdpa_backward(&ctx, &a->q.tensor, &a->k.tensor, &a->v.tensor, &prm, &r->out,
                            &r->lse, &a->dout.tensor, &g);
    CHECK_INT(rc, 0);
    if (rc)
        fprintf(stderr, "  %s: %s\n", label, ctx.message);
    attn_ctx_release(&ctx);
    double w = worst_ratio("out", label, &r->out, &a->out, &a->tol_out);
    double x = worst_ratio("lse", label, &r->lse, &a->lse, &a->tol_lse);
    w = x > w ? x : w;
    if (rc)
        return INFINITY;
    x = worst_ratio("dq", label, &r->dq, &a->dq, &a->tol_dq);
    w = x > w ? x : w;
    x = worst_ratio("dk", label, &r->dk, &a->dk, &a->tol_dk);
    w = x > w ? x : w;
    x = worst_ratio("dv", label, &r->dv, &a->dv, &a->tol_dv);
    w = x > w ? x : w;
    if (p->bias) {
        x = worst_ratio("dbias", label, &r->dbias, &a->dbias, &a->tol_dbias);
        w = x > w ? x : w;
    }
    if (p->sinks) {
        x = worst_ratio("dsinks", label, &r->dsinks, &a->dsinks, &a->tol_dsinks);
        w = x > w ? x : w;
    }
    return w;
}

int main(void)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/port/MANIFEST", ATTN_TEST_DATA_DIR);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f)
        return check_summary("test_port_golden");
    TEST("random combinations of every section 6 option (GQA, causal forms, windows, "
         "softcap, ALiBi, broadcast bias and masks, sinks, scale, empty rows) agree with "
         "a float64 PyTorch oracle, forward, log-sum-exp and backward, on every path "
         "with 1 and 2 threads, and 1 and 2 threads give the same bits");
    const attn_arch archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    const char *names[] = {"ref", "scalar", "avx2", "avx512"};
    double worst[4] = {0, 0, 0, 0};
    int n = 0, refused = 0;
    char line[512];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#') {
            if (n == 0 && strstr(line, "torch"))
                fprintf(stderr, "   %s\n", line);
            continue;
        }
        if (!line[0])
            continue;
        problem p;
        CHECK_INT(parse_line(line, &p), 0);
        if (parse_line(line, &p) != 0)
            continue;
        arrays a;
        load(&ctx, &p, &a);
        if (!a.q.buffer || !a.out.buffer) {
            unload(&ctx, &a);
            continue;
        }
        for (int path_i = 0; path_i < 4; path_i++) {
            const attn_impl impl = path_i == 0 ? ATTN_IMPL_REF : ATTN_IMPL_AUTO;
            const attn_arch arch = path_i == 0 ? ATTN_ARCH_AUTO : archs[path_i - 1];
            if (path_i > 0 && !attn_arch_supported(arch))
                continue;
            results r1, r2;
            results_alloc(&ctx, &p, &a, &r1);
            results_alloc(&ctx, &p, &a, &r2);
            double w1 = run(&p, &a, impl, arch, 1, &r1);
            double w2 = run(&p, &a, impl, arch, 2, &r2);
            if (!p.refused) {
                /* The same bits for 1 and 2 threads, forward and backward. */
                int same = same_bits(&r1.out, &r2.out) && same_bits(&r1.lse, &r2.lse) &&
                           same_bits(&r1.dq, &r2.dq) && same_bits(&r1.dk, &r2.dk) &&
                           same_bits(&r1.dv, &r2.dv) &&
                           (!p.bias || same_bits(&r1.dbias, &r2.dbias)) &&
                           (!p.sinks || same_bits(&r1.dsinks, &r2.dsinks));
                if (!same)
                    fprintf(stderr, "  %s %s: 1 and 2 threads differ\n", p.name,
                            names[path_i]);
                CHECK(same);
            }
            double w = w1 > w2 ? w1 : w2;
            if (!(w <= worst[path_i]))
                worst[path_i] = w;
            results_free(&ctx, &r1);
            results_free(&ctx, &r2);
        }
        refused += p.refused;
        unload(&ctx, &a);
        n++;
    }
    fclose(f);
    attn_ctx_release(&ctx);
    CHECK(n >= 30);
    CHECK(refused >= 1);
    fprintf(stderr, "   %d problems (%d refused for a row that sees no key); worst error / "
                    "bound: ref %.3f, scalar %.3f, avx2 %.3f, avx512 %.3f (0 where the path "
                    "is absent)\n",
            n, refused, worst[0], worst[1], worst[2], worst[3]);
    return check_summary("test_port_golden");
}
