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

/* GFLOP/s of `threads` threads running 16 independent FMA chains each, all at once
 * (best of 5). */
double bench_probe_peak(int threads);

/* Prints the peak line (o->peak1 and o->peakn, measured by the caller) for
 * `attn bench --peak`. */
void bench_report_peak(const bench_opts *o, int threads);

/* Measures the streaming read bandwidth of S5's K and V (2 x 64 MiB) with the run's
 * threads, prints its line and sets o->stream_gbs. 0, or 1 when out of memory. */
int bench_bandwidth(bench_opts *o);

#endif /* TOOLS_BENCH_PROBES_H */
