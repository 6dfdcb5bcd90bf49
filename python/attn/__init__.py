"""attn: self-attention from scratch in C11, from Python.

numpy arrays in and out. float32 arrays (contiguous, or strided views with
non-negative strides) are read in place, without a copy; the GIL is released
while the C kernels run, so Python threads run attention in parallel. Library
errors raise ValueError (shapes, masks, options), MemoryError or OSError, with
the library's message; an argument that is not a float32 array raises TypeError.

sdpa also takes q, k and v in 16 bits (SPEC section 10), read in place too:
numpy float16 arrays, ml_dtypes.bfloat16 arrays (when the ml_dtypes package is
installed; attn does not need it), or uint16 arrays of bfloat16 bits with
dtype="bf16". Products and sums accumulate in float32; the output has the
inputs' dtype, the weights and log-sum-exp stay float32. A KVCache made with
dtype="bf16" or "f16" stores K and V in 16 bits (see its docstring), and
load_npy / load_safetensors(keep_half=True) keep 16-bit tensors as stored. The
other calls (multi-head attention, RoPE, the backwards) take float32 only.

Functions:
    sdpa(q, k, v, *, mask, causal, scale, window, softcap, alibi, bias, sinks,
         return_weights, return_lse, empty_rows, out)   scaled dot-product attention
    sdpa_backward(q, k, v, out, lse, dout, *, the same options)
                                                         its gradients (dq, dk, dv
                                                         [, dbias][, dsinks])
    padding_mask(token_ids, pad_id), causal_mask(T)      the chapter's masks
    mha_forward(x, weights, num_heads, ...)              multi-head self-attention
    mha_backward(x, weights, num_heads, dout, ...)       its gradients (dx, {name: grad}),
                                                         grouped-query and RoPE too
    rope(x, *, pairing, base, offset, out)               rotary position embedding
    KVCache(batch, kv_heads, capacity, head_dim, dtype=) a KV cache for decoding
    load_npy, save_npy, load_safetensors, save_safetensors
    arch()                                               which kernels run, and why
    Generator(seed)                                      PyTorch's CPU random numbers
"""

import operator as _operator
import os as _os
import threading as _threading

import numpy as _np

from ._attn import (  # noqa: F401  (re-exported)
    __version__,
    arch,
    causal_mask,
    load_npy,
    load_safetensors,
    padding_mask,
    rope,
    save_npy,
    save_safetensors,
    sdpa,
    sdpa_backward,
)
from . import _attn

__all__ = [
    "sdpa", "sdpa_backward", "padding_mask", "causal_mask", "mha_forward", "mha_backward",
    "rope", "KVCache",
    "load_npy", "save_npy", "load_safetensors", "save_safetensors", "arch", "Generator",
]

# The weight names attn_weights_load knows, and the grouped-query ones.
_CHAPTER = ("qkv.weight", "qkv.bias", "output.weight", "output.bias")
_TORCH = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
_SEPARATE = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")


def _f32(a, name):
    # Weights are small next to the activations: a float64 or non-contiguous
    # weight is converted here rather than refused (activations never are).
    if a is None:
        return None
    return _np.ascontiguousarray(a, dtype=_np.float32)


