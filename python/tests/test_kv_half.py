"""attn.KVCache in 16 bits (SPEC section 9 and 10) and the loaders' keep_half=True.

A cache made with dtype="bf16" or "f16" stores K and V in that dtype: float32 keys
and values are rounded once to nearest even as they are appended, 16-bit ones are
copied bit for bit, and attend takes q in float32 or the cache's dtype. The
accuracy rule is test_half.py's with PyTorch's term left out (the floor alone,
which is the stricter bound): against a float64 oracle on the exact stored values,

    max |attn - oracle|  <=  floor = 2^-8 (bfloat16), 2^-11 (float16) x max |oracle|
"""
import gc
import json
import os
import struct
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import attn
from test_half import FLOOR_EXP, bf16_bits, bf16_values, to_dtype, widen


def oracle(q, k, v, causal=True):
    """float64 attention of q [B, H, Tq, D] against k, v [B, Hkv, Tk, *] with
    grouped heads and the bottom-right causal mask (the cache's only one)."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
    if causal:
        i = np.arange(Tq)[:, None] + Tk - Tq
        s = np.where(np.arange(Tk)[None, :] <= i, s, -np.inf)
    s -= s.max(-1, keepdims=True)
    w = np.exp(s)
    return (w / w.sum(-1, keepdims=True)) @ v


def stored(x, dtype):
    """x's values as a `dtype` cache stores them (rounded once), in float64."""
    return to_dtype(x, dtype)[1]


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


SHAPES = [  # (B, H, Hkv, chunks of keys appended, Tq, D, Dv)
    (1, 1, 1, (1,), 1, 8, 8),
    (2, 4, 2, (3, 14), 1, 16, 16),
    (1, 6, 2, (17,), 3, 64, 32),
    (2, 3, 1, (100, 13), 17, 8, 24),
]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B%d-H%d-Hkv%d-T%s-Tq%d-D%d-Dv%d" % (
    s[0], s[1], s[2], "+".join(map(str, s[3])), s[4], s[5], s[6]))
