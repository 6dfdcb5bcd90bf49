"""Masks, options, multi-head attention, the KV cache, RoPE and files from Python."""
import numpy as np
import pytest

import attn


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_masks_are_the_chapters():
    """padding_mask is [B, 1, 1, T], False at pad keys; causal_mask is lower triangular."""
    ids = np.array([[5, 6, 0], [7, 0, 0]], np.int64)
    pad = attn.padding_mask(ids, 0)
    assert pad.shape == (2, 1, 1, 3) and pad.dtype == bool
    assert np.array_equal(pad[:, 0, 0], ids != 0)
    assert np.array_equal(attn.padding_mask(ids.astype(np.int32), 0), pad)
    c = attn.causal_mask(4)
    assert c.shape == (1, 1, 4, 4)
    assert np.array_equal(c[0, 0], np.tril(np.ones((4, 4), bool)))


def test_returns_follow_the_flags():
    """sdpa returns out alone, or (out, weights), (out, lse), (out, weights, lse)."""
    q, k, v = rand(2, 4, 5, 4, seed=1), rand(2, 4, 6, 4, seed=2), rand(2, 4, 6, 3, seed=3)
    out = attn.sdpa(q, k, v)
    assert isinstance(out, np.ndarray) and out.shape == (2, 4, 5, 3)
    o, w = attn.sdpa(q, k, v, return_weights=True)
    assert w.shape == (2, 4, 5, 6) and np.array_equal(o, out)
    o, l = attn.sdpa(q, k, v, return_lse=True)
    assert l.shape == (2, 4, 5)
    o, w, l2 = attn.sdpa(q, k, v, return_weights=True, return_lse=True)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    assert np.array_equal(l, l2)


def test_causal_true_is_top_left_and_bottom_right_differs_when_tq_lt_tk():
    """causal=True equals "top_left"; with Tq < Tk "bottom_right" lets the last query see all."""
    q, k, v = rand(1, 2, 3, 4, seed=4), rand(1, 2, 5, 4, seed=5), rand(1, 2, 5, 4, seed=6)
    _, w1 = attn.sdpa(q, k, v, causal=True, return_weights=True)
    _, w2 = attn.sdpa(q, k, v, causal="top_left", return_weights=True)
    _, w3 = attn.sdpa(q, k, v, causal="bottom_right", return_weights=True)
    assert np.array_equal(w1, w2)
    assert np.all(w1[..., 0, 1:] == 0) and np.all(w3[..., -1, :] > 0)


def test_empty_rows_zero_gives_zeros_not_nan():
    """A fully masked row is an error by default and zeros with empty_rows="zero"."""
    q, k, v = rand(1, 1, 2, 4), rand(1, 1, 2, 4, seed=1), rand(1, 1, 2, 4, seed=2)
    mask = np.array([[True, True], [False, False]])
    with pytest.raises(ValueError):
        attn.sdpa(q, k, v, mask=mask)
    out = attn.sdpa(q, k, v, mask=mask, empty_rows="zero")
    assert np.all(out[0, 0, 1] == 0) and not np.any(np.isnan(out))


def test_gqa_reads_the_shared_head():
    """With Hkv = 2 and H = 4, query head 3 attends to key/value head 1."""
    q, k, v = rand(1, 4, 3, 8), rand(1, 2, 3, 8, seed=1), rand(1, 2, 3, 8, seed=2)
    out = attn.sdpa(q, k, v)
    one = attn.sdpa(q[:, 3:4], k[:, 1:2], v[:, 1:2])
    assert np.array_equal(out[:, 3:4], one)


def test_mha_with_a_dict_of_torch_names_equals_the_chapter_names():
    """nn.MultiheadAttention's names and the chapter's give the same output."""
    E, H = 8, 2
    x = rand(2, 3, E)
    w = {"qkv.weight": rand(3 * E, E, seed=1), "qkv.bias": rand(3 * E, seed=2),
         "output.weight": rand(E, E, seed=3), "output.bias": rand(E, seed=4)}
    t = {"in_proj_weight": w["qkv.weight"], "in_proj_bias": w["qkv.bias"],
         "out_proj.weight": w["output.weight"], "out_proj.bias": w["output.bias"]}
    a = attn.mha_forward(x, w, H, causal=True)
    b = attn.mha_forward(x, t, H, causal=True)
    assert a.shape == (2, 3, E) and np.array_equal(a, b)


