"""Arrays are used in place, references are not leaked, and threads agree."""
import gc
import os
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import attn


def qkv(B=2, H=4, T=5, D=4, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))


def naive(q, k, v, scale=None):
    """The chapter's three steps in float64 numpy: the oracle for these tests."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v


def test_out_is_the_callers_array():
    """With out=, the result is the caller's own array, filled in place."""
    q, k, v = qkv()
    out = np.full_like(q, np.nan)
    res = attn.sdpa(q, k, v, out=out)
    assert res is out and np.shares_memory(res, out)
    np.testing.assert_allclose(out, naive(q, k, v), rtol=1e-5, atol=2e-6)


def test_out_may_be_a_strided_view():
    """out= may be a strided view into a larger array; only that view is written."""
    q, k, v = qkv()
    big = np.zeros((2, 4, 5, 8), np.float32)
    view = big[..., ::2]
    assert attn.sdpa(q, k, v, out=view) is view
    np.testing.assert_allclose(big[..., ::2], naive(q, k, v), rtol=1e-5, atol=2e-6)
    assert np.all(big[..., 1::2] == 0), "a column between the view's was written"


def test_strided_inputs_are_read_in_place():
    """A strided view of 16 MB of keys is read without a copy: Python allocates under 1 MB.

    tracemalloc sees numpy's allocations (numpy reports them to it), so a copy of k or
    v made by the binding would show as a peak of at least their 16 MB; the library's
    own scratch is C malloc and not counted.
    """
    rng = np.random.default_rng(1)
    kv = rng.standard_normal((1, 1, 32768, 128)).astype(np.float32)
    k, v = kv[..., :64], kv[..., 64:]  # row stride 128: not contiguous
    q = rng.standard_normal((1, 1, 1, 64)).astype(np.float32)
    assert not k.flags.c_contiguous
    tracemalloc.start()
    out = attn.sdpa(q, k, v)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20, "peak Python allocation %d bytes for a 16 MB strided k/v" % peak
    np.testing.assert_allclose(out, naive(q, k, v), rtol=1e-4, atol=1e-5)


def test_broadcast_views_with_zero_strides_are_read_in_place():
    """A mask made with np.broadcast_to (zero strides) is accepted as it is."""
    q, k, v = qkv()
    row = np.array([True, True, False, True, True])
    mask = np.broadcast_to(row, (2, 4, 5, 5))
    out = attn.sdpa(q, k, v, mask=mask)
    want = attn.sdpa(q, k, v, mask=np.ascontiguousarray(mask))
    assert np.array_equal(out, want)


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    pytest.skip("no /proc/self/status")


def test_a_million_calls_leak_nothing():
    """A million small sdpa calls leave the refcounts, tracemalloc and the RSS unchanged."""
    q, k, v = qkv(1, 1, 2, 2)
    out = np.empty_like(q)
    refs = [sys.getrefcount(a) for a in (q, k, v, out)]
    for _ in range(10000):  # warm up allocator pools before measuring
        attn.sdpa(q, k, v)
        attn.sdpa(q, k, v, out=out)
    gc.collect()
    rss0 = rss_kib()
    tracemalloc.start()
    snap0 = tracemalloc.get_traced_memory()[0]
    sdpa = attn.sdpa
    for _ in range(500000):
        sdpa(q, k, v)
        sdpa(q, k, v, out=out)
    gc.collect()
    snap1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    rss1 = rss_kib()
    assert [sys.getrefcount(a) for a in (q, k, v, out)] == refs
    assert snap1 - snap0 < 64 * 1024, "Python memory grew by %d bytes" % (snap1 - snap0)
    # One leaked 16-byte array per call would be 16 MB; allow 4 MB of noise.
    assert rss1 - rss0 < 4096, "RSS grew from %d to %d KiB" % (rss0, rss1)


def test_failing_calls_leak_nothing():
    """100000 calls that fail (a bad mask, then a bad dtype) keep the refcounts unchanged."""
    q, k, v = qkv(1, 1, 2, 2)
    mask = np.zeros((3, 3), bool)
    bad = q.astype(np.float64)
    refs = [sys.getrefcount(a) for a in (q, k, v, mask, bad)]
    for _ in range(50000):
        try:
            attn.sdpa(q, k, v, mask=mask, return_weights=True, return_lse=True)
        except ValueError:
            pass
        try:
            attn.sdpa(q, k, bad)
        except TypeError:
            pass
    assert [sys.getrefcount(a) for a in (q, k, v, mask, bad)] == refs


def test_threads_give_the_same_answers():
    """Eight Python threads calling attn.sdpa at once each get their own correct result."""
    inputs = [qkv(2, 4, 33, 16, seed=s) for s in range(8)]
    want = [attn.sdpa(*a, causal=True) for a in inputs]
    got = [None] * 8
    errors = []

    def work(i):
        try:
            for _ in range(200):
                r = attn.sdpa(*inputs[i], causal=True)
                if not np.array_equal(r, want[i]):
                    errors.append("thread %d: a different result" % i)
                    return
            got[i] = r
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append("thread %d: %r" % (i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(8):
        assert np.array_equal(got[i], want[i])


def test_the_gil_is_released_while_the_kernel_runs():
    """While one thread runs a long sdpa, the main thread keeps running Python code.

    With the GIL held for the whole call the main thread could not run a single
    bytecode until it returned, so its loop would count almost nothing.
    """
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 4, 2048, 64)).astype(np.float32) for _ in range(3))
    started = threading.Event()

    def run():
        started.set()
        attn.sdpa(q, k, v)

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    n = 0
    while t.is_alive():
        n += 1
    t.join()
    assert n > 1000, "the main thread ran %d loop turns during the call" % n


def test_split_heads_as_a_view_is_read_in_place():
    """The chapter's split heads, x.reshape(B, T, H, D).transpose(0, 2, 1, 3), is taken as
    it is (a strided view, no copy) and gives the contiguous copy's result, bit for bit
    (the kernels read strides; the arithmetic is the same)."""
    B, T, H, D = 2, 7, 4, 8
    rng = np.random.default_rng(3)
    qkv_ = rng.standard_normal((3, B, T, H * D)).astype(np.float32)
    q, k, v = (a.reshape(B, T, H, D).transpose(0, 2, 1, 3) for a in qkv_)
    assert not q.flags.c_contiguous and np.shares_memory(q, qkv_)
    got = attn.sdpa(q, k, v, causal=True)
    want = attn.sdpa(*(np.ascontiguousarray(a) for a in (q, k, v)), causal=True)
    diff = np.abs(got - want).max()
    assert np.array_equal(got, want), "strided and contiguous inputs differ by %g" % diff