def test_16_bit_cache_is_within_the_rule_of_a_float64_oracle(dtype, shape):
    """float32 K and V appended in chunks to a 16-bit cache, attended with a float32
    q (float32 out) and with q in the cache's dtype (16-bit out), stay within the
    floor of the float64 oracle on the stored values, grouped heads, Dv != D and
    bottom-right causal included; the views hold exactly the rounded values."""
    B, H, Hkv, chunks, Tq, D, Dv = shape
    rng = np.random.default_rng(sum(shape[:3]) + sum(chunks) + D + Dv)
    Tk = sum(chunks)
    k, v = rand(rng, B, Hkv, Tk, D), rand(rng, B, Hkv, Tk, Dv)
    cache = attn.KVCache(B, Hkv, Tk + 2, D, Dv, dtype=dtype)
    t = 0
    for n in chunks:
        cache.append(k[:, :, t:t + n], v[:, :, t:t + n])
        t += n
    ks, vs = stored(k, dtype), stored(v, dtype)
    for b in range(B):
        kv, vv = cache.view(b)
        assert kv.dtype == (np.float16 if dtype == "f16" else np.uint16), kv.dtype
        assert np.array_equal(widen(kv, dtype), ks[b:b + 1]), "keys are not rounded once"
        assert np.array_equal(widen(vv, dtype), vs[b:b + 1]), "values are not rounded once"
    q32 = rand(rng, B, H, Tq, D)
    q16, q16_exact = to_dtype(q32, dtype)
    for q, exact in ((q32, q32.astype(np.float64)), (q16, q16_exact)):
        want = oracle(exact, ks, vs)
        out = cache.attend(q, causal=True)
        assert out.dtype == q.dtype and out.shape == (B, H, Tq, Dv), (out.dtype, out.shape)
        got = out.astype(np.float64) if q is q32 else widen(out, dtype)
        err = np.abs(got - want).max()
        floor = 2.0 ** FLOOR_EXP[dtype] * np.abs(want).max()
        assert err <= floor, "%s q %s: error %g above the floor %g" % (dtype, q.dtype, err,
                                                                       floor)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_16_bit_cache_gives_sdpas_bits_on_the_same_16_bit_keys(dtype):
    """attend with q in the cache's dtype gives, sequence by sequence, the bits of
    attn.sdpa on the same 16-bit q and the cache's views (sequences of different
    lengths, bottom-right causal, grouped heads): the same kernel, the same bits."""
    rng = np.random.default_rng(3)
    B, H, Hkv, D, Dv, Tq = 3, 4, 2, 16, 8, 2
    cache = attn.KVCache(B, Hkv, 40, D, Dv, dtype=dtype)
    for b, n in enumerate((5, 17, 33)):
        k16, _ = to_dtype(rand(rng, 1, Hkv, n, D), dtype)
        v16, _ = to_dtype(rand(rng, 1, Hkv, n, Dv), dtype)
        cache.append(k16, v16, first=b)
        kv, vv = cache.view(b)
        assert np.array_equal(kv, k16) and np.array_equal(vv, v16), "not copied bit for bit"
    q, _ = to_dtype(rand(rng, B, H, Tq, D), dtype)
    out = cache.attend(q, causal=True)
    kw = {"dtype": dtype} if dtype == "bf16" else {}
    for b in range(B):
        kv, vv = cache.view(b)
        want = attn.sdpa(q[b:b + 1], kv, vv, causal="bottom_right", **kw)
        assert np.array_equal(out[b:b + 1], want), (b, out[b:b + 1], want)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_rope_into_a_16_bit_cache_rounds_the_float32_rotation_once(dtype):
    """Keys turned by RoPE as they go into a 16-bit cache are the float32 cache's
    turned keys rounded once: the rotation is computed in float32, not in 16 bits."""
    rng = np.random.default_rng(4)
    k, v = rand(rng, 2, 2, 7, 16), rand(rng, 2, 2, 7, 16)
    c32 = attn.KVCache(2, 2, 9, 16)
    c16 = attn.KVCache(2, 2, 9, 16, dtype=dtype)
    for c in (c32, c16):
        c.append(k[:, :, :3], v[:, :, :3], rope="half")
        c.append(k[:, :, 3:], v[:, :, 3:], rope="half")
    for b in range(2):
        want = to_dtype(c32.view(b)[0], dtype)[0]
        got = c16.view(b)[0]
        assert np.array_equal(got, want), (b, got, want)


EVERY_PATH = '''
import sys
import attn
import test_kv_half as t

assert attn.arch()["selected"] == sys.argv[1], attn.arch()
n = 0
for dtype in ("bf16", "f16"):
    for shape in t.SHAPES:
        t.test_16_bit_cache_is_within_the_rule_of_a_float64_oracle(dtype, shape)
        n += 1
    t.test_16_bit_cache_gives_sdpas_bits_on_the_same_16_bit_keys(dtype)
    t.test_rope_into_a_16_bit_cache_rounds_the_float32_rotation_once(dtype)
    n += 2
print("ok", sys.argv[1], n)
'''


@pytest.mark.parametrize("arch", ["ref", "scalar", "avx2", "avx512"])
def test_every_instruction_set_path_meets_the_rule_and_gives_sdpas_bits(arch):
    """With ATTN_ARCH forcing each path this CPU has (one interpreter each: the
    dispatch is decided once per process), the oracle, sdpa-bits and RoPE tests above
    all pass."""
    order = ["ref", "scalar", "avx2", "avx512", "avx512bf16", "amx"]
    best = attn.arch()["best"]
    if order.index(arch) > order.index(best):
        pytest.skip("this CPU's best path is %s, so %s cannot run here" % (best, arch))
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ATTN_ARCH=arch, PYTHONPATH=os.pathsep.join([here] + sys.path))
    r = subprocess.run([sys.executable, "-c", EVERY_PATH, arch], capture_output=True,
                       text=True, env=env)
    n = 2 * (len(SHAPES) + 2)
    last = r.stdout.strip().splitlines()[-1:] or [""]
    assert r.returncode == 0 and last[0] == "ok %s %d" % (arch, n), \
        "ATTN_ARCH=%s:\nstdout: %s\nstderr: %s" % (arch, r.stdout[-3000:], r.stderr[-3000:])


