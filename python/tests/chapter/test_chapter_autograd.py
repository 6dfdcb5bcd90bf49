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


class TinyModel(torch.nn.Module):
    """A trainer's toy: token embedding -> the chapter's module -> a linear readout."""

    def __init__(self, module, vocab=8, E=16, H=2, T=6):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, E)
        self.pos = torch.nn.Parameter(0.1 * torch.randn(T, E))
        self.attention = module.MultiHeadSelfAttention(E, H)
        self.readout = torch.nn.Linear(E, vocab)

    def forward(self, ids, mask=None):
        return self.readout(self.attention(self.embed(ids) + self.pos, attention_mask=mask))


def train_adamw(module, steps, masked):
    """steps of AdamW on reversing 6 tokens (copying them under the causal mask, which
    hides the tokens a reversal needs); the losses and the trained model."""
    torch.manual_seed(1)
    model = TinyModel(module)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    mask = attention.make_causal_attention_mask(6) if masked else None
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 8, (16, 6), generator=g)
        logits = model(ids, mask)
        target = ids if masked else ids.flip(1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 8), target.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("masked", [False, True])
def test_adamw_training_tracks_the_same_model_on_plain_pytorch_step_for_step(masked):
    """60 AdamW steps through attn.torch give plain PyTorch's loss at every step (within
    1e-5) and its parameters at the end (within 1e-5), from the same initial parameters
    and the same batches. The keys' bias (qkv.bias rows E..2E) is left out: its gradient
    is zero in exact arithmetic (adding a constant to every key of a row leaves the
    softmax as it is), so both sides give float32 noise of order 1e-10 there, which AdamW
    divides by its own square root into steps of the learning rate's size."""
    ours, our_model = train_adamw(attention, 60, masked)
    theirs, their_model = train_adamw(plain, 60, masked)
    worst = max(abs(a - b) for a, b in zip(ours, theirs))
    assert worst < 1e-5, "losses differ by %.3g\nattn  %s\nplain %s" % (worst, ours, theirs)
    # It learns (the point here is the lockstep; the reversal takes longer than 60
    # steps to finish): the last ten steps' mean loss is below 0.8 of the first.
    assert sum(ours[-10:]) / 10 < 0.8 * ours[0], "the loss did not fall: %s" % ours
    E = 16
    for (name, p), q in zip(our_model.named_parameters(), their_model.parameters()):
        if name == "attention.qkv.bias":
            p, q = torch.cat([p[:E], p[2 * E:]]), torch.cat([q[:E], q[2 * E:]])
        torch.testing.assert_close(p, q, atol=1e-5, rtol=0, msg=lambda m: "%s: %s" % (name, m))


def test_the_module_copies_pickles_and_moves_between_dtypes_like_a_module():
    """copy.deepcopy, pickle and torch.save/load give a module with the same output;
    its state_dict loads into the plain module and back with the same output; .double()
    gives float64 outputs and float64 gradients; no_grad and inference_mode give outputs
    that need no gradient; .train()/.eval() change nothing (the module has no dropout)."""
    import copy
    import io
    import pickle

    torch.manual_seed(6)
    m = attention.MultiHeadSelfAttention(8, 2)
    x = torch.randn(2, 5, 8)
    want = m(x)
    for how, other in (("deepcopy", copy.deepcopy(m)), ("pickle", pickle.loads(pickle.dumps(m)))):
        torch.testing.assert_close(other(x), want, atol=0, rtol=0, msg=lambda s: how + ": " + s)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    p = plain.MultiHeadSelfAttention(8, 2)
    p.load_state_dict(torch.load(buf))
    close(p(x), want, "the plain module with attn's state_dict")
    back = attention.MultiHeadSelfAttention(8, 2)
    back.load_state_dict(p.state_dict())
    torch.testing.assert_close(back(x), want, atol=0, rtol=0)

    d = copy.deepcopy(m).double()
    xd = x.double().requires_grad_(True)
    out = d(xd)
    out.sum().backward()
    assert out.dtype == torch.float64 and xd.grad.dtype == torch.float64 \
        and d.qkv.weight.grad.dtype == torch.float64, (out.dtype, xd.grad.dtype,
                                                      d.qkv.weight.grad.dtype)
    close(out.float(), want, "float64 module")
    with torch.no_grad():
        assert not m(x).requires_grad
    with torch.inference_mode():
        assert not m(x).requires_grad
    torch.testing.assert_close(m.eval()(x), m.train()(x), atol=0, rtol=0)


