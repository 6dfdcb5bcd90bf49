"""attn.torch with bfloat16 and float16 tensors (SPEC section 10).

Without a gradient, 16-bit query, key and value go to attn's 16-bit kernels as
they are; with one, attn.torch falls back to its float32 path (attn's backward is
float32 only). Either way the output is within the accuracy rule of test_half.py
(twice PyTorch's own same-dtype error plus the floor, against a float64 oracle),
and comes back in the inputs' dtype.
"""
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed in this environment: attn.torch needs it "
    "(CI runs these tests on Debian's python3-torch)")

import attn.torch as attention  # noqa: E402
from test_half import FLOOR_EXP, oracle64, torch_error  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


class Spy:
    """attn's C module, recording the dtype of each sdpa call's q and its dtype=."""

    def __init__(self, real):
        self.real, self.seen = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def sdpa(self, q, k, v, **kw):
        self.seen.append((str(q.dtype), kw.get("dtype")))
        return self.real.sdpa(q, k, v, **kw)


def inputs(dtype, shape=(2, 3, 17, 16), seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(DTYPES[dtype]) for _ in range(3))


def rule(out, q, k, v, mask, dtype, what):
    """out within 2 x torch's error + floor of the float64 oracle."""
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    mask = np.broadcast_to(mask.numpy(), q64.shape[:-1] + (k64.shape[-2],))
    oracle = oracle64(q64, k64, v64, mask, 1 / np.sqrt(q64.shape[-1]))
    terr = torch_error(q64, k64, v64, np.array(mask), 1 / np.sqrt(q64.shape[-1]), dtype, oracle)
    err = float(np.max(np.abs(out.double().numpy() - oracle)))
    floor = np.ldexp(float(np.max(np.abs(oracle))), FLOOR_EXP[dtype])
    assert err <= 2 * terr + floor, "%s: error %.4g > 2 x torch's %.4g + floor %.4g" % (
        what, err, terr, floor)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_16_bit_tensors_without_a_gradient_run_attns_16_bit_kernels(dtype, monkeypatch):
    """bfloat16/float16 tensors under no_grad reach attn.sdpa as 16-bit arrays (uint16
    bits with dtype="bf16", or float16), and the output, in their dtype, meets the rule."""
    spy = Spy(attention._attn)
    monkeypatch.setattr(attention, "_attn", spy)
    q, k, v = inputs(dtype)
    mask = attention.make_causal_attention_mask(17)
    with torch.no_grad():
        out, weights = attention.scaled_dot_product_attention(q, k, v, attention_mask=mask)
    want = ("uint16", "bf16") if dtype == "bf16" else ("float16", "f16")
    assert spy.seen == [want], spy.seen
    assert (out.dtype, weights.dtype) == (DTYPES[dtype],) * 2, (out.dtype, weights.dtype)
    rule(out, q, k, v, mask, dtype, "causal " + dtype)
    # A padding mask and key/value read through a transposed (strided) view.
    ids = torch.tensor([[1, 2, 3] + [0] * 14, [4] * 17])
    pad = attention.make_padding_attention_mask(ids, 0)
    kt = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    with torch.no_grad():
        out, _ = attention.scaled_dot_product_attention(q, kt, v, attention_mask=pad)
    rule(out, q, k, v, pad, dtype, "padding " + dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_16_bit_tensors_with_a_gradient_fall_back_to_float32(dtype, monkeypatch):
    """When a gradient is wanted, 16-bit tensors take the float32 path (attn's backward
    is float32 only): attn.sdpa sees float32, the output and the gradients come back in
    the inputs' dtype, and the output meets the same rule."""
    spy = Spy(attention._attn)
    monkeypatch.setattr(attention, "_attn", spy)
    q, k, v = inputs(dtype, seed=1)
    qg = q.clone().requires_grad_(True)
    mask = attention.make_causal_attention_mask(17)
    out, _ = attention.scaled_dot_product_attention(qg, k, v, attention_mask=mask)
    out.float().sum().backward()
    assert spy.seen == [("float32", None)], spy.seen
    assert (out.dtype, qg.grad.dtype) == (DTYPES[dtype],) * 2, (out.dtype, qg.grad.dtype)
    rule(out.detach(), q, k, v, mask, dtype, "with a gradient, " + dtype)


def test_mixed_dtypes_take_the_float32_path():
    """query bfloat16 with key and value float16 is not a 16-bit call: all three are
    widened to float32, and the output comes back in the query's dtype."""
    q, _, _ = inputs("bf16", seed=2)
    _, k, v = inputs("f16", seed=3)
    with torch.no_grad():
        out, weights = attention.scaled_dot_product_attention(q, k, v)
        want, _ = attention.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert out.dtype == torch.bfloat16, out.dtype
    assert torch.equal(out, want.to(torch.bfloat16)), (out, want)
