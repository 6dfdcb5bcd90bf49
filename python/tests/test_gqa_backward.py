"""attn.mha_backward on grouped-query attention (separate q_proj/k_proj/v_proj/o_proj
weights, Hkv < H, chapter 21's block), with RoPE and SPEC section 6's options: the
gradients of x and of every weight and bias must be those of attn.mha_forward with
the same arguments. Checked two ways: against float64 central differences of the
block written here in numpy (no PyTorch needed), and against PyTorch's autograd
through the same block written in plain PyTorch from the same weights (float64),
on awkward shapes, with 1 and 2 library threads (which must give the same bits).

Tolerance: as in test_backward_options.py, 2e-5 absolute + 1e-4 relative: attn is
float32 on values of order 1, and a gradient that misses a group's sum, RoPE's
inverse rotation or an option's term is off by 1e-2 or more.
"""
import numpy as np
import pytest

import attn
from test_backward_options import central_differences, forward64

ATOL, RTOL = 2e-5, 1e-4
SEP = ("q_proj", "k_proj", "v_proj", "o_proj")


def rand(*shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def gqa_weights(E, H, Hkv, D, biases=True, seed=10):
    w = {"q_proj.weight": rand(H * D, E, seed=seed, scale=0.4),
         "k_proj.weight": rand(Hkv * D, E, seed=seed + 1, scale=0.4),
         "v_proj.weight": rand(Hkv * D, E, seed=seed + 2, scale=0.4),
         "o_proj.weight": rand(E, H * D, seed=seed + 3, scale=0.4)}
    if biases:
        for i, (n, rows) in enumerate(zip(SEP, (H * D, Hkv * D, Hkv * D, E))):
            w[n + ".bias"] = rand(rows, seed=seed + 4 + i, scale=0.3)
    return w


def rope64(x, pairing, base, offset):
    """RoPE on x [B, H, T, D] in float64: pair k of row t turned by
    (offset + t) * base^(-2k/D); "interleaved" pairs (2k, 2k+1), "half" (k, k+D/2)."""
    D, T = x.shape[-1], x.shape[-2]
    ang = (offset + np.arange(T))[:, None] * base ** (-np.arange(0, D, 2) / D)[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if pairing == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :D // 2], x[..., D // 2:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if pairing == "interleaved":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :D // 2], out[..., D // 2:] = ra, rb
    return out


def gqa_forward64(x, w, H, Hkv, rope=None, rope_base=10000.0, rope_offset=0, **options):
    """Chapter 21's block in float64 numpy: the projections, heads, RoPE on q and k,
    SPEC 6's attention (kv head h // (H / Hkv)), heads merged, o_proj."""
    B, T, E = x.shape
    D = w["q_proj.weight"].shape[0] // H

    def proj(n, heads):
        y = x @ w[n + ".weight"].T + w.get(n + ".bias", 0.0)
        return y.reshape(B, T, heads, D).transpose(0, 2, 1, 3)

    q, k, v = proj("q_proj", H), proj("k_proj", Hkv), proj("v_proj", Hkv)
    if rope is not None:
        q, k = rope64(q, rope, rope_base, rope_offset), rope64(k, rope, rope_base, rope_offset)
    ctx = forward64(q, k, v, **options)
    merged = ctx.transpose(0, 2, 1, 3).reshape(B, T, H * D)
    return merged @ w["o_proj.weight"].T + w.get("o_proj.bias", 0.0)


# (name, B, T, E, H, Hkv, D, biases, keywords of mha_forward/mha_backward)
CASES = [
    ("gqa", 2, 3, 8, 4, 2, 2, True, {}),
    ("mqa_causal", 1, 4, 6, 3, 1, 2, True, {"causal": True}),
    ("rope_interleaved", 2, 3, 8, 4, 2, 4, False, {"rope": "interleaved", "causal": True}),
    ("rope_half_offset_base", 1, 4, 6, 2, 1, 4, True,
     {"rope": "half", "rope_base": 100.0, "rope_offset": 5}),
    ("every_option", 2, 4, 6, 4, 2, 2, True,
     {"rope": "interleaved", "causal": True, "window": (2, -1), "softcap": 2.0,
      "alibi": [0.3, 0.2, 0.1, 0.05], "bias": "bias", "sinks": "sinks", "mask": "padding",
      "scale": 0.8}),
]


def _options(opts, B, H, T):
    """The case's keywords with its bias, sinks and mask made (attn's arrays, and
    float64 copies for the oracle)."""
    opts = dict(opts)
    if "alibi" in opts:
        opts["alibi"] = np.array(opts["alibi"], np.float32)
    if opts.get("bias") == "bias":
        opts["bias"] = rand(1, H, T, T, seed=40, scale=0.5)
    if opts.get("sinks") == "sinks":
        opts["sinks"] = rand(H, seed=41)
    if opts.get("mask") == "padding":
        m = np.ones((B, 1, 1, T), bool)
        m[-1, ..., T - 1] = False
        opts["mask"] = m
    return opts


@pytest.mark.parametrize("name,B,T,E,H,Hkv,D,biases,opts", CASES, ids=[c[0] for c in CASES])
def test_gqa_backward_gives_the_gradients_of_the_gqa_forward(name, B, T, E, H, Hkv, D, biases,
                                                               opts):
    """mha_backward on separate weights returns dx and every weight's and bias's
    gradient by name, equal to float64 central differences of sum(mha_forward(x) *
    dout) for grouped- and multi-query heads, RoPE in both pairings (with a base and
    an offset) and every option of SPEC section 6 together."""
    x = rand(B, T, E, seed=1)
    w = gqa_weights(E, H, Hkv, D, biases)
    opts = _options(opts, B, H, T)
    dout = rand(B, T, E, seed=6)
    dx, grads = attn.mha_backward(x, w, H, dout, num_kv_heads=Hkv, **opts)
    assert sorted(grads) == sorted(w), sorted(grads)

    x64 = x.astype(np.float64)
    w64 = {n: a.astype(np.float64) for n, a in w.items()}
    o64 = {n: (a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype == np.float32
               else a) for n, a in opts.items()}
    rope = {n: o64.pop(n) for n in ("rope", "rope_base", "rope_offset") if n in o64}
    d64 = dout.astype(np.float64)

    def loss():
        return float((gqa_forward64(x64, w64, H, Hkv, **rope, **o64) * d64).sum())

    names = sorted(w)
    wants = central_differences(loss, [x64] + [w64[n] for n in names])
    for n, got, want in zip(["x"] + names, [dx] + [grads[n] for n in names], wants):
        assert got.shape == want.shape, (n, got.shape, want.shape)
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=n)
    # The forward the gradients belong to is the same block.
    np.testing.assert_allclose(attn.mha_forward(x, w, H, num_kv_heads=Hkv, **opts),
                               gqa_forward64(x64, w64, H, Hkv, **rope, **o64),
                               atol=ATOL, rtol=RTOL)


def test_the_chapters_weights_with_rope_give_the_same_gradients_as_separate_ones():
    """The chapter's qkv.weight split into its row blocks is the separate block with
    Hkv = H: mha_backward with rope on the chapter's names gives the gradients of the
    separate names, stacked back into qkv's shapes, bit for bit."""
    B, T, E, H = 2, 5, 8, 2
    x, dout = rand(B, T, E, seed=1), rand(B, T, E, seed=2)
    fused = {"qkv.weight": rand(3 * E, E, seed=3, scale=0.4), "qkv.bias": rand(3 * E, seed=4),
             "output.weight": rand(E, E, seed=5, scale=0.4), "output.bias": rand(E, seed=6)}
    sep = {"q_proj.weight": fused["qkv.weight"][:E], "k_proj.weight": fused["qkv.weight"][E:2 * E],
           "v_proj.weight": fused["qkv.weight"][2 * E:], "o_proj.weight": fused["output.weight"],
           "q_proj.bias": fused["qkv.bias"][:E], "k_proj.bias": fused["qkv.bias"][E:2 * E],
           "v_proj.bias": fused["qkv.bias"][2 * E:], "o_proj.bias": fused["output.bias"]}
    kw = dict(causal=True, rope="half")
    dx_f, g_f = attn.mha_backward(x, fused, H, dout, **kw)
    dx_s, g_s = attn.mha_backward(x, sep, H, dout, **kw)
    np.testing.assert_array_equal(dx_f, dx_s)
    np.testing.assert_array_equal(
        g_f["qkv.weight"], np.concatenate([g_s["q_proj.weight"], g_s["k_proj.weight"],
                                           g_s["v_proj.weight"]]))
    np.testing.assert_array_equal(
        g_f["qkv.bias"], np.concatenate([g_s["q_proj.bias"], g_s["k_proj.bias"],
                                         g_s["v_proj.bias"]]))
    np.testing.assert_array_equal(g_f["output.weight"], g_s["o_proj.weight"])
    np.testing.assert_array_equal(attn.mha_forward(x, fused, H, **kw),
                                  attn.mha_forward(x, sep, H, **kw))


def test_gqa_backward_errors_name_the_argument():
    """A dout of the wrong shape, a head count that does not divide, an odd head size
    under RoPE and an unknown pairing are ValueErrors that say which."""
    x = rand(1, 3, 6)
    w = gqa_weights(6, 2, 1, 3)
    with pytest.raises(ValueError, match="dout"):
        attn.mha_backward(x, w, 2, x[:, :2])
    with pytest.raises(ValueError, match="num_kv_heads|multiple"):
        attn.mha_backward(x, gqa_weights(6, 3, 2, 2), 3, x, num_kv_heads=2)
    with pytest.raises(ValueError, match="D|even|odd"):
        attn.mha_backward(x, w, 2, x, rope="interleaved")
    with pytest.raises(ValueError, match="pairing"):
        attn.mha_backward(x, gqa_weights(6, 3, 1, 2), 3, x, rope="sideways")


# --- against PyTorch's autograd ---------------------------------------------------

def _torch_block(torch, x, w, H, Hkv, rope, rope_base, causal, mask):
    """Chapter 21's block in plain PyTorch (float64): nn.functional.linear, heads,
    RoPE, repeat_kv, the chapter's three attention steps, o_proj."""
    B, T, E = x.shape
    D = w["q_proj.weight"].shape[0] // H

    def proj(n, heads):
        y = torch.nn.functional.linear(x, w[n + ".weight"], w.get(n + ".bias"))
        return y.reshape(B, T, heads, D).transpose(1, 2)

    def turn(t):
        ang = torch.arange(T, dtype=torch.float64)[:, None] * rope_base ** (
            -torch.arange(0, D, 2, dtype=torch.float64) / D)[None, :]
        c, s = torch.cos(ang), torch.sin(ang)
        if rope == "interleaved":
            a, b = t[..., 0::2], t[..., 1::2]
            return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
        a, b = t[..., :D // 2], t[..., D // 2:]
        return torch.cat((a * c - b * s, a * s + b * c), dim=-1)

    q, k, v = proj("q_proj", H), proj("k_proj", Hkv), proj("v_proj", Hkv)
    if rope is not None:
        q, k = turn(q), turn(k)
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    scores = q @ k.transpose(-2, -1) / D ** 0.5
    visible = torch.ones(T, T, dtype=torch.bool)
    if causal:
        visible = visible.tril()
    if mask is not None:
        visible = visible & torch.from_numpy(mask)
    scores = scores.masked_fill(~visible, float("-inf"))
    ctx = torch.softmax(scores, dim=-1) @ v
    return torch.nn.functional.linear(ctx.transpose(1, 2).reshape(B, T, H * D),
                                      w["o_proj.weight"], w.get("o_proj.bias"))


# (B, T, E, H, Hkv, D, rope): T of 1, 3, 17 and 113; MHA, GQA and MQA heads.
TORCH_SHAPES = [(1, 1, 8, 2, 1, 4, "interleaved"), (2, 3, 12, 6, 2, 2, None),
                (2, 17, 16, 4, 2, 4, "half"), (1, 113, 16, 4, 1, 8, "interleaved"),
                (1, 17, 16, 4, 4, 4, None)]


@pytest.mark.parametrize("B,T,E,H,Hkv,D,rope", TORCH_SHAPES,
                         ids=["T%d_H%d_Hkv%d_%s" % (s[1], s[3], s[4], s[6]) for s in TORCH_SHAPES])
def test_gqa_backward_equals_pytorch_autograd_with_one_and_two_threads(B, T, E, H, Hkv, D, rope):
    """On awkward shapes, mha_forward and mha_backward on separate weights equal
    PyTorch's autograd through the same block in plain PyTorch (float64, from the
    same weights, a padding mask and causal), and 1 and 2 library threads give the
    same bits."""
    # dout of a mean over the B*T rows, so that the weights' gradients (sums over
    # the rows) stay of order 1 and the tolerance means the same at every T.
    x, dout = rand(B, T, E, seed=B * T), rand(B, T, E, seed=E, scale=1.0 / (B * T))
    w = gqa_weights(E, H, Hkv, D, biases=True, seed=T)
    mask = np.ones((B, 1, 1, T), bool)
    mask[-1, ..., T - 1] = T == 1  # the last key of the last sequence padded (T > 1)
    kw = dict(num_kv_heads=Hkv, causal=True, mask=mask, rope=rope)
    outs = [attn.mha_forward(x, w, H, threads=n, **kw) for n in (1, 2)]
    backs = [attn.mha_backward(x, w, H, dout, threads=n, **kw) for n in (1, 2)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(backs[0][0], backs[1][0])
    for n in w:
        np.testing.assert_array_equal(backs[0][1][n], backs[1][1][n], err_msg=n)

    # (The threads' bits above need no PyTorch; the comparison below does.)
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in w.items()}
    out = _torch_block(torch, xt, wt, H, Hkv, rope, 10000.0, True, mask)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(outs[0], out.detach().numpy(), atol=ATOL, rtol=RTOL)
    dx, grads = backs[0]
    np.testing.assert_allclose(dx, xt.grad.numpy(), atol=ATOL, rtol=RTOL, err_msg="x")
    for n in w:
        np.testing.assert_allclose(grads[n], wt[n].grad.numpy(), atol=ATOL, rtol=RTOL, err_msg=n)