def test_torch_func_grad_vmap_and_functional_call_give_plain_pytorchs_results():
    """Under torch.func (PyTorch 2.x) attention runs in PyTorch operations on the wrapped
    tensors: grad and vmap of scaled_dot_product_attention, and grad through the module
    by functional_call, equal plain PyTorch's. Before, grad raised PyTorch's
    'must override the setup_context staticmethod' and vmap 'Cannot access data
    pointer of Tensor that doesn't have storage'."""
    func = pytest.importorskip("torch.func", reason="torch.func is PyTorch 2.x's")
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=g) for _ in range(3))
    mask = causal_and_padding(3, 5)

    def loss(module):
        return lambda q: module.scaled_dot_product_attention(
            q, k, v, attention_mask=mask)[0].pow(2).sum()
    close(func.grad(loss(attention))(q), func.grad(loss(plain))(q), "grad of sdpa")

    def one(module):
        return lambda q, k, v: module.scaled_dot_product_attention(q, k, v)[0]
    close(func.vmap(one(attention))(q, k, v), func.vmap(one(plain))(q, k, v), "vmap of sdpa")

    x = torch.randn(2, 5, 8, generator=g)
    grads = []
    for module in (attention, plain):
        torch.manual_seed(8)
        m = module.MultiHeadSelfAttention(8, 2)
        params = dict(m.named_parameters())
        grads.append(func.grad(lambda p: func.functional_call(m, p, (x,)).pow(2).sum())(params))
    for name in grads[1]:
        close(grads[0][name], grads[1][name], "torch.func.grad of " + name)


def test_torch_compile_gives_the_same_output_and_gradients():
    """torch.compile (PyTorch 2.x) of the module and of the function runs (with a graph
    break at attn's call) and gives plain PyTorch's outputs and gradients."""
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is PyTorch 2.x's")
    import warnings
    torch.manual_seed(3)
    ours = attention.MultiHeadSelfAttention(16, 4)
    theirs = plain.MultiHeadSelfAttention(16, 4)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 16)
    mask = causal_and_padding(2, 5)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's note that it cannot trace the extension
        for module in (torch.compile(ours), theirs):
            xg = x.clone().requires_grad_(True)
            out = module(xg, attention_mask=mask)
            out.pow(2).sum().backward()
            results.append([out, xg.grad, module.qkv.weight.grad])
        f = torch.compile(lambda q: attention.scaled_dot_product_attention(q, q, q, mask))
        for fn in (f, lambda q: plain.scaled_dot_product_attention(q, q, q, mask)):
            q = torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(1),
                            requires_grad=True)
            out, weights = fn(q)
            (out.sum() + weights.pow(2).sum()).backward()
            results[0 if fn is f else 1].append(q.grad)
    for name, a, b in zip(("output", "dx", "qkv.weight.grad", "dq of sdpa"), *results):
        close(a, b, name)


def test_under_cpu_autocast_attention_stays_float32_and_trains():
    """Under torch.autocast("cpu", bfloat16) attn.torch ignores autocast: the module and
    the function compute in float32 and return float32 (the chapter's module would
    return bfloat16 from its autocast linears), equal to the float32 results outside
    autocast, and the gradients reach x and the parameters in float32."""
    torch.manual_seed(2)
    m = attention.MultiHeadSelfAttention(8, 2)
    x = torch.randn(2, 5, 8)
    want = m(x)
    q = torch.randn(1, 2, 5, 4)
    want_sdpa, _ = attention.scaled_dot_product_attention(q, q, q)
    xg = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(xg)
        got_sdpa, _ = attention.scaled_dot_product_attention(q, q, q)
    assert out.dtype == torch.float32 and got_sdpa.dtype == torch.float32, \
        (out.dtype, got_sdpa.dtype)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    torch.testing.assert_close(got_sdpa, want_sdpa, atol=0, rtol=0)
    out.pow(2).sum().backward()
    assert xg.grad.dtype == torch.float32 and m.qkv.weight.grad.dtype == torch.float32


def test_a_jit_trace_records_attention_and_gives_plain_pytorchs_results_on_new_inputs():
    """torch.jit.trace of scaled_dot_product_attention and of the module records
    attention as PyTorch operations: the trace (also after torch.jit.save and load)
    gives plain PyTorch's results on inputs it was not traced with. Before, the
    function's output was recorded as a constant: the trace returned the traced
    input's attention for every input."""
    import io
    import warnings
    torch.manual_seed(12)
    ours = attention.MultiHeadSelfAttention(8, 2)
    theirs = plain.MultiHeadSelfAttention(8, 2)
    theirs.load_state_dict(ours.state_dict())
    g = torch.Generator().manual_seed(13)
    x, x_new = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    q, q_new = torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    mask = causal_and_padding(1, 5)

    def sdpa(module):
        return lambda q: module.scaled_dot_product_attention(q, q, q, attention_mask=mask)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch 2.x calls trace deprecated
        traced_fn = torch.jit.trace(sdpa(attention), q)
        traced_module = torch.jit.trace(ours, x)
        buf = io.BytesIO()
        torch.jit.save(traced_module, buf)
        buf.seek(0)
        loaded = torch.jit.load(buf)
    close(traced_fn(q_new), sdpa(plain)(q_new), "traced sdpa on a new input")
    with torch.no_grad():
        want = theirs(x_new)
        close(traced_module(x_new), want, "traced module on a new input")
        close(loaded(x_new), want, "traced module saved and loaded, on a new input")


