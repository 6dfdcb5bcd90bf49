/*
 * common_cli.c - the option parser, the number rule and error printing for every
 * program in tools/; see common_cli.h for the conventions.
 */
#define _POSIX_C_SOURCE 200809L

#include "common_cli.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Prints "PROG: " + the message on one line: a newline inside the message (a file
 * name with a newline, say) is shown as a space so the error stays one line. */
static void vline(const char *prog, const char *suffix, const char *fmt, va_list ap)
{
    char buf[1024];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    for (char *c = buf; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    fprintf(stderr, "%s: %s%s\n", prog, buf, suffix);
}

/* The failing allocator of ATTN_FAIL_ALLOC_AT: one per process, as a tool makes
 * one context. */
static long fail_alloc_at, alloc_calls;

static void *cli_failing_alloc(void *user, size_t size)
{
    (void)user;
    return ++alloc_calls == fail_alloc_at ? NULL : malloc(size);
}

static void cli_plain_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

void cli_ctx_init(attn_ctx *ctx)
{
    attn_ctx_init(ctx);
    const char *at = getenv("ATTN_FAIL_ALLOC_AT");
    int64_t n;
    if (at && cli_parse_int64(at, &n) == CLI_NUM_OK && n >= 1) {
        fail_alloc_at = (long)n;
        alloc_calls = 0;
        ctx->allocator.alloc = cli_failing_alloc;
        ctx->allocator.free = cli_plain_free;
    }
}

void cli_error(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline(prog, "", fmt, ap);
    va_end(ap);
}

int cli_usage_error(const char *prog, const char *fmt, ...)
{
    char suffix[160];
    snprintf(suffix, sizeof(suffix), " (run '%s --help')", prog);
    va_list ap;
    va_start(ap, fmt);
    vline(prog, suffix, fmt, ap);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_fail(const char *prog, const attn_ctx *ctx)
{
    cli_error(prog, "%s", ctx->message[0] ? ctx->message : attn_strerror(ctx->status));
    return CLI_EXIT_ERROR;
}

const char *cli_shape(const attn_tensor *t, char *buf, size_t cap)
{
    attn_shape_format(buf, cap, t->ndim, t->shape);
    return buf;
}

/* Checks that s is a plain decimal number and nothing else: an optional '-', digits,
 * and, when `real`, an optional fraction and exponent ("-1", "0.5", ".5", "1e-3").
 * strtoll and strtod alone would accept leading spaces, '+', hex and "inf", which
 * the rule refuses; they are used only once the text has passed this check.
 * *nonzero says whether any digit before the exponent is not 0, so that a value
 * that rounds to 0 can be told from a written 0. */
static int decimal_syntax(const char *s, int real, int *nonzero)
{
    const char *p = s;
    int digits = 0;
    *nonzero = 0;
    if (*p == '-')
        p++;
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        *nonzero |= *p != '0';
    if (real && *p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++, digits++)
            *nonzero |= *p != '0';
    if (!digits)
        return 0;
    if (real && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '-' || *p == '+')
            p++;
        int exp_digits = 0;
        for (; *p >= '0' && *p <= '9'; p++)
            exp_digits++;
        if (!exp_digits)
            return 0;
    }
    return *p == '\0';
}

cli_num cli_parse_int64(const char *s, int64_t *out)
{
    int nonzero;
    if (!s || !decimal_syntax(s, 0, &nonzero))
        return CLI_NUM_SYNTAX;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE)
        return CLI_NUM_TOO_BIG;
    if (*end)
        return CLI_NUM_SYNTAX;
    *out = (int64_t)v;
    return CLI_NUM_OK;
}

cli_num cli_parse_float(const char *s, float *out)
{
    int nonzero;
    if (!s || !decimal_syntax(s, 1, &nonzero))
        return CLI_NUM_SYNTAX;
    char *end;
    double v = strtod(s, &end); /* ERANGE is judged below, against float32 */
    if (*end)
        return CLI_NUM_SYNTAX;
    /* Halfway between FLT_MAX and 2^128: from here on float32 rounds to infinity
     * (round to nearest, ties to even), so compare before converting, which C
     * leaves undefined for a value float cannot hold. */
    if (!isfinite(v) || fabs(v) >= 0x1.ffffffp+127)
        return CLI_NUM_TOO_BIG;
    const float f = (float)v;
    if (f == 0.0f && nonzero)
        return CLI_NUM_TO_ZERO;
    *out = f;
    return CLI_NUM_OK;
}

