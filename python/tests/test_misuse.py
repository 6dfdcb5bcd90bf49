"""Misuse that used to pass silently or raise a message that did not name the
argument (an audit's probes): each is now an exception of the right type that
says what was wrong, or, for a numpy bool, the value it means."""
import numpy as np
import pytest

import attn


def qkv(B=1, H=4, Hkv=2, Tq=3, Tk=5, D=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, Tq, D)).astype(np.float32),
            rng.standard_normal((B, Hkv, Tk, D)).astype(np.float32),
            rng.standard_normal((B, Hkv, Tk, D)).astype(np.float32))


@pytest.mark.parametrize("window", [(1.5, 0), (0, float("nan")), (2 ** 70, 0), ("2", 0)])
def test_a_window_side_that_is_not_an_int_names_window(window):
    """Before: TypeError "'float' object cannot be interpreted as an integer" or
    OverflowError "int too big to convert", neither naming the argument."""
    q, k, v = qkv()
    with pytest.raises((TypeError, ValueError), match="window"):
        attn.sdpa(q, k, v, window=window)


def test_a_numpy_bool_is_a_bool_for_causal():
    """causal=np.bool_(True) (what a comparison of numpy values gives) means True;
    before it was a TypeError whose message ended 'not True'."""
    q, k, v = qkv(Tq=5)
    for flag in (True, False):
        assert np.array_equal(attn.sdpa(q, k, v, causal=np.bool_(flag)),
                              attn.sdpa(q, k, v, causal=flag))
    with pytest.raises(TypeError, match="int"):
        attn.sdpa(q, k, v, causal=1)


@pytest.mark.parametrize("name", ["q", "k", "v", "bias"])
def test_a_masked_array_is_refused_not_read_without_its_mask(name):
    """attn reads an array's memory: a numpy.ma.MaskedArray's mask was ignored
    and its hidden entries used as numbers. It is a TypeError naming it."""
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, bias=np.zeros((3, 5), np.float32))
    args[name] = np.ma.masked_array(args[name], mask=args[name] > 0)
    with pytest.raises(TypeError, match=name + r" is a numpy\.ma\.MaskedArray"):
        attn.sdpa(args["q"], args["k"], args["v"], bias=args["bias"])


@pytest.mark.parametrize("value", [1e300, -1e39])
def test_a_scale_beyond_float32_says_so(value):
    """scale=1e300 was reported as 'scale inf is not a finite number'."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="scale .* float32"):
        attn.sdpa(q, k, v, scale=value)
    with pytest.raises(ValueError, match="softcap .* float32"):
        attn.sdpa(q, k, v, softcap=abs(value))


@pytest.mark.parametrize("alibi", [1.0, "yes", [0.5, 0.25, 0.125, 0.0625]])
def test_alibi_that_is_neither_true_nor_an_array_names_what_it_takes(alibi):
    q, k, v = qkv()
    with pytest.raises(TypeError, match="alibi must be None, False, True or"):
        attn.sdpa(q, k, v, alibi=alibi)


def fused_weights(E=16, seed=1):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {"qkv.weight": f(3 * E, E), "qkv.bias": f(3 * E),
            "output.weight": f(E, E), "output.bias": f(E)}


@pytest.mark.parametrize("nkv", [1, 2, 3, 0])
def test_num_kv_heads_with_the_chapters_weights_must_be_num_heads(nkv):
    """The chapter's qkv weights have as many key/value heads as query heads; a
    num_kv_heads that says otherwise was ignored (the call ran as plain
    multi-head attention)."""
    x = np.random.default_rng(2).standard_normal((2, 5, 16)).astype(np.float32)
    w = fused_weights()
    with pytest.raises(ValueError, match="num_kv_heads"):
        attn.mha_forward(x, w, 4, num_kv_heads=nkv)
    with pytest.raises(ValueError, match="num_kv_heads"):
        attn.mha_backward(x, w, 4, x, num_kv_heads=nkv)
    attn.mha_forward(x, w, 4, num_kv_heads=4)  # the true count is taken


@pytest.mark.parametrize("nkv", [0, -2])
def test_num_kv_heads_below_one_is_named_as_given(nkv):
    """num_kv_heads=0 was made 1, and the error then spoke of 'num_kv_heads 1'."""
    rng = np.random.default_rng(3)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    w = {"q_proj.weight": f(16, 16), "k_proj.weight": f(8, 16), "v_proj.weight": f(8, 16),
         "o_proj.weight": f(16, 16)}
    x = f(2, 5, 16)
    with pytest.raises(ValueError, match=r"num_kv_heads \(%d\) must be at least 1" % nkv):
        attn.mha_forward(x, w, 4, num_kv_heads=nkv)
    with pytest.raises(TypeError, match="num_kv_heads"):
        attn.mha_forward(x, w, 4, num_kv_heads=2.5)


def test_kv_cache_dtype_none_is_named_as_none():
    """np.dtype(None) is float64, so dtype=None was refused as 'not float64'."""
    with pytest.raises(TypeError, match="not None"):
        attn.KVCache(1, 1, 4, 4, dtype=None)


@pytest.mark.parametrize("name", ["pairing", "base", "capacity"])
def test_kv_attend_refuses_the_c_calls_own_arguments_naming_them(name):
    """attend fills pairing, base and capacity from rope= and the cache; given as
    options they were 'multiple values for keyword argument' of _kv_attend. The
    cache stays usable after the error."""
    c = attn.KVCache(1, 2, 8, 4)
    k = np.ones((1, 2, 3, 4), np.float32)
    c.append(k, k)
    q = np.ones((1, 2, 1, 4), np.float32)
    with pytest.raises(TypeError, match="KVCache.attend.*'%s'" % name):
        c.attend(q, **{name: 1})
    out = c.attend(q)
    assert out.shape == (1, 2, 1, 4) and np.allclose(out, 1.0)


@pytest.mark.parametrize("seed", [2 ** 64, 2 ** 64 + 5, -2 ** 63 - 1])
def test_a_seed_outside_torchs_range_is_refused_not_wrapped(seed):
    """torch.manual_seed takes -2**63 .. 2**64 - 1 (a negative seed as its
    64-bit two's complement) and raises past it; Generator(2**64) gave the
    draws of Generator(0), silently."""
    with pytest.raises(ValueError, match="seed"):
        attn.Generator(seed)
    assert np.array_equal(attn.Generator(-1).randn(3), attn.Generator(2 ** 64 - 1).randn(3))


def test_save_npy_of_an_unsupported_dtype_names_the_ones_it_takes(tmp_path):
    """The message was 'array must be of a supported dtype, not float64'."""
    with pytest.raises(TypeError, match="float32, int64, int32 or bool, not float64"):
        attn.save_npy(tmp_path / "a.npy", np.zeros((2, 2)))
