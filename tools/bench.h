/*
 * bench.h - the pieces of `attn bench`, one file each:
 *
 *   tools/cmd_bench.c      the command line: help, options, which benchmark runs
 *   tools/bench_common.c   timing (median of samples), SPEC section 5's shapes,
 *                          the text header and the JSON line every benchmark prints
 *   tools/bench_probes.c   the machine's own limits: the FP32 FMA peak and the
 *                          streaming read bandwidth (tools/bench_probes.h)
 *   tools/bench_sdpa.c     scaled dot-product attention on S1-S8 or a custom shape
 *   tools/bench_mha.c      multi-head attention end to end, projections included
 *   tools/bench_gemm.c     the projection GEMM alone (y = x W^T)
 *   tools/bench_decode.c   decoding through the KV cache: S9's batched step, and a
 *                          decode loop (--decode) with its allocations counted
 *   tools/bench_backward.c the backward (--backward) alone and after the forward
 *
 * Method: inputs are filled once (uniform in [-1, 1)), each measurement does two
 * warm-up calls and then at least `runs` timed samples; a sample of a very short
 * call repeats it enough times to last about a millisecond and divides. The figure
 * is the median sample. FLOPs are SPEC section 5's: 4*B*H*Tq*Tk*D, halved for
 * causal shapes with Tq == Tk; a window, or causal with Tq != Tk, counts the
 * (query, key) pairs it leaves visible instead (4*B*H*D per pair), so that a
 * window's GFLOP/s count only the work it needs. Multi-head attention adds
 * 2*B*T*E*4E for the projections.
 */
#ifndef TOOLS_BENCH_H
#define TOOLS_BENCH_H

#include "attn.h"

#include <stdint.h>

/* What every benchmark needs to know about the run. */
typedef struct bench_opts {
    int threads;         /* --threads, or 0: one per usable core (attn_threads_online) */
    int runs;            /* timed samples per measurement */
    int json;            /* one JSON object per line instead of the table */
    const char *impl;    /* --impl: default, ref, fused, scalar, avx2, avx512, all */
    double peak1, peakn; /* FP32 FMA peak, GFLOP/s, with 1 and with `threads` threads */
    double stream_gbs;   /* K/V streaming bandwidth when measured, else 0 */
    void *stream;        /* the bandwidth probe's copies, kept for the paired runs
                            (tools/bench_probes.h), or NULL */
    const char *default_arch; /* the path attn_sdpa picks, and why (JSON-escaped) */
    attn_dtype dtype;    /* --dtype: q, k, v and out of the attention benchmarks */
    char reason_json[1024];
} bench_opts;

/* One attention shape: SPEC section 5's S1-S8, or the command line's own. */
typedef struct bench_shape {
    const char *name;
    int64_t B, H, Tq, Tk, D;
    int causal;       /* an attn_causal value */
    int padding;      /* S6's padding mask */
    int64_t Hkv;      /* key/value heads (grouped-query attention); 0 = H */
    int has_window;   /* a sliding window (window_left, window_right), -1 = unbounded */
    int64_t window_left, window_right;
    float softcap;    /* 0 = none */
} bench_shape;

#define BENCH_N_SPEC_SHAPES 8
extern const bench_shape bench_spec_shapes[BENCH_N_SPEC_SHAPES];

/* ---- timing (bench_common.c) ---- */

typedef int (*bench_fn)(void *arg); /* 0 on success, else the call failed */

typedef struct bench_timing {
    double median_s, min_s;
    int runs;
    int status; /* the first nonzero return of the call, else 0 */
} bench_timing;

double bench_now_s(void);
/* The process's peak resident memory so far, MiB. */
double bench_peak_rss_mib(void);
/* Two warm-up calls, then `runs` samples of at least ~1 ms each. */
bench_timing bench_time_call(bench_fn fn, void *arg, int runs);
void bench_fill_uniform(float *p, int64_t n, uint64_t seed);
/* FLOPs of the attention core on s (SPEC section 5; see the top of this file). */
double bench_sdpa_flops(const bench_shape *s);
/* none, causal, causal_bottom_right or padding. */
const char *bench_mask_name(const bench_shape *s);
/* The options of shape s into p (initialised here); with S6's padding, fills mask
 * [B, 1, 1, Tk] (samples b >= B/2 pad their last quarter of keys, so no row is left
 * empty) and points p at it. Shared by the forward and backward benchmarks. */
void bench_sdpa_params(const bench_shape *s, int64_t B, int64_t Tk, attn_tensor *mask,
                       attn_sdpa_params *p);
/* Why a call failed: the context's message, or the status when the benchmark's own
 * allocation failed and left none. */
const char *bench_why(const attn_ctx *ctx, int rc);
/* s's key/value heads: Hkv, or H when not set. */
int64_t bench_kv_heads(const bench_shape *s);

/* ---- output (bench_common.c) ---- */

/* The table's header in text mode, once per run; nothing in JSON mode, where every
 * line carries the same facts itself. */
void bench_print_header(const bench_opts *o);

/* SPEC section 4's fields, which every JSON line carries in this order, followed by
 * the run's setup (default_arch, reason, peak_gflops_1t, peak_gflops). A field that
 * means nothing for a line's kind (the attention shape of a GEMM, the time of the
 * FMA peak) is null: B..D when B <= 0, mask when NULL, median_ms and gflops when
 * negative. */
typedef struct bench_fields {
    const char *kind;  /* sdpa, kv_stream, decode, mha, gemm, peak, bandwidth */
    const char *impl;
    int64_t B, H, Tq, Tk, D;
    const char *mask;
    int threads;
    double median_ms, gflops;
} bench_fields;

/* Prints "{" and the fields above; the caller prints its own ",\"key\":value" pairs
 * and ends the line with bench_json_end(). */
void bench_json_begin(const bench_opts *o, const bench_fields *f);
void bench_json_end(void);

/* ---- the benchmarks ---- */

int bench_sdpa(const bench_shape *s, const bench_opts *o);                        /* bench_sdpa.c */
int bench_mha(int64_t T, int64_t E, int64_t H, int causal, const bench_opts *o); /* bench_mha.c */
int bench_gemm(int64_t n, const bench_opts *o);                                   /* bench_gemm.c */
int bench_kv_s9(const bench_opts *o);                                             /* bench_decode.c */
int bench_decode(int64_t prefill, int64_t steps, int64_t tq, const bench_opts *o); /* bench_decode.c */
int bench_backward(const bench_shape *s, const bench_opts *o);                    /* bench_backward.c */

#endif /* TOOLS_BENCH_H */
