/*
 * common_cli.h - the one option parser and the error printing shared by every
 * program in tools/ (the `attn` subcommands and inspect_self_attention).
 *
 * Conventions (SPEC section 4): options are long, "--name VALUE" or "--name=VALUE";
 * "--help" / "-h" asks for the help text; exit status 0 on success, 2 on a usage
 * error, 1 on any other error; every error is ONE line on stderr, prefixed with the
 * program name, e.g.
 *
 *   attn forward: missing --num-heads (run 'attn forward --help')
 *   attn forward: W.safetensors: tensor 'qkv.bias' is missing
 *
 * One rule for numbers, in every program: the whole value must be a decimal number.
 * Leading or trailing whitespace, a leading '+', hex ("0x10"), "inf"/"nan", an empty
 * value and a value that overflows are usage errors that name the option and the
 * value; so is a real number that is not 0 but that float32 rounds to 0 or to
 * infinity ("--scale 1e-50", "1e39"), because silently using 0 or refusing only one
 * of the two would surprise the user.
 */
#ifndef TOOLS_COMMON_CLI_H
#define TOOLS_COMMON_CLI_H

#include "attn.h"

#include <stddef.h>
#include <stdint.h>

#define CLI_EXIT_OK 0
#define CLI_EXIT_ERROR 1
#define CLI_EXIT_USAGE 2

/* Paragraphs every program's --help ends with, so the rule for numbers and the exit
 * statuses read the same everywhere (man-page layout: a section title at column 0,
 * the text indented by four spaces). */
#define CLI_HELP_NUMBERS                                                                 \
    "NUMBERS\n"                                                                           \
    "    A number is written in decimal and is the whole value: '4', '-1', '0.125',\n"     \
    "    '1e-3'. Spaces around it, a leading '+', hex ('0x10'), 'inf' or 'nan', an\n"     \
    "    empty value, a whole number outside its option's range or beyond 64 bits,\n"   \
    "    and a real number that float32 would round to 0 or to infinity (1e-50,\n"      \
    "    1e39) are usage errors.\n"
#define CLI_HELP_EXIT                                                                    \
    "EXIT STATUS\n"                                                                       \
    "    0   success (and --help).\n"                                                  \
    "    2   a usage error: an unknown, repeated or missing option, a missing value,\n" \
    "        a bad number or choice; nothing is computed or written.\n"                \
    "    1   any other error: a file that cannot be read or written, shapes that do\n" \
    "        not fit, a fully masked query row, out of memory.\n"                      \
    "    Every error prints exactly one line on stderr that names the problem.\n"

/* The FILES paragraph of the programs that read .npy arrays: what the readers take
 * (src/io/npy.c) and what the writers make (src/io/output.c). */
#define CLI_HELP_FILES                                                                   \
    "FILES\n"                                                                             \
    "    Arrays are numpy .npy files (format 1.0, 2.0 or 3.0; little- or big-endian;\n"   \
    "    C or Fortran order) of 1 to 4 dimensions, every size at least 1. Float\n"        \
    "    inputs may be float32, float64 (rounded to float32) or float16 (exact);\n"       \
    "    masks bool or uint8 (nonzero = may attend); token ids int32 or int64. Other\n"   \
    "    dtypes, 0-d and empty arrays, truncated files and headers that lie about\n"      \
    "    their sizes are errors (exit 1) naming the option, the file and the problem.\n"  \
    "    An input must be a regular file: a directory, FIFO, pipe or device is\n"         \
    "    refused at once, and '-' is a usage error (/dev/stdin redirected from a\n"      \
    "    file is read).\n"                                                                \
    "\n"                                                                                  \
    "    Outputs are little-endian C-order .npy files, float32 unless said\n"             \
    "    otherwise. Every output of a run is written to a temporary file beside it\n"     \
    "    and renamed into place only when all are complete, so a failed run (a bad\n"     \
    "    input, a full disk, Ctrl-C before the renames) changes no existing file.\n"    \
    "    An existing file is replaced (its permission bits kept). An output that\n"      \
    "    names an input file is refused before anything is read, two outputs that\n"     \
    "    name one file before anything is written. '-' writes to standard output,\n"    \
    "    and a character device or FIFO is written directly.\n"