def test_kv_cache_decoding_equals_the_causal_pass():
    """Appending keys one token at a time and attending gives the full causal pass."""
    B, H, Hkv, T, D = 2, 4, 2, 6, 8
    q, k, v = rand(B, H, T, D), rand(B, Hkv, T, D, seed=1), rand(B, Hkv, T, D, seed=2)
    full = attn.sdpa(q, k, v, causal=True)
    cache = attn.KVCache(B, Hkv, capacity=8, head_dim=D)
    outs = []
    for t in range(T):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        outs.append(cache.attend(q[:, :, t:t + 1], causal=True))
    assert cache.length(0) == T and cache.length(1) == T
    np.testing.assert_allclose(np.concatenate(outs, axis=2), full, rtol=1e-5, atol=2e-6)
    kk, vv = cache.view(1)
    assert np.array_equal(kk[0], k[1]) and np.array_equal(vv[0], v[1])
    cache.truncate(2)
    assert cache.length(0) == 2
    with pytest.raises(ValueError):
        cache.append(rand(B, Hkv, 7, D), rand(B, Hkv, 7, D))  # 2 + 7 > capacity 8
    assert cache.length(0) == 2, "a failed append changed the length"


def test_kv_cache_view_returns_copies_that_neither_side_can_change():
    """KVCache.view gives copies: writing into them leaves the cache alone, and a later
    truncate and append into the cache leaves an earlier view's values alone."""
    B, Hkv, D = 2, 2, 4
    k, v = rand(B, Hkv, 3, D, seed=5), rand(B, Hkv, 3, D, seed=6)
    cache = attn.KVCache(B, Hkv, capacity=5, head_dim=D)
    cache.append(k, v)
    kk, vv = cache.view(0)
    assert kk.shape == (1, Hkv, 3, D) and vv.shape == (1, Hkv, 3, D), (kk.shape, vv.shape)
    assert kk.flags.owndata and kk.flags.writeable, kk.flags
    kk[...] = 99.0
    vv[...] = 99.0
    again_k, again_v = cache.view(0)
    assert np.array_equal(again_k[0], k[0]) and np.array_equal(again_v[0], v[0]), \
        "writing into a view changed the cache: %s" % again_k
    cache.truncate(1)
    cache.append(rand(B, Hkv, 2, D, seed=7), rand(B, Hkv, 2, D, seed=8))
    assert np.array_equal(again_k[0], k[0]) and np.array_equal(again_v[0], v[0]), \
        "a later append changed an earlier view: %s" % again_k
    assert not np.array_equal(cache.view(0)[0][0, :, 1:], k[0, :, 1:3]), "append wrote nothing"


def test_kv_cache_rope_equals_rope_then_sdpa():
    """Keys rotated as they are stored and queries at their positions equal attn.rope first."""
    B, H, T, D = 1, 2, 5, 8
    q, k, v = rand(B, H, T, D), rand(B, H, T, D, seed=1), rand(B, H, T, D, seed=2)
    want = attn.sdpa(attn.rope(q, pairing="half"), attn.rope(k, pairing="half"), v, causal=True)
    cache = attn.KVCache(B, H, 8, D)
    cache.append(k, v, rope="half")
    got = cache.attend(q, rope="half", causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_files_round_trip(tmp_path):
    """save_npy/load_npy and save_safetensors/load_safetensors keep values and order."""
    a = rand(2, 3, 4)
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    m = np.array([[True, False]])
    attn.save_npy(tmp_path / "a.npy", a[:, ::2])  # a strided view is written as its values
    assert np.array_equal(attn.load_npy(tmp_path / "a.npy"), a[:, ::2])
    assert np.array_equal(np.load(tmp_path / "a.npy"), a[:, ::2])
    attn.save_safetensors(str(tmp_path / "t.safetensors"), {"z": a, "ids": ids, "m": m})
    d = attn.load_safetensors(tmp_path / "t.safetensors")
    assert list(d) == ["z", "ids", "m"]
    assert np.array_equal(d["z"], a) and np.array_equal(d["ids"], ids)
    assert np.array_equal(d["m"], m)


def test_arch_says_what_runs():
    """arch() names the selected instruction set and the reason."""
    info = attn.arch()
    assert info["selected"] in ("ref", "scalar", "avx2", "avx512", "avx512bf16", "amx")
    assert info["reason"] and info["threads"] >= 1


@pytest.mark.parametrize("fn", [attn.sdpa, attn.mha_forward, attn.rope, attn.padding_mask,
                                attn.causal_mask, attn.KVCache, attn.load_npy, attn.save_npy,
                                attn.load_safetensors, attn.save_safetensors, attn.arch])
def test_every_function_has_a_docstring_with_shapes_or_types(fn):
    """help() on each public function shows a real docstring."""
    doc = fn.__doc__ or ""
    assert len(doc) > 80, "%s has a docstring of %d characters" % (fn.__name__, len(doc))
