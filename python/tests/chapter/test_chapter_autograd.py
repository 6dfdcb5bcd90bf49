"""attn.torch under the parts of autograd a trainer reaches for beyond loss.backward():
second derivatives (create_graph=True, as a gradient penalty needs), against the same
computations in plain PyTorch (plain_attention.py).

Tolerance: as in test_chapter_module.py (float32 on both sides, values of order 1,
different summation orders; a missing term is off by order 1e-1).
"""
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed in this environment: attn.torch needs it "
    "(CI runs these tests on Debian's python3-torch)")

import attn.torch as attention  # noqa: E402
import plain_attention as plain  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4


def close(got, want, what):
    """assert_close with both values printed on failure."""
    assert got is not None and want is not None, (what, got, want)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL,
                               msg=lambda m: "%s: %s\ngot  %s\nwant %s" % (what, m, got, want))


def causal_and_padding(B, T):
    ids = torch.ones(B, T, dtype=torch.long)
    ids[-1, T - 2:] = 0
    return (attention.make_padding_attention_mask(ids, 0)
            & attention.make_causal_attention_mask(T))


def sdpa_penalty_grads(module, q, k, v, mask, first_loss, on_weights):
    """The gradients of q, k, v for loss = out.sum() + |d first_loss / dq|^2: the
    penalty's gradient is a second derivative through attention."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, weights = module.scaled_dot_product_attention(*leaves, attention_mask=mask)
    first = out.sum() if first_loss == "sum" else out.pow(2).sum()
    if on_weights:
        first = first + weights.pow(2).sum()
    dq, = torch.autograd.grad(first, leaves[0], create_graph=True)
    (out.sum() + dq.pow(2).sum()).backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("on_weights", [False, True])
@pytest.mark.parametrize("first_loss", ["sum", "square"])
@pytest.mark.parametrize("masked", [False, True])
def test_a_gradient_penalty_through_sdpa_equals_plain_pytorchs(masked, first_loss, on_weights):
    """A second derivative through scaled_dot_product_attention (create_graph=True) equals
    plain PyTorch's: with the first loss out.sum() (its incoming gradient a constant,
    which once gave attention's term silently dropped from the penalty's gradient) and
    out.pow(2).sum(), with and without the weights in it, with and without a mask."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 2, 5, 3, generator=g) for _ in range(3))
    mask = causal_and_padding(2, 5) if masked else None
    got = sdpa_penalty_grads(attention, q, k, v, mask, first_loss, on_weights)
    want = sdpa_penalty_grads(plain, q, k, v, mask, first_loss, on_weights)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        close(a, b, name)


@pytest.mark.parametrize("masked", [False, True])
def test_a_gradient_penalty_through_the_module_equals_plain_pytorchs(masked):
    """A penalty on the gradient of x through MultiHeadSelfAttention (the fused path)
    gives the parameters and x plain PyTorch's gradients."""
    results = []
    for module in (attention, plain):
        torch.manual_seed(4)
        m = module.MultiHeadSelfAttention(8, 2)
        x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(5),
                        requires_grad=True)
        mask = causal_and_padding(2, 6) if masked else None
        out = m(x, attention_mask=mask)
        dx, = torch.autograd.grad(out.sum(), x, create_graph=True)
        (out.pow(2).mean() + dx.pow(2).sum()).backward()
        results.append([x.grad] + [p.grad for p in m.parameters()])
    for name, a, b in zip(("x", "qkv.weight", "qkv.bias", "output.weight", "output.bias"),
                          *results):
        close(a, b, "gradient of " + name)


def test_a_plain_backward_still_runs_attns_backward_not_pytorchs(monkeypatch):
    """Without create_graph the backward is attn's C code: the PyTorch form the second
    derivative uses is never called (it is made to fail here)."""
    def refuse(*args):
        raise AssertionError("the PyTorch form of the backward ran without create_graph")
    monkeypatch.setattr(attention, "_grads_in_torch", refuse)
    q = torch.randn(1, 2, 4, 3, requires_grad=True)
    out, weights = attention.scaled_dot_product_attention(q, q, q)
    (out.sum() + weights.pow(2).sum()).backward()
    m = attention.MultiHeadSelfAttention(8, 2)
    m(torch.randn(2, 3, 8)).sum().backward()
    assert q.grad is not None and m.qkv.weight.grad is not None