int cli_fail_attention(const char *prog, const attn_ctx *ctx, const char *mask_path)
{
    if (ctx->status == ATTN_STATUS_MASK_BROADCAST && mask_path) {
        cli_error(prog, "--mask %s: %s", mask_path, ctx->message);
        return CLI_EXIT_ERROR;
    }
    if (ctx->status != ATTN_STATUS_EMPTY_ROW)
        return cli_fail(prog, ctx);
    /* The library's message ends with advice for C callers ("(use empty_rows = zero
     * ...)"); a command-line user needs the flag instead. Everything before that
     * advice (which query, batch and head) is kept as the library wrote it. */
    const char *m = ctx->message;
    const char *advice = strstr(m, " (use ");
    int keep = advice ? (int)(advice - m) : (int)strlen(m);
    cli_error(prog, "%.*s (use --empty-rows zero to give such rows zero output)", keep, m);
    return CLI_EXIT_ERROR;
}

const cli_opt *cli_find(const cli_opt *opts, int nopts, const char *name)
{
    for (int i = 0; i < nopts; i++)
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    return NULL;
}

int cli_seen(const cli_opt *opts, int nopts, const char *name)
{
    const cli_opt *o = cli_find(opts, nopts, name);
    return o && o->seen;
}

static int set_value(const char *prog, cli_opt *o, const char *v)
{
    switch (o->kind) {
    case CLI_FLAG:
        *(int *)o->dest = 1;
        return CLI_PARSED;
    case CLI_STRING:
        if (!*v)
            return cli_usage_error(prog, "--%s needs a non-empty value", o->name);
        *(const char **)o->dest = v;
        return CLI_PARSED;
    case CLI_INT: {
        int64_t x = 0;
        const cli_num r = cli_parse_int64(v, &x);
        if (r == CLI_NUM_SYNTAX)
            return cli_usage_error(prog, "--%s takes a whole number, not '%s'", o->name, v);
        if (r == CLI_NUM_OK && x >= o->min && x <= o->max) {
            *(int64_t *)o->dest = x;
            return CLI_PARSED;
        }
        /* Out of range or beyond 64 bits: both name the range and the text given. A
         * value beyond 64 bits is below the range when it is negative. */
        const int below = r == CLI_NUM_OK ? x < o->min : v[0] == '-';
        if (below ? o->min == INT64_MIN : o->max == INT64_MAX)
            return cli_usage_error(prog, "--%s does not fit in 64 bits (got %s)", o->name, v);
        if (below && o->max == INT64_MAX)
            return cli_usage_error(prog, "--%s must be at least %lld (got %s)", o->name,
                                   (long long)o->min, v);
        return cli_usage_error(prog, "--%s must be in %lld..%lld (got %s)", o->name,
                               (long long)o->min, (long long)o->max, v);
    }
    case CLI_FLOAT: {
        float x = 0;
        switch (cli_parse_float(v, &x)) {
        case CLI_NUM_OK:
            *(float *)o->dest = x;
            return CLI_PARSED;
        case CLI_NUM_SYNTAX:
            return cli_usage_error(prog, "--%s takes a finite number, not '%s'", o->name, v);
        case CLI_NUM_TOO_BIG:
            return cli_usage_error(prog, "--%s %s is too large for float32 (it would be "
                                   "infinity)", o->name, v);
        case CLI_NUM_TO_ZERO:
            return cli_usage_error(prog, "--%s %s is too small for float32 (it would be 0)",
                                   o->name, v);
        }
        return CLI_EXIT_USAGE;
    }
    case CLI_CHOICE:
        for (int k = 0; o->choices[k]; k++)
            if (strcmp(o->choices[k], v) == 0) {
                *(int *)o->dest = k;
                return CLI_PARSED;
            }
        {
            char list[256] = "";
            for (int k = 0; o->choices[k]; k++) {
                strncat(list, k ? "|" : "", sizeof(list) - strlen(list) - 1);
                strncat(list, o->choices[k], sizeof(list) - strlen(list) - 1);
            }
            return cli_usage_error(prog, "--%s takes %s, not '%s'", o->name, list, v);
        }
    }
    return CLI_EXIT_USAGE;
}