/* The ENVIRONMENT paragraph: every variable the library and these programs read
 * (grep getenv in src/ and tools/). */
#define CLI_HELP_ENVIRONMENT                                                             \
    "ENVIRONMENT\n"                                                                       \
    "    ATTN_ARCH=ref|scalar|avx2|avx512|avx512bf16|amx|auto\n"                          \
    "        Force a kernel path instead of the best one for this CPU (auto);\n"          \
    "        avx512bf16 and amx are the avx512 build with a bfloat16 kernel of their\n"  \
    "        own. A value that is not one of these, or a path this CPU cannot run,\n"    \
    "        is ignored; 'attn bench' prints which path runs and why.\n"                  \
    "    ATTN_BF16_EMULATE=1|always\n"                                                    \
    "        Let avx512bf16 run on an AVX-512 CPU without AVX512-BF16 (vdpbf16ps\n"       \
    "        emulated; for testing); always: emulate it even where the CPU has it.\n"    \
    "    ATTN_TILE=BRxBC\n"                                                               \
    "        Force the fused kernel's tile sizes (BR a multiple of 32 in 32..512, BC\n"   \
    "        a multiple of 8 in 8..1024), bfloat16 on AMX's too (128x128 by\n"           \
    "        default); another value is ignored.\n"                                       \
    "    ATTN_MICROTILE=8x2|4x4\n"                                                        \
    "        Force the avx512 build's micro-tile shapes (the same bits either way).\n"    \
    "    ATTN_SPIN_US=N\n"                                                                \
    "        How long, in microseconds (0..1000000, default 100), the worker\n"          \
    "        threads spin waiting for the next call, and a call for its workers,\n"     \
    "        before they sleep; 0 sleeps at once (for a machine whose cores are\n"      \
    "        shared with other busy threads). Another value is ignored.\n"              \
    "    ATTN_FAIL_ALLOC_AT=N\n"                                                          \
    "        Make the Nth allocation of attn forward, decode or sdpa fail (for\n"        \
    "        testing the out-of-memory paths).\n"                                                                   \
    "    ATTN_TEST_OUTPUT_PAUSE_MS=N\n"                                                   \
    "        Wait N ms (1..600000) after the outputs are written and before they are\n"   \
    "        renamed into place (for testing Ctrl-C).\n"

/* attn bench's own variable, for its ENVIRONMENT and attn's. */
#define CLI_HELP_BENCH_CLOCK                                                             \
    "    ATTN_BENCH_CLOCK=cpu\n"                                                          \
    "        attn bench times the calling thread's CPU time instead of the wall\n"       \
    "        clock: on a busy machine, a --threads 1 figure without the waits.\n"

/* The --threads option of attn sdpa, forward and decode. */
#define CLI_HELP_THREADS                                                                 \
    "    --threads N\n"                                                                   \
    "        Worker threads, a whole number in 1..1024 (default: one per core the\n"      \
    "        process may run on, fewer under taskset or a cpuset). Every output has\n"    \
    "        the same bits for any N.\n"
#define CLI_MAX_THREADS 1024

typedef enum cli_kind {
    CLI_FLAG,   /* no value; *(int *)dest = 1 */
    CLI_STRING, /* *(const char **)dest = the value, which must not be empty */
    CLI_INT,    /* *(int64_t *)dest, a whole decimal number in [min, max] */
    CLI_FLOAT,  /* *(float *)dest, a finite decimal number float32 can hold */
    CLI_CHOICE  /* *(int *)dest = the index of the value in `choices` */
} cli_kind;

typedef struct cli_opt {
    const char *name; /* without the dashes: "num-heads" */
    cli_kind kind;
    void *dest;
    const char *const *choices; /* CLI_CHOICE: a NULL-terminated list */
    int64_t min, max;           /* CLI_INT: the allowed range, both ends included */
    int seen;                   /* set by cli_parse */
} cli_opt;

