"""attn.torch: the chapter's PyTorch attention module, computed by attn's C kernels.

A drop-in for the chapter's module (llm_tutor.models.attention, SPEC section 9):
code written against it runs on attn with only its import changed,

    import attn.torch as attention      # was: from llm_tutor.models import attention

    scaled_dot_product_attention(query, key, value, attention_mask=None)
        -> (output [..., Tq, Dv], weights [..., Tq, Tk])
    make_padding_attention_mask(token_ids, pad_id)   -> bool [B, 1, 1, T]
    make_causal_attention_mask(seq_len, device=None) -> bool [1, 1, T, T]
    MultiHeadSelfAttention(embed_dim, num_heads)     an nn.Module with the
        parameters qkv (nn.Linear(E, 3E)) and output (nn.Linear(E, E)), and
        forward(x, attention_mask=None, return_attention=False)
        -> output [B, T, E], or (output, weights [B, H, T, T])

Beyond the chapter's API, for training current models:

    sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
         scale=None, enable_gqa=False, *, window, softcap, alibi, bias, sinks,
         empty_rows) -> output
        torch.nn.functional.scaled_dot_product_attention's arguments, then SPEC
        section 6's options; gradients to query, key, value, bias (or a float
        attn_mask) and sinks through attn's C backward.
    GroupedQueryAttention(embed_dim, num_heads, num_kv_heads, head_dim=None,
        bias=False, rope="interleaved", rope_base=10000.0)
        chapter 21's block (q_proj, k_proj, v_proj, o_proj) on attn_gqa_forward
        and attn_gqa_backward.
    kernel_calls() -> {"forward": n, "backward": n}, the C calls made so far.

With PyTorch >= 2.4 the forward and backward are also the custom operators
attn::sdpa_forward and attn::sdpa_backward, which torch.compile (fullgraph=True
too) and torch.export put in their graphs: compiled and exported code runs attn's
kernels (the chapter's module and function, sdpa and GroupedQueryAttention).

The chapter's API has the same names, parameters, return values and errors as the
chapter's module:
ValueError when a query row sees no key ("at least one key"), when a mask is not
boolean ("boolean"), when a mask "cannot broadcast" to the scores (both shapes
named), when the head sizes or the key and value lengths differ, and when
embed_dim is not divisible by num_heads. Where the chapter's module fails inside
PyTorch with a RuntimeError (an input whose last axis is not embed_dim, batch axes
that do not broadcast), this module raises AttnShapeError, which is both a
ValueError and a RuntimeError, so either `except` still catches it.

Forward and backward run in attn's kernels through torch.autograd.Function: the
forward is attn.sdpa (or attn's fused multi-head forward), the backward the C
library's attn_sdpa_backward / attn_mha_backward (SPEC section 8), so
loss.backward() gives the gradients PyTorch's autograd gives through the
chapter's module. float32 contiguous (or strided) CPU tensors are handed to the C
library without a copy, as numpy views of the tensors' own memory.

Differences a caller can see, all of them deliberate:
- attn computes in float32. float64 tensors are converted to float32 on the way
  in and the results back to float64 on the way out, so a float64 caller gets
  float32 accuracy.
- 16 bits (SPEC section 10): when query, key and value are all bfloat16 or all
  float16 and no gradient is wanted (torch.no_grad(), torch.inference_mode(),
  or tensors that do not require one), scaled_dot_product_attention runs attn's
  16-bit kernels on the tensors as they are, without a float32 copy: products
  and sums in float32, the output rounded once to the inputs' dtype. When a
  gradient is wanted, it falls back to the float32 path instead, because attn's
  backward is float32 only: the tensors are widened to float32 (exactly), the
  forward and backward run in float32, and the output, weights and gradients
  come back in the inputs' dtype. Both paths round the same float32 result once,
  so they agree within the 16-bit accuracy rule (docs/python.md). 16-bit x in
  MultiHeadSelfAttention, and mixed dtypes, always take the float32 path.
- Tensors on another device than the CPU are refused (ValueError naming the
  device); integer tensors are refused (TypeError).
- attention_mask (and pad_id) may also be passed by position; the chapter's
  module takes them by keyword only.
- torch.autocast is ignored: under CPU autocast to bfloat16 the results are
  float32 (the chapter's module, whose linears autocast runs in bfloat16,
  returns bfloat16).
- A second derivative (backward with create_graph=True, as a gradient penalty
  needs) works, at PyTorch's cost: attn's backward runs in C outside autograd's
  graph, so when autograd asks for a graph of the backward itself, the
  backward is worked out instead in PyTorch operations on the same tensors (the
  chapter's steps, differentiated by autograd), which autograd can differentiate
  again. Without create_graph the backward is always attn's.
- Under torch.func (PyTorch 2.x: grad, vmap, jacrev, functional_call ...) the
  tensors are functorch's wrappers, which attn cannot read, and torch.jit.trace
  and torch.export record PyTorch operations only: under all three the
  chapter's steps run in PyTorch operations instead, at PyTorch's cost (a trace
  is then a graph of PyTorch operations, which torch.jit.save can write). There
  a query row that sees no key gives NaN, as PyTorch's softmax does, not the
  ValueError (the check would read the mask's values, which vmap does not allow
  and a trace cannot record).
  With PyTorch >= 2.4, torch.export records attn's custom operator instead.
  torch.jit.script cannot compile the module (its Python is not TorchScript).
"""

try:
    import torch
except ImportError as _error:  # pragma: no cover - exercised where torch is absent
    raise ImportError(
        "attn.torch needs PyTorch, which could not be imported (%s); install torch, "
        "or use the numpy API (import attn), which does not need it" % _error) from _error

import math
import operator

import numpy as _numpy
from torch import nn

from . import _attn

__all__ = [
    "sdpa",
    "kernel_calls",
    "GroupedQueryAttention",
    "scaled_dot_product_attention",
    "make_padding_attention_mask",
    "make_causal_attention_mask",
    "MultiHeadSelfAttention",
    "AttnShapeError",
]


class AttnShapeError(ValueError, RuntimeError):
    """Shapes that do not fit where the chapter's module fails inside PyTorch with a
    RuntimeError; a ValueError too, like every other argument error here."""


# ---------------------------------------------------------------------------
# Arguments: the chapter's checks, with its messages
# ---------------------------------------------------------------------------

