/*
 * bench_probes.h - the machine's own limits, against which `attn bench` reads its
 * figures: the FP32 FMA peak (what a compute-bound kernel could reach) and the
 * read bandwidth of streaming S5's K and V (what bounds one decoding step). Neither
 * calls the library's kernels; see tools/bench_probes.c for how each is measured.
 */
#ifndef TOOLS_BENCH_PROBES_H
#define TOOLS_BENCH_PROBES_H

#include "bench.h"

/* The instruction set the FMA chains run on here: "avx512", "avx2" or "scalar". */
const char *bench_probe_peak_isa(void);

/* GFLOP/s of `threads` threads running independent FMA chains each, all at once
 * (best of 5), on the best instruction set here (bench_probe_peak_isa). */
double bench_probe_peak(int threads);

/* The same on the chains of one instruction set: "avx512" (16 x 512-bit FMA
 * chains), "avx2" (12 x 256-bit) or "scalar" (64 multiply-add chains in portable
 * C, compiled as the portable kernel is); the caller checks the CPU has it. */
double bench_probe_peak_on(const char *isa, int threads);

/* The probe an attention path is read against: "scalar" for the reference and the
 * portable build, "avx2" for the AVX2 build, the best one here otherwise (the
 * AVX-512 paths, and the default path on an AVX-512 machine). */
const char *bench_peak_isa_of(attn_arch arch);

/* The peak, GFLOP/s, of probe `isa` with `threads` threads: o's own figures when
 * they are that probe's, else measured on first use and remembered. */
double bench_peak_for(const bench_opts *o, const char *isa, int threads);

/* Prints the peak line (o->peak1 and o->peakn, measured by the caller) for
 * `attn bench --peak`. */
void bench_report_peak(const bench_opts *o, int threads);

/* Bytes of the last-level cache (sysconf, else sysfs); 0 when unknown. */
int64_t bench_llc_bytes(void);

/* How many copies of a working set of `bytes` a benchmark rotates through, one a
 * call, so that the copy a call reads has left the last-level cache: between two
 * reads of one copy the others bring at least twice the LLC's bytes through it
 * (twice the LLC of 256 MiB when the LLC is unknown; at most 64 copies). */
int bench_cold_copies(double bytes);

/* Measures the streaming read bandwidth of S5's K and V (2 x 64 MiB, rotating through
 * bench_cold_copies() copies so that memory, not the cache, is read) with the run's
 * threads, prints its line and sets o->stream_gbs. 0, or 1 when out of memory. */
int bench_bandwidth(bench_opts *o);

/* The decode shapes against the probe, interleaved: on a shared machine the
 * bandwidth moves from one second to the next (7-29 GB/s within a minute here),
 * so a fraction of a bandwidth measured earlier says little. Each of `runs`
 * pairs (at least 5) reads the probe's next copy, then makes one call of fn
 * (which reads `bytes` of K and V, from memory when fn rotates its copies); the
 * fraction is the median over the pairs of the call's rate over the probe's.
 * Needs bench_bandwidth's copies (o->stream); without them it sets nothing and
 * returns 0. 0, or what fn returned, or ATTN_STATUS_NO_MEMORY. */
typedef struct bench_pair {
    int runs;
    double fraction, fraction_min, fraction_max; /* median, lowest, highest */
    double kv_gbs, stream_gbs;                   /* medians over the pairs */
} bench_pair;
int bench_paired_fraction(const bench_opts *o, bench_fn fn, void *arg, double bytes, int runs,
                          bench_pair *out);

/* Frees the probe's copies (o->stream) that bench_bandwidth kept. */
void bench_stream_free(bench_opts *o);

#endif /* TOOLS_BENCH_PROBES_H */
