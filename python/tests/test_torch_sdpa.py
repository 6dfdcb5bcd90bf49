"""attn.torch.sdpa: torch.nn.functional.scaled_dot_product_attention's arguments plus
SPEC section 6's options, with autograd through attn's C backward, and (PyTorch >=
2.4) as custom operators that torch.compile(fullgraph=True) and torch.export put in
their graphs.

The reference is SPEC section 6 written here in plain PyTorch operations in float64
(ref_sdpa), differentiated by PyTorch's autograd: for each option the output and the
gradients of query, key, value, bias (or a float attn_mask) and sinks must match it.

Tolerance: 2e-5 absolute + 1e-4 relative, as in the other gradient tests: attn is
float32 on values of order 1 (the loss's weights dout are scaled by 1/sqrt(Tq) so that
a key's gradient, a sum over the queries, stays of order 1 at Tq = 113); a missing
option term or a gradient of the wrong head is off by 1e-2 or more. 16-bit inputs:
see test_16_bit_forward_runs_attns_16_bit_kernel_and_the_backward_in_float32.
"""
import math

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed in this environment: attn.torch needs it")

import attn  # noqa: E402
import attn.torch as at  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4
HAS_OPS = at._OPS  # PyTorch >= 2.4: torch.library.custom_op


def close(got, want, what, atol=ATOL, rtol=RTOL):
    assert got is not None and want is not None, (what, got, want)
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol,
                               msg=lambda m: "%s: %s" % (what, m))


def ref_sdpa(q, k, v, mask=None, causal=False, scale=None, window=None, softcap=None,
             slopes=None, bias=None, sinks=None):
    """SPEC section 6 in float64 PyTorch operations, step by step: scores, softcap,
    + bias, + ALiBi, hidden keys, softmax with the sink, weights v (GQA by repeating
    the key/value heads, as chapter 21's repeat_kv)."""
    H, Tq, D = q.shape[-3:]
    Hkv, Tk = k.shape[-3], k.shape[-2]
    k, v = k.repeat_interleave(H // Hkv, dim=-3), v.repeat_interleave(H // Hkv, dim=-3)
    s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(D) if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    i = torch.arange(Tq)[:, None]
    i_end, j = i + Tk - Tq, torch.arange(Tk)[None, :]
    if slopes is not None:
        s = s - slopes[:, None, None] * (i_end - j).abs()
    visible = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal in (True, "top_left"):
        visible &= j <= i
    elif causal == "bottom_right":
        visible &= j <= i_end
    if window is not None:
        if window[0] is not None and window[0] >= 0:
            visible &= j >= i_end - window[0]
        if window[1] is not None and window[1] >= 0:
            visible &= j <= i_end + window[1]
    if mask is not None:
        visible = visible & mask
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        s = torch.cat((s, sinks[:, None, None].expand(s.shape[:-1] + (1,))), dim=-1)
        return torch.softmax(s, dim=-1)[..., :Tk] @ v
    return torch.softmax(s, dim=-1) @ v


def alibi_paper_slopes(H):
    # The ALiBi paper's slopes for a power of two H: 2^(-8k/H), k = 1..H.
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=g)