def _check_tensor(t, name, keep_half=False):
    """t as a float32 CPU tensor (converted from another floating dtype), or with
    keep_half its bfloat16 or float16 self."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("attn.torch runs on the CPU, but %s is on %s; move it with .cpu()"
                         % (name, t.device))
    if not t.is_floating_point():
        raise TypeError("%s must be a floating-point tensor (float32 is used as it is), "
                        "not %s" % (name, t.dtype))
    if t.dtype == torch.float32 or (keep_half and t.dtype in _HALF):
        return t
    return t.float()


def _mask_broadcasts(mask_shape, target):
    """numpy's and Tensor.expand's rule: right-aligned, each axis equal or 1, and
    no more axes than the target."""
    if len(mask_shape) > len(target):
        return False
    return all(m == 1 or m == t for m, t in zip(reversed(mask_shape), reversed(target)))


def _check_mask(mask, scores_shape):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError("attention_mask must be a boolean torch.Tensor or None, not %s"
                        % type(mask).__name__)
    if mask.dtype != torch.bool:
        raise ValueError("attention_mask must be a boolean tensor, not %s." % mask.dtype)
    if mask.device.type != "cpu":
        raise ValueError("attn.torch runs on the CPU, but attention_mask is on %s; move it "
                         "with .cpu()" % mask.device)
    if not _mask_broadcasts(tuple(mask.shape), tuple(scores_shape)):
        raise ValueError("attention_mask shape %s cannot broadcast to scores shape %s."
                         % (tuple(mask.shape), tuple(scores_shape)))
    return mask


def _broadcast(*shapes):
    """numpy's broadcast of shapes (tuples), or None when they do not broadcast.
    (torch.broadcast_shapes does the same but costs tens of microseconds a call.)"""
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        size = 1
        for s in shapes:
            d = s[i - n + len(s)] if i - n + len(s) >= 0 else 1
            if d != 1:
                if size != 1 and size != d:
                    return None
                size = d
        out.append(size)
    return tuple(out)


# Above this many scores per (batch, head), a mask that is exactly the causal one
# goes to the kernel as causal=True instead: the same keys are hidden, and the
# kernel then skips the tiles above the diagonal without reading the mask. Below
# it, the check would cost more than it saves.
_CAUSAL_CHECK_MIN = 4096


def _split_causal(mask, Tq, Tk):
    """(mask, causal): (None, True) when mask is exactly make_causal_attention_mask's
    [.., T, T] lower triangle with every leading axis of size 1, else (mask, False)."""
    if (mask is None or Tq != Tk or Tq * Tk < _CAUSAL_CHECK_MIN or mask.dim() < 2
            or tuple(mask.shape[-2:]) != (Tq, Tk) or mask.numel() != Tq * Tk):
        return mask, False
    tril = torch.ones(Tq, Tk, dtype=torch.bool).tril_()
    if torch.equal(mask.reshape(Tq, Tk), tril):
        return None, True
    return mask, False


# torch.func's stack of active transforms (PyTorch 2.x: None when no grad, vmap,
# jacrev ... is running; absent in 1.13, whose functorch is a separate package
# that attn.torch does not support), and torch.export's test for an export in
# progress. One call each, well under a microsecond, on every attention call.
_FUNCTORCH_STACK = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack",
                           None)
_IS_EXPORTING = getattr(getattr(torch, "compiler", None), "is_exporting", None)


def _pytorch_only():
    """Whether attention must run in PyTorch operations rather than attn's call:
    under torch.jit.trace or torch.export, which record PyTorch operations only
    (attn's result would be recorded as a constant, and the trace would return it
    for any input), or under a torch.func transform (grad, vmap, jacrev ...),
    whose wrapper tensors have no memory of their own for attn to read."""
    if _in_graph_capture():
        # torch.compile or torch.export with attn's custom operators (PyTorch >=
        # 2.4): they go into the graph as they are (see _in_graph_capture). Asked
        # first, since dynamo cannot trace the functorch query below.
        return False
    return (torch.jit.is_tracing()
            or (_IS_EXPORTING is not None and _IS_EXPORTING())
            or (_FUNCTORCH_STACK is not None and _FUNCTORCH_STACK() is not None))


def _np(t):
    # A numpy view of the tensor's own memory (no copy, strides kept): the C
    # library reads strided float32 views in place, zero strides included.
    return t.detach().numpy()


# The 16-bit dtypes attn's forward takes as they are, and the dtype= keyword of
# attn.sdpa that says what their bits are.
_HALF = {torch.bfloat16: "bf16", torch.float16: "f16"}


def _np16(t):
    # numpy has no bfloat16: a bfloat16 tensor goes to attn as a uint16 view of
    # its own memory (a view of the same bits, strides kept, no copy), with
    # dtype="bf16". A float16 tensor is numpy's float16 as it is.
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_numpy.uint16)
    return t.numpy()


def _from_np16(a, dtype):
    # attn.sdpa's 16-bit output as a tensor of dtype, sharing its memory.
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(_numpy.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _call(fn, *args, **kwargs):
    """A C call whose empty-row error is reworded as the chapter words it."""
    try:
        return fn(*args, **kwargs)
    except ValueError as error:
        if "keys masked" in str(error):
            # The library's hint names its empty_rows option, which the chapter's API
            # does not have: the message keeps where the row is and drops the hint.
            where = str(error).split(" (use empty_rows", 1)[0]
            raise ValueError("Every query position must be able to attend to at least one "
                             "key: %s" % where) from None
        raise


# ---------------------------------------------------------------------------
# Scaled dot-product attention
# ---------------------------------------------------------------------------

class _SDPAFunction(torch.autograd.Function):
    """attn.sdpa forward, attn_sdpa_backward backward, on q [N, H, Tq, D],
    k [N, H, Tk, D], v [N, H, Tk, Dv] float32 CPU tensors; returns (output, weights)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal):
        out, weights, lse = _call(_attn.sdpa, _np(q), _np(k), _np(v),
                                  mask=None if mask is None else _np(mask), causal=causal,
                                  return_weights=True, return_lse=True)
        out, weights, lse = (torch.from_numpy(a) for a in (out, weights, lse))
        ctx.save_for_backward(q, k, v, mask, out, lse, weights)
        ctx.causal = causal
        # An output no loss depends on gets None in backward, not a tensor of zeros.
        ctx.set_materialize_grads(False)
        return out, weights

    # attn's backward runs in C on numpy views, outside autograd's graph, so its
    # result has no derivative of its own. Autograd runs a backward with grad mode
    # on exactly when it was asked to build a graph of it (create_graph=True, for a
    # second derivative); then the gradients are worked out in PyTorch operations
    # instead, so that the second derivative is the chapter's. (Returning the C
    # result there would silently leave attention out of the second derivative.)
    @staticmethod
    def backward(ctx, dout, dweights):
        q, k, v, mask, out, lse, weights = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _grads_in_torch(
                ctx, (q, k, v), lambda q, k, v: _sdpa_in_torch(q, k, v, mask, ctx.causal),
                (dout, dweights)) + (None, None)
        m = None if mask is None else _np(mask)
        if dout is not None:
            dq, dk, dv = (torch.from_numpy(a) for a in _call(
                _attn.sdpa_backward, _np(q), _np(k), _np(v), _np(out), _np(lse),
                _np(dout), mask=m, causal=ctx.causal))
        else:
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        if dweights is not None:
            # A loss that reads the weights themselves (the chapter returns them, so
            # a caller may): the softmax's backward, dS = P * (dP - rowsum(P * dP)),
            # then the scores' scale q k^T / sqrt(D). A hidden key has P = 0, so it
            # gets no gradient here either.
            p = weights
            ds = p * (dweights - (p * dweights).sum(dim=-1, keepdim=True))
            scale = 1.0 / math.sqrt(q.shape[-1])
            dq = dq + scale * (ds @ k)
            dk = dk + scale * (ds.transpose(-2, -1) @ q)
        return dq, dk, dv, None, None


