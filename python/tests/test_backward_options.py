"""attn.sdpa_backward with every option of SPEC section 6, and attn.mha_backward, as a
trainer calls them from numpy. For sdpa_backward the log-sum-exp of sdpa(...,
return_lse=True) goes in with the same options, and the gradients (dq, dk, dv, and
dbias, dsinks when given) must be those of the forward, checked against float64
central differences of SPEC section 6's forward written here in numpy (no PyTorch
needed); mha_backward's against the chapter's module written the same way. Also:
each bad argument's message names it, threads get one thread's bits, and nothing
leaks.

Tolerance: attn computes in float32 on values of order 1 over at most 7 keys (the
rounding seen is a few 1e-7); the differences are float64 with a step of 1e-6 on a
smooth function (error below 1e-8). atol 2e-5 + rtol 1e-4 lets neither a missing
option term nor a gradient of the wrong key through (those are off by 1e-2 or more).
"""
import gc
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import attn

ATOL, RTOL = 2e-5, 1e-4


def rand(*shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def forward64(q, k, v, mask=None, causal=False, scale=None, window=None, softcap=None,
              alibi=None, bias=None, sinks=None):
    """SPEC section 6's forward in float64, step by step: s = scale q k, softcap,
    + bias + alibi, masks, softmax with the sink, weights v. GQA by repeating heads."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    group = H // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = (1 / np.sqrt(D) if scale is None else scale) * q @ np.swapaxes(k, -1, -2)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    i = np.arange(Tq)[:, None]
    i_end = i + Tk - Tq  # i' of SPEC 6.3: the query's place counted from the keys' end
    j = np.arange(Tk)[None, :]
    if bias is not None:
        s = s + bias
    if alibi is not None:
        s = s - np.asarray(alibi, np.float64)[None, :, None, None] * np.abs(i_end - j)
    visible = np.ones((Tq, Tk), bool)
    if causal is True or causal == "top_left":
        visible &= j <= i
    elif causal == "bottom_right":
        visible &= j <= i_end
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= i_end - left
        if right >= 0:
            visible &= j <= i_end + right
    if mask is not None:
        visible = visible & mask
    s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        sink = np.asarray(sinks, np.float64)[None, :, None, None]
        m = np.maximum(m, sink)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(sink - m)
    return (e / den) @ v


def central_differences(loss, arrays, h=1e-6):
    """d loss / d a for each array, by central differences in float64."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            keep = a[idx]
            a[idx] = keep + h
            up = loss()
            a[idx] = keep - h
            down = loss()
            a[idx] = keep
            g[idx] = (up - down) / (2 * h)
        grads.append(g)
    return grads


# (name, H, Hkv, Tq, Tk, options); bias and sinks are made below from their shapes.
CASES = [
    ("plain", 2, 2, 5, 5, {}),
    ("gqa_sums_over_each_group", 4, 2, 5, 5, {}),
    ("causal_top_left", 2, 2, 5, 5, {"causal": True}),
    ("causal_bottom_right_cross", 2, 2, 3, 7, {"causal": "bottom_right"}),
    ("window", 2, 2, 6, 6, {"window": (2, 1)}),
    ("softcap", 2, 2, 5, 5, {"softcap": 1.5}),
    ("alibi_slopes", 2, 2, 5, 5, {"alibi": [0.5, 0.25]}),
    ("scale", 2, 2, 5, 5, {"scale": 0.9}),
    ("bias_full", 2, 2, 4, 5, {"bias": (1, 2, 4, 5)}),
    ("bias_broadcast_over_queries", 2, 2, 4, 5, {"bias": (2, 1, 5)}),
    ("sinks", 2, 2, 5, 5, {"sinks": (2,)}),
    ("mask", 2, 2, 5, 6, {"mask": "padding"}),
    ("everything", 4, 2, 4, 6, {"causal": "bottom_right", "window": (3, -1), "softcap": 2.0,
                                "alibi": [0.3, 0.2, 0.1, 0.05], "bias": (1, 4, 1, 6),
                                "sinks": (4,), "mask": "padding", "scale": 0.6}),
]


def build(H, Hkv, Tq, Tk, options, D=3, Dv=4):
    q, k, v = rand(1, H, Tq, D, seed=1), rand(1, Hkv, Tk, D, seed=2), rand(1, Hkv, Tk, Dv, seed=3)
    opts = dict(options)
    if "bias" in opts:
        opts["bias"] = rand(*opts["bias"], seed=4, scale=0.5)
    if "sinks" in opts:
        opts["sinks"] = rand(*opts["sinks"], seed=5)
    if "alibi" in opts:
        opts["alibi"] = np.array(opts["alibi"], np.float32)
    if opts.get("mask") == "padding":
        opts["mask"] = np.ones((1, 1, 1, Tk), bool)
        opts["mask"][..., Tk - 2:] = False  # the last two keys are padding
    return q, k, v, opts


@pytest.mark.parametrize("name,H,Hkv,Tq,Tk,options", CASES, ids=[c[0] for c in CASES])
def test_sdpa_backward_gives_the_gradients_of_the_forward_with_each_option(name, H, Hkv, Tq,
                                                                           Tk, options):
    """sdpa_backward's dq, dk, dv (summed over each GQA group), dbias (summed over the
    axes the bias broadcasts along) and dsinks equal float64 central differences of
    sum(out * dout), with the lse of sdpa(..., return_lse=True) under the same options."""
    q, k, v, opts = build(H, Hkv, Tq, Tk, options)
    out, lse = attn.sdpa(q, k, v, return_lse=True, **opts)
    dout = rand(*out.shape, seed=6)
    got = attn.sdpa_backward(q, k, v, out, lse, dout, **opts)
    names = ["dq", "dk", "dv"] + [n for n in ("bias", "sinks") if n in opts]
    assert len(got) == len(names), (len(got), names)

    x = {"q": q.astype(np.float64), "k": k.astype(np.float64), "v": v.astype(np.float64)}
    o64 = {n: (a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype == np.float32
               else a) for n, a in opts.items()}
    d64 = dout.astype(np.float64)

    def loss():
        return float((forward64(x["q"], x["k"], x["v"], **o64) * d64).sum())

    np.testing.assert_allclose(out, forward64(x["q"], x["k"], x["v"], **o64), atol=ATOL,
                               rtol=RTOL, err_msg="the forward itself")
    wants = central_differences(loss, [x["q"], x["k"], x["v"]]
                                + [o64[n] for n in ("bias", "sinks") if n in o64])
    for n, g, w in zip(names, got, wants):
        assert g.shape == w.shape and g.dtype == np.float32, (n, g.shape, w.shape, g.dtype)
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL, err_msg="%s (%s)" % (n, name))
    if isinstance(opts.get("mask"), np.ndarray):
        # Padded keys take no part in the forward: exactly zero gradient, not merely small.
        assert not got[1][..., Tk - 2:, :].any() and not got[2][..., Tk - 2:, :].any(), \
            (got[1][..., Tk - 2:, :], got[2][..., Tk - 2:, :])


