"""The extension's backward entry points (what attn.torch's autograd calls), without
PyTorch: against the backward worked out in float64 numpy, and with bad arguments."""
import numpy as np
import pytest

import attn
from attn import _attn


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def sdpa_backward_f64(q, k, v, mask, dout):
    """docs/gradients.md's formulas in float64: P, dV = P^T dO, dP = dO V^T,
    dS = P (dP - rowsum(P dP)), dQ = s dS K, dK = s dS^T Q."""
    q, k, v, dout = (a.astype(np.float64) for a in (q, k, v, dout))
    s = 1.0 / np.sqrt(q.shape[-1])
    scores = s * q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    return s * ds @ k, s * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ dout


# Tolerance: float32 results against float64 on values of order 1 over at most 17
# keys; the float32 rounding seen is below 1e-6.
ATOL, RTOL = 1e-5, 1e-4


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backward_equals_the_float64_formulas(causal):
    """attn.sdpa_backward's dq, dk, dv equal the float64 backward, with and without a mask
    (causal given as a flag, and as a bool mask: the same gradients)."""
    B, H, T, D = 2, 3, 17, 8
    q, k, v, dout = rand(B, H, T, D, seed=1), rand(B, H, T, D, seed=2), \
        rand(B, H, T, D, seed=3), rand(B, H, T, D, seed=4)
    out, lse = attn.sdpa(q, k, v, causal=causal, return_lse=True)
    got = attn.sdpa_backward(q, k, v, out, lse, dout, causal=causal)
    mask = np.tril(np.ones((T, T), bool)) if causal else None
    want = sdpa_backward_f64(q, k, v, mask, dout)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == np.float32, (name, g.shape, g.dtype)
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL, err_msg=name)
    if causal:
        by_mask = attn.sdpa_backward(q, k, v, out, lse, dout, mask=mask)
        for name, a, b in zip(("dq", "dk", "dv"), got, by_mask):
            np.testing.assert_allclose(a, b, atol=ATOL, rtol=RTOL, err_msg=name)


def test_mha_backward_gives_five_gradients_of_the_parameters_shapes():
    """_mha_backward returns dx [B,T,E], dw_qkv [3E,E], db_qkv [3E], dw_o [E,E], db_o [E];
    db_o is the column sum of dout, as the output layer's bias gradient must be."""
    B, T, E, H = 2, 5, 8, 2
    x, dout = rand(B, T, E, seed=1), rand(B, T, E, seed=2)
    w_qkv, b_qkv = rand(3 * E, E, seed=3) * 0.3, rand(3 * E, seed=4)
    w_o, b_o = rand(E, E, seed=5) * 0.3, rand(E, seed=6)
    g = _attn._mha_backward(x, w_qkv, b_qkv, w_o, b_o, H, dout, causal=True)
    shapes = [a.shape for a in g]
    assert shapes == [(B, T, E), (3 * E, E), (3 * E,), (E, E), (E,)], shapes
    np.testing.assert_allclose(g[4], dout.sum(axis=(0, 1)), atol=1e-5, rtol=1e-5)


def test_backward_bad_arguments_raise_and_never_crash():
    """None, float64, a wrong lse shape and a zero num_heads are exceptions with messages."""
    q, k, v = rand(1, 2, 4, 4), rand(1, 2, 4, 4, seed=1), rand(1, 2, 4, 4, seed=2)
    out, lse = attn.sdpa(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match="dout"):
        attn.sdpa_backward(q, k, v, out, lse, None)
    with pytest.raises(TypeError, match="q must be float32"):
        attn.sdpa_backward(q.astype(np.float64), k, v, out, lse, out)
    with pytest.raises(ValueError):
        attn.sdpa_backward(q, k, v, out, lse[..., :2], out)
    x = rand(1, 4, 4)
    w = (rand(12, 4), rand(12), rand(4, 4), rand(4))
    with pytest.raises(ValueError, match="num_heads"):
        _attn._mha_backward(x, *w, 0, x)
    with pytest.raises(ValueError):
        _attn._mha_backward(x, *w, 3, x)  # 4 is not divisible by 3
    with pytest.raises(TypeError):
        _attn._mha_backward(x, *w, 2, None)


def test_backward_calls_leak_nothing():
    """60000 backward calls (half of them failing) keep the refcounts, Python's traced
    memory and the RSS unchanged: every gradient array made is freed with its tuple."""
    import gc
    import sys
    import tracemalloc

    def rss_kib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

    q, k, v, dout = (rand(1, 1, 2, 2, seed=s) for s in range(4))
    out, lse = attn.sdpa(q, k, v, return_lse=True)
    bad = lse[..., :1]
    x, w = rand(1, 2, 2), (rand(6, 2), rand(6), rand(2, 2), rand(2))
    args = (q, k, v, dout, out, lse, bad, x) + w
    refs = [sys.getrefcount(a) for a in args]

    def calls(n):
        for _ in range(n):
            attn.sdpa_backward(q, k, v, out, lse, dout)
            _attn._mha_backward(x, *w, 1, x)
            for bad_call in (lambda: attn.sdpa_backward(q, k, v, out, bad, dout),
                             lambda: _attn._mha_backward(x, *w, 3, x)):
                try:
                    bad_call()
                except ValueError:
                    pass

    calls(2000)  # warm up allocator pools before measuring
    gc.collect()
    rss0 = rss_kib()
    tracemalloc.start()
    snap0 = tracemalloc.get_traced_memory()[0]
    calls(15000)
    gc.collect()
    snap1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    rss1 = rss_kib()
    assert [sys.getrefcount(a) for a in args] == refs
    assert snap1 - snap0 < 64 * 1024, "Python memory grew by %d bytes" % (snap1 - snap0)
    # One leaked gradient array per call would be over 1.5 MB, all of them 15 MB; allow
    # 4 MB of noise (refcounts and tracemalloc catch the smaller leaks).
    assert rss1 - rss0 < 4096, "RSS grew from %d to %d KiB" % (rss0, rss1)