/* What cli_parse returns besides an exit status. */
#define CLI_PARSED (-1)

/* Parses argv[1..argc-1] (argv[0] is the program's or subcommand's own name; `prog`
 * is what messages start with, "attn sdpa"). Returns CLI_PARSED when the options are fine, CLI_EXIT_OK when help
 * was asked for (help_text has been printed to stdout), or CLI_EXIT_USAGE after
 * printing one line on stderr. */
int cli_parse(const char *prog, int argc, char **argv, cli_opt *opts, int nopts,
              const char *help_text);

/* The option of that name (NULL if none), to ask whether it was seen. */
const cli_opt *cli_find(const cli_opt *opts, int nopts, const char *name);
int cli_seen(const cli_opt *opts, int nopts, const char *name);

/* Prints "PROG: missing --NAME (run 'PROG --help')" unless every named option was
 * given; the names are a NULL-terminated list. Returns CLI_PARSED or CLI_EXIT_USAGE. */
int cli_require(const char *prog, const cli_opt *opts, int nopts, const char *const *names);

/* attn_ctx_init(), and then, when the environment variable ATTN_FAIL_ALLOC_AT=N
 * (N >= 1) is set, an allocator whose Nth allocation fails: the tests use it to
 * drive every tool through each out-of-memory path. */
void cli_ctx_init(attn_ctx *ctx);