def test_sdpa_backward_errors_name_the_argument_and_the_shapes():
    """A dout, lse, bias or sinks of the wrong shape, and a float64 dout, are errors whose
    messages name the argument and its shape."""
    q, k, v = rand(1, 2, 4, 3), rand(1, 2, 5, 3, seed=1), rand(1, 2, 5, 3, seed=2)
    out, lse = attn.sdpa(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"dout has shape \(1, 2, 4, 2\); expected \(1, 2, 4, 3\)"):
        attn.sdpa_backward(q, k, v, out, lse, out[..., :2])
    with pytest.raises(ValueError, match=r"lse has shape \(1, 2, 3\); expected \(1, 2, 4\)"):
        attn.sdpa_backward(q, k, v, out, lse[..., :3], out)
    with pytest.raises(TypeError, match="dout must be float32"):
        attn.sdpa_backward(q, k, v, out, lse, out.astype(np.float64))
    with pytest.raises(ValueError, match=r"bias shape \(3, 5\) does not broadcast to "
                                         r"\(1, 2, 4, 5\)"):
        attn.sdpa_backward(q, k, v, out, lse, out, bias=rand(3, 5))
    with pytest.raises(ValueError, match=r"sinks has shape \(3,\); expected \(2,\)"):
        attn.sdpa_backward(q, k, v, out, lse, out, sinks=rand(3))
    with pytest.raises(TypeError, match="window"):
        attn.sdpa_backward(q, k, v, out, lse, out, window=(1,))