def _sdpa(q, k, v, mask):
    """(output, weights) through the autograd function when a gradient is wanted,
    else straight from the C call (no graph to record, and less to do per call).
    16-bit q, k, v (never with a gradient: see the module's docstring) go to
    attn's 16-bit kernels; the output is in their dtype, the weights float32."""
    if _in_graph_capture():
        # Under torch.compile or torch.export: attn's custom operator, with the
        # weights (whose gradient its backward adds), and no look at the mask's
        # values (_split_causal's), which a graph cannot depend on.
        out, _, weights = _FORWARD(*_contiguous_in_graph(q, k, v), None, None, mask, None, 0,
                                   None, -1, -1, None, "error", True)
        return out, weights
    mask, causal = _split_causal(mask, q.shape[-2], k.shape[-2])
    if q.dtype in _HALF:
        out, weights = _call(_attn.sdpa, _np16(q), _np16(k), _np16(v),
                             mask=None if mask is None else _np(mask), causal=causal,
                             return_weights=True, dtype=_HALF[q.dtype])
        return _from_np16(out, q.dtype), torch.from_numpy(weights)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _SDPAFunction.apply(q, k, v, mask, causal)
    out, weights = _call(_attn.sdpa, _np(q), _np(k), _np(v),
                         mask=None if mask is None else _np(mask), causal=causal,
                         return_weights=True)
    return torch.from_numpy(out), torch.from_numpy(weights)


def _wants_grad(*tensors):
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def scaled_dot_product_attention(query, key, value, attention_mask=None):
    """Scaled dot-product attention, softmax(query key^T / sqrt(head_dim)) value.

    Shapes (the chapter's):
    - query: [batch, heads, query_len, head_dim]
    - key: [batch, heads, key_len, head_dim]
    - value: [batch, heads, key_len, value_dim]
    - attention_mask: bool, broadcastable to [batch, heads, query_len, key_len];
      True means "can attend", False means "masked out".
    Leading axes may be any number (or none), broadcasting as in `query @ key^T`.

    Returns (output [..., query_len, value_dim], weights [..., query_len, key_len]),
    both differentiable. Raises ValueError as the chapter's module does.
    """
    if _half_call(query, key, value):
        # attn's 16-bit kernels on the tensors as they are (after the same device
        # checks); the float32 path otherwise.
        q, k, v = (_check_tensor(t, n, keep_half=True)
                   for t, n in ((query, "query"), (key, "key"), (value, "value")))
    else:
        q = _check_tensor(query, "query")
        k = _check_tensor(key, "key")
        v = _check_tensor(value, "value")
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise AttnShapeError("query, key and value need at least 2 axes ([..., len, dim]); "
                             "got %s, %s and %s" % (tuple(q.shape), tuple(k.shape),
                                                    tuple(v.shape)))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError("query and key must have the same head_dim: query %s, key %s."
                         % (tuple(q.shape), tuple(k.shape)))
    if k.shape[-2] != v.shape[-2]:
        raise ValueError("key and value must have the same sequence length: key %s, value %s."
                         % (tuple(k.shape), tuple(v.shape)))
    batch = _broadcast(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
    if batch is None:
        raise AttnShapeError("the batch axes of query %s, key %s and value %s do not broadcast"
                             % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    Tq, Tk, D, Dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    scores_shape = batch + (Tq, Tk)
    mask = _check_mask(attention_mask, scores_shape)
    if 0 in scores_shape:
        out, weights = _sdpa_empty(q, k, v, mask, scores_shape)
        if query.dtype != out.dtype:
            out, weights = out.to(query.dtype), weights.to(query.dtype)
        return out, weights

    if _pytorch_only():
        # Under torch.jit.trace, torch.export or torch.func (grad, vmap, jacrev,
        # functional_call ...): the chapter's steps in PyTorch operations, which a
        # trace or an export records and every transform knows how to handle (see
        # _pytorch_only).
        out, weights = _sdpa_in_torch(q, k, v, mask, False)
    elif q.dim() == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]:
        # The chapter's case: attn reads the tensors, and the mask with its
        # broadcast axes, where they are.
        out, weights = _sdpa(q, k, v, mask)
    else:
        # Any other batch layout is brought to [N, 1, T, D]; the expand and the
        # reshape are autograd's, so the gradients of broadcast axes are summed
        # back by PyTorch.
        n = 1
        for s in batch:
            n *= s
        q4 = q.expand(batch + (Tq, D)).reshape(n, 1, Tq, D)
        k4 = k.expand(batch + (Tk, D)).reshape(n, 1, Tk, D)
        v4 = v.expand(batch + (Tk, Dv)).reshape(n, 1, Tk, Dv)
        m4 = None if mask is None else mask.expand(scores_shape).reshape(n, 1, Tq, Tk)
        out, weights = _sdpa(q4, k4, v4, m4)
        out, weights = out.reshape(batch + (Tq, Dv)), weights.reshape(scores_shape)
    if query.dtype != torch.float32:
        out, weights = out.to(query.dtype), weights.to(query.dtype)
    return out, weights


def _sdpa_empty(q, k, v, mask, scores_shape):
    """Attention on a problem with no scores: an empty batch or no queries (the
    library takes sizes of at least 1), or no keys. With no query row there is
    nothing to compute, so the chapter's steps run in PyTorch on the empty tensors,
    which gives the chapter's empty output and weights and, through autograd,
    gradients of zeros in the inputs' shapes. Rows with no key at all cannot attend
    to one: the chapter's error."""
    rows = 1
    for s in scores_shape[:-1]:
        rows *= s
    if rows and scores_shape[-1] == 0:
        raise ValueError("Every query position must be able to attend to at least one key: "
                         "key %s has no positions" % (tuple(k.shape),))
    D = q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(D if D else 1)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v), weights


def _half_call(query, key, value):
    """Whether query, key and value go to attn's 16-bit kernels as they are: all
    bfloat16 or all float16 tensors, and no gradient wanted (attn's backward is
    float32 only, so a call that wants one takes the float32 path)."""
    return (all(isinstance(t, torch.Tensor) for t in (query, key, value))
            and query.dtype in _HALF and key.dtype == value.dtype == query.dtype
            and not _wants_grad(query, key, value))


# ---------------------------------------------------------------------------
# The same computations in PyTorch operations, for second derivatives, traces,
# exports and torch.func
# ---------------------------------------------------------------------------