def test_ml_dtypes_bfloat16_cache_gives_the_bits_of_the_uint16_path():
    """A cache made with dtype=ml_dtypes.bfloat16 takes and gives ml_dtypes arrays:
    its views and attend's output are the bits of the uint16 ("bf16") cache."""
    ml_dtypes = pytest.importorskip(
        "ml_dtypes", reason="ml_dtypes is not installed; bfloat16 is tested as uint16 "
        "bits with dtype=\"bf16\" (tested above)")
    rng = np.random.default_rng(5)
    k, v, q = rand(rng, 1, 2, 9, 8), rand(rng, 1, 2, 9, 8), rand(rng, 1, 4, 2, 8)
    bits = attn.KVCache(1, 2, 9, 8, dtype="bf16")
    ml = attn.KVCache(1, 2, 9, 8, dtype=ml_dtypes.bfloat16)
    bits.append(bf16_bits(k), bf16_bits(v))
    ml.append(bf16_bits(k).view(ml_dtypes.bfloat16), v)
    (kb, vb), (km, vm) = bits.view(0), ml.view(0)
    assert km.dtype == ml_dtypes.bfloat16 and kb.dtype == np.uint16, (km.dtype, kb.dtype)
    assert np.array_equal(km.view(np.uint16), kb) and np.array_equal(vm.view(np.uint16), vb)
    want = bits.attend(bf16_bits(q), causal=True)
    got = ml.attend(bf16_bits(q).view(ml_dtypes.bfloat16), causal=True)
    assert got.dtype == ml_dtypes.bfloat16, got.dtype
    assert np.array_equal(got.view(np.uint16), want), (got, want)
    assert np.array_equal(ml.attend(bf16_bits(q), causal=True), want), "uint16 q on ml cache"