def _weights_dict(weights, prefix):
    if isinstance(weights, (str, bytes, _os.PathLike)):
        weights = load_safetensors(weights)
    if not isinstance(weights, dict):
        raise TypeError("weights must be a dict of arrays or the path of a .safetensors file, "
                        "not %s" % type(weights).__name__)
    prefix = prefix or ""
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def mha_forward(x, weights, num_heads, *, num_kv_heads=None, prefix="", mask=None,
                causal=False, scale=None, window=None, softcap=None, alibi=None, bias=None,
                sinks=None, empty_rows="error", return_weights=False, rope=None,
                rope_base=10000.0, rope_offset=0, threads=0):
    """Multi-head self-attention forward (the chapter's module, or Llama-style GQA).

    x [B, T, E] float32. weights: a dict {name: array} or the path of a
    .safetensors file, with (after `prefix`) one of these name sets:
      the chapter's   qkv.weight [3E, E], qkv.bias [3E], output.weight [E, E],
                      output.bias [E]
      nn.MultiheadAttention   in_proj_weight, in_proj_bias, out_proj.weight,
                      out_proj.bias
      separate        q_proj.weight [H*D, E], k_proj.weight and v_proj.weight
                      [Hkv*D, E], o_proj.weight [E, H*D], each .bias optional;
                      Hkv < H (grouped-query attention) when num_kv_heads is given
                      or k_proj has fewer rows than q_proj. With the first two
                      (a fused W_qkv) num_kv_heads may only be num_heads.
    mask: bool, broadcasts to [B, H, T, T] (e.g. padding_mask(ids, pad) & causal);
    causal, scale, window, softcap, alibi, bias, sinks, empty_rows: attn.sdpa's
    options, applied to every head's attention.
    rope: None, "interleaved" (chapter 21, GPT-J) or "half" (Llama, NeoX): q and k
    rotated at positions rope_offset + t after the projections, with base
    rope_base (attn.rope's rotation). threads: the library's worker threads for
    this call (0 or below: one per core the process may run on; the result has the same bits for any).
    Returns out [B, T, E], or (out, weights [B, H, T, T]) with return_weights.
    Raises ValueError for shapes, names and masks.
    """
    w = _weights_dict(weights, prefix)
    opts = dict(mask=mask, causal=causal, scale=scale, window=window, softcap=softcap,
                alibi=alibi, bias=bias, sinks=sinks, empty_rows=empty_rows,
                return_weights=return_weights, threads=threads)
    num_kv_heads = _kv_heads(w, num_heads, num_kv_heads)
    if (_CHAPTER[0] in w or _TORCH[0] in w) and rope is None:
        _, fused = _fused_weights(w)
        return _attn._mha_forward(x, *fused, num_heads, **opts)
    _, sep, heads = _separate_weights(w, prefix, num_heads, num_kv_heads)
    return _attn._gqa_forward(x, *sep, *heads, rope=rope, rope_base=rope_base,
                              rope_offset=rope_offset, **opts)


def _kv_heads(w, num_heads, num_kv_heads):
    """num_kv_heads as an int (None stays None). The chapter's and
    nn.MultiheadAttention's fused W_qkv have as many key/value heads as query
    heads, so another count is an error rather than ignored."""
    if num_kv_heads is None:
        return None
    try:
        num_kv_heads = _operator.index(num_kv_heads)
    except TypeError:
        raise TypeError("num_kv_heads must be an int or None, not %r" % (num_kv_heads,)) from None
    if (_CHAPTER[0] in w or _TORCH[0] in w) and num_kv_heads != num_heads:
        raise ValueError("num_kv_heads is %d, but the weights' fused %s has as many key/value "
                         "heads as query heads (%r): leave num_kv_heads out, or give separate "
                         "q_proj/k_proj/v_proj weights for grouped-query attention"
                         % (num_kv_heads, _CHAPTER[0] if _CHAPTER[0] in w else _TORCH[0],
                            num_heads))
    return num_kv_heads