def _sdpa_in_torch(q, k, v, mask, causal):
    """The chapter's three steps on [..., T, D] tensors in PyTorch operations:
    (output, weights), differentiable as many times as autograd likes. causal is
    the top-left triangle (_split_causal gives it only for Tq == Tk)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        tq, tk = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(tq, tk, dtype=torch.bool).tril_()
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v), weights


def _mha_in_torch(x, w_qkv, b_qkv, w_o, b_o, mask, causal, num_heads):
    """attn's multi-head forward (the chapter's module) in PyTorch operations."""
    B, T, E = x.shape
    qkv = nn.functional.linear(x, w_qkv, b_qkv)
    q, k, v = (t.reshape(B, T, num_heads, E // num_heads).transpose(1, 2)
               for t in qkv.chunk(3, dim=-1))
    context, _ = _sdpa_in_torch(q, k, v, mask, causal)
    return nn.functional.linear(context.transpose(1, 2).reshape(B, T, E), w_o, b_o)


def _grads_in_torch(ctx, inputs, fn, grad_outputs):
    """The gradients of fn(*inputs) (a tuple of tensors) for the inputs that need
    one, given the gradients of its outputs (None: the loss does not read that
    output), with a graph of their own (create_graph=True). For a backward called
    with grad mode on; the inputs are the function's saved inputs, so the graph
    reaches back to the caller's tensors."""
    needs = ctx.needs_input_grad[:len(inputs)]
    with torch.enable_grad():
        outputs = fn(*inputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None]
    wanted = [t for t, need in zip(inputs, needs) if need]
    if not pairs or not wanted:
        return (None,) * len(inputs)
    grads = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                     create_graph=True, allow_unused=True))
    return tuple(next(grads) if need else None for need in needs)


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------

