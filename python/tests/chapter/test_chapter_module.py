"""The chapter's module, with only its import changed to attn.torch.

The first group is the chapter's own behaviour, written again here (not copied)
against the names the chapter's tests use: shapes, the three masks, the errors.
The second group compares attn.torch with plain_attention.py (the same module in
plain PyTorch) on the forward, the weights and every gradient, over awkward
shapes and every mask.

Tolerance: both sides compute in float32 on values of order 1, in different
summation orders (attn's fused kernels against PyTorch's matmul and softmax); the
differences seen are a few 1e-7. atol 2e-5 + rtol 1e-4 leaves room for longer
sums (T = 113) without letting a wrong mask or a wrong gradient through: those
are off by order 1e-2 or more.
"""
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed in this environment: attn.torch needs it "
    "(CI runs these tests on Debian's python3-torch)")

import attn.torch as attention  # noqa: E402  (the chapter: from ... import attention)
import plain_attention as plain  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4


def close(got, want, what):
    """assert_close with both values printed on failure."""
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL,
                               msg=lambda m: "%s: %s\ngot  %s\nwant %s" % (what, m, got, want))


# ---------------------------------------------------------------------------
# The chapter's behaviour
# ---------------------------------------------------------------------------

def test_module_keeps_the_input_shape_and_weight_rows_sum_to_one():
    """[2, 5, 16] in gives [2, 5, 16] out and weights [2, 4, 5, 5] whose rows sum to 1."""
    torch.manual_seed(0)
    module = attention.MultiHeadSelfAttention(embed_dim=16, num_heads=4)
    x = torch.randn(2, 5, 16)
    out, weights = module(x, return_attention=True)
    assert out.shape == x.shape, (out.shape, x.shape)
    assert weights.shape == (2, 4, 5, 5), weights.shape
    close(weights.sum(dim=-1), torch.ones(2, 4, 5), "row sums")


def test_module_has_the_chapters_parameter_names_and_shapes():
    """Parameters are qkv.weight [3E, E], qkv.bias [3E], output.weight [E, E], output.bias [E]."""
    module = attention.MultiHeadSelfAttention(embed_dim=8, num_heads=2)
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    assert shapes == {"qkv.weight": (24, 8), "qkv.bias": (24,), "output.weight": (8, 8),
                      "output.bias": (8,)}, shapes
    assert (module.embed_dim, module.num_heads, module.head_dim) == (8, 2, 4)


def test_padded_keys_get_exactly_zero_weight():
    """With a padding mask, every query gives the two pad keys weight 0."""
    torch.manual_seed(42)
    module = attention.MultiHeadSelfAttention(embed_dim=8, num_heads=2)
    mask = attention.make_padding_attention_mask(torch.tensor([[5, 6, 0, 0]]), pad_id=0)
    assert mask.shape == (1, 1, 1, 4) and mask.dtype == torch.bool, (mask.shape, mask.dtype)
    _, weights = module(torch.randn(1, 4, 8), attention_mask=mask, return_attention=True)
    assert torch.all(weights[..., 2:] == 0), weights
    assert torch.all(weights[..., :2] > 0), weights


def test_causal_mask_hides_every_future_key():
    """Under the causal mask the weight of a key after the query is exactly 0."""
    torch.manual_seed(42)
    module = attention.MultiHeadSelfAttention(embed_dim=8, num_heads=2)
    mask = attention.make_causal_attention_mask(4)
    assert mask.shape == (1, 1, 4, 4), mask.shape
    assert mask[0, 0].tolist() == [[True, False, False, False], [True, True, False, False],
                                   [True, True, True, False], [True, True, True, True]]
    _, weights = module(torch.randn(1, 4, 8), attention_mask=mask, return_attention=True)
    future = torch.ones(4, 4, dtype=torch.bool).triu(diagonal=1)
    assert torch.all(weights[..., future] == 0), weights
    assert torch.all(weights[..., ~future] > 0), weights


def test_padding_and_causal_combine_by_broadcasting():
    """padding [2,1,1,4] & causal [1,1,4,4] is [2,1,4,4]; each sample's pads get weight 0."""
    torch.manual_seed(42)
    module = attention.MultiHeadSelfAttention(embed_dim=8, num_heads=2)
    ids = torch.tensor([[3, 1, 4, 0], [1, 5, 0, 0]])
    mask = (attention.make_padding_attention_mask(ids, pad_id=0)
            & attention.make_causal_attention_mask(4))
    assert mask.shape == (2, 1, 4, 4), mask.shape
    _, weights = module(torch.randn(2, 4, 8), attention_mask=mask, return_attention=True)
    assert weights.shape == (2, 2, 4, 4), weights.shape
    assert torch.all(weights[0, :, :, 3] == 0) and torch.all(weights[1, :, :, 2:] == 0), weights