def _separate_weights(w, prefix, num_heads, num_kv_heads):
    """(names, (w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o), (H, Hkv)) for
    _gqa_forward/_gqa_backward: the separate name set as it is (a missing bias
    None), or the chapter's or nn.MultiheadAttention's W_qkv split into its three
    row blocks (views, no copy: the library's grouped-query call with Hkv = H is
    the chapter's module, with RoPE too). names are the weights' names for the
    gradients, in the same order; None for a bias the weights do not have."""
    if _CHAPTER[0] in w or _TORCH[0] in w:
        names, (wqkv, bqkv, wo, bo) = _fused_weights(w)
        e = wqkv.shape[0] // 3
        if wqkv.ndim != 2 or wqkv.shape[0] != 3 * e:
            raise ValueError("%s has shape %s; expected [3E, E]" % (names[0], wqkv.shape))
        sep = (wqkv[:e], wqkv[e:2 * e], wqkv[2 * e:], wo, bqkv[:e], bqkv[e:2 * e], bqkv[2 * e:], bo)
        return names, sep, (num_heads, num_heads)
    if not all(n in w for n in _SEPARATE):
        raise ValueError("no weight name set found under prefix %r: looked for %s, %s or %s; "
                         "have %s" % (prefix, "/".join(_CHAPTER), "/".join(_TORCH),
                                      "/".join(_SEPARATE), sorted(w)))
    wq, wk, wv, wo = (_f32(w[n], n) for n in _SEPARATE)
    bias_names = tuple(n[:-len("weight")] + "bias" for n in _SEPARATE)
    bq, bk, bv, bo = (_f32(w.get(n), n) for n in bias_names)
    if num_kv_heads is None:
        # Inferred from the rows; at least 1, so that a k_proj too small for one
        # head is reported by the shape check, with both shapes.
        num_kv_heads = max(num_heads * wk.shape[0] // max(wq.shape[0], 1), 1)
    names = _SEPARATE + tuple(n if n in w else None for n in bias_names)
    return names, (wq, wk, wv, wo, bq, bk, bv, bo), (num_heads, num_kv_heads)


def _fused_weights(w):
    """(names, (w_qkv, b_qkv, w_o, b_o)) of the chapter's or nn.MultiheadAttention's
    name set in w, float32, a missing bias as zeros."""
    names = _CHAPTER if _CHAPTER[0] in w else _TORCH
    wqkv = _f32(w[names[0]], names[0])
    bqkv = w.get(names[1])
    bqkv = _np.zeros(wqkv.shape[0], _np.float32) if bqkv is None else _f32(bqkv, names[1])
    if names[2] not in w:
        raise ValueError("weights have %s but no %s" % (names[0], names[2]))
    wo = _f32(w[names[2]], names[2])
    bo = w.get(names[3])
    bo = _np.zeros(wo.shape[0], _np.float32) if bo is None else _f32(bo, names[3])
    return names, (wqkv, bqkv, wo, bo)


def mha_backward(x, weights, num_heads, dout, *, num_kv_heads=None, prefix="", mask=None,
                 causal=False, scale=None, window=None, softcap=None, alibi=None, bias=None,
                 sinks=None, empty_rows="error", rope=None, rope_base=10000.0, rope_offset=0,
                 threads=0):
    """The backward of mha_forward (attn_mha_backward / attn_gqa_backward, SPEC
    section 8), for a training loop in numpy: the gradients of a loss with respect
    to x and to the weights.

    x [B, T, E] float32, weights, num_heads, num_kv_heads, prefix, the options and
    RoPE exactly as given to mha_forward; dout [B, T, E] the loss's gradient with
    respect to mha_forward's output. Returns (dx [B, T, E], grads), grads a dict
    {name: gradient} named as the weights are, prefix included, each the shape of
    its weight:
      the chapter's / nn.MultiheadAttention's: the four names (qkv.weight [3E, E],
        qkv.bias [3E], output.weight [E, E], output.bias [E]); a bias missing from
        the weights (taken as zeros by the forward) still gets its gradient;
      separate (grouped-query attention): q_proj.weight [H*D, E], k_proj.weight
        and v_proj.weight [Hkv*D, E] (summed over the query heads of each group),
        o_proj.weight [E, H*D], and each bias the weights have.
    mask, bias, sinks and ALiBi's slopes are constants here: no gradient (for
    those, attn.sdpa_backward). threads as for mha_forward. Raises ValueError for
    shapes and names.
    """
    w = _weights_dict(weights, prefix)
    prefix = prefix or ""
    opts = dict(mask=mask, causal=causal, scale=scale, window=window, softcap=softcap,
                alibi=alibi, bias=bias, sinks=sinks, empty_rows=empty_rows, threads=threads)
    num_kv_heads = _kv_heads(w, num_heads, num_kv_heads)
    if (_CHAPTER[0] in w or _TORCH[0] in w) and rope is None:
        names, fused = _fused_weights(w)
        dx, *grads = _attn._mha_backward(x, *fused, num_heads, dout, **opts)
        return dx, {prefix + n: g for n, g in zip(names, grads)}
    names, sep, heads = _separate_weights(w, prefix, num_heads, num_kv_heads)
    dx, *grads = _attn._gqa_backward(x, *sep, *heads, dout, rope=rope, rope_base=rope_base,
                                     rope_offset=rope_offset, **opts)
    if names[0] in _SEPARATE:
        return dx, {prefix + n: g for n, g in zip(names, grads) if n is not None}
    # The chapter's W_qkv with RoPE: the three row blocks' gradients, stacked back.
    dwq, dwk, dwv, dwo, dbq, dbk, dbv, dbo = grads
    return dx, {prefix + names[0]: _np.concatenate([dwq, dwk, dwv]),
                prefix + names[1]: _np.concatenate([dbq, dbk, dbv]),
                prefix + names[2]: dwo, prefix + names[3]: dbo}


class KVCache:
    """A KV cache for decoding: keys [B, Hkv, capacity, D] and values
    [B, Hkv, capacity, Dv] of up to `capacity` positions per sequence, each
    sequence with its own length. Allocated once, at creation.

    append(k, v, first=0, rope=None)   k [Bn, Hkv, Tnew, D], v [Bn, Hkv, Tnew, Dv]
        into sequences first .. first+Bn-1; rope="interleaved"/"half" rotates the
        keys at their positions as they are stored (rope_base sets the base).
        A sequence without room fails the whole call (ValueError), appending nothing.
    attend(q, first=0, rope=None, **options)   q [Bn, H, Tq, D]: the last Tq
        positions of each sequence against its keys, always bottom-right causal
        as the C call is (causal=True says so; leaving it out changes nothing);
        the options of attn.sdpa. Returns out [Bn, H, Tq, Dv] (or a
        tuple with weights [Bn, H, Tq, capacity] / lse).
    truncate(length, seq=-1)   roll back one sequence (or all, seq=-1).
    length(seq)                positions sequence seq holds.
    view(seq)                  its keys and values [1, Hkv, length, D] as new arrays:
                               copies, not views of the cache, so writing into them
                               leaves the cache alone and a later append or truncate
                               leaves them alone.

    dtype: how K and V are stored. "f32" (the default), "f16" (or numpy.float16)
    or "bf16" (or ml_dtypes.bfloat16). append takes k and v in float32 (rounded
    once, to nearest even) or in the cache's dtype (copied bit for bit); attend
    takes q in float32 or the cache's dtype and returns out in q's dtype, the same
    kind of array as q, as attn.sdpa does; every product and sum is float32. In a
    16-bit cache a uint16 array holds the cache's dtype's bits (no dtype= needed:
    the cache says which). view returns the cache's dtype: float16 arrays, and for
    bfloat16 uint16 bits when the cache was made with "bf16", ml_dtypes.bfloat16
    arrays when it was made with ml_dtypes.bfloat16. Any other dtype is a
    TypeError that names it.

    The GIL is released while append and attend run; a lock serialises the calls
    on one cache, so threads may share it (separate caches run in parallel).
    """

    def __init__(self, batch, kv_heads, capacity, head_dim, value_dim=0, rope_base=10000.0,
                 dtype="f32"):
        self.dtype, self._ml_bf16 = _kv_dtype(dtype)
        self._c = _attn._kv_create(batch, kv_heads, capacity, head_dim, value_dim, self.dtype)
        self.batch, self.kv_heads, self.capacity = batch, kv_heads, capacity
        self.head_dim = head_dim
        self.value_dim = value_dim or head_dim
        self.rope_base = float(rope_base)
        self._lock = _threading.Lock()

    def length(self, seq=0):
        n = _attn._kv_length(self._c, seq)
        if n < 0:
            raise ValueError("sequence %d is not in 0 .. %d" % (seq, self.batch - 1))
        return n

    def append(self, k, v, first=0, rope=None):
        with self._lock:
            _attn._kv_append(self._c, first, k, v, rope, self.rope_base)

    def attend(self, q, first=0, rope=None, **options):
        # The C call's own arguments, which attend fills from the cache: given as
        # options they reached it twice and Python's message named _kv_attend.
        own = sorted(set(options) & {"pairing", "base", "capacity"})
        if own:
            raise TypeError("KVCache.attend() got an unexpected keyword argument %r: rope= "
                            "picks the pairing, and the base (rope_base) and capacity are "
                            "the cache's own, set when it is made" % own[0])
        if options.get("causal") is True:
            options["causal"] = "bottom_right"
        with self._lock:
            return _attn._kv_attend(self._c, first, q, self.capacity, pairing=rope,
                                    base=self.rope_base, **options)

    def truncate(self, length, seq=-1):
        with self._lock:
            _attn._kv_truncate(self._c, seq, length)

    def view(self, seq=0):
        """Copies of sequence seq's keys and values, [1, Hkv, length, D] and
        [1, Hkv, length, Dv] (see the class's docstring: copies, not views)."""
        with self._lock:
            k, v = _attn._kv_view(self._c, seq)
        if self._ml_bf16 is not None:
            k, v = k.view(self._ml_bf16), v.view(self._ml_bf16)
        return k, v


_KV_DTYPES = {"f32": "f32", "float32": "f32", "bf16": "bf16", "bfloat16": "bf16",
              "f16": "f16", "float16": "f16"}


def _kv_dtype(dtype):
    """KVCache's dtype= as ("f32" | "bf16" | "f16", the ml_dtypes bfloat16 dtype
    when views should be of it, else None). Strings name a dtype as sdpa's dtype=
    does (bfloat16 given as a string means uint16 bits, as there); a numpy dtype or
    scalar type names its own. Never imports ml_dtypes: an ml_dtypes.bfloat16
    given here is already imported."""
    if dtype is None:
        # np.dtype(None) is float64, which would name the wrong thing below.
        raise TypeError('KVCache dtype must be "f32", "bf16" or "f16" (or numpy.float32, '
                        'numpy.float16, ml_dtypes.bfloat16), not None')
    if isinstance(dtype, str):
        if dtype in _KV_DTYPES:
            return _KV_DTYPES[dtype], None
        raise TypeError('KVCache dtype must be "f32", "bf16" or "f16" (or numpy.float32, '
                        'numpy.float16, ml_dtypes.bfloat16), not %r' % (dtype,))
    try:
        dt = _np.dtype(dtype)
    except TypeError:
        dt = None
    if dt == _np.float32:
        return "f32", None
    if dt == _np.float16:
        return "f16", None
    if dt is not None and dt.name == "bfloat16" and dt.itemsize == 2:
        return "bf16", dt
    raise TypeError('KVCache dtype must be "f32", "bf16" or "f16" (or numpy.float32, '
                    'numpy.float16, ml_dtypes.bfloat16), not %s'
                    % (dt if dt is not None else repr(dtype)))


class Generator:
    """PyTorch's CPU generator, draw for draw: after Generator(seed), randn(*shape)
    equals torch.randn(*shape) after torch.manual_seed(seed), and linear(in_features,
    out_features) equals nn.Linear(in_features, out_features)'s initial (weight
    [out, in], bias [out]), both uniform in +-1/sqrt(in_features). Draws continue
    from one call to the next, as torch's global generator does. float32 out.
    """

    def __init__(self, seed):
        # torch.manual_seed's range, a negative seed as its 64-bit two's
        # complement (what the C call's unsigned conversion does); past it torch
        # raises, where the conversion would wrap silently to another seed.
        seed = _operator.index(seed)
        if not -2 ** 63 <= seed < 2 ** 64:
            raise ValueError("seed must be in -2**63 .. 2**64 - 1, as torch.manual_seed's, "
                             "not %d" % seed)
        self._g = _attn._rng_new(seed)

    def randn(self, *shape):
        a = _np.empty(shape, _np.float32)
        _attn._rng_fill(self._g, a, 0, None)
        return a

    def linear(self, in_features, out_features):
        w = _np.empty((out_features, in_features), _np.float32)
        b = _np.empty(out_features, _np.float32)
        _attn._rng_fill(self._g, w, 1, b)
        return w, b