def make_padding_attention_mask(token_ids, pad_id):
    """Padding mask: bool [batch, 1, 1, seq_len], False where the KEY is pad_id (a
    pad query still attends; its output is ignored later). token_ids [batch,
    seq_len]; other ranks give token_ids.shape with two axes of 1 after the first,
    as the chapter's does."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError("token_ids must be a torch.Tensor, not %s" % type(token_ids).__name__)
    if (token_ids.dim() == 2 and token_ids.device.type == "cpu"
            and token_ids.dtype in (torch.int64, torch.int32)):
        return torch.from_numpy(_attn.padding_mask(_np(token_ids), int(pad_id)))
    # Other dtypes, ranks and devices: the same rule, written in torch.
    return (token_ids != pad_id).unsqueeze(1).unsqueeze(2)


def make_causal_attention_mask(seq_len, device=None):
    """Causal mask: bool [1, 1, seq_len, seq_len], lower triangular with the
    diagonal, so position t sees positions 0..t. device: where to put it."""
    seq_len = int(seq_len)
    if seq_len == 0:
        mask = torch.ones(0, 0, dtype=torch.bool).view(1, 1, 0, 0)
    elif seq_len < 0:
        raise ValueError("seq_len must be at least 0, not %d" % seq_len)
    else:
        mask = torch.from_numpy(_attn.causal_mask(seq_len))
    return mask if device is None else mask.to(device)


# ---------------------------------------------------------------------------
# Multi-head self-attention
# ---------------------------------------------------------------------------

class _MHAFunction(torch.autograd.Function):
    """attn's fused multi-head forward (projections, heads, attention, output) and
    attn_mha_backward. x [B, T, E], w_qkv [3E, E], b_qkv [3E], w_o [E, E],
    b_o [E], float32 CPU. Returns out [B, T, E], or (out, weights [B, H, T, T])
    with want_weights, the weights then without a gradient (the module takes the
    other path when they need one)."""

    @staticmethod
    def forward(ctx, x, w_qkv, b_qkv, w_o, b_o, mask, causal, num_heads, want_weights):
        m = None if mask is None else _np(mask)
        r = _call(_attn._mha_forward, _np(x), _np(w_qkv), _np(b_qkv), _np(w_o), _np(b_o),
                  num_heads, mask=m, causal=causal, return_weights=want_weights)
        ctx.save_for_backward(x, w_qkv, b_qkv, w_o, b_o, mask)
        ctx.num_heads, ctx.causal = num_heads, causal
        ctx.set_materialize_grads(False)
        if want_weights:
            out, weights = torch.from_numpy(r[0]), torch.from_numpy(r[1])
            ctx.mark_non_differentiable(weights)
            return out, weights
        return torch.from_numpy(r)

    @staticmethod
    def backward(ctx, dout, *unused):
        x, w_qkv, b_qkv, w_o, b_o, mask = ctx.saved_tensors
        if dout is None:
            return (None,) * 9
        if torch.is_grad_enabled():
            # create_graph=True: the gradients in PyTorch operations, as in
            # _SDPAFunction.backward, so that they can be differentiated again.
            return _grads_in_torch(
                ctx, (x, w_qkv, b_qkv, w_o, b_o),
                lambda *t: (_mha_in_torch(*t, mask, ctx.causal, ctx.num_heads),),
                (dout,)) + (None,) * 4
        grads = _call(_attn._mha_backward, _np(x), _np(w_qkv), _np(b_qkv), _np(w_o), _np(b_o),
                      ctx.num_heads, _np(dout), mask=None if mask is None else _np(mask),
                      causal=ctx.causal)
        return tuple(torch.from_numpy(g) for g in grads) + (None,) * 4


class MultiHeadSelfAttention(nn.Module):
    """The chapter's multi-head self-attention, computed by attn.

    qkv = nn.Linear(embed_dim, 3 * embed_dim) makes q, k and v (in that order);
    the heads are split [B, T, E] -> [B, H, T, D]; attention; merged back; then
    output = nn.Linear(embed_dim, embed_dim). The parameters have the chapter's
    names, shapes and initialisation (drawn in the same order, so the same seed
    gives the same module), and its state_dict loads into the chapter's module
    and back.
    """

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError("embed_dim must be divisible by num_heads: %d is not a multiple "
                             "of %d." % (embed_dim, num_heads))
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, embed_dim * 3)
        self.output = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, attention_mask=None, return_attention=False):
        """x [batch, seq_len, embed_dim]; attention_mask bool, broadcastable to
        [batch, heads, seq_len, seq_len]. Returns output [batch, seq_len,
        embed_dim], or (output, weights [batch, heads, seq_len, seq_len]) with
        return_attention."""
        xf = _check_tensor(x, "x")
        if xf.dim() != 3:
            raise AttnShapeError("x must be [batch, seq_len, embed_dim] (3 axes), not %s"
                                 % (tuple(x.shape),))
        B, T, E = xf.shape
        if E != self.embed_dim:
            raise AttnShapeError("x %s has embed_dim %d, but the module was made with "
                                 "embed_dim %d" % (tuple(x.shape), E, self.embed_dim))
        mask = _check_mask(attention_mask, (B, self.num_heads, T, T))
        params = [self.qkv.weight, self.qkv.bias, self.output.weight, self.output.bias]
        for p, name in zip(params, ("qkv.weight", "qkv.bias", "output.weight", "output.bias")):
            _check_tensor(p, name)
        w_qkv, b_qkv, w_o, b_o = (p if p.dtype == torch.float32 else p.float() for p in params)
        needs_grad = torch.is_grad_enabled() and (
            xf.requires_grad or any(p.requires_grad for p in params))
        if (return_attention and needs_grad or B * T == 0 or _pytorch_only()
                or _in_graph_capture()):
            # (An empty batch or sequence goes this way too: the library takes
            # sizes of at least 1, and there is nothing to compute; and so do a
            # trace, an export and torch.func's transforms, whose attention then
            # runs in PyTorch: see _pytorch_only; and torch.compile and
            # torch.export with custom operators, whose attention is then attn's
            # operator between the projections in PyTorch.)
            # The weights are returned with their gradient, as the chapter's are:
            # the projections in PyTorch around attn's attention and its backward.
            out, weights = self._forward_in_steps(xf, w_qkv, b_qkv, w_o, b_o, mask)
        else:
            fused_mask, causal = _split_causal(mask, T, T)
            r = _MHAFunction.apply(xf, w_qkv, b_qkv, w_o, b_o, fused_mask, causal,
                                   self.num_heads, return_attention)
            out, weights = r if return_attention else (r, None)
        if x.dtype != torch.float32:
            out = out.to(x.dtype)
            weights = weights.to(x.dtype) if return_attention else None
        return (out, weights) if return_attention else out

    def _forward_in_steps(self, x, w_qkv, b_qkv, w_o, b_o, mask):
        B, T, E = x.shape
        qkv = nn.functional.linear(x, w_qkv, b_qkv)
        q, k, v = (self._split_heads(t) for t in qkv.chunk(3, dim=-1))
        context, weights = scaled_dot_product_attention(q, k, v, attention_mask=mask)
        merged = context.transpose(1, 2).reshape(B, T, E)
        return nn.functional.linear(merged, w_o, b_o), weights

    def _split_heads(self, x):
        # [B, T, E] -> [B, H, T, D], as the chapter splits them.
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)


# ---------------------------------------------------------------------------
# The engineer's function: sdpa(query, key, value, attn_mask, ..., window,
# softcap, alibi, bias, sinks), SPEC section 6's options with autograd, and
# attn's forward and backward as custom operators (PyTorch >= 2.4) so that
# torch.compile(fullgraph=True) and torch.export run attn's kernels
# ---------------------------------------------------------------------------

# How many times attn's C forward and backward ran from attn.torch's custom
# operators (or their PyTorch 1.13 stand-ins): a test can tell a compiled or
# exported graph that calls attn's kernels from one that fell back to PyTorch's.
_KERNEL_CALLS = {"forward": 0, "backward": 0}


def kernel_calls():
    """{"forward": n, "backward": n}: how many times attn.torch.sdpa's C forward
    and backward have run in this process (from eager code, a compiled graph or an
    exported program alike; the PyTorch-operation paths of torch.func, jit.trace
    and second derivatives do not count)."""
    return dict(_KERNEL_CALLS)


_CAUSAL_CODE = {False: 0, True: 1, "top_left": 1, "bottom_right": 2}
_CAUSAL_NAME = {0: False, 1: "top_left", 2: "bottom_right"}


def _c_options(mask, bias, sinks, slopes, causal, scale, window_left, window_right, softcap,
               empty_rows):
    """attn.sdpa's keywords from an operator's arguments (tensors as numpy views)."""
    has_window = window_left != -1 or window_right != -1
    return dict(mask=None if mask is None else _np(mask), causal=_CAUSAL_NAME[causal],
                scale=scale, window=(window_left, window_right) if has_window else None,
                softcap=softcap, alibi=None if slopes is None else _np(slopes),
                bias=None if bias is None else _np(bias),
                sinks=None if sinks is None else _np(sinks), empty_rows=empty_rows)


def _forward_impl(q, k, v, bias, sinks, mask, slopes, causal, scale, window_left,
                  window_right, softcap, empty_rows, want_weights):
    """attn.sdpa on the tensors' own memory: (out [B, H, Tq, Dv] in q's dtype,
    lse [B, H, Tq] float32, weights [B, H, Tq, Tk] float32, or an empty tensor
    when not wanted). q, k, v: float32, or one 16-bit dtype (attn's 16-bit
    kernels, SPEC section 10); the rest float32 (mask bool)."""
    _KERNEL_CALLS["forward"] += 1
    opts = _c_options(mask, bias, sinks, slopes, causal, scale, window_left, window_right,
                      softcap, empty_rows)
    if q.dtype in _HALF:
        r = _call(_attn.sdpa, _np16(q), _np16(k), _np16(v), dtype=_HALF[q.dtype],
                  return_weights=want_weights, return_lse=True, **opts)
        out = _from_np16(r[0], q.dtype)
    else:
        r = _call(_attn.sdpa, _np(q), _np(k), _np(v), return_weights=want_weights,
                  return_lse=True, **opts)
        out = torch.from_numpy(r[0])
    weights = torch.from_numpy(r[1]) if want_weights else torch.empty(0)
    return out, torch.from_numpy(r[-1]), weights


def _backward_impl(q, k, v, out, lse, dout, bias, sinks, mask, slopes, causal, scale,
                   window_left, window_right, softcap, empty_rows):
    """attn.sdpa_backward: (dq, dk, dv in q's dtype, dbias in the bias's shape,
    dsinks [H]; an empty tensor for an option not given). attn's backward is
    float32: 16-bit q, k, v, out and dout are widened to float32 (exactly) for it,
    and the gradients rounded once to the inputs' dtype."""
    _KERNEL_CALLS["backward"] += 1
    opts = _c_options(mask, bias, sinks, slopes, causal, scale, window_left, window_right,
                      softcap, empty_rows)
    f32 = [t if t.dtype == torch.float32 else t.float() for t in (q, k, v, out, dout)]
    r = _call(_attn.sdpa_backward, _np(f32[0]), _np(f32[1]), _np(f32[2]), _np(f32[3]),
              _np(lse), _np(f32[4]), **opts)
    dq, dk, dv = (torch.from_numpy(a) for a in r[:3])
    if q.dtype != torch.float32:
        dq, dk, dv = dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)
    rest = list(r[3:])
    dbias = torch.from_numpy(rest.pop(0)) if bias is not None else torch.empty(0)
    dsinks = torch.from_numpy(rest.pop(0)) if sinks is not None else torch.empty(0)
    return dq, dk, dv, dbias, dsinks