int cli_parse(const char *prog, int argc, char **argv, cli_opt *opts, int nopts,
              const char *help_text)
{
    for (int i = 0; i < nopts; i++)
        opts[i].seen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(help_text, stdout);
            return CLI_EXIT_OK;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2])
            return cli_usage_error(prog, "unexpected argument '%s'", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        cli_opt *o = NULL;
        for (int k = 0; k < nopts; k++)
            if (strlen(opts[k].name) == len && strncmp(opts[k].name, name, len) == 0)
                o = &opts[k];
        if (!o)
            return cli_usage_error(prog, "unknown option '--%.*s'", (int)len, name);
        if (o->seen)
            return cli_usage_error(prog, "--%s is given twice", o->name);
        o->seen = 1;
        const char *v = NULL;
        if (o->kind == CLI_FLAG) {
            if (eq)
                return cli_usage_error(prog, "--%s takes no value", o->name);
        } else if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc)
                return cli_usage_error(prog, "--%s needs a value", o->name);
            v = argv[++i];
        }
        int rc = set_value(prog, o, v);
        if (rc != CLI_PARSED)
            return rc;
    }
    return CLI_PARSED;
}

int cli_require(const char *prog, const cli_opt *opts, int nopts, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!cli_seen(opts, nopts, names[i]))
            return cli_usage_error(prog, "missing --%s", names[i]);
    return CLI_PARSED;
}

int cli_load_npy(const char *prog, attn_ctx *ctx, const char *what, const char *path,
                 attn_array *out)
{
    if (attn_npy_load(ctx, path, out) == ATTN_OK)
        return 0;
    cli_error(prog, "%s: %s", what, ctx->message);
    return CLI_EXIT_ERROR;
}

int cli_load_mask(const char *prog, attn_ctx *ctx, const char *path, attn_array *out)
{
    if (cli_load_npy(prog, ctx, "--mask", path, out))
        return CLI_EXIT_ERROR;
    if (out->tensor.dtype != ATTN_DTYPE_BOOL) {
        cli_error(prog, "--mask %s: a mask must be bool or uint8, not %s", path,
                  attn_dtype_name(out->tensor.dtype));
        return CLI_EXIT_ERROR;
    }
    return 0;
}

/* A directory the program made for this run's outputs (cli_rmdir_on_signal), or
 * NULL. */
static const char *volatile cli_made_dir;

void cli_rmdir_on_signal(const char *dir) { cli_made_dir = dir; }

/* SIGINT and SIGTERM while outputs are being written: the library's temporary files
 * are removed, and the directory the program made for them if it is now empty
 * (rmdir removes no other), then the signal does what it would have done (the
 * process ends with it, so the shell sees 130 or 143). Only async-signal-safe calls
 * here (POSIX.1-2008, 2.4.3: unlink, rmdir, signal, raise). */
static void cli_on_signal(int sig)
{
    attn_output_remove_temporaries();
    if (cli_made_dir)
        (void)rmdir(cli_made_dir);
    signal(sig, SIG_DFL);
    raise(sig);
}

int cli_save_outputs(const char *prog, attn_ctx *ctx, int n, const cli_output *outs)
{
    static const int sigs[2] = {SIGINT, SIGTERM};
    struct sigaction sa, old[2];
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = cli_on_signal;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 2; k++)
        sigaction(sigs[k], &sa, &old[k]);

    /* One output set for the whole run: nothing is renamed into place until every
     * output is written and synced (include/attn.h, "Output sets"). */
    attn_output_set *set = NULL;
    int rc = attn_output_set_create(ctx, &set);
    for (int i = 0; i < n && !rc; i++) {
        const cli_output *o = &outs[i];
        if (o->names)
            rc = attn_output_set_add_safetensors(ctx, set, o->path, o->names, o->named,
                                                 o->n_named);
        else if (o->tensor)
            rc = attn_output_set_add_npy(ctx, set, o->path, o->tensor);
        else
            rc = attn_output_set_add_bytes(ctx, set, o->path, o->bytes, o->n_bytes);
    }
    /* Standard output may be one of the outputs: what was printed goes first. */
    if (!rc)
        fflush(stdout);
    if (!rc)
        rc = attn_output_set_commit(ctx, set);
    attn_output_set_free(ctx, set);

    for (int k = 0; k < 2; k++)
        sigaction(sigs[k], &old[k], NULL);
    return rc ? cli_fail(prog, ctx) : 0;
}