def test_a_query_that_sees_no_key_is_refused():
    """A mask row with every key hidden raises ValueError saying 'at least one key'."""
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4)
    mask = torch.tensor([[[[True, False], [False, False]]]])
    with pytest.raises(ValueError, match="at least one key"):
        attention.scaled_dot_product_attention(q, k, v, attention_mask=mask)
    module = attention.MultiHeadSelfAttention(embed_dim=4, num_heads=1)
    with pytest.raises(ValueError, match="at least one key"):
        module(torch.randn(1, 2, 4), attention_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_a_mask_that_is_not_boolean_is_refused(dtype):
    """A float, int or uint8 mask raises ValueError saying it must be 'boolean'."""
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="boolean"):
        attention.scaled_dot_product_attention(q, q, q,
                                               attention_mask=torch.ones(1, 1, 2, 2, dtype=dtype))


def test_a_mask_that_does_not_broadcast_is_refused_naming_both_shapes():
    """A [5, 5] mask on [2, 1, 3, 3] scores: ValueError 'cannot broadcast' with both shapes."""
    q = torch.randn(2, 1, 3, 4)
    with pytest.raises(ValueError, match="cannot broadcast") as info:
        attention.scaled_dot_product_attention(q, q, q,
                                               attention_mask=torch.ones(5, 5, dtype=torch.bool))
    assert "(5, 5)" in str(info.value) and "(2, 1, 3, 3)" in str(info.value), str(info.value)
    module = attention.MultiHeadSelfAttention(embed_dim=4, num_heads=2)
    with pytest.raises(ValueError, match="cannot broadcast"):
        module(torch.randn(2, 3, 4), attention_mask=torch.ones(3, 1, 3, 3, dtype=torch.bool))


def test_the_chapters_other_errors():
    """head_dim mismatch, key/value length mismatch and E % H != 0 are ValueErrors."""
    with pytest.raises(ValueError, match="same head_dim"):
        attention.scaled_dot_product_attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 3),
                                               torch.randn(1, 1, 2, 3))
    with pytest.raises(ValueError, match="same sequence length"):
        attention.scaled_dot_product_attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4),
                                               torch.randn(1, 1, 2, 4))
    with pytest.raises(ValueError, match="divisible"):
        attention.MultiHeadSelfAttention(embed_dim=10, num_heads=4)


def test_where_pytorch_raises_runtime_error_both_excepts_catch_it():
    """x with the wrong embed_dim: an error that is a ValueError and a RuntimeError."""
    module = attention.MultiHeadSelfAttention(embed_dim=8, num_heads=2)
    with pytest.raises(RuntimeError, match="embed_dim"):
        module(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match="embed_dim"):
        module(torch.randn(1, 3, 6))


def test_tensors_attn_cannot_run_are_refused_clearly():
    """Integer tensors are a TypeError, a tensor on another device a ValueError naming it."""
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(TypeError, match="floating-point"):
        attention.scaled_dot_product_attention(q.long(), q, q)
    with pytest.raises(TypeError, match="torch.Tensor"):
        attention.scaled_dot_product_attention(q.tolist(), q, q)
    meta = torch.empty(1, 1, 2, 4, device="meta")  # a device that is not the CPU
    with pytest.raises(ValueError, match="meta"):
        attention.scaled_dot_product_attention(meta, q, q)


# ---------------------------------------------------------------------------
# Against the same module in plain PyTorch: forward, weights, gradients
# ---------------------------------------------------------------------------

def masks_for(kind, B, T):
    if kind == "none":
        return None
    ids = torch.ones(B, T, dtype=torch.long)
    for b in range(B):
        ids[b, max(1, T - b):] = 0  # sample b has b trailing pads (at least one real token)
    pad = attention.make_padding_attention_mask(ids, pad_id=0)
    causal = attention.make_causal_attention_mask(T)
    return {"padding": pad, "causal": causal, "both": pad & causal}[kind]