def _opts_in_torch(q, k, v, bias, sinks, mask, slopes, causal, scale, window_left,
                   window_right, softcap, want_weights=True):
    """SPEC section 6's attention in PyTorch operations, (output, weights): what
    second derivatives, torch.func, jit.trace and torch.export before 2.4 run.
    A row that sees no key gives NaN here (PyTorch's softmax), zero with sinks."""
    H, Tq, D = q.shape[-3], q.shape[-2], q.shape[-1]
    Hkv, Tk = k.shape[-3], k.shape[-2]
    if Hkv != H:
        k, v = (t.repeat_interleave(H // Hkv, dim=-3) for t in (k, v))
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D) if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    i_end = torch.arange(Tq)[:, None] + (Tk - Tq)  # SPEC 6.3's i' for each query
    j = torch.arange(Tk)[None, :]
    if slopes is not None:
        s = s - slopes.to(s.dtype)[:, None, None] * (i_end - j).abs().to(s.dtype)
    visible = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal == 1:
        visible = visible & (j <= torch.arange(Tq)[:, None])
    elif causal == 2:
        visible = visible & (j <= i_end)
    if window_left >= 0:
        visible = visible & (j >= i_end - window_left)
    if window_right >= 0:
        visible = visible & (j <= i_end + window_right)
    if mask is not None:
        visible = visible & mask
    s = s.masked_fill(~visible, -math.inf)
    if sinks is not None:
        sink = sinks.to(s.dtype)[:, None, None].expand(s.shape[:-1] + (1,))
        weights = torch.softmax(torch.cat((s, sink), dim=-1), dim=-1)[..., :Tk]
    else:
        weights = torch.softmax(s, dim=-1)
    return torch.matmul(weights, v), weights


def _setup_context(ctx, inputs, output):
    (q, k, v, bias, sinks, mask, slopes, causal, scale, window_left, window_right, softcap,
     empty_rows, want_weights) = inputs
    out, lse, weights = output
    ctx.save_for_backward(q, k, v, bias, sinks, mask, slopes, out, lse, weights)
    ctx.opts = (causal, scale, window_left, window_right, softcap, empty_rows)
    ctx.want_weights = want_weights


def _backward(ctx, dout, dlse, dweights):
    """The forward operator's gradients: attn's C backward (the backward operator),
    plus, when a loss reads the weights (the chapter's function returns them), the
    softmax's own backward in PyTorch operations on the saved weights. Asked for
    a graph of itself (create_graph=True), it works the gradients out in PyTorch
    operations instead, as _SDPAFunction does."""
    q, k, v, bias, sinks, mask, slopes, out, lse, weights = ctx.saved_tensors
    causal, scale, wl, wr, softcap, empty_rows = ctx.opts
    nothing = (None,) * 9
    if dweights is not None and (not ctx.want_weights or dweights.numel() == 0):
        dweights = None
    if torch.is_grad_enabled():
        return _grads_in_torch(
            ctx, (q, k, v, bias, sinks),
            lambda q, k, v, bias, sinks: _opts_in_torch(q, k, v, bias, sinks, mask, slopes,
                                                        causal, scale, wl, wr, softcap),
            (dout, dweights)) + nothing
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dbias, dsinks = _BACKWARD(q, k, v, out, lse, dout, bias, sinks, mask, slopes,
                                          causal, scale, wl, wr, softcap, empty_rows)
    if dweights is not None:
        # Only the chapter's function returns the weights, with no option but a
        # mask: dS = P * (dP - rowsum(P * dP)), then the scores' scale.
        p = weights
        ds = p * (dweights - (p * dweights).sum(dim=-1, keepdim=True))
        sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        dq = dq + (sc * (ds @ k.float())).to(dq.dtype)
        dk = dk + (sc * (ds.transpose(-2, -1) @ q.float())).to(dk.dtype)
    need = ctx.needs_input_grad
    return (dq, dk, dv, dbias if bias is not None and need[3] else None,
            dsinks if sinks is not None and need[4] else None) + nothing


# torch.library.custom_op arrived in PyTorch 2.4; with it attn's forward and
# backward are operators of their own (attn::sdpa_forward, attn::sdpa_backward)
# that torch.compile and torch.export put in their graphs as they are, with
# shapes from the fake functions below and gradients from register_autograd.
_CUSTOM_OP = getattr(getattr(torch, "library", None), "custom_op", None)
_OPS = _CUSTOM_OP is not None and hasattr(torch.library, "register_autograd")

if _OPS:
    from typing import Optional, Tuple

    Tensor = torch.Tensor

    @_CUSTOM_OP("attn::sdpa_forward", mutates_args=())
    def _forward_op(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                    sinks: Optional[Tensor], mask: Optional[Tensor], slopes: Optional[Tensor],
                    causal: int, scale: Optional[float], window_left: int, window_right: int,
                    softcap: Optional[float], empty_rows: str,
                    want_weights: bool) -> Tuple[Tensor, Tensor, Tensor]:
        return _forward_impl(q, k, v, bias, sinks, mask, slopes, causal, scale, window_left,
                             window_right, softcap, empty_rows, want_weights)

    @_forward_op.register_fake
    def _(q, k, v, bias, sinks, mask, slopes, causal, scale, window_left, window_right,
          softcap, empty_rows, want_weights):
        rows = tuple(q.shape[:-1])
        out = q.new_empty(rows + (v.shape[-1],))
        lse = q.new_empty(rows, dtype=torch.float32)
        weights = q.new_empty(rows + (k.shape[-2],) if want_weights else (0,),
                              dtype=torch.float32)
        return out, lse, weights

    @_CUSTOM_OP("attn::sdpa_backward", mutates_args=())
    def _backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                     bias: Optional[Tensor], sinks: Optional[Tensor], mask: Optional[Tensor],
                     slopes: Optional[Tensor], causal: int, scale: Optional[float],
                     window_left: int, window_right: int, softcap: Optional[float],
                     empty_rows: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        return _backward_impl(q, k, v, out, lse, dout, bias, sinks, mask, slopes, causal,
                              scale, window_left, window_right, softcap, empty_rows)

    @_backward_op.register_fake
    def _(q, k, v, out, lse, dout, bias, sinks, mask, slopes, causal, scale, window_left,
          window_right, softcap, empty_rows):
        # New contiguous tensors, as the C call returns (not empty_like, which
        # would keep a strided input's strides).
        empty = q.new_empty(0, dtype=torch.float32)
        return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
                empty if bias is None else bias.new_empty(bias.shape),
                empty if sinks is None else sinks.new_empty(sinks.shape))

    torch.library.register_autograd("attn::sdpa_forward", _backward,
                                    setup_context=_setup_context)
    _FORWARD, _BACKWARD = _forward_op, _backward_op
else:
    class _OptsFunction(torch.autograd.Function):
        """PyTorch before 2.4 (Debian's 1.13): the same forward and backward as an
        autograd.Function (no custom operators there, so torch.compile, where it
        exists, breaks the graph at attn's call)."""

        @staticmethod
        def forward(ctx, *inputs):
            output = _forward_impl(*inputs)
            _setup_context(ctx, inputs, output)
            return output

        @staticmethod
        def backward(ctx, dout, dlse, dweights):
            return _backward(ctx, dout, dlse, dweights)

    def _FORWARD(*inputs):
        if torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in inputs[:5]):
            return _OptsFunction.apply(*inputs)
        return _forward_impl(*inputs)

    _BACKWARD = _backward_impl