int cli_save_npys(const char *prog, attn_ctx *ctx, int n, const char *const *paths,
                  const attn_tensor *tensors)
{
    cli_output outs[16];
    if (n > 16) {
        cli_error(prog, "internal error: more than 16 outputs");
        return CLI_EXIT_ERROR;
    }
    for (int i = 0; i < n; i++)
        outs[i] = (cli_output){paths[i], &tensors[i], NULL, NULL, 0, NULL, 0};
    return cli_save_outputs(prog, ctx, n, outs);
}

/* ---- The options of current models ---- */

int cli_parse_window(const char *prog, const char *opt, const char *text, int64_t *left,
                     int64_t *right)
{
    const char *comma = strchr(text, ',');
    char a[64], b[64];
    int64_t l = 0, r = 0;
    if (!comma || (size_t)(comma - text) >= sizeof a || strlen(comma + 1) >= sizeof b)
        return cli_usage_error(prog, "--%s takes LEFT,RIGHT (two whole numbers, each -1 for "
                               "unbounded or >= 0), not '%s'", opt, text);
    memcpy(a, text, (size_t)(comma - text));
    a[comma - text] = '\0';
    strcpy(b, comma + 1);
    const cli_num rl = cli_parse_int64(a, &l), rr = cli_parse_int64(b, &r);
    if (rl == CLI_NUM_SYNTAX || rr == CLI_NUM_SYNTAX)
        return cli_usage_error(prog, "--%s takes LEFT,RIGHT (two whole numbers, each -1 for "
                               "unbounded or >= 0), not '%s'", opt, text);
    if (rl != CLI_NUM_OK || rr != CLI_NUM_OK)
        return cli_usage_error(prog, "--%s %s does not fit in 64 bits", opt, text);
    if (l < -1 || r < -1)
        return cli_usage_error(prog, "--%s %s: the %s side is %lld; each side must be -1 "
                               "(unbounded) or at least 0", opt, text,
                               l < -1 ? "left" : "right", (long long)(l < -1 ? l : r));
    *left = l;
    *right = r;
    return CLI_PARSED;
}

int cli_sdpa_options_check(const char *prog, cli_sdpa_options *o, int softcap_seen)
{
    if (o->causal && o->causal_bottom_right)
        return cli_usage_error(prog, "--causal (top-left) and --causal-bottom-right exclude "
                               "each other: give one alignment");
    if (o->alibi && o->alibi_slopes)
        return cli_usage_error(prog, "--alibi (the default slopes) and --alibi-slopes %s "
                               "exclude each other", o->alibi_slopes);
    if (softcap_seen && !(o->softcap > 0.0f))
        return cli_usage_error(prog, "--softcap must be a number > 0 (got %g)",
                               (double)o->softcap);
    if (o->window)
        return cli_parse_window(prog, "window", o->window, &o->window_left, &o->window_right);
    return CLI_PARSED;
}

/* Loads one float array for an option of section 6. */
static int load_float(const char *prog, attn_ctx *ctx, const char *opt, const char *path,
                      attn_array *a)
{
    if (cli_load_npy(prog, ctx, opt, path, a))
        return CLI_EXIT_ERROR;
    if (a->tensor.dtype == ATTN_DTYPE_F32)
        return 0;
    cli_error(prog, "%s %s: expected a float array, got %s", opt, path,
              a->file_dtype ? a->file_dtype : attn_dtype_name(a->tensor.dtype));
    return CLI_EXIT_ERROR;
}

int cli_sdpa_options_load(const char *prog, attn_ctx *ctx, cli_sdpa_options *o,
                          attn_sdpa_params *p)
{
    p->causal = o->causal ? ATTN_CAUSAL_TOP_LEFT
                : o->causal_bottom_right ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
    if (o->window) {
        p->has_window = 1;
        p->window_left = o->window_left;
        p->window_right = o->window_right;
    }
    p->softcap = o->softcap;
    p->alibi = o->alibi;
    if (o->alibi_slopes) {
        if (load_float(prog, ctx, "--alibi-slopes", o->alibi_slopes, &o->slopes_a))
            return CLI_EXIT_ERROR;
        p->alibi_slopes = &o->slopes_a.tensor;
    }
    if (o->bias) {
        if (load_float(prog, ctx, "--bias", o->bias, &o->bias_a))
            return CLI_EXIT_ERROR;
        p->bias = &o->bias_a.tensor;
    }
    if (o->sinks) {
        if (load_float(prog, ctx, "--sinks", o->sinks, &o->sinks_a))
            return CLI_EXIT_ERROR;
        p->sinks = &o->sinks_a.tensor;
    }
    return 0;
}