def pair_of_modules(E, H, seed):
    """The attn module and the plain one, with the same parameters."""
    torch.manual_seed(seed)
    ours = attention.MultiHeadSelfAttention(E, H)
    torch.manual_seed(seed)
    theirs = plain.MultiHeadSelfAttention(E, H)
    for (n1, p1), (n2, p2) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), "same seed, different %s" % n1
    return ours, theirs


def grads_of(module, x, mask, return_attention, seed):
    """Output, weights and the gradients of a random linear loss (on both outputs)."""
    x = x.clone().requires_grad_(True)
    module.zero_grad()
    r = module(x, attention_mask=mask, return_attention=return_attention)
    out, weights = r if return_attention else (r, None)
    g = torch.Generator().manual_seed(seed)
    loss = (out * torch.randn(out.shape, generator=g)).sum()
    if weights is not None:
        loss = loss + (weights * torch.randn(weights.shape, generator=g)).sum()
    loss.backward()
    grads = {"x": x.grad}
    grads.update({n: p.grad for n, p in module.named_parameters()})
    return out, weights, grads


@pytest.mark.parametrize("return_attention", [False, True])
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "both"])
@pytest.mark.parametrize("B,T,E,H", [(1, 1, 4, 1), (2, 5, 16, 4), (3, 17, 24, 3),
                                     (2, 113, 8, 2)])
def test_module_forward_weights_and_gradients_equal_plain_pytorch(B, T, E, H, mask,
                                                                  return_attention):
    """attn.torch's output, weights and the gradients of x and all four parameters equal
    PyTorch autograd's through the plain module, for every mask and awkward sizes."""
    ours, theirs = pair_of_modules(E, H, seed=B * 1000 + T)
    x = torch.randn(B, T, E)
    m = masks_for(mask, B, T)
    o1, w1, g1 = grads_of(ours, x, m, return_attention, seed=7)
    o2, w2, g2 = grads_of(theirs, x, m, return_attention, seed=7)
    close(o1, o2, "output")
    if return_attention:
        close(w1, w2, "weights")
    for name in g2:
        close(g1[name], g2[name], "gradient of " + name)


@pytest.mark.parametrize("case", ["4d", "cross", "value_dim", "3d", "2d", "shared_kv_head",
                                  "5d", "mask_2d", "causal_big", "almost_causal"])
def test_sdpa_forward_weights_and_gradients_equal_plain_pytorch(case):
    """scaled_dot_product_attention agrees with plain PyTorch (output, weights, dq, dk, dv)
    on the chapter's layout and on every other layout the chapter's accepts."""
    g = torch.Generator().manual_seed(3)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    mask = None
    if case == "4d":
        q, k, v = r(2, 3, 7, 5), r(2, 3, 7, 5), r(2, 3, 7, 5)
        mask = masks_for("both", 2, 7)
    elif case == "cross":  # Tq != Tk, a padding mask over the keys
        q, k, v = r(2, 2, 3, 4), r(2, 2, 9, 4), r(2, 2, 9, 4)
        mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
        mask[1, ..., 5:] = False
    elif case == "value_dim":
        q, k, v = r(1, 2, 6, 4), r(1, 2, 6, 4), r(1, 2, 6, 11)
    elif case == "3d":
        q, k, v = r(3, 5, 4), r(3, 5, 4), r(3, 5, 4)
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
    elif case == "2d":
        q, k, v = r(4, 8), r(6, 8), r(6, 3)
    elif case == "shared_kv_head":  # k and v broadcast over the heads
        q, k, v = r(2, 4, 5, 4), r(2, 1, 5, 4), r(2, 1, 5, 4)
    elif case == "5d":
        q, k, v = r(2, 2, 2, 3, 4), r(2, 2, 2, 3, 4), r(2, 2, 2, 3, 4)
    elif case == "mask_2d":  # a 2-D mask broadcast over batch and heads
        q, k, v = r(2, 2, 5, 4), r(2, 2, 5, 4), r(2, 2, 5, 4)
        mask = torch.rand(5, 5, generator=g) > 0.4
        mask[:, 0] = True
    else:  # the causal mask at a size where it goes to the kernel as causal=True,
        # and the same mask with one future key let through, which must not
        q, k, v = r(1, 2, 80, 4), r(1, 2, 80, 4), r(1, 2, 80, 4)
        mask = attention.make_causal_attention_mask(80)
        if case == "almost_causal":
            mask = mask.clone()
            mask[0, 0, 10, 50] = True
    do, dw = None, None
    results = []
    for module in (attention, plain):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, weights = module.scaled_dot_product_attention(*leaves, attention_mask=mask)
        if do is None:
            do, dw = torch.randn(out.shape, generator=g), torch.randn(weights.shape, generator=g)
        ((out * do).sum() + (weights * dw).sum()).backward()
        results.append([out, weights] + [t.grad for t in leaves])
    for name, a, b in zip(["output", "weights", "dq", "dk", "dv"], *results):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        close(a, b, name)


