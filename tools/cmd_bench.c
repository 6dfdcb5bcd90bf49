/*
 * cmd_bench.c - `attn bench`: the command line of the benchmark. It reads the
 * options, measures the machine's FMA peak (every figure is read against it) and
 * runs one benchmark: attention on SPEC section 5's shapes or a custom one
 * (bench_sdpa.c), multi-head attention (bench_mha.c), the GEMM (bench_gemm.c), or
 * a probe alone (bench_probes.c), or the backward (bench_backward.c). bench.h says
 * how they measure.
 */
#include "attn.h"
#include "bench.h"
#include "bench_probes.h"
#include "cmds.h"
#include "common_cli.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PROG "attn bench"

/* Sizes are capped where the arrays would no longer fit in memory anyway, so that
 * the shapes' products (3*E*E, N*N) cannot overflow before the library sees them. */
#define BENCH_MAX_SIZE 1048576
#define BENCH_MAX_THREADS 1024
#define BENCH_MAX_RUNS 1000000

static const char HELP[] =
    "NAME\n"
    "    attn bench - time attention against this machine's FMA peak\n"
    "\n"
    "SYNOPSIS\n"
    "    attn bench [--shape NAME | --batch B --heads H [--kv-heads Hkv]\n"
    "               --query-len Tq [--key-len Tk] --head-dim D\n"
    "               [--causal | --causal-bottom-right] [--padding]\n"
    "               [--window LEFT,RIGHT] [--softcap C]]\n"
    "               [--threads N] [--impl NAME] [--runs N] [--dtype f32|bf16|f16]\n"
    "               [--json]\n"
    "    attn bench --peak [--threads N] [--json]\n"
    "    attn bench --mha [--seq-len T] [--embed-dim E] [--num-heads H] [--causal]\n"
    "               [--threads N] [--impl default|ref|all] [--runs N] [--json]\n"
    "    attn bench --gemm [--size N] [--threads N] [--impl default|ref|all]\n"
    "               [--runs N] [--json]\n"
    "    attn bench --bandwidth [--threads N] [--impl NAME] [--runs N]\n"
    "               [--dtype f32|bf16|f16] [--json]\n"
    "    attn bench --decode [--prefill N] [--steps N] [--tq N] [--threads N]\n"
    "               [--dtype f32|bf16|f16] [--json]\n"
    "    attn bench --backward [--shape NAME | a custom shape] [--threads N]\n"
    "               [--impl NAME] [--runs N] [--json]\n"
    "\n"
    "DESCRIPTION\n"
    "    Times scaled dot-product attention and reports, for each measurement, the\n"
    "    median of at least --runs timed calls after two warm-up calls, in\n"
    "    milliseconds, the GFLOP/s that gives, the fraction of this machine's FP32\n"
    "    FMA peak (measured at start, as --peak does) and the process's peak resident\n"
    "    memory so far. An attention line's %peak is of the peak of the instruction\n"
    "    set its path runs on: 512-bit FMA chains for the AVX-512 paths, 256-bit ones\n"
    "    for avx2 (half the AVX-512 figure on a core with two 512-bit FMA units, the\n"
    "    same on one that splits them), and for scalar and ref 64 multiply-add chains\n"
    "    in portable C, compiled as the portable kernel is (SSE2 on x86-64); the\n"
    "    JSON's peak_isa and isa_peak_gflops say which and how much. A call shorter\n"
    "    than a millisecond is repeated within each sample and divided. Each\n"
    "    implementation keeps its scratch from call to call\n"
    "    (attn_ctx.keep_workspace), as a model's loop would.\n"
    "\n"
    "    Shapes (SPEC section 5; FLOPs 4*B*H*Tq*Tk*D, half of that for causal with\n"
    "    Tq == Tk; with a window, or causal with Tq != Tk, 4*B*H*D per visible\n"
    "    (query, key) pair):\n"
    "      S1  B=2 H=4  Tq=Tk=5    D=4    none     the chapter's toy size\n"
    "      S2  B=1 H=12 Tq=Tk=1024 D=64   causal   a GPT-2 small layer\n"
    "      S3  B=4 H=12 Tq=Tk=1024 D=64   causal\n"
    "      S4  B=1 H=16 Tq=Tk=4096 D=64   causal\n"
    "      S5  B=1 H=32 Tq=1 Tk=4096 D=128 none    one decode step against a cache\n"
    "      S6  B=8 H=8  Tq=Tk=512  D=64   padding  samples b >= B/2 pad their last\n"
    "                                              quarter of keys\n"
    "      S7  B=1 H=32 Hkv=8 Tq=1 Tk=8192 D=128 bottom-right causal: one GQA decode\n"
    "                                              step against a cache (judged by\n"
    "                                              K/V bytes per second, --bandwidth)\n"
    "      S8  B=1 H=32 Hkv=8 Tq=Tk=2048 D=128 causal: GQA prefill\n"
    "      S9  B=4 H=16 Tq=1 Tk=1024,2048,3072,4096 D=64: one batched decode step,\n"
    "                                              one cache length per sequence, run\n"
    "                                              through the KV cache (impl kv:ISA;\n"
    "                                              Tk is the longest; judged by K/V\n"
    "                                              bytes per second, --bandwidth)\n"
    "    Without --shape or a custom shape, all nine run in turn.\n"
    "\n"
    "OPTIONS\n"
    "    --shape NAME\n"
    "        S1 .. S9, or all (the default). S9 runs the library's default path\n"
    "        only, whatever --impl says.\n"
    "    --batch B, --heads H, --query-len Tq, --key-len Tk, --head-dim D\n"
    "        A custom shape instead of --shape: --query-len and --head-dim are\n"
    "        needed, Tk defaults to Tq, H and B to 1; each 1..1048576.\n"
    "    --kv-heads Hkv\n"
    "        Grouped-query attention on a custom shape: K and V have Hkv heads\n"
    "        (default H), Hkv dividing H; 1 is multi-query attention.\n"
    "    --causal\n"
    "        Top-left causal on a custom shape (any Tq, Tk), or with --mha.\n"
    "    --causal-bottom-right\n"
    "        Bottom-right causal on a custom shape: query i sees keys up to\n"
    "        i + Tk - Tq (a query block at the end of a cache).\n"
    "    --padding\n"
    "        S6's padding mask on a custom shape.\n"
    "    --window LEFT,RIGHT\n"
    "        A sliding window on a custom shape (each side -1 for unbounded or\n"
    "        >= 0; see 'attn sdpa --help').\n"
    "    --softcap C\n"
    "        Logit softcapping, C > 0, on a custom shape.\n"
    "    --threads N\n"
    "        Worker threads, 1..1024 (default: one per core the process may run on,\n"
    "        fewer under taskset or a cpuset; the library uses at most its own pool's\n"
    "        size).\n"
    "    --impl NAME\n"
    "        default (the default): the library's default path only (what\n"
    "        attn_sdpa runs, see ATTN_ARCH); ref: the reference; fused: the fused\n"
    "        kernel on the selected ISA; scalar, avx2, avx512: the fused kernel on\n"
    "        that ISA; avx512bf16, amx: the avx512 build with its vdpbf16ps or\n"
    "        AMX-BF16 kernel for --dtype bf16 (the avx512 kernel otherwise); all:\n"
    "        the reference and every ISA this CPU runs (avx512bf16 and amx with\n"
    "        --dtype bf16 only). An ISA this CPU cannot run is an error (exit 1);\n"
    "        --backward (float32 only) takes scalar, avx2 or avx512, not\n"
    "        avx512bf16 or amx. --mha and --gemm know default, ref and all.\n"
    "    --runs N\n"
    "        Timed samples per measurement, 1..1000000 (default 10; the reference on\n"
    "        shapes over 2 GFLOP is capped at 3, which the runs field says).\n"
    "    --json\n"
    "        One JSON object per line instead of the table (see JSON OUTPUT).\n"
    "    --peak\n"
    "        Only measure the FP32 FMA peak: independent FMA chains per thread (16\n"
    "        of 512 bits with AVX-512, 12 of 256 bits on an AVX2-only CPU),\n"
    "        with 1 thread and with --threads threads, on the best instruction set\n"
    "        here (the AVX2 and portable peaks are measured when a line needs them).\n"
    "    --mha\n"
    "        Multi-head attention end to end, projections included (B=1; default\n"
    "        --seq-len 1024, --embed-dim 768, --num-heads 12; each 1..1048576).\n"
    "    --gemm\n"
    "        The projection GEMM alone, y = x W^T, N x N x N (--size N, default 1024,\n"
    "        1..1048576).\n"
    "    --bandwidth\n"
    "        The read bandwidth of streaming S5's K and V (GB/s), then S5's, S7's\n"
    "        and S9's attention times as the rate at which they read their K and V,\n"
    "        and that rate as a fraction of the bandwidth. Each rotates through\n"
    "        copies of its K and V that together hold at least twice the last-level\n"
    "        cache, so that memory is read, not the cache; the fraction is the\n"
    "        median over interleaved pairs (one stream read, one call), so that a\n"
    "        busy machine slows both sides of each pair alike.\n"
    "    --decode\n"
    "        A decoding loop through the KV cache on S5's, S7's and S9's head\n"
    "        shapes (B, H, Hkv, D): --prefill N tokens (default 4096) appended for\n"
    "        every sequence, then --steps N steps (default 128) of --tq tokens each\n"
    "        (append their k and v, attend their queries). Prints the median step,\n"
    "        the K/V bytes a middle step reads per second, and the allocations the\n"
    "        steps made under a counting allocator with the context's workspace set\n"
    "        to attn_kv_cache_workspace_size bytes (0 is the target). With --dtype\n"
    "        bf16|f16 the cache stores K and V in 16 bits, and the K/V rate counts\n"
    "        those bytes. Each step is timed once, on the library's default path:\n"
    "        --runs and --impl do not apply.\n"
    "    --backward\n"
    "        The gradients (attn_sdpa_backward) instead of the forward, on S2, S3,\n"
    "        S4 and S8 (or --shape, or a custom shape): the backward alone, with the\n"
    "        forward's output and log-sum-exp made once beforehand (kind\n"
    "        sdpa_backward, FLOPs 2.5 times the forward's, FlashAttention-2's\n"
    "        count), then forward with log-sum-exp + backward (kind sdpa_fwd_bwd,\n"
    "        3.5 times; the table's last column says which). --impl as for the\n"
    "        forward (ref: attn_sdpa_backward_ref). The resident memory is the\n"
    "        process's: run --shape S4 alone for S4's.\n"
    "    --prefill N, --steps N\n"
    "        The decoding loop's sizes, 1..1048576 each (only with --decode).\n"
    "    --tq N\n"
    "        Tokens per decoding step, each sequence's query rows in one attend,\n"
    "        1..4096 (default 1; more: a speculative-decoding step or a chunked\n"
    "        prefill's chunk; the cache's capacity is --prefill + --steps x N;\n"
    "        only with --decode).\n"
    "    --dtype f32|bf16|f16\n"
    "        How q, k, v and the output are stored (default f32): bfloat16 or\n"
    "        float16 inputs hold the same values rounded to 16 bits, and attention\n"
    "        still computes in float32 (docs/half-precision.md). Applies to the\n"
    "        attention shapes, --bandwidth and --decode; for S9 and --decode it is\n"
    "        also how the KV cache stores K and V.\n"
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    --peak, --mha, --gemm, --bandwidth and --decode exclude each other, a\n"
    "    shape and --backward. An option that the run would not use is a usage\n"
    "    error (exit 2), never ignored: --seq-len, --embed-dim and --num-heads\n"
    "    without --mha, --size without --gemm, --prefill, --steps and --tq\n"
    "    without --decode, --runs or --impl with --peak (or --decode), the mask\n"
    "    and shape options of a custom shape without one.\n"
    "    Options take their value as the next argument or after '=' (--threads=2).\n"
    "\n"
    "JSON OUTPUT\n"
    "    Every line is one object with SPEC section 4's fields first: kind (sdpa,\n"
    "    kv_stream, decode, mha, gemm, peak, bandwidth), impl, B, H, Tq, Tk, D, mask,\n"
    "    threads, median_ms, gflops; then the run's setup: default_arch and reason\n"
    "    (the path attn_sdpa picks and why), peak_gflops_1t and peak_gflops; then the\n"
    "    kind's own fields (shape, runs, min_ms, peak_frac, peak_rss_mib, kv_heads,\n"
    "    window ([LEFT, RIGHT] or null), softcap (or null), dtype, peak_isa and\n"
    "    isa_peak_gflops (the peak peak_frac is of) for sdpa; E and arch\n"
    "    for mha; M, N, K for gemm; kv_gbs, stream_gbs, fraction for kv_stream; gbs\n"
    "    and bytes for bandwidth; shape, kv_heads, prefill, steps, min_ms, kv_gbs,\n"
    "    allocs and allocs_per_step for decode, whose Tk is the cache's capacity;\n"
    "    lengths and kv_gbs on S9's sdpa line; the sdpa fields and flop_factor for\n"
    "    sdpa_backward and sdpa_fwd_bwd). A field that means nothing for a kind is\n"
    "    null: the attention shape and mask of gemm, peak and bandwidth, the time of\n"
    "    peak, the GFLOP/s of bandwidth.\n"
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    CLI_HELP_ENVIRONMENT
    CLI_HELP_BENCH_CLOCK
    "    The header line (or the default_arch and reason fields) says which path\n"
    "    ran and why, and which tile sizes were chosen or forced.\n"
    "\n"
    "EXAMPLES\n"
    "    attn bench --shape S2 --threads 2 --impl all --json\n"
    "    attn bench --backward --shape S2 --threads 2\n"
    "    attn bench --shape S4 --threads 2 --dtype bf16\n"
    "    attn bench --decode --threads 2 --dtype bf16\n"
    "\n"
    "SEE ALSO\n"
    "    attn --help; docs/performance.md (the figures, how they are measured),\n"
    "    bench/compare_torch.py (PyTorch's side of the same shapes).\n";

