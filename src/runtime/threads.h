/*
 * threads.h - the thread pool (src/runtime/threads.c): a parallel for over work
 * items, and how many threads a problem deserves. Internal; names start with attn__.
 */
#ifndef ATTN_THREADS_H
#define ATTN_THREADS_H

#include "attn_internal.h"

#include <stdint.h>

/* Runs fn(arg, item, worker) for every item in [0, n_items) on up to `threads`
 * threads (the caller is worker 0; workers are numbered 0 .. threads-1, so a
 * worker may index per-thread scratch). Items are handed out in increasing order
 * from a shared counter, so which thread runs an item varies from run to run: fn
 * must write results that depend on the item only. Returns when every item is
 * done. Never fails: without threads it runs the items on the caller. */
typedef void (*attn__task_fn)(void *arg, int64_t item, int worker);
void attn__parallel_for(int threads, int64_t n_items, attn__task_fn fn, void *arg);

/* How many threads a problem of `flops` floating-point operations split into
 * `n_items` pieces should use under ctx: ctx->threads (0 = attn_threads_online(): the cores it may run on), no more
 * than the items, and 1 below about 1 MFLOP per thread, where waking a thread
 * costs more than it saves. */
int attn__threads_for(const attn_ctx *ctx, double flops, int64_t n_items);

#endif /* ATTN_THREADS_H */