def test_only_the_output_in_the_loss_gives_the_librarys_backward_alone():
    """A loss of the output only (weights unused) gives plain PyTorch's dq, dk, dv."""
    q, k, v = (torch.randn(2, 2, 9, 8) for _ in range(3))
    results = []
    for module in (attention, plain):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, _ = module.scaled_dot_product_attention(*leaves,
                                                     attention_mask=masks_for("causal", 2, 9))
        out.square().sum().backward()
        results.append([t.grad for t in leaves])
    for name, a, b in zip(["dq", "dk", "dv"], *results):
        close(a, b, name)


def test_float64_inputs_are_computed_in_float32_and_returned_as_float64():
    """A float64 module and input give float64 results within float32 accuracy."""
    ours, theirs = pair_of_modules(8, 2, seed=5)
    ours, theirs = ours.double(), theirs.double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    o1, w1, g1 = grads_of(ours, x, masks_for("both", 2, 6), True, seed=1)
    o2, w2, g2 = grads_of(theirs, x, masks_for("both", 2, 6), True, seed=1)
    assert o1.dtype == torch.float64 and w1.dtype == torch.float64, (o1.dtype, w1.dtype)
    close(o1, o2, "output")
    close(g1["qkv.weight"], g2["qkv.weight"], "gradient of qkv.weight")


def test_state_dicts_move_between_the_chapters_module_and_attn():
    """A plain module's state_dict loads into attn's module and gives the same output,
    and attn's loads into the plain module."""
    torch.manual_seed(11)
    theirs = plain.MultiHeadSelfAttention(12, 3)
    ours = attention.MultiHeadSelfAttention(12, 3)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 4, 12)
    with torch.no_grad():
        close(ours(x), theirs(x), "output after load_state_dict")
    fresh, back = attention.MultiHeadSelfAttention(12, 3), plain.MultiHeadSelfAttention(12, 3)
    back.load_state_dict(fresh.state_dict())
    with torch.no_grad():
        close(back(x), fresh(x), "plain module after loading attn's state_dict")


def test_float32_tensors_reach_the_library_without_a_copy(monkeypatch):
    """q, k, v and the mask are handed to the C call as views of the tensors' memory."""
    import attn._attn as lib

    seen = {}
    real = lib.sdpa

    def spy(q, k, v, **kw):
        seen.update(q=q, k=k, v=v, mask=kw.get("mask"))
        return real(q, k, v, **kw)

    monkeypatch.setattr(lib, "sdpa", spy)
    q, k, v = (torch.randn(2, 2, 4, 4) for _ in range(3))
    k_view = torch.randn(2, 4, 2, 4).transpose(1, 2)  # a strided view, read in place too
    mask = attention.make_causal_attention_mask(4)
    attention.scaled_dot_product_attention(q, k_view, v, attention_mask=mask)
    for name, t in (("q", q), ("k", k_view), ("v", v), ("mask", mask)):
        addr = seen[name].__array_interface__["data"][0]
        assert addr == t.data_ptr(), "%s was copied: %#x != %#x" % (name, addr, t.data_ptr())