def test_threads_calling_sdpa_backward_at_once_get_one_threads_bits():
    """Four Python threads running sdpa_backward at once (the GIL released) each get the
    bits of the same call made alone, with bias and sinks gradients too."""
    problems = []
    for s in range(4):
        q, k, v = (rand(2, 4, 33, 16, seed=10 * s + i) for i in range(3))
        opts = {"causal": True, "bias": rand(4, 33, 33, seed=10 * s + 3, scale=0.3),
                "sinks": rand(4, seed=10 * s + 4)}
        out, lse = attn.sdpa(q, k, v, return_lse=True, **opts)
        problems.append(((q, k, v, out, lse, rand(*out.shape, seed=10 * s + 5)), opts))
    want = [attn.sdpa_backward(*a, **o) for a, o in problems]
    errors = []

    def work(i):
        try:
            for _ in range(30):
                got = attn.sdpa_backward(*problems[i][0], **problems[i][1])
                if not all(np.array_equal(g, w) for g, w in zip(got, want[i])):
                    errors.append("thread %d: different bits" % i)
                    return
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append("thread %d: %r" % (i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_backward_calls_with_bias_and_sinks_leak_nothing():
    """20000 sdpa_backward calls that return dbias and dsinks (and 20000 failing ones)
    keep the refcounts and Python's traced memory unchanged."""
    q, k, v, dout = (rand(1, 2, 2, 2, seed=s) for s in range(4))
    bias, sinks = rand(2, 2, seed=5), rand(2, seed=6)
    out, lse = attn.sdpa(q, k, v, bias=bias, sinks=sinks, return_lse=True)
    bad = rand(3, seed=7)
    args = (q, k, v, dout, out, lse, bias, sinks, bad)
    refs = [sys.getrefcount(a) for a in args]

    def calls(n):
        for _ in range(n):
            attn.sdpa_backward(q, k, v, out, lse, dout, bias=bias, sinks=sinks)
            try:
                attn.sdpa_backward(q, k, v, out, lse, dout, bias=bias, sinks=bad)
            except ValueError:
                pass

    calls(2000)
    gc.collect()
    tracemalloc.start()
    snap0 = tracemalloc.get_traced_memory()[0]
    calls(20000)
    gc.collect()
    snap1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert [sys.getrefcount(a) for a in args] == refs
    assert snap1 - snap0 < 64 * 1024, "Python memory grew by %d bytes" % (snap1 - snap0)


def mha_forward64(x, w, H, mask=None, causal=False):
    """The chapter's module in float64 numpy: qkv projection, heads, SPEC 6's attention,
    heads merged, output projection."""
    B, T, E = x.shape
    qkv = x @ w["qkv.weight"].T + w["qkv.bias"]
    q, k, v = (qkv[..., i * E:(i + 1) * E].reshape(B, T, H, E // H).transpose(0, 2, 1, 3)
               for i in range(3))
    ctx = forward64(q, k, v, mask=mask, causal=causal)
    return ctx.transpose(0, 2, 1, 3).reshape(B, T, E) @ w["output.weight"].T + w["output.bias"]


@pytest.mark.parametrize("causal", [False, True])
def test_mha_backward_gives_the_gradients_of_mha_forward_by_name(causal):
    """attn.mha_backward returns dx and a dict of the four weights' gradients, keyed by
    their names with the prefix, equal to float64 central differences of
    sum(mha_forward(x) * dout), with a padding mask, with and without causal."""
    B, T, E, H = 2, 4, 6, 2
    x = rand(B, T, E, seed=1)
    w = {"layer0.qkv.weight": rand(3 * E, E, seed=2, scale=0.4),
         "layer0.qkv.bias": rand(3 * E, seed=3),
         "layer0.output.weight": rand(E, E, seed=4, scale=0.4),
         "layer0.output.bias": rand(E, seed=5)}
    mask = np.ones((B, 1, 1, T), bool)
    mask[1, ..., T - 1] = False
    dout = rand(B, T, E, seed=6)
    dx, grads = attn.mha_backward(x, w, H, dout, prefix="layer0.", mask=mask, causal=causal)
    assert sorted(grads) == sorted(w), sorted(grads)

    x64 = x.astype(np.float64)
    w64 = {n[len("layer0."):]: a.astype(np.float64) for n, a in w.items()}
    d64 = dout.astype(np.float64)

    def loss():
        return float((mha_forward64(x64, w64, H, mask, causal) * d64).sum())

    names = ["qkv.weight", "qkv.bias", "output.weight", "output.bias"]
    wants = central_differences(loss, [x64] + [w64[n] for n in names])
    for name, got, want in zip(["x"] + names, [dx] + [grads["layer0." + n] for n in names],
                               wants):
        assert got.shape == want.shape, (name, got.shape, want.shape)
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=name)


def test_mha_backward_refuses_what_it_cannot_differentiate_naming_it():
    """mha_backward on no known name set, and with a dout of the wrong shape, raises
    ValueError saying which. (Separate q_proj/k_proj/v_proj weights were refused
    here until attn_gqa_backward was wrapped: test_gqa_backward.py checks them.)"""
    x = rand(1, 3, 4)
    with pytest.raises(ValueError, match="no weight name set found"):
        attn.mha_backward(x, {"w": rand(4, 4)}, 2, x)
    w = {"qkv.weight": rand(12, 4), "qkv.bias": rand(12), "output.weight": rand(4, 4),
         "output.bias": rand(4)}
    with pytest.raises(ValueError, match=r"dout has shape \(1, 2, 4\); expected \(1, 3, 4\)"):
        attn.mha_backward(x, w, 2, x[:, :2])