_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _in_graph_capture():
    """Whether torch.compile or torch.export is capturing a graph right now and
    attn's custom operators exist (PyTorch >= 2.4): then attention goes into the
    graph as attn's operator, neither as a graph break nor as PyTorch operations."""
    if not _OPS:
        return False
    return bool((_IS_COMPILING is not None and _IS_COMPILING())
                or (_IS_EXPORTING is not None and _IS_EXPORTING()))


def _contiguous_in_graph(*tensors):
    """The tensors as they are, or contiguous while a graph is captured: Inductor
    expects the gradient of a strided input (the heads of a transpose) in that
    input's strides, which attn's backward operator, returning new contiguous
    tensors, does not give (its check fails: 'expected ... stride'). Eager calls
    read strided tensors in place."""
    if _in_graph_capture():
        return tuple(t.contiguous() for t in tensors)
    return tensors


def _alibi_slopes(H):
    """The ALiBi paper's slopes for H heads, float32 [H], by the rule the C
    library's attn_alibi_slopes follows (include/attn.h)."""
    m = 1
    while m * 2 <= H:
        m *= 2
    slopes = [2.0 ** (-8.0 * (h + 1) / m) if h < m else 2.0 ** (-8.0 * (2 * (h - m) + 1) / (2 * m))
              for h in range(H)]
    return torch.tensor(slopes, dtype=torch.float32)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False, *, window=None, softcap=None, alibi=None, bias=None, sinks=None,
         empty_rows="error"):
    """Scaled dot-product attention with SPEC section 6's options and autograd, on
    attn's kernels: torch.nn.functional.scaled_dot_product_attention's arguments,
    then attn.sdpa's options.

    query [B, H, Tq, D], key [B, Hkv, Tk, D], value [B, Hkv, Tk, Dv] (2 or 3 axes:
    leading sizes of 1); float32, or all bfloat16 or all float16 (attn's 16-bit
    kernels; the backward in float32, gradients rounded to that dtype), or float64
    (computed in float32). CPU tensors, any strides.
      attn_mask  bool (True: may attend) or float (added to the scores, with a
                 gradient when it requires one), broadcasting to [B, H, Tq, Tk].
      dropout_p  must be 0: attn has no dropout.
      is_causal  False, True or "top_left" (PyTorch's: query i sees keys j <= i),
                 or "bottom_right" (j <= i + Tk - Tq). May be combined with a mask.
      scale      instead of 1/sqrt(D).
      enable_gqa True to allow Hkv < H (H a multiple of Hkv), as PyTorch asks;
                 key/value head h // (H / Hkv) serves query head h, never copied,
                 and its gradient is summed over the group.
      window     (left, right): key j visible from query i iff
                 i' - left <= j <= i' + right, i' = i + Tk - Tq; -1 or None:
                 unbounded on that side.
      softcap    c > 0: each score s becomes c * tanh(s / c) (Gemma 2).
      alibi      True (the ALiBi paper's slopes) or slopes [H] (constants).
      bias       float, broadcasts to [B, H, Tq, Tk], added to the scores;
                 gradient in its own shape.
      sinks      [H]: one logit per query head in each row's softmax
                 denominator (gpt-oss); gradient [H].
      empty_rows "error" (a query row that sees no key raises ValueError) or
                 "zero" (its output is 0).
    Returns the output [B, H, Tq, Dv] (query's shape with value's last axis) in
    query's dtype. Gradients reach query, key, value, bias (and a float
    attn_mask) and sinks. Under torch.compile (fullgraph too) and torch.export
    (PyTorch >= 2.4) the forward and backward are the custom operators
    attn::sdpa_forward and attn::sdpa_backward.
    """
    if dropout_p != 0.0:
        raise ValueError("attn has no dropout: dropout_p must be 0, not %r" % (dropout_p,))
    half = _half_call_any(query, key, value)
    q, k, v = (_check_tensor(t, n, keep_half=half)
               for t, n in ((query, "query"), (key, "key"), (value, "value")))
    if not (2 <= q.dim() <= 4 and q.dim() == k.dim() == v.dim()):
        raise AttnShapeError("query, key and value need 2 to 4 axes, the same number: got "
                             "%s, %s and %s" % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    lead = q.dim()
    while q.dim() < 4:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv != H and not enable_gqa:
        raise ValueError("key and value have %d heads and query %d: pass enable_gqa=True for "
                         "grouped-query attention (query %s, key %s)"
                         % (Hkv, H, tuple(query.shape), tuple(key.shape)))
    if is_causal not in _CAUSAL_CODE:
        raise ValueError('is_causal must be False, True, "top_left" or "bottom_right", not %r'
                         % (is_causal,))
    causal = _CAUSAL_CODE[is_causal]
    mask = None
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError("attn_mask must be a torch.Tensor or None, not %s"
                            % type(attn_mask).__name__)
        if attn_mask.dtype == torch.bool:
            mask = _check_tensor_device(attn_mask, "attn_mask")
        else:
            added = _check_tensor(attn_mask, "attn_mask")
            bias = added if bias is None else _check_tensor(bias, "bias") + added
    if bias is not None:
        bias = _check_tensor(bias, "bias")
    if sinks is not None:
        sinks = _check_tensor(sinks, "sinks")
    slopes = None
    if isinstance(alibi, torch.Tensor):
        # Tested first: `in` and == compare an array element by element.
        slopes = _check_tensor(alibi, "alibi").detach()
    elif alibi is True:
        slopes = _alibi_slopes(H)
    elif not (alibi is None or alibi is False):
        raise TypeError("alibi must be None, True or a tensor of slopes [H], not %s"
                        % type(alibi).__name__)
    wl, wr = _window_pair(window)
    scale = None if scale is None else float(scale)
    softcap = None if softcap is None else float(softcap)
    if 0 in q.shape or 0 in k.shape or 0 in v.shape or _pytorch_only():
        # Empty sizes (the library takes sizes of at least 1), and torch.func,
        # jit.trace and exports before 2.4: SPEC 6's steps in PyTorch operations.
        out, _ = _opts_in_torch(q, k, v, bias, sinks, mask, slopes, causal, scale, wl, wr,
                                softcap)
    else:
        out = _FORWARD(*_contiguous_in_graph(q, k, v), bias, sinks, mask, slopes, causal, scale,
                       wl, wr, softcap, empty_rows, False)[0]
    while out.dim() > lead:
        out = out.squeeze(0)
    return out if out.dtype == query.dtype else out.to(query.dtype)


def _window_pair(window):
    """window as (left, right) ints, -1 for None (unbounded); (-1, -1) for None.
    Exactly two sides, each an int (or None): int() would truncate 1.7 to 1, and a
    third item was ignored, as attn.sdpa's numpy API never does."""
    if window is None:
        return -1, -1
    bad = TypeError("window must be a pair (left, right) of ints (-1 or None: unbounded), "
                    "not %r" % (window,))
    if isinstance(window, (str, bytes)):
        raise bad
    try:
        sides = tuple(window)
    except TypeError:
        raise bad from None
    if len(sides) != 2:
        raise bad
    try:
        return tuple(-1 if w is None else operator.index(w) for w in sides)
    except TypeError:
        raise bad from None


def _half_call_any(query, key, value):
    """Whether query, key and value are all one 16-bit dtype (kept as they are for
    attn's 16-bit forward, with or without a gradient)."""
    return (all(isinstance(t, torch.Tensor) for t in (query, key, value))
            and query.dtype in _HALF and key.dtype == value.dtype == query.dtype)


def _check_tensor_device(t, name):
    if t.device.type != "cpu":
        raise ValueError("attn.torch runs on the CPU, but %s is on %s; move it with .cpu()"
                         % (name, t.device))
    return t


# ---------------------------------------------------------------------------
# Grouped-query attention as an nn.Module (chapter 21's block, Llama's names)
# ---------------------------------------------------------------------------

def _rope_in_torch(x, pairing, base, offset):
    """RoPE on x [B, H, T, D] in PyTorch operations (attn.rope's rotation, for the
    paths that record or transform PyTorch operations): pair k of row t turned by
    (offset + t) * base^(-2k/D); "interleaved" pairs (2k, 2k+1), "half" (k, k+D/2)."""
    T, D = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.arange(offset, offset + T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    c, s = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    if pairing == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    a, b = x[..., :D // 2], x[..., D // 2:]
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)


class _GQAFunction(torch.autograd.Function):
    """attn's grouped-query forward (attn_gqa_forward, or with RoPE the packed
    forward) and attn_gqa_backward, on x [B, T, E] and the four projections'
    weights and biases (a bias may be None), float32 CPU."""

    @staticmethod
    def forward(ctx, x, wq, wk, wv, wo, bq, bk, bv, bo, spec):
        ctx.save_for_backward(x, wq, wk, wv, wo, bq, bk, bv, bo)
        ctx.spec = spec
        ctx.set_materialize_grads(False)
        return torch.from_numpy(_gqa_call(_attn._gqa_forward, x, (wq, wk, wv, wo, bq, bk, bv, bo),
                                          spec))

    @staticmethod
    def backward(ctx, dout):
        saved = ctx.saved_tensors
        if dout is None:
            return (None,) * 10
        if torch.is_grad_enabled():
            # create_graph=True: the block in PyTorch operations, as _SDPAFunction.
            return _grads_in_torch(ctx, saved, lambda *t: (_gqa_in_torch(*t, ctx.spec),),
                                   (dout,)) + (None,)
        grads = _gqa_call(_attn._gqa_backward, saved[0], saved[1:], ctx.spec, dout)
        # (A bias the module does not have gets no gradient.)
        return tuple(None if t is None else torch.from_numpy(g)
                     for t, g in zip(saved, grads)) + (None,)


def _gqa_call(fn, x, weights, spec, dout=None):
    H, Hkv, mask, causal, window, rope, rope_base, rope_offset = spec
    args = [_np(x)] + [None if w is None else _np(w) for w in weights] + [H, Hkv]
    if dout is not None:
        args.append(_np(dout))
    return _call(fn, *args, mask=None if mask is None else _np(mask), causal=causal,
                 window=window, rope=rope, rope_base=rope_base, rope_offset=rope_offset)


def _gqa_in_torch(x, wq, wk, wv, wo, bq, bk, bv, bo, spec):
    """The block in PyTorch operations, attention by sdpa (attn's operator under
    torch.compile and torch.export, PyTorch operations under a trace or torch.func)."""
    H, Hkv, mask, causal, window, rope, rope_base, rope_offset = spec
    B, T, _ = x.shape

    def heads(w, b, n):
        return nn.functional.linear(x, w, b).reshape(B, T, n, -1).transpose(1, 2)

    q, k, v = heads(wq, bq, H), heads(wk, bk, Hkv), heads(wv, bv, Hkv)
    if rope is not None:
        q, k = (_rope_in_torch(t, rope, rope_base, rope_offset) for t in (q, k))
    ctx = sdpa(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, window=window)
    return nn.functional.linear(ctx.transpose(1, 2).reshape(B, T, -1), wo, bo)


class GroupedQueryAttention(nn.Module):
    """Grouped-query self-attention (chapter 21's block; Llama's layer names),
    computed by attn's fused forward and backward (attn_gqa_forward,
    attn_gqa_backward).

    q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias), k_proj and v_proj
    nn.Linear(embed_dim, num_kv_heads * head_dim, bias), o_proj nn.Linear(num_heads
    * head_dim, embed_dim, bias); head_dim defaults to embed_dim // num_heads. Query
    head h reads key/value head h // (num_heads / num_kv_heads). rope: None,
    "interleaved" (chapter 21, GPT-J) or "half" (Llama), applied to q and k at
    positions rope_offset + t with base rope_base. The state_dict's names are the
    separate name set attn.mha_forward and attn.mha_backward take.
    """

    def __init__(self, embed_dim, num_heads, num_kv_heads, head_dim=None, bias=False,
                 rope="interleaved", rope_base=10000.0):
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError("num_heads (%d) must be a multiple of num_kv_heads (%d)"
                             % (num_heads, num_kv_heads))
        if rope not in (None, "interleaved", "half"):
            raise ValueError('rope must be None, "interleaved" or "half", not %r' % (rope,))
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = head_dim or embed_dim // num_heads
        self.rope, self.rope_base = rope, float(rope_base)
        self.q_proj = nn.Linear(embed_dim, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, embed_dim, bias=bias)

    def forward(self, x, attention_mask=None, is_causal=False, window=None, rope_offset=0):
        """x [B, T, E] -> [B, T, E]. attention_mask bool, broadcasting to
        [B, H, T, T]; is_causal False/True; window (left, right) as in sdpa."""
        xf = _check_tensor(x, "x")
        if xf.dim() != 3:
            raise AttnShapeError("x must be [batch, seq_len, embed_dim] (3 axes), not %s"
                                 % (tuple(x.shape),))
        layers = (self.q_proj, self.k_proj, self.v_proj, self.o_proj)
        params = [l.weight for l in layers] + [l.bias for l in layers]
        params = [None if p is None else (p if p.dtype == torch.float32 else p.float())
                  for p in params]
        mask = None if attention_mask is None else _check_tensor_device(attention_mask,
                                                                         "attention_mask")
        if window is not None:
            window = _window_pair(window)
        spec = (self.num_heads, self.num_kv_heads, mask, bool(is_causal), window, self.rope,
                self.rope_base, int(rope_offset))
        if 0 in xf.shape or _pytorch_only() or _in_graph_capture():
            out = _gqa_in_torch(xf, *params, spec)
        elif torch.is_grad_enabled() and (xf.requires_grad or any(
                p is not None and p.requires_grad for p in params)):
            out = _GQAFunction.apply(xf, *params, spec)
        else:
            out = torch.from_numpy(_gqa_call(_attn._gqa_forward, xf, params, spec))
        return out if out.dtype == x.dtype else out.to(x.dtype)