void cli_sdpa_options_free(attn_ctx *ctx, cli_sdpa_options *o)
{
    attn_array_free(ctx, &o->slopes_a);
    attn_array_free(ctx, &o->bias_a);
    attn_array_free(ctx, &o->sinks_a);
}

int cli_fail_sdpa(const char *prog, const attn_ctx *ctx, const cli_sdpa_options *o,
                  const char *mask_path)
{
    /* The library names the tensor by its field ("bias shape (3, 4) does not
     * broadcast to ..."); the user knows it by its flag and file. */
    static const char *const fields[3] = {"bias ", "sinks ", "alibi_slopes "};
    static const char *const flags[3] = {"--bias", "--sinks", "--alibi-slopes"};
    const char *paths[3] = {o->bias, o->sinks, o->alibi_slopes};
    if (ctx->status != ATTN_STATUS_EMPTY_ROW && ctx->status != ATTN_STATUS_MASK_BROADCAST)
        for (int i = 0; i < 3; i++)
            if (paths[i] && strncmp(ctx->message, fields[i], strlen(fields[i])) == 0) {
                cli_error(prog, "%s %s: %s", flags[i], paths[i], ctx->message);
                return CLI_EXIT_ERROR;
            }
    return cli_fail_attention(prog, ctx, mask_path);
}

/* Whether paths a and b name one file: the same text, or two names (./y.npy and
 * y.npy, a link) of one regular file that exists. An output that does not exist
 * yet is compared by its text only; devices and pipes (/dev/stdin and /dev/stdout
 * on one terminal) are not files a run could overwrite. */
static int same_file(const char *a, const char *b)
{
    if (strcmp(a, b) == 0)
        return 1;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && S_ISREG(sa.st_mode) &&
           S_ISREG(sb.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int cli_distinct_outputs(const char *prog, int n, const char *const *names,
                         const char *const *paths)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (paths[i] && paths[j] && strcmp(paths[i], paths[j]) == 0)
                return cli_usage_error(prog, "--%s and --%s name the same file", names[i],
                                       names[j]);
    return CLI_PARSED;
}

int cli_outputs_spare_inputs(const char *prog, const cli_opt *opts, int nopts, int n,
                             const char *const *names, const char *const *paths,
                             const char *const *inputs)
{
    for (int k = 0; inputs[k]; k++) {
        const cli_opt *in = cli_find(opts, nopts, inputs[k]);
        if (!in || !in->seen || in->kind != CLI_STRING)
            continue;
        const char *in_path = *(const char *const *)in->dest;
        /* '-' is standard output for an output; for an input it would be read as a
         * file named '-', which "No such file" explains badly. The readers seek, so
         * standard input can only be a file redirected to it (/dev/stdin). */
        if (in_path && strcmp(in_path, "-") == 0)
            return cli_usage_error(prog,
                                   "--%s -: inputs are read from files, not from a pipe; "
                                   "give a file name (or /dev/stdin redirected from a file)",
                                   inputs[k]);
        for (int i = 0; i < n; i++)
            if (paths[i] && in_path && same_file(paths[i], in_path))
                return cli_usage_error(prog,
                                       "--%s %s is also read as --%s: attn does not "
                                       "write over its own inputs",
                                       names[i], paths[i], inputs[k]);
    }
    return CLI_PARSED;
}

const char *const cli_rope_choices[] = {"interleaved", "half", NULL};

int cli_rope_options_get(const char *prog, const cli_opt *opts, int nopts,
                         const cli_rope_options *o, attn_rope_params *rp, int *use)
{
    attn_rope_params_init(rp);
    *use = cli_seen(opts, nopts, "rope");
    const int base_seen = cli_seen(opts, nopts, "rope-base");
    const int offset_seen = cli_seen(opts, nopts, "rope-offset");
    if (!*use && (base_seen || offset_seen))
        return cli_usage_error(prog, "--%s needs --rope interleaved|half",
                               base_seen ? "rope-base" : "rope-offset");
    if (base_seen && !(o->base > 0.0f))
        return cli_usage_error(prog, "--rope-base must be a number > 0 (got %g)",
                               (double)o->base);
    if (!*use)
        return CLI_PARSED;
    rp->pairing = o->pairing ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
    if (base_seen)
        rp->base = o->base;
    rp->offset = o->offset;
    return CLI_PARSED;
}