/* One line "PROG: MESSAGE" on stderr. */
void cli_error(const char *prog, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* A usage error: one line with a pointer to --help; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *prog, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prints the library's message from ctx as one line; returns CLI_EXIT_ERROR. */
int cli_fail(const char *prog, const attn_ctx *ctx);

/* A tensor's shape as a Python tuple, "(2, 5, 16)", in buf. */
const char *cli_shape(const attn_tensor *t, char *buf, size_t cap);

/* The number rule above, for one value. */
typedef enum cli_num {
    CLI_NUM_OK,
    CLI_NUM_SYNTAX,   /* not a plain decimal number */
    CLI_NUM_TOO_BIG,  /* beyond int64, or float32 would round it to infinity */
    CLI_NUM_TO_ZERO   /* not 0, but float32 would round it to 0 */
} cli_num;
cli_num cli_parse_int64(const char *s, int64_t *out);
cli_num cli_parse_float(const char *s, float *out);

/* The library's error from ctx as one line, in the command line's words: the
 * empty-row error of attn_sdpa and attn_mha_forward names the flag
 * (--empty-rows zero) instead of the C field the library's message names; a mask
 * that does not broadcast names the --mask file when mask_path is set. Returns
 * CLI_EXIT_ERROR. */
int cli_fail_attention(const char *prog, const attn_ctx *ctx, const char *mask_path);

/* Loads an .npy file; on failure prints one line and returns CLI_EXIT_ERROR. `what`
 * names the option (e.g. "--input") for the message. */
int cli_load_npy(const char *prog, attn_ctx *ctx, const char *what, const char *path,
                 attn_array *out);

/* Loads a boolean mask (.npy of bool or uint8) for --mask; on failure prints one
 * line and returns CLI_EXIT_ERROR. */
int cli_load_mask(const char *prog, attn_ctx *ctx, const char *path, attn_array *out);

/* ---- The options of current models (SPEC section 6), shared by `attn sdpa` and
 * `attn forward` ---- */

/* What the command line gave (filled by cli_parse through CLI_SDPA_OPTIONS) and
 * what cli_sdpa_options_load then loaded. Zero it before parsing. */
typedef struct cli_sdpa_options {
    int causal;              /* --causal (top-left) */
    int causal_bottom_right; /* --causal-bottom-right */
    const char *window;      /* --window LEFT,RIGHT, as given */
    float softcap;           /* --softcap C (> 0) */
    int alibi;               /* --alibi: the default slopes */
    const char *alibi_slopes, *bias, *sinks; /* .npy paths */
    const char *lse;         /* --lse: where to write the log-sum-exp */
    int64_t window_left, window_right; /* --window, parsed by cli_sdpa_options_check */
    attn_array slopes_a, bias_a, sinks_a; /* loaded by cli_sdpa_options_load */
} cli_sdpa_options;

/* The cli_opt entries of those options, for a command's option table:
 *   cli_opt opts[] = { ..., CLI_SDPA_OPTIONS(&o), ... }; */
#define CLI_SDPA_OPTIONS(o)                                                              \
    {"causal", CLI_FLAG, &(o)->causal, NULL, 0, 0, 0},                                    \
    {"causal-bottom-right", CLI_FLAG, &(o)->causal_bottom_right, NULL, 0, 0, 0},          \
    {"window", CLI_STRING, &(o)->window, NULL, 0, 0, 0},                                  \
    {"softcap", CLI_FLOAT, &(o)->softcap, NULL, 0, 0, 0},                                 \
    {"alibi", CLI_FLAG, &(o)->alibi, NULL, 0, 0, 0},                                      \
    {"alibi-slopes", CLI_STRING, &(o)->alibi_slopes, NULL, 0, 0, 0},                      \
    {"bias", CLI_STRING, &(o)->bias, NULL, 0, 0, 0},                                      \
    {"sinks", CLI_STRING, &(o)->sinks, NULL, 0, 0, 0},                                    \
    {"lse", CLI_STRING, &(o)->lse, NULL, 0, 0, 0}

/* Parses "LEFT,RIGHT" for --window (each a whole number, -1 for unbounded or >= 0).
 * Returns CLI_PARSED, or CLI_EXIT_USAGE after one line naming the value. */
int cli_parse_window(const char *prog, const char *opt, const char *text, int64_t *left,
                     int64_t *right);

/* The usage rules of those options, after cli_parse: --causal and
 * --causal-bottom-right exclude each other, as do --alibi and --alibi-slopes; the
 * window's sides are -1 or >= 0; the softcap is > 0 (finiteness is the number
 * rule's). Returns CLI_PARSED or CLI_EXIT_USAGE (one line naming the values). */
int cli_sdpa_options_check(const char *prog, cli_sdpa_options *o, int softcap_seen);

/* Loads the slopes, bias and sinks files (float arrays; float64 and float16 are
 * converted) and sets p's causal, window, softcap, ALiBi, bias and sinks fields;
 * p->lse is the caller's (its shape depends on the command). Returns 0, or
 * CLI_EXIT_ERROR after one line naming the file. */
int cli_sdpa_options_load(const char *prog, attn_ctx *ctx, cli_sdpa_options *o,
                          attn_sdpa_params *p);
void cli_sdpa_options_free(attn_ctx *ctx, cli_sdpa_options *o);

/* cli_fail_attention, and a library message about the bias, the sinks or the
 * ALiBi slopes (a shape that does not fit) also names the file it came from. */
int cli_fail_sdpa(const char *prog, const attn_ctx *ctx, const cli_sdpa_options *o,
                  const char *mask_path);

/* ---- RoPE (SPEC section 7), shared by `attn forward`, `attn sdpa` and
 * `attn decode` ---- */

/* What --rope, --rope-base and --rope-offset gave. Zero it before parsing. */
typedef struct cli_rope_options {
    int pairing;    /* --rope: an index into cli_rope_choices */
    float base;     /* --rope-base B (> 0) */
    int64_t offset; /* --rope-offset N (>= 0) */
} cli_rope_options;

extern const char *const cli_rope_choices[]; /* "interleaved", "half", NULL */

/* The cli_opt entries of those options, for a command's option table. */
#define CLI_ROPE_OPTIONS(o)                                                              \
    {"rope", CLI_CHOICE, &(o)->pairing, cli_rope_choices, 0, 0, 0},                       \
    {"rope-base", CLI_FLOAT, &(o)->base, NULL, 0, 0, 0},                                  \
    {"rope-offset", CLI_INT, &(o)->offset, NULL, 0, INT64_MAX, 0}

/* The OPTIONS paragraphs of those options, for a command's --help; `where` says
 * which rows are rotated (one indented line or more, ending in a newline). */
#define CLI_HELP_ROPE(where)                                                             \
    "    --rope interleaved|half\n"                                                      \
    "        Rotary position embedding (RoPE) on q and k: pair k of a row at\n"           \
    "        position p turns by p / B^(2k/D). 'interleaved' pairs features 2k and\n"    \
    "        2k+1 (GPT-J, the tutorial's chapter 21); 'half' pairs k and k + D/2\n"      \
    "        (Llama, GPT-NeoX). D must be even (an odd D is an error, exit 1).\n"        \
    where                                                                                  \
    "    --rope-base B\n"                                                                 \
    "        The base, any number > 0 (default 10000; Llama 3 uses 500000.0).\n"         \
    "    --rope-offset N\n"                                                               \
    "        The position of the first key, a whole number >= 0 (default 0).\n"         \
    "        --rope-base and --rope-offset need --rope.\n"

/* The usage rules of those options, after cli_parse: --rope-base and --rope-offset
 * need --rope, and the base must be > 0. On CLI_PARSED, *use says whether --rope
 * was given and rp holds the parameters (the library's defaults where not given).
 * Returns CLI_PARSED or CLI_EXIT_USAGE (one line naming the value). */
int cli_rope_options_get(const char *prog, const cli_opt *opts, int nopts,
                         const cli_rope_options *o, attn_rope_params *rp, int *use);

/* Usage error unless the named output paths (NULL = not wanted) are all different:
 * "--output and --lse name the same file". n <= 8. (Two names of one file, ./y.npy
 * and y.npy or a link, are refused by the output writer, before anything is
 * written.) */
int cli_distinct_outputs(const char *prog, int n, const char *const *names,
                         const char *const *paths);

/* Usage error when an output path (as in cli_distinct_outputs) names the file of
 * one of the input options in `inputs` (NULL-terminated option names; those not in
 * opts, or not given, are skipped): "--grad-weights w.safetensors is also read as
 * --weights: ...". A run would otherwise replace the user's weights or
 * arrays with its results. An input given as '-' is a usage error too: '-' is
 * standard output, and the readers cannot read a pipe. */
int cli_outputs_spare_inputs(const char *prog, const cli_opt *opts, int nopts, int n,
                             const char *const *names, const char *const *paths,
                             const char *const *inputs);

/* One output file: a .npy of `tensor`; or, when `names` is set, a .safetensors of
 * the n_named tensors `named` under those names; or, when both are NULL, the
 * n_bytes bytes at `bytes` (an SVG). */
typedef struct cli_output {
    const char *path;
    const attn_tensor *tensor;
    const char *const *names;
    const attn_tensor *named;
    int64_t n_named;
    const void *bytes;
    size_t n_bytes;
} cli_output;

/* Writes n output files as one output set (include/attn.h, "Output sets"): every
 * file is written to a temporary file and synced first, and only then renamed into
 * place, so a failed run (a full disk, a bad path, a directory given as a file, two
 * names for one file, no memory) changes no output; devices, FIFOs and "-"
 * (standard output) are written directly. While it runs, SIGINT and SIGTERM remove
 * the temporary files before the process ends. Prints one line on failure and
 * returns CLI_EXIT_ERROR; 0 on success. */
int cli_save_outputs(const char *prog, attn_ctx *ctx, int n, const cli_output *outs);

/* dir (kept as given: it must outlive the run, e.g. a string of argv) is a directory
 * the program made for its outputs: SIGINT and SIGTERM during cli_save_outputs
 * remove it too, when nothing else is in it. NULL forgets it. */
void cli_rmdir_on_signal(const char *dir);

/* cli_save_outputs for n tensors as .npy files. */
int cli_save_npys(const char *prog, attn_ctx *ctx, int n, const char *const *paths,
                  const attn_tensor *tensors);

#endif /* TOOLS_COMMON_CLI_H */