def test_bad_cache_dtypes_are_type_errors_naming_them():
    """An unknown dtype= and arrays of a dtype the cache does not take are TypeErrors
    that name the dtypes; a float32 cache still refuses 16-bit arrays, saying how to
    make a 16-bit one."""
    for bad in ("int8", "float64", np.float64, np.int16, None):
        with pytest.raises(TypeError, match="KVCache dtype must be \"f32\", \"bf16\" or "
                                            "\"f16\""):
            attn.KVCache(1, 1, 4, 4, dtype=bad)
    x = np.zeros((1, 1, 2, 4), np.float32)
    h, b = x.astype(np.float16), bf16_bits(x)
    cb = attn.KVCache(1, 1, 4, 4, dtype="bf16")
    ch = attn.KVCache(1, 1, 4, 4, dtype="f16")
    c32 = attn.KVCache(1, 1, 4, 4)
    cases = [
        (lambda: cb.append(h, x), "k must be float32 or bfloat16 \\(the KV cache's dtype.*"
                                  "not float16"),
        (lambda: cb.append(x, x.astype(np.float64)), "v must be float32 or bfloat16 .*not "
                                                     "float64"),
        (lambda: ch.append(x, x.astype(np.int32)), "v must be float32 or float16 .*not int32"),
        (lambda: c32.append(h, x), "k must be float32, not float16: of attn's calls only "
                                   "sdpa and a KVCache made with dtype=\"bf16\" or \"f16\""),
        (lambda: c32.append(b, x), "k must be float32, not uint16"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError, match=message):
            call()
    for c in (cb, ch, c32):
        c.append(x, x)
        assert c.length(0) == 2, "the refused appends appended something"
    with pytest.raises(TypeError, match="q must be float32 or bfloat16 .*not float16"):
        cb.attend(h[:, :, :1])
    with pytest.raises(TypeError, match="q must be float32 or float16 .*not float64"):
        ch.attend(x[:, :, :1].astype(np.float64))
    with pytest.raises(TypeError, match="q must be float32, not float16"):
        c32.attend(h[:, :, :1])


def test_16_bit_cache_calls_leak_nothing():
    """20000 calls on 16-bit caches (append, attend with float32 and 16-bit q, view,
    truncate), a quarter of them failing, keep the refcounts and Python's traced
    memory unchanged."""
    rng = np.random.default_rng(6)
    x = rand(rng, 1, 2, 2, 4)
    q = rand(rng, 1, 2, 1, 4)
    h, qh = x.astype(np.float16), q.astype(np.float16)
    b, qb = bf16_bits(x), bf16_bits(q)
    bad = x.astype(np.float64)
    caches = [(attn.KVCache(1, 1, 4, 4, dtype="f16"), h, qh),
              (attn.KVCache(1, 1, 4, 4, dtype="bf16"), b, qb)]
    every = [x, q, h, qh, b, qb, bad]
    refs = [sys.getrefcount(a) for a in every]

    def calls(n):
        for _ in range(n):
            for cache, k16, q16 in caches:
                cache.truncate(0)
                cache.append(x[:, :1], x[:, :1])
                cache.append(k16[:, :1], k16[:, :1])
                cache.attend(q, causal=True)
                cache.attend(q16, causal=True, return_weights=True, return_lse=True)
                cache.view(0)
                for call in (lambda: cache.append(bad[:, :1], x[:, :1]),
                             lambda: cache.attend(bad[:, :, :1])):
                    try:
                        call()
                    except TypeError:
                        pass

    calls(200)  # warm up allocator pools before measuring
    gc.collect()
    tracemalloc.start()
    snap0 = tracemalloc.get_traced_memory()[0]
    calls(20000 // (8 * len(caches)))
    gc.collect()
    snap1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert [sys.getrefcount(a) for a in every] == refs
    assert snap1 - snap0 < 64 * 1024, "Python memory grew by %d bytes" % (snap1 - snap0)


# ---------------------------------------------------------------------------
# The loaders' keep_half=True
# ---------------------------------------------------------------------------

def write_safetensors(path, tensors):
    """A .safetensors file written by hand (name -> (dtype string, uint16 or float32
    array)), so that the test needs neither the safetensors package nor torch."""
    header, blobs, offset = {}, [], 0
    for name, (dt, a) in tensors.items():
        data = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset,
                                                                              offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_keep_half_loads_16_bit_files_as_stored(tmp_path):
    """load_npy and load_safetensors with keep_half=True give float16 and bfloat16
    (uint16 bits) bit for bit, NaN and infinity included; without it they widen to
    float32 exactly, as before; float32 tensors are unchanged either way."""
    rng = np.random.default_rng(8)
    h = rng.standard_normal((3, 5)).astype(np.float16)
    h[0, :2] = [np.inf, np.nan]
    b = bf16_bits(rng.standard_normal((2, 3, 4)))
    b[0, 0, 0] = 0x7FC1  # a NaN with a payload: kept as stored
    f = rand(rng, 4)
    np.save(tmp_path / "h.npy", h)
    got = attn.load_npy(tmp_path / "h.npy", keep_half=True)
    assert got.dtype == np.float16 and np.array_equal(got.view(np.uint16), h.view(np.uint16))
    wide = attn.load_npy(tmp_path / "h.npy")
    assert wide.dtype == np.float32 and np.array_equal(wide, h.astype(np.float32),
                                                       equal_nan=True), wide
    write_safetensors(tmp_path / "t.safetensors",
                      {"h": ("F16", h.view(np.uint16)), "b": ("BF16", b), "f": ("F32", f)})
    d = attn.load_safetensors(tmp_path / "t.safetensors", keep_half=True)
    assert list(d) == ["h", "b", "f"], list(d)
    assert d["h"].dtype == np.float16 and np.array_equal(d["h"].view(np.uint16),
                                                         h.view(np.uint16))
    assert d["b"].dtype == np.uint16 and np.array_equal(d["b"], b), (d["b"], b)
    assert d["f"].dtype == np.float32 and np.array_equal(d["f"], f)
    d = attn.load_safetensors(tmp_path / "t.safetensors")
    assert [a.dtype for a in d.values()] == [np.float32] * 3
    assert np.array_equal(d["b"], bf16_values(b), equal_nan=True), (d["b"], bf16_values(b))
    # What keep_half gives goes straight into a 16-bit cache and sdpa.
    d = attn.load_safetensors(tmp_path / "t.safetensors", keep_half=True)
    kb = d["b"][None, :, 1:]
    cache = attn.KVCache(1, 2, 2, 4, dtype="bf16")
    cache.append(kb, kb)
    assert np.array_equal(cache.view(0)[0], kb)
    with pytest.raises(TypeError):
        attn.load_npy(tmp_path / "h.npy", True)  # keep_half is keyword-only