def test_no_grad_inference_and_an_optimizer_step_work():
    """Under no_grad the module runs without a graph; one SGD step lowers a loss."""
    torch.manual_seed(2)
    module = attention.MultiHeadSelfAttention(8, 2)
    x, target = torch.randn(4, 6, 8), torch.randn(4, 6, 8)
    with torch.no_grad():
        assert not module(x).requires_grad
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(module(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[1] < losses[0], losses


@pytest.mark.parametrize("T", [5, 80])
def test_without_a_gradient_the_results_are_the_same_bits(T):
    """Under no_grad (no autograd graph) the output and weights equal the grad path's."""
    q, k, v = (torch.randn(2, 3, T, 8) for _ in range(3))
    mask = attention.make_causal_attention_mask(T)
    with_grad = attention.scaled_dot_product_attention(q.requires_grad_(True), k, v,
                                                       attention_mask=mask)
    with torch.no_grad():
        without = attention.scaled_dot_product_attention(q, k, v, attention_mask=mask)
    for name, a, b in zip(["output", "weights"], with_grad, without):
        assert torch.equal(a.detach(), b), "%s differs: %s vs %s" % (name, a, b)


def test_gradients_of_a_plain_sum_and_of_a_strided_input():
    """loss = out.sum() hands the backward a gradient with zero strides, and x may be a
    transposed view: both are read in place and give plain PyTorch's gradients."""
    ours, theirs = pair_of_modules(8, 2, seed=9)
    base = torch.randn(6, 3, 8)
    grads = []
    for module in (ours, theirs):
        leaf = base.clone().requires_grad_(True)
        module(leaf.transpose(0, 1), attention_mask=masks_for("causal", 3, 6)).sum().backward()
        grads.append([leaf.grad] + [p.grad for p in module.parameters()])
    for name, a, b in zip(["x", "qkv.weight", "qkv.bias", "output.weight", "output.bias"],
                          *grads):
        close(a, b, "gradient of " + name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tensors_are_converted_and_returned_in_their_dtype(dtype):
    """float16 and bfloat16 inputs are computed in float32 and come back (output, weights,
    gradient) in their own dtype, the float32 result rounded (so within one unit of the
    dtype's last place of plain PyTorch's float32 result, rounded the same way)."""
    q = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(4))
    q = q.to(dtype).requires_grad_(True)
    out, weights = attention.scaled_dot_product_attention(q, q, q)
    out.float().sum().backward()
    assert (out.dtype, weights.dtype, q.grad.dtype) == (dtype, dtype, dtype), \
        (out.dtype, weights.dtype, q.grad.dtype)
    want, _ = plain.scaled_dot_product_attention(*(q.detach().float(),) * 3)
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(out, want.to(dtype), atol=0, rtol=ulp,
                               msg=lambda m: "%s\n%s\n%s" % (m, out, want))


# ---------------------------------------------------------------------------
# Edges a training loop meets: empty batches, second derivatives
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 2, 3, 4), (2, 0, 3, 4), (2, 2, 0, 4)])
def test_no_query_rows_give_empty_results_and_zero_gradients_as_plain_pytorch(shape):
    """An empty batch, no heads or no queries (the chapter's module returns empty
    tensors there; the library takes sizes of at least 1) give plain PyTorch's empty
    output and weights, and gradients of zeros in the inputs' shapes."""
    q = torch.randn(*shape, requires_grad=True)
    k = torch.randn(shape[0], shape[1], 5, 4, requires_grad=True)
    v = torch.randn(shape[0], shape[1], 5, 3, requires_grad=True)
    out, weights = attention.scaled_dot_product_attention(q, k, v)
    want_out, want_weights = plain.scaled_dot_product_attention(q, k, v)
    assert out.shape == want_out.shape and weights.shape == want_weights.shape, \
        (out.shape, want_out.shape, weights.shape, want_weights.shape)
    out.sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.grad is not None and t.grad.shape == t.shape, (name, t.grad, t.shape)
        assert not t.grad.any(), (name, t.grad)


def test_keys_of_length_zero_are_refused_as_a_row_with_no_key():
    """Queries with no key to attend to raise the chapter's 'at least one key'."""
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="at least one key"):
        attention.scaled_dot_product_attention(q, torch.randn(1, 2, 0, 4), torch.randn(1, 2, 0, 4))


@pytest.mark.parametrize("shape", [(0, 3, 8), (2, 0, 8)])
def test_the_module_on_an_empty_batch_or_sequence_is_plain_pytorchs(shape):
    """The module on x [0, T, E] or [B, 0, E] returns the chapter's empty output (and
    weights), and the backward gives x and the parameters zero gradients."""
    torch.manual_seed(0)
    module = attention.MultiHeadSelfAttention(embed_dim=8, num_heads=2)
    x = torch.randn(*shape, requires_grad=True)
    out, weights = module(x, return_attention=True)
    assert out.shape == shape and weights.shape == (shape[0], 2, shape[1], shape[1]), \
        (out.shape, weights.shape)
    out.sum().backward()
    assert x.grad.shape == shape and not x.grad.any(), x.grad
    for name, p in module.named_parameters():
        assert p.grad is not None and not p.grad.any(), (name, p.grad)