def test_torch_export_records_attention_and_gives_plain_pytorchs_results_on_new_inputs():
    """torch.export (PyTorch 2.x) of the module, with and without dynamo (strict), gives
    a program whose results on a new input are plain PyTorch's: attention is exported
    as PyTorch operations. Before, export failed ('Attempted to call function marked
    as skipped' with dynamo, '.numpy() is not supported for tensor subclasses'
    without)."""
    export = getattr(torch, "export", None)
    if export is None or not hasattr(export, "export"):
        pytest.skip("torch.export is PyTorch 2.x's")
    import warnings
    torch.manual_seed(14)
    ours = attention.MultiHeadSelfAttention(8, 2)
    theirs = plain.MultiHeadSelfAttention(8, 2)
    theirs.load_state_dict(ours.state_dict())
    g = torch.Generator().manual_seed(15)
    x, x_new = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    for strict in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = export.export(ours, (x,), strict=strict)
        with torch.no_grad():
            close(program.module()(x_new), theirs(x_new), "exported (strict=%s)" % strict)


@pytest.mark.parametrize("wanted", ["q", "k", "v", "kv"])
def test_gradients_only_for_the_inputs_that_require_them_equal_plain_pytorchs(wanted):
    """With only some of query, key and value requiring a gradient, those get plain
    PyTorch's gradient and the others none (grad stays None)."""
    g = torch.Generator().manual_seed(16)
    q, k, v = (torch.randn(2, 3, 17, 4, generator=g) for _ in range(3))
    mask = causal_and_padding(2, 17)
    results = []
    for module in (attention, plain):
        leaves = [t.clone().requires_grad_(n in wanted) for t, n in zip((q, k, v), "qkv")]
        out, weights = module.scaled_dot_product_attention(*leaves, attention_mask=mask)
        (out.pow(2).sum() + weights.pow(2).sum()).backward()
        results.append([t.grad for t in leaves])
    for n, a, b in zip("qkv", *results):
        if n in wanted:
            close(a, b, "d" + n)
        else:
            assert a is None and b is None, (n, a, b)


def test_strided_leaves_retain_graph_and_nan_in_the_incoming_gradient_as_plain_pytorch():
    """Query a transposed view, key an expanded (stride 0) batch, value a slice: their
    bases get plain PyTorch's gradients; backward twice with retain_graph=True doubles
    them; a NaN in the output's gradient reaches the same entries of dq, dk, dv (SPEC
    section 8: a NaN stays in the rows it reaches) as in plain PyTorch."""
    g = torch.Generator().manual_seed(17)
    qb, kb, vb = (torch.randn(2, 3, 3, 4, generator=g), torch.randn(1, 3, 3, 4, generator=g),
                  torch.randn(2, 3, 3, 8, generator=g))
    dout = torch.randn(2, 3, 3, 4, generator=g)
    nan_dout = dout.clone()
    nan_dout[1, 2, 0, 3] = float("nan")
    results = []
    for module in (attention, plain):
        bases = [t.clone().requires_grad_(True) for t in (qb, kb, vb)]
        q, k, v = bases[0].transpose(1, 2), bases[1].expand(2, 3, 3, 4), bases[2][..., ::2]
        out, _ = module.scaled_dot_product_attention(q, k, v)
        out.backward(dout, retain_graph=True)
        once = [b.grad.clone() for b in bases]
        out.backward(dout, retain_graph=True)
        twice = [b.grad.clone() for b in bases]
        for b in bases:
            b.grad = None
        out.backward(nan_dout)
        results.append(once + twice + [b.grad.isnan() for b in bases])
    names = ["dq", "dk", "dv", "dq twice", "dk twice", "dv twice"]
    for name, a, b in zip(names, results[0][:6], results[1][:6]):
        close(a, b, name)
    for name, a, b in zip(names[:3], results[0][:3], results[0][3:6]):
        close(b, 2 * a, name + ": twice is double")
    for name, a, b in zip(names[:3], results[0][6:], results[1][6:]):
        assert torch.equal(a, b), "NaN in %s: attn %s, plain %s" % (name, a.nonzero().tolist(),
                                                                    b.nonzero().tolist())
        assert a.any(), "no NaN reached %s" % name