# (name, (B, H, Hkv, Tq, Tk, D, Dv), options). "bias", "sinks", "mask", "float_mask"
# and "slopes" are made from the shapes; alibi=True is the paper's slopes.
CASES = [
    ("plain_T1", (1, 1, 1, 1, 1, 8, 8), {}),
    ("gqa_T17", (2, 4, 2, 17, 17, 8, 4), {"enable_gqa": True}),
    ("mqa_T113", (1, 4, 1, 113, 113, 8, 8), {"enable_gqa": True, "is_causal": True}),
    ("causal_top_left_cross", (2, 2, 2, 3, 7, 4, 4), {"is_causal": True}),
    ("causal_bottom_right_cross", (2, 2, 2, 3, 7, 4, 4), {"is_causal": "bottom_right"}),
    ("window", (1, 2, 2, 17, 17, 4, 4), {"window": (3, 1)}),
    ("window_left_only", (1, 2, 2, 6, 9, 4, 4), {"window": (2, None), "is_causal": "bottom_right"}),
    ("softcap", (1, 2, 2, 5, 5, 4, 4), {"softcap": 1.5, "scale": 2.0}),
    ("alibi_paper", (1, 4, 4, 5, 5, 4, 4), {"alibi": True}),
    ("alibi_slopes", (1, 2, 2, 5, 5, 4, 4), {"alibi": "slopes"}),
    ("scale", (1, 2, 2, 3, 5, 4, 4), {"scale": 0.3}),
    ("bias_full", (2, 2, 2, 3, 5, 4, 4), {"bias": (2, 2, 3, 5)}),
    ("bias_broadcast", (2, 2, 2, 3, 5, 4, 4), {"bias": (2, 1, 5)}),
    ("float_attn_mask", (2, 2, 2, 3, 5, 4, 4), {"attn_mask": "float"}),
    ("bool_attn_mask", (2, 2, 2, 4, 5, 4, 4), {"attn_mask": "bool"}),
    ("sinks", (1, 2, 2, 5, 5, 4, 4), {"sinks": True}),
    ("everything", (2, 4, 2, 3, 17, 8, 4),
     {"enable_gqa": True, "is_causal": "bottom_right", "window": (5, -1), "softcap": 2.0,
      "alibi": "slopes", "bias": (1, 4, 1, 17), "sinks": True, "attn_mask": "bool",
      "scale": 0.5}),
]


def make_case(shape, opts, seed=0):
    """(query, key, value, attn.torch.sdpa's keywords, ref_sdpa's keywords) float32."""
    B, H, Hkv, Tq, Tk, D, Dv = shape
    q, k, v = rand(B, H, Tq, D, seed=seed), rand(B, Hkv, Tk, D, seed=seed + 1), \
        rand(B, Hkv, Tk, Dv, seed=seed + 2)
    ours, ref = {}, {}
    for name, val in opts.items():
        if name == "enable_gqa":
            ours[name] = val
        elif name == "is_causal":
            ours[name], ref["causal"] = val, val
        elif name in ("window", "softcap", "scale"):
            ours[name] = ref[name] = val
        elif name == "alibi":
            ours["alibi"] = True if val is True else rand(H, seed=7).abs()
            ref["slopes"] = alibi_paper_slopes(H) if val is True else ours["alibi"]
        elif name == "bias":
            ours["bias"] = ref["bias"] = rand(*val, seed=8)
        elif name == "sinks":
            ours["sinks"] = ref["sinks"] = rand(H, seed=9)
        elif name == "attn_mask" and val == "float":
            ours["attn_mask"] = ref["bias"] = rand(B, 1, Tq, Tk, seed=10)
        elif name == "attn_mask":
            m = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
            m[-1, ..., Tk - 1] = False  # the last key of the last batch padded
            ours["attn_mask"] = ref["mask"] = m
    return q, k, v, ours, ref