/* s as the inside of a JSON string (quotes, backslashes and control characters
 * escaped): the reason may echo an ATTN_ARCH value the user typed. */
static void json_escape(const char *s, char *buf, size_t size)
{
    size_t n = 0;
    for (; *s && n + 7 < size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            n += (size_t)snprintf(buf + n, size - n, "\\%c", c);
        else if (c < 0x20)
            n += (size_t)snprintf(buf + n, size - n, "\\u%04x", c);
        else
            buf[n++] = (char)c;
    }
    buf[n] = 0;
}

int cmd_bench(int argc, char **argv)
{
    static const char *const shape_names[] = {"S1", "S2", "S3", "S4", "S5",
                                              "S6", "S7", "S8", "S9", "all", NULL};
    static const char *const impl_names[] = {"default", "ref",    "fused",      "scalar", "avx2",
                                             "avx512",  "all",    "avx512bf16", "amx",    NULL};
    bench_opts o;
    memset(&o, 0, sizeof o);
    int64_t threads = 0, runs = 10, B = 1, H = 1, Tq = 0, Tk = 0, D = 0;
    int64_t T = 1024, E = 768, NH = 12, gemm_n = 1024;
    int64_t kv_heads = 0;
    int shape_ix = BENCH_N_SPEC_SHAPES + 1, impl_ix = 0; /* --shape all, --impl default */
    int64_t prefill = 4096, steps = 128, step_tq = 1;
    int want_decode = 0, want_backward = 0;
    static const char *const dtype_names[] = {"f32", "bf16", "f16", NULL};
    static const attn_dtype dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    int dtype_ix = 0;
    int causal = 0, causal_br = 0, padding = 0;
    int want_peak = 0, want_mha = 0, want_gemm = 0, want_bw = 0;
    const char *window = NULL;
    float softcap = 0;
    cli_opt opts[] = {
        {"shape", CLI_CHOICE, &shape_ix, shape_names, 0, 0, 0},
        {"batch", CLI_INT, &B, NULL, 1, BENCH_MAX_SIZE, 0},
        {"heads", CLI_INT, &H, NULL, 1, BENCH_MAX_SIZE, 0},
        {"query-len", CLI_INT, &Tq, NULL, 1, BENCH_MAX_SIZE, 0},
        {"key-len", CLI_INT, &Tk, NULL, 1, BENCH_MAX_SIZE, 0},
        {"head-dim", CLI_INT, &D, NULL, 1, BENCH_MAX_SIZE, 0},
        {"kv-heads", CLI_INT, &kv_heads, NULL, 1, BENCH_MAX_SIZE, 0},
        {"causal", CLI_FLAG, &causal, NULL, 0, 0, 0},
        {"causal-bottom-right", CLI_FLAG, &causal_br, NULL, 0, 0, 0},
        {"padding", CLI_FLAG, &padding, NULL, 0, 0, 0},
        {"window", CLI_STRING, &window, NULL, 0, 0, 0},
        {"softcap", CLI_FLOAT, &softcap, NULL, 0, 0, 0},
        {"threads", CLI_INT, &threads, NULL, 1, BENCH_MAX_THREADS, 0},
        {"impl", CLI_CHOICE, &impl_ix, impl_names, 0, 0, 0},
        {"runs", CLI_INT, &runs, NULL, 1, BENCH_MAX_RUNS, 0},
        {"json", CLI_FLAG, &o.json, NULL, 0, 0, 0},
        {"peak", CLI_FLAG, &want_peak, NULL, 0, 0, 0},
        {"mha", CLI_FLAG, &want_mha, NULL, 0, 0, 0},
        {"seq-len", CLI_INT, &T, NULL, 1, BENCH_MAX_SIZE, 0},
        {"embed-dim", CLI_INT, &E, NULL, 1, BENCH_MAX_SIZE, 0},
        {"num-heads", CLI_INT, &NH, NULL, 1, BENCH_MAX_SIZE, 0},
        {"gemm", CLI_FLAG, &want_gemm, NULL, 0, 0, 0},
        {"size", CLI_INT, &gemm_n, NULL, 1, BENCH_MAX_SIZE, 0},
        {"bandwidth", CLI_FLAG, &want_bw, NULL, 0, 0, 0},
        {"decode", CLI_FLAG, &want_decode, NULL, 0, 0, 0},
        {"prefill", CLI_INT, &prefill, NULL, 1, BENCH_MAX_SIZE, 0},
        {"steps", CLI_INT, &steps, NULL, 1, BENCH_MAX_SIZE, 0},
        {"tq", CLI_INT, &step_tq, NULL, 1, 4096, 0},
        {"dtype", CLI_CHOICE, &dtype_ix, dtype_names, 0, 0, 0},
        {"backward", CLI_FLAG, &want_backward, NULL, 0, 0, 0},
    };
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    int rc = cli_parse(PROG, argc, argv, opts, nopts, HELP);
    if (rc != CLI_PARSED)
        return rc;

    /* Combinations the options cannot mean together are refused, not ignored. */
    const int is_custom = cli_seen(opts, nopts, "batch") || cli_seen(opts, nopts, "heads") ||
                          cli_seen(opts, nopts, "query-len") ||
                          cli_seen(opts, nopts, "key-len") || cli_seen(opts, nopts, "head-dim") ||
                          cli_seen(opts, nopts, "kv-heads");
    if (want_peak + want_mha + want_gemm + want_bw + want_decode + want_backward > 1)
        return cli_usage_error(PROG, "--peak, --mha, --gemm, --bandwidth, --decode and "
                               "--backward exclude each other");
    if ((want_peak || want_mha || want_gemm || want_bw || want_decode) &&
        (is_custom || cli_seen(opts, nopts, "shape")))
        return cli_usage_error(PROG, "--%s takes no shape (--shape or custom sizes)",
                               want_peak ? "peak" : want_mha ? "mha" : want_gemm ? "gemm"
                                                    : want_bw ? "bandwidth" : "decode");
    /* Each mode's own sizes, given without that mode, would be dropped without a
     * word (the run would time another shape than the one asked for). */
    static const char *const mha_only[] = {"seq-len", "embed-dim", "num-heads", NULL};
    for (int i = 0; mha_only[i]; i++)
        if (!want_mha && cli_seen(opts, nopts, mha_only[i]))
            return cli_usage_error(PROG, "--%s applies to --mha", mha_only[i]);
    if (!want_gemm && cli_seen(opts, nopts, "size"))
        return cli_usage_error(PROG, "--size applies to --gemm");
    if (want_peak && (cli_seen(opts, nopts, "runs") || cli_seen(opts, nopts, "impl")))
        return cli_usage_error(PROG, "--peak measures the FMA peak alone: --%s does not apply",
                               cli_seen(opts, nopts, "runs") ? "runs" : "impl");
    if (!want_decode && (cli_seen(opts, nopts, "prefill") || cli_seen(opts, nopts, "steps") ||
                         cli_seen(opts, nopts, "tq")))
        return cli_usage_error(PROG, "--prefill, --steps and --tq apply to --decode");
    /* The decoding loop times each of its --steps once, on the library's default
     * path: a --runs or another --impl would be silently ignored. */
    if (want_decode && (cli_seen(opts, nopts, "runs") || impl_ix != 0))
        return cli_usage_error(PROG, "--decode times each of its --steps once on the default "
                                     "path: --%s does not apply (use --steps)",
                               cli_seen(opts, nopts, "runs") ? "runs" : "impl");
    if (want_backward && shape_ix == BENCH_N_SPEC_SHAPES)
        return cli_usage_error(PROG, "--backward runs S1 .. S8, not S9 (a decode step)");
    if (is_custom && cli_seen(opts, nopts, "shape"))
        return cli_usage_error(PROG, "--shape and a custom shape exclude each other");
    if (is_custom && (!Tq || !D))
        return cli_usage_error(PROG, "a custom shape needs --query-len and --head-dim");
    if (!is_custom && (!want_mha && causal))
        return cli_usage_error(PROG, "--causal applies to a custom shape or --mha (the SPEC "
                               "shapes have their own masks)");
    if (!is_custom && padding)
        return cli_usage_error(PROG, "--padding applies to a custom shape");
    static const char *const custom_only[] = {"causal-bottom-right", "window", "softcap", NULL};
    for (int i = 0; custom_only[i]; i++)
        if (!is_custom && cli_seen(opts, nopts, custom_only[i]))
            return cli_usage_error(PROG, "--%s applies to a custom shape", custom_only[i]);
    if (causal && causal_br)
        return cli_usage_error(PROG, "--causal (top-left) and --causal-bottom-right exclude "
                               "each other: give one alignment");
    if (cli_seen(opts, nopts, "softcap") && !(softcap > 0.0f))
        return cli_usage_error(PROG, "--softcap must be a number > 0 (got %g)", (double)softcap);
    int64_t window_left = -1, window_right = -1;
    if (window && (rc = cli_parse_window(PROG, "window", window, &window_left, &window_right)) !=
                      CLI_PARSED)
        return rc;
    if (!Tk)
        Tk = Tq;
    if (kv_heads && H % kv_heads != 0)
        return cli_usage_error(PROG, "--heads %lld is not a multiple of --kv-heads %lld",
                               (long long)H, (long long)kv_heads);
    if (want_mha && E % NH != 0)
        return cli_usage_error(PROG, "--embed-dim %lld is not divisible by --num-heads %lld",
                               (long long)E, (long long)NH);
    if ((want_mha || want_gemm) && impl_ix != 0 && impl_ix != 1 && impl_ix != 6)
        return cli_usage_error(PROG, "--%s runs --impl default, ref or all, not '%s'",
                               want_mha ? "mha" : "gemm", impl_names[impl_ix]);

    if (dtype_ix != 0 && (want_peak || want_mha || want_gemm || want_backward))
        return cli_usage_error(PROG, "--dtype %s applies to the attention shapes (and "
                               "--bandwidth's and --decode's), not to --%s",
                               dtype_names[dtype_ix],
                               want_peak   ? "peak"
                               : want_mha  ? "mha"
                               : want_gemm ? "gemm"
                                           : "backward");

    /* An instruction set named by --impl must be one this run can time: otherwise
     * the table would come out with no line and the exit status would say all
     * went well. The backward is float32 only, where avx512bf16 and amx are the
     * avx512 kernel, so it has no kernel of theirs to time. */
    attn_arch impl_arch;
    if (attn_arch_parse(impl_names[impl_ix], &impl_arch) == ATTN_OK) {
        const int own_bf16 = impl_arch == ATTN_ARCH_AVX512_BF16 || impl_arch == ATTN_ARCH_AMX;
        if (want_backward && own_bf16)
            return cli_usage_error(PROG, "--backward is float32 only, where --impl %s is the "
                                         "avx512 kernel: use --impl avx512",
                                   impl_names[impl_ix]);
        if (!attn_arch_supported(impl_arch)) {
            cli_error(PROG, "--impl %s: this CPU (or this build) cannot run that path, so "
                            "there is nothing to time; --impl all times every path it can",
                      impl_names[impl_ix]);
            return CLI_EXIT_ERROR;
        }
    }

    o.dtype = dtypes[dtype_ix];
    o.threads = (int)threads;
    o.runs = (int)runs;
    o.impl = impl_names[impl_ix];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = o.threads;
    const int nthreads = attn_threads_resolve(&ctx);
    o.default_arch = attn_arch_name(attn_arch_selected(&ctx));
    json_escape(attn_arch_reason(&ctx), o.reason_json, sizeof o.reason_json);
    o.peak1 = bench_probe_peak(1);
    o.peakn = nthreads == 1 ? o.peak1 : bench_probe_peak(nthreads);
    if (want_peak) {
        bench_report_peak(&o, nthreads);
        return CLI_EXIT_OK;
    }
    bench_print_header(&o);
    if (want_mha)
        return bench_mha(T, E, NH, causal, &o) ? CLI_EXIT_ERROR : CLI_EXIT_OK;
    if (want_gemm)
        return bench_gemm(gemm_n, &o) ? CLI_EXIT_ERROR : CLI_EXIT_OK;
    if (want_bw) {
        /* S5 and S7 are the decode steps: their K and V against the bandwidth. */
        const int bad = bench_bandwidth(&o) || bench_sdpa(&bench_spec_shapes[4], &o) ||
                        bench_sdpa(&bench_spec_shapes[6], &o) || bench_kv_s9(&o);
        bench_stream_free(&o);
        return bad ? CLI_EXIT_ERROR : CLI_EXIT_OK;
    }
    if (want_decode)
        return bench_decode(prefill, steps, step_tq, &o) ? CLI_EXIT_ERROR : CLI_EXIT_OK;
    if (is_custom) {
        const bench_shape custom = {"custom",
                                    B,
                                    H,
                                    Tq,
                                    Tk,
                                    D,
                                    causal      ? ATTN_CAUSAL_TOP_LEFT
                                    : causal_br ? ATTN_CAUSAL_BOTTOM_RIGHT
                                                : ATTN_CAUSAL_NONE,
                                    padding,
                                    kv_heads,
                                    window != NULL,
                                    window_left,
                                    window_right,
                                    softcap};
        return (want_backward ? bench_backward(&custom, &o) : bench_sdpa(&custom, &o))
                   ? CLI_EXIT_ERROR
                   : CLI_EXIT_OK;
    }
    int status = 0;
    const int all = shape_ix == BENCH_N_SPEC_SHAPES + 1;
    if (want_backward) {
        /* The training shapes (S2, S3, S4, S8) unless one shape is named. */
        for (int x = 0; x < BENCH_N_SPEC_SHAPES; x++)
            if (all ? (x == 1 || x == 2 || x == 3 || x == 7) : shape_ix == x)
                status |= bench_backward(&bench_spec_shapes[x], &o);
        return status ? CLI_EXIT_ERROR : CLI_EXIT_OK;
    }
    for (int x = 0; x < BENCH_N_SPEC_SHAPES; x++)
        if (all || shape_ix == x)
            status |= bench_sdpa(&bench_spec_shapes[x], &o);
    if (all || shape_ix == BENCH_N_SPEC_SHAPES)
        status |= bench_kv_s9(&o); /* S9, through the KV cache (stored in --dtype) */
    return status ? CLI_EXIT_ERROR : CLI_EXIT_OK;
}