def ours_and_reference(q, k, v, ours, ref, dout):
    """attn.torch.sdpa's output and gradients, and the float64 reference's, for the
    loss sum(out * dout), over query, key, value and the bias/sinks given."""
    # A bool attn_mask has no gradient; a float one, a bias and sinks do.
    grads_of = [n for n in ("bias", "attn_mask", "sinks")
                if n in ours and ours[n].is_floating_point()]
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    kw = dict(ours)
    extra = [kw[n].clone().requires_grad_(True) for n in grads_of]
    kw.update(zip(grads_of, extra))
    out = at.sdpa(*leaves, **kw)
    (out * dout).sum().backward()
    got = [out] + [t.grad for t in leaves + extra]

    leaves64 = [t.double().requires_grad_(True) for t in (q, k, v)]
    kw64 = {n: (t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
            for n, t in ref.items()}
    ref_of = {"bias": "bias", "attn_mask": "bias", "sinks": "sinks"}
    extra64 = [kw64[ref_of[n]].requires_grad_(True) for n in grads_of]
    out64 = ref_sdpa(*leaves64, **kw64)
    (out64 * dout.double()).sum().backward()
    want = [out64] + [t.grad for t in leaves64 + extra64]
    return got, want, ["out", "dq", "dk", "dv"] + ["d" + n for n in grads_of]


@pytest.mark.parametrize("name,shape,opts", CASES, ids=[c[0] for c in CASES])
def test_sdpa_output_and_gradients_equal_pytorch_autograd_for_each_option(name, shape, opts):
    """For each option of SPEC section 6 (and all together), on awkward shapes (1, 3,
    17, 113 positions, grouped- and multi-query heads, Dv != D), attn.torch.sdpa's
    output and the gradients of query, key, value, bias or a float attn_mask, and
    sinks equal PyTorch's autograd through the float64 reference."""
    q, k, v, ours, ref = make_case(shape, opts)
    dout = rand(*q.shape[:-1], shape[-1], seed=11, scale=1 / math.sqrt(shape[3]))
    got, want, names = ours_and_reference(q, k, v, ours, ref, dout)
    for g, w, n in zip(got, want, names):
        assert g.shape == w.shape, (n, g.shape, w.shape)
        close(g, w, "%s %s" % (name, n))


def test_sdpa_equals_pytorchs_own_sdpa_where_it_has_the_option():
    """Where torch.nn.functional.scaled_dot_product_attention exists (PyTorch 2.x) and
    has the option (a bool or float mask, is_causal, scale, enable_gqa), attn.torch.sdpa
    with the same arguments gives its output and gradients."""
    F = torch.nn.functional
    if not hasattr(F, "scaled_dot_product_attention"):
        pytest.skip("this PyTorch has no scaled_dot_product_attention")
    q, k, v = rand(2, 4, 5, 8, seed=1), rand(2, 2, 5, 8, seed=2), rand(2, 2, 5, 8, seed=3)
    fmask = rand(2, 1, 5, 5, seed=4)
    bmask = torch.ones(5, 5, dtype=torch.bool).tril()
    for kw in (dict(is_causal=True, scale=0.4), dict(attn_mask=fmask), dict(attn_mask=bmask)):
        results = []
        for fn in (at.sdpa, F.scaled_dot_product_attention):
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            extra = {n: (t.clone().requires_grad_(True) if t.is_floating_point() else t)
                     for n, t in kw.items() if isinstance(t, torch.Tensor)}
            out = fn(*leaves, enable_gqa=True, **dict(kw, **extra))
            out.pow(2).sum().backward()
            results.append([out] + [t.grad for t in leaves] +
                           [t.grad for t in extra.values() if t.requires_grad])
        for a, b in zip(*results):
            close(a, b, "against F.scaled_dot_product_attention %s" % sorted(kw))


def test_strided_and_lower_rank_inputs_give_the_contiguous_results():
    """Transposed views (a [B, T, H, D] layout seen as [B, H, T, D]), an expanded bool
    mask and 3-axis inputs give the same bits as contiguous 4-axis copies, with
    gradients in the views' shapes."""
    x = rand(2, 6, 4, 8, seed=3)  # [B, T, H, D]
    q, k, v = (x.transpose(1, 2) * s for s in (1.0, 0.5, 2.0))
    assert not q.is_contiguous()
    mask = torch.ones(1, 1, 1, 6, dtype=torch.bool).expand(2, 4, 6, 6).clone()
    mask[..., 5] = False
    mask_view = torch.ones(1, 1, 6, 6, dtype=torch.bool).expand(2, 4, 6, 6)
    mask_view = mask_view & mask  # same values, made from an expand
    a = [t.clone().requires_grad_(True) for t in (q, k, v)]
    b = [t.contiguous().clone().requires_grad_(True) for t in (q, k, v)]
    out_a = at.sdpa(*a, attn_mask=mask_view, is_causal=True)
    out_b = at.sdpa(*b, attn_mask=mask.contiguous(), is_causal=True)
    out_a.sum().backward()
    out_b.sum().backward()
    assert torch.equal(out_a, out_b)
    for ta, tb in zip(a, b):
        assert torch.equal(ta.grad, tb.grad)
    q3, k3, v3 = (t[0].detach().clone().requires_grad_(True) for t in (q, k, v))
    out3 = at.sdpa(q3, k3, v3, is_causal=True)
    assert out3.shape == (4, 6, 8)
    assert torch.equal(out3, at.sdpa(q[:1].detach(), k[:1].detach(), v[:1].detach(),
                                     is_causal=True)[0])
    out3.sum().backward()
    assert q3.grad.shape == q3.shape


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_forward_runs_attns_16_bit_kernel_and_the_backward_in_float32(dtype):
    """16-bit query, key and value: the forward is attn's 16-bit kernel (the bits of
    attn.sdpa on the same arrays), the output and gradients are in that dtype, and
    the gradients are the float32 backward's (of the widened inputs and the 16-bit
    output) rounded once: within two units of the dtype's precision at the
    gradient's largest magnitude (2^-8 bfloat16, 2^-11 float16) of the float64
    reference's on the same 16-bit values, one for the gradient's own rounding and
    one for the 16-bit output the backward reads (its rowsum(dO * O) term)."""
    dt = getattr(torch, dtype)
    q, k, v = (rand(1, 4, 17, 8, seed=s).to(dt) for s in (1, 2, 3))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = at.sdpa(*leaves[:1], leaves[1][:, :2], leaves[2][:, :2], is_causal=True,
                  enable_gqa=True)
    assert out.dtype == dt
    want_bits = attn.sdpa(*(at._np16(t) for t in (q, k[:, :2], v[:, :2])), causal=True,
                          dtype=at._HALF[dt])
    assert torch.equal(out.detach(), at._from_np16(want_bits, dt))
    dout = rand(1, 4, 17, 8, seed=4) / math.sqrt(17)
    (out.float() * dout).sum().backward()
    leaves64 = [t.double().requires_grad_(True) for t in (q, k[:, :2], v[:, :2])]
    ref = ref_sdpa(*leaves64, causal=True)
    (ref * dout.double()).sum().backward()
    unit = 2.0 ** (-8 if dtype == "bfloat16" else -11)
    for got, want, n in zip([leaves[0].grad, leaves[1].grad[:, :2], leaves[2].grad[:, :2]],
                            [t.grad for t in leaves64], ("dq", "dk", "dv")):
        assert got.dtype == dt, (n, got.dtype)
        bound = 2 * unit * float(want.abs().max()) + 1e-6
        err = float((got.double() - want).abs().max())
        assert err <= bound, "%s %s: error %g, bound %g" % (dtype, n, err, bound)
    # The unused half of key and value's heads get zero gradient.
    assert not leaves[1].grad[:, 2:].any() and not leaves[2].grad[:, 2:].any()


def test_sdpa_refuses_what_it_cannot_do_naming_it():
    """dropout, Hkv < H without enable_gqa, an unknown is_causal and a wrong sinks
    shape are errors that name them."""
    q = rand(1, 4, 3, 8)
    with pytest.raises(ValueError, match="dropout"):
        at.sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa"):
        at.sdpa(q, q[:, :2], q[:, :2])
    with pytest.raises(ValueError, match="is_causal"):
        at.sdpa(q, q, q, is_causal="sideways")
    with pytest.raises(ValueError, match="sinks"):
        at.sdpa(q, q, q, sinks=rand(3))
    with pytest.raises(ValueError, match="at least one key|masked"):
        at.sdpa(q, q, q, attn_mask=torch.zeros(3, 3, dtype=torch.bool))
    out = at.sdpa(q, q, q, attn_mask=torch.zeros(3, 3, dtype=torch.bool), empty_rows="zero")
    assert not out.any()


@pytest.mark.parametrize("window", [2, (1, 2, 3), (1.7, 0), (0, float("nan")), "ab"])
def test_a_window_that_is_not_a_pair_of_ints_is_a_type_error_naming_it(window):
    """Before: window=(1, 2, 3) ran with (1, 2), (1.7, 0) with (1, 0) (int()
    truncates), and window=2 raised "'int' object is not subscriptable"; the same
    in GroupedQueryAttention. numpy's attn.sdpa refuses all of them."""
    q = rand(1, 4, 3, 8)
    with pytest.raises(TypeError, match="window must be a pair"):
        at.sdpa(q, q, q, window=window)
    gqa = at.GroupedQueryAttention(16, 4, 2)
    with pytest.raises(TypeError, match="window must be a pair"):
        gqa(rand(1, 3, 16), window=window)
    assert torch.equal(at.sdpa(q, q, q, window=(1, None)), at.sdpa(q, q, q, window=(1, -1)))


def test_alibi_slopes_as_a_numpy_array_are_a_type_error_naming_alibi():
    """A numpy array of slopes raised numpy's 'The truth value of an array with
    more than one element is ambiguous' (from the test for None and False)."""
    import numpy as np
    q = rand(1, 2, 3, 8)
    with pytest.raises(TypeError, match="alibi must be None, True or a tensor"):
        at.sdpa(q, q, q, alibi=np.ones(2, np.float32))


def test_a_second_derivative_through_sdpa_with_options_equals_the_references():
    """A gradient penalty (create_graph=True) through sdpa with a bias, sinks, softcap
    and bottom-right causal gives the float64 reference's second derivatives."""
    q, k, v, ours, ref = make_case((1, 2, 2, 3, 5, 4, 4),
                                   {"bias": (2, 3, 5), "sinks": True, "softcap": 2.0,
                                    "is_causal": "bottom_right"})
    results = []
    for fn, kw, cast in ((at.sdpa, ours, lambda t: t), (ref_sdpa, ref, lambda t: t.double())):
        leaves = [cast(t).clone().requires_grad_(True) for t in (q, k, v)]
        kw = {n: (cast(t) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
        out = fn(*leaves, **kw)
        dq, = torch.autograd.grad(out.pow(2).sum(), leaves[0], create_graph=True)
        (out.sum() + dq.pow(2).sum()).backward()
        results.append([t.grad for t in leaves])
    for a, b, n in zip(*results, ("q", "k", "v")):
        close(a, b, "second derivative, d/d" + n)


def test_torch_func_grad_of_sdpa_with_options_equals_the_reference():
    """torch.func.grad (PyTorch 2.x) through sdpa with sinks and a window runs
    PyTorch operations and gives the reference's gradient."""
    func = pytest.importorskip("torch.func", reason="torch.func is PyTorch 2.x's")
    q, k, v, ours, ref = make_case((1, 2, 2, 5, 5, 4, 4), {"sinks": True, "window": (1, 1)})
    got = func.grad(lambda q: at.sdpa(q, k, v, **ours).pow(2).sum())(q)
    ref64 = {n: t.double() if isinstance(t, torch.Tensor) else t for n, t in ref.items()}
    want = func.grad(lambda q: ref_sdpa(q, k.double(), v.double(), **ref64).pow(2).sum())(
        q.double())
    close(got, want, "torch.func.grad")


def test_float64_inputs_are_computed_in_float32_and_returned_in_float64():
    """float64 query, key, value and bias give a float64 output and float64 gradients,
    equal to the float32 call's values."""
    q, k, v, ours, _ = make_case((1, 2, 2, 5, 5, 4, 4), {"bias": (2, 5, 5)})
    results = []
    for dt in (torch.float64, torch.float32):
        leaves = [t.to(dt).requires_grad_(True) for t in (q, k, v, ours["bias"])]
        out = at.sdpa(*leaves[:3], bias=leaves[3])
        out.pow(2).sum().backward()
        assert out.dtype == dt and all(t.grad.dtype == dt for t in leaves)
        results.append([out] + [t.grad for t in leaves])
    for a, b, n in zip(*results, ("out", "dq", "dk", "dv", "dbias")):
        assert torch.equal(a, b.double()), n


def test_a_jit_trace_of_sdpa_gives_the_references_results_on_a_new_input():
    """torch.jit.trace of attn.torch.sdpa with sinks and bottom-right causal records
    PyTorch operations, whose result on an input it was not traced with is the
    reference's (not the traced input's attention)."""
    import warnings
    q, k, v, ours, ref = make_case((1, 2, 2, 3, 5, 4, 4),
                                   {"sinks": True, "is_causal": "bottom_right"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(lambda q: at.sdpa(q, k, v, **ours), q)
    q_new = rand(*q.shape, seed=20)
    ref64 = {n: t.double() if isinstance(t, torch.Tensor) else t for n, t in ref.items()}
    close(traced(q_new), ref_sdpa(q_new.double(), k.double(), v.double(), **ref64),
          "traced sdpa on a new input")


# --- torch.compile and torch.export: attn's custom operators ----------------------

needs_ops = pytest.mark.skipif(not HAS_OPS, reason="attn's custom operators need "
                               "torch.library.custom_op (PyTorch >= 2.4)")


@needs_ops
def test_compiled_fullgraph_sdpa_runs_attns_kernels_with_eagers_results():
    """torch.compile(fullgraph=True) of a function calling attn.torch.sdpa with every
    option compiles without a graph break, gives eager's output and gradients (the
    same bits), and its forward and backward are attn's C kernels: kernel_calls()
    counts one of each per compiled call."""
    q, k, v, ours, _ = make_case((2, 4, 2, 5, 7, 8, 4),
                                 {"enable_gqa": True, "is_causal": "bottom_right",
                                  "window": (4, -1), "softcap": 3.0, "alibi": True,
                                  "bias": (1, 4, 1, 7), "sinks": True, "attn_mask": "bool"})
    bias, sinks = ours.pop("bias"), ours.pop("sinks")

    def f(q, k, v, bias, sinks):
        return at.sdpa(q, k, v, bias=bias, sinks=sinks, **ours)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    results = []
    for fn in (f, compiled):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, bias, sinks)]
        before = at.kernel_calls()
        out = fn(*leaves)
        out.pow(2).sum().backward()
        after = at.kernel_calls()
        assert after["forward"] == before["forward"] + 1, (before, after)
        assert after["backward"] == before["backward"] + 1, (before, after)
        results.append([out] + [t.grad for t in leaves])
    for a, b, n in zip(*results, ("out", "dq", "dk", "dv", "dbias", "dsinks")):
        assert torch.equal(a, b), n


@needs_ops
def test_compiled_fullgraph_chapter_module_runs_attns_operator():
    """torch.compile(fullgraph=True) of the chapter's MultiHeadSelfAttention (and of
    scaled_dot_product_attention, whose weights a loss reads) compiles without a graph
    break, its attention is attn's operator (kernel_calls() counts it), and its
    output and gradients equal eager's."""
    torch.manual_seed(3)
    m = at.MultiHeadSelfAttention(16, 4)
    x = torch.randn(2, 5, 16)
    mask = at.make_causal_attention_mask(5)
    torch._dynamo.reset()
    # AOTAutograd without Inductor's code generation (which the test above runs):
    # the graph, the operator in it and the gradients are the same, at a fraction
    # of the compile time.
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (m, compiled):
        m.zero_grad()
        xg = x.clone().requires_grad_(True)
        before = at.kernel_calls()
        out = fn(xg, attention_mask=mask)
        out.pow(2).sum().backward()
        if fn is compiled:
            assert at.kernel_calls()["forward"] > before["forward"]
            assert at.kernel_calls()["backward"] > before["backward"]
        results.append([out, xg.grad, m.qkv.weight.grad.clone()])
    for a, b, n in zip(*results, ("out", "dx", "dqkv.weight")):
        close(a, b, "compiled module " + n)

    def f(q):
        out, weights = at.scaled_dot_product_attention(q, q, q, mask)
        return out.sum() + weights.pow(2).sum()

    grads = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        q = rand(2, 2, 5, 4, seed=1).requires_grad_(True)
        fn(q).backward()
        grads.append(q.grad)
    close(grads[1], grads[0], "compiled scaled_dot_product_attention, loss on the weights")


@needs_ops
def test_torch_export_records_attns_operator_and_runs_it():
    """torch.export of a module calling attn.torch.sdpa records attn::sdpa_forward in
    its graph (not PyTorch's attention), and the exported program runs attn's kernel
    on a new input with the eager result."""
    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return at.sdpa(q, k, v, is_causal=True, enable_gqa=True, softcap=5.0)

    q, k, v = rand(1, 4, 6, 8, seed=1), rand(1, 2, 6, 8, seed=2), rand(1, 2, 6, 8, seed=3)
    program = torch.export.export(Block(), (q, k, v))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert any("attn.sdpa_forward" in t for t in targets), targets
    assert not any("softmax" in t for t in targets), targets
    q2 = rand(1, 4, 6, 8, seed=4)
    before = at.kernel_calls()["forward"]
    got = program.module()(q2, k, v)
    assert at.kernel_calls()["forward"] == before + 1
    assert torch.equal(got, Block()(q2, k, v))


# --- GroupedQueryAttention --------------------------------------------------------

@pytest.mark.parametrize("rope,bias,Hkv", [("interleaved", False, 2), ("half", True, 1),
                                           (None, True, 4)])
def test_grouped_query_attention_module_equals_the_block_in_plain_pytorch(rope, bias, Hkv):
    """attn.torch.GroupedQueryAttention (fused forward and attn_gqa_backward) gives the
    output and the gradients of x and of every parameter that PyTorch's autograd gives
    through chapter 21's block written in plain PyTorch (float64) from the same
    parameters, with a padding mask and causal; its state_dict is attn.mha_forward's
    separate name set (the same output from numpy)."""
    from test_gqa_backward import _torch_block
    import numpy as np
    torch.manual_seed(5)
    B, T, E, H = 2, 17, 16, 4
    m = at.GroupedQueryAttention(E, H, Hkv, bias=bias, rope=rope)
    x = rand(B, T, E, seed=6).requires_grad_(True)
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[-1, ..., T - 1] = False
    out = m(x, attention_mask=mask, is_causal=True)
    dout = rand(B, T, E, seed=7) / (B * T)
    (out * dout).sum().backward()

    w64 = {n: p.detach().double().requires_grad_(True) for n, p in m.named_parameters()}
    x64 = x.detach().double().requires_grad_(True)
    want = _torch_block(torch, x64, w64, H, Hkv, rope, 10000.0, True, mask.numpy())
    (want * dout.double()).sum().backward()
    close(out, want, "output")
    close(x.grad, x64.grad, "dx")
    for n, p in m.named_parameters():
        close(p.grad, w64[n].grad, "d" + n)
    numpy_out = attn.mha_forward(x.detach().numpy(), {n: p.detach().numpy() for n, p in
                                                     m.state_dict().items()},
                                 H, num_kv_heads=Hkv, mask=mask.numpy(), causal=True, rope=rope)
    np.testing.assert_array_equal(out.detach().numpy(), numpy_out)


@needs_ops
def test_compiled_fullgraph_grouped_query_attention_equals_eager():
    """torch.compile(fullgraph=True) of GroupedQueryAttention (projections and RoPE in
    PyTorch, attention as attn's operator) gives eager's output and gradients, and
    its attention is attn's kernel (kernel_calls() counts it)."""
    torch.manual_seed(6)
    m = at.GroupedQueryAttention(16, 4, 2, rope="half")
    x = rand(2, 5, 16, seed=8)
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")  # as above
    results = []
    for fn in (m, compiled):
        m.zero_grad()
        xg = x.clone().requires_grad_(True)
        before = at.kernel_calls()
        out = fn(xg, is_causal=True)
        out.pow(2).sum().backward()
        if fn is compiled:
            after = at.kernel_calls()
            assert after["forward"] > before["forward"] and after["backward"] > before["backward"]
        results.append([out, xg.grad, m.q_proj.weight.grad.clone(), m.k_proj.weight.grad.clone()])
    for a, b, n in zip(*results, ("out", "dx", "dq_proj", "dk_proj")):
        close(a, b, "compiled GroupedQueryAttention " + n)


@needs_ops
def test_pytorchs_opcheck_passes_on_both_operators():
    """torch.library.opcheck (schema, autograd registration, the fake functions against
    the real ones, AOT dispatch with dynamic shapes) passes for attn::sdpa_forward,
    with and without the weights and options, and for attn::sdpa_backward."""
    q, k, v = rand(1, 2, 3, 4, seed=1), rand(1, 1, 5, 4, seed=2), rand(1, 1, 5, 4, seed=3)
    bias, sinks = rand(2, 3, 5, seed=4), rand(2, seed=5)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    fwd, bwd = torch.ops.attn.sdpa_forward.default, torch.ops.attn.sdpa_backward.default
    grad = [t.clone().requires_grad_(True) for t in (q, k, v, bias, sinks)]
    torch.library.opcheck(fwd, (q, k, v, None, None, mask, None, 1, None, -1, -1, None,
                                "error", True))
    torch.library.opcheck(fwd, (*grad, None, rand(2, seed=6).abs(), 2, 0.5, 3, -1, 2.0,
                                "error", False))
    out, lse, _ = fwd(q, k, v, bias, sinks, None, None, 2, None, -1, -1, None, "error", False)
    torch.library.opcheck(bwd, (q, k, v, out, lse, rand(1, 2, 3, 4, seed=7), bias, sinks,
                                None, None, 2, None, -1, -1, None, "error"))
