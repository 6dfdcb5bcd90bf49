"""attn.sdpa in 16 bits (SPEC section 10): float16, bfloat16 as uint16 bits with
dtype="bf16", and ml_dtypes.bfloat16 where that package is installed.

The accuracy rule is tests/test_half.c's (FlashAttention's): against a float64
oracle computed on the exact 16-bit input values,

    max |attn - oracle|  <=  2 x max |torch - oracle|  +  floor
    floor = 2^-8 x max |oracle| (bfloat16),  2^-11 x max |oracle| (float16)

where torch is PyTorch's own scaled_dot_product_attention on the same 16-bit
inputs. The golden cases (tests/data/golden_half, written by
tests/golden/gen_half.py) carry PyTorch's error in their case.txt, so they need no
PyTorch here. The random cases measure it live where torch >= 2.0 is importable;
elsewhere (Debian's PyTorch 1.13 has no scaled_dot_product_attention) the bound is
the floor alone, which is stricter: rounding the float32 result to 16 bits costs
at most half the floor, and a wrong mask or a wrong head moves outputs by far more.
"""
import gc
import os
import subprocess
import sys
import tracemalloc
import zlib

import numpy as np
import pytest

import attn
from conftest import DATA, read_case
from test_golden import sdpa_kwargs

try:
    import torch
    import torch.nn.functional as _F
    TORCH_SDPA = hasattr(_F, "scaled_dot_product_attention")
except ImportError:
    torch = None
    TORCH_SDPA = False

FLOOR_EXP = {"bf16": -8, "f16": -11}


# ---------------------------------------------------------------------------
# bfloat16 without ml_dtypes: the bits, rounded to nearest even
# ---------------------------------------------------------------------------

def bf16_bits(x):
    """float32 values rounded to nearest even bfloat16, as uint16 bits (finite x)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits):
    """uint16 bfloat16 bits widened to float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_dtype(x, dtype):
    """(array attn takes, its exact values as float64) for dtype "bf16" or "f16"."""
    if dtype == "f16":
        h = np.asarray(x, np.float32).astype(np.float16)
        return h, h.astype(np.float64)
    b = bf16_bits(x)
    return b, bf16_values(b).astype(np.float64)


def widen(out, dtype):
    return (out.astype(np.float64) if dtype == "f16"
            else bf16_values(out).astype(np.float64))


def test_bf16_bits_helper_rounds_to_nearest_even():
    """The tests' own bfloat16 rounding: ties go to even, 1 + 2^-8 rounds down, and
    a value above the tie rounds up (so the golden inputs really are bfloat16)."""
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.5], np.float32)
    want = np.array([0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020], np.uint16)
    got = bf16_bits(x)
    assert np.array_equal(got, want), (got, want)


# ---------------------------------------------------------------------------
# The golden cases: PyTorch's error stored with each case
# ---------------------------------------------------------------------------

def half_cases():
    root = DATA / "golden_half"
    if not root.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason="no %s here" % root))]
    return [pytest.param(root / n, id=n) for n in sorted(os.listdir(root))
            if (root / n / "case.txt").is_file()]


def golden_inputs(folder):
    c = read_case(folder)
    q, k, v = (np.load(folder / ("%s.npy" % n)) for n in "qkv")
    oracle = np.load(folder / "out64.npy")
    return c, q, k, v, oracle


def check_rule(got64, oracle, dtype, torch_err, what):
    err = float(np.max(np.abs(got64 - oracle)))
    floor = np.ldexp(float(np.max(np.abs(oracle))), FLOOR_EXP[dtype])
    bound = 2.0 * torch_err + floor
    assert np.isfinite(err) and err <= bound, (
        "%s: attn's error %.4g > 2 x torch's %.4g + floor %.4g" % (what, err, torch_err, floor))
    # Shown with pytest -s: the margins docs/python.md quotes.
    print("%s: attn's error %.3g, torch's %.3g, bound %.3g" % (what, err, torch_err, bound))
    return err


@pytest.mark.parametrize("folder", half_cases())
def test_golden_half_cases_meet_the_accuracy_rule(folder):
    """Every golden 16-bit case (both dtypes, every option) is within twice PyTorch's
    error plus the floor, its output in the inputs' dtype and shape."""
    run_golden(folder)


def run_golden(folder):
    c, q, k, v, oracle = golden_inputs(folder)
    dtype = c["dtype"]
    args = [to_dtype(a, dtype) for a in (q, k, v)]
    for (a, exact), src in zip(args, (q, k, v)):
        # The case's float32 values are exact in the dtype: nothing is rounded here.
        assert np.array_equal(exact, src.astype(np.float64)), "%s: inputs not exact" % folder.name
    kw = sdpa_kwargs(folder, c)
    if dtype == "bf16":
        kw["dtype"] = "bf16"
    out = attn.sdpa(*(a for a, _ in args), **kw)
    assert out.dtype == args[0][0].dtype and out.shape == oracle.shape, (out.dtype, out.shape,
                                                                        oracle.shape)
    check_rule(widen(out, dtype), oracle, dtype, float(c["torch_err"]), folder.name)


ORDER = ["ref", "scalar", "avx2", "avx512", "avx512bf16", "amx"]

EVERY_CASE = '''
import sys
import attn
import test_half

assert attn.arch()["selected"] == sys.argv[1], attn.arch()
n = 0
for folder in sorted((test_half.DATA / "golden_half").iterdir()):
    if (folder / "case.txt").is_file():
        test_half.run_golden(folder)
        n += 1
print("ok", sys.argv[1], n)
'''


@pytest.mark.parametrize("arch", ORDER)
def test_every_instruction_set_path_meets_the_accuracy_rule(arch):
    """With ATTN_ARCH forcing each path this CPU has (the dispatch is decided once per
    process, so each runs in its own interpreter), every golden 16-bit case meets the
    rule."""
    if not (DATA / "golden_half").is_dir():
        pytest.skip("no %s here" % (DATA / "golden_half"))
    best = attn.arch()["best"]
    if ORDER.index(arch) > ORDER.index(best):
        pytest.skip("this CPU's best path is %s, so %s cannot run here" % (best, arch))
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ATTN_ARCH=arch, PYTHONPATH=os.pathsep.join([here] + sys.path))
    r = subprocess.run([sys.executable, "-c", EVERY_CASE, arch], capture_output=True,
                       text=True, env=env)
    n = sum((f / "case.txt").is_file() for f in (DATA / "golden_half").iterdir())
    last = r.stdout.strip().splitlines()[-1:] or [""]
    assert r.returncode == 0 and last[0] == "ok %s %d" % (arch, n), \
        "ATTN_ARCH=%s:\nstdout: %s\nstderr: %s" % (arch, r.stdout[-3000:], r.stderr[-3000:])


# ---------------------------------------------------------------------------
# Random awkward shapes against a float64 oracle, with a mask, GQA, bottom-right
# ---------------------------------------------------------------------------

def oracle64(q, k, v, mask, scale):
    """softmax(scale q k^T, masked) v in float64; k and v repeated for GQA."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = scale * (q @ np.swapaxes(k, -1, -2))
    s = np.where(mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def torch_error(q64, k64, v64, mask, scale, dtype, oracle):
    """PyTorch's own largest error in the dtype on the same inputs, or 0 where it has
    no scaled_dot_product_attention (the bound is then the floor alone)."""
    if not TORCH_SDPA:
        return 0.0
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    g = q64.shape[1] // k64.shape[1]
    k64, v64 = np.repeat(k64, g, axis=1), np.repeat(v64, g, axis=1)
    q, k, v = (torch.from_numpy(a).to(tdt) for a in (q64, k64, v64))
    # Its default scale is 1/sqrt(D), the one used here.
    out = _F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(mask))
    return float(np.max(np.abs(out.double().numpy() - oracle)))


SHAPES = [  # B, H, Hkv, Tq, Tk, D, Dv, what
    (1, 1, 1, 1, 1, 8, 8, "one query, one key"),
    (2, 3, 3, 3, 17, 16, 16, "cross-attention 3 x 17"),
    (1, 4, 2, 17, 17, 64, 64, "GQA 4/2 heads"),
    (1, 2, 1, 113, 113, 32, 24, "113 x 113, MQA, Dv != D"),
    (2, 2, 2, 1, 113, 128, 128, "one decoding step"),
]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("masking", ["none", "mask", "bottom_right"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[-1] for s in SHAPES])
def test_random_shapes_meet_the_accuracy_rule(shape, masking, dtype):
    """Awkward shapes, a boolean mask, bottom-right causal and grouped-query heads in
    16 bits stay within twice PyTorch's error plus the floor against float64."""
    B, H, Hkv, Tq, Tk, D, Dv, what = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, masking, dtype)).encode()))
    q, exact_q = to_dtype(rng.standard_normal((B, H, Tq, D)), dtype)
    k, exact_k = to_dtype(rng.standard_normal((B, Hkv, Tk, D)), dtype)
    v, exact_v = to_dtype(rng.standard_normal((B, Hkv, Tk, Dv)), dtype)
    kw = {"dtype": "bf16"} if dtype == "bf16" else {}
    mask = np.ones((B, H, Tq, Tk), bool)
    if masking == "mask":
        mask = rng.random((B, 1, Tq, Tk)) < 0.6
        mask[..., rng.integers(0, Tk)] = True  # every row sees at least one key
        kw["mask"] = mask
        mask = np.broadcast_to(mask, (B, H, Tq, Tk))
    elif masking == "bottom_right":
        kw["causal"] = "bottom_right"
        mask = np.broadcast_to(np.tril(np.ones((Tq, Tk), bool), Tk - Tq), (B, H, Tq, Tk))
    scale = 1 / np.sqrt(D)
    oracle = oracle64(exact_q, exact_k, exact_v, mask, scale)
    out = attn.sdpa(q, k, v, **kw)
    assert out.dtype == q.dtype and out.shape == (B, H, Tq, Dv), (out.dtype, out.shape)
    terr = torch_error(exact_q, exact_k, exact_v, np.array(mask), scale, dtype,
                       oracle)
    check_rule(widen(out, dtype), oracle, dtype, terr, "%s, %s, %s" % (what, masking, dtype))


def test_16_bit_views_are_read_in_place_and_out_is_filled():
    """A transposed (strided) float16 k gives the contiguous k's bits, and out= of
    float16 is the caller's array, filled in place."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 17, 8)).astype(np.float16) for _ in range(3))
    want = attn.sdpa(q, k, v, causal=True)
    kt = np.ascontiguousarray(np.swapaxes(k, -1, -2))
    out = np.empty_like(q)
    got = attn.sdpa(q, np.swapaxes(kt, -1, -2), v, causal=True, out=out)
    assert got is out
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16)), (out, want)


def test_16_bit_strided_inputs_are_read_without_a_copy():
    """A strided view of 8 MB of float16 (and, where ml_dtypes is installed, bfloat16)
    keys and values is read in place: Python allocates under 1 MB (tracemalloc sees
    numpy's allocations, so a copy would show as a peak of at least 4 MB; the
    library's own widening scratch is C malloc and not counted)."""
    rng = np.random.default_rng(2)
    kv = rng.standard_normal((1, 1, 32768, 128)).astype(np.float16)
    q = rng.standard_normal((1, 1, 1, 64)).astype(np.float16)
    kinds = [(kv, q)]
    try:
        import ml_dtypes
        kinds.append((kv.astype(ml_dtypes.bfloat16), q.astype(ml_dtypes.bfloat16)))
    except ImportError:
        pass
    for kv, q in kinds:
        k, v = kv[..., :64], kv[..., 64:]  # row stride 128: not contiguous
        assert not k.flags.c_contiguous
        tracemalloc.start()
        out = attn.sdpa(q, k, v)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 1 << 20, "peak Python allocation %d bytes for an 8 MB %s k/v" % (
            peak, kv.dtype)
        want = attn.sdpa(*(np.ascontiguousarray(a) for a in (q, k, v)))
        assert np.array_equal(out.view(np.uint16), want.view(np.uint16)), kv.dtype


def test_weights_and_lse_stay_float32_in_16_bits():
    """With 16-bit inputs the output is 16-bit, the weights and log-sum-exp float32,
    and they agree with the float32 call on the same (widened) values."""
    rng = np.random.default_rng(5)
    q, k, v = (bf16_bits(rng.standard_normal((2, 2, 3, 8))) for _ in range(3))
    out, w, lse = attn.sdpa(q, k, v, dtype="bf16", return_weights=True, return_lse=True)
    assert (out.dtype, w.dtype, lse.dtype) == (np.uint16, np.float32, np.float32)
    w32, lse32 = attn.sdpa(*(bf16_values(a) for a in (q, k, v)), return_weights=True,
                           return_lse=True)[1:]
    np.testing.assert_allclose(w, w32, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, lse32, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# ml_dtypes.bfloat16
# ---------------------------------------------------------------------------

def test_ml_dtypes_bfloat16_arrays_give_bfloat16_out_with_the_bits_of_the_uint16_path():
    """ml_dtypes.bfloat16 q, k, v (and out=) give an ml_dtypes.bfloat16 output whose
    bits are those of the same call on uint16 bits with dtype="bf16"."""
    ml_dtypes = pytest.importorskip(
        "ml_dtypes", reason="ml_dtypes is not installed: bfloat16 arrays are then passed as "
        "uint16 bits with dtype=\"bf16\" (tested above)")
    rng = np.random.default_rng(7)
    bits = [bf16_bits(rng.standard_normal(s)) for s in ((1, 4, 17, 16), (1, 2, 40, 16),
                                                        (1, 2, 40, 16))]
    arrays = [b.view(ml_dtypes.bfloat16) for b in bits]
    want = attn.sdpa(*bits, dtype="bf16", causal="bottom_right")
    got = attn.sdpa(*arrays, causal="bottom_right")
    assert got.dtype == ml_dtypes.bfloat16, got.dtype
    assert np.array_equal(got.view(np.uint16), want), (got, want)
    out = np.empty(want.shape, ml_dtypes.bfloat16)
    assert attn.sdpa(*arrays, causal="bottom_right", out=out) is out
    assert np.array_equal(out.view(np.uint16), want)
    # A strided bfloat16 view is read in place too.
    kt = np.ascontiguousarray(np.swapaxes(arrays[1], -1, -2))
    again = attn.sdpa(arrays[0], np.swapaxes(kt, -1, -2), arrays[2], causal="bottom_right")
    assert np.array_equal(again.view(np.uint16), want)
    with pytest.raises(TypeError, match="q, k and v must share one dtype.*q bfloat16, "
                                        "k float16"):
        attn.sdpa(arrays[0], arrays[1].astype(np.float16), arrays[2])
    with pytest.raises(TypeError, match="x must be float32, not bfloat16: of attn's calls "
                                        "only sdpa and a KVCache made with"):
        attn.rope(arrays[0])


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------

def test_mixed_and_unsupported_dtypes_are_type_errors_naming_them():
    """Mixed dtypes name each one; float64, int and unmarked uint16 say what is taken;
    dtype= must agree with the arrays; out= must have q's dtype."""
    q = np.zeros((1, 1, 2, 4), np.float32)
    h = q.astype(np.float16)
    b = bf16_bits(q)
    cases = [
        (lambda: attn.sdpa(h, q, h), "q, k and v must share one dtype .*not q float16, "
                                     "k float32, v float16"),
        (lambda: attn.sdpa(b, h, b, dtype="bf16"), "not q bfloat16, k float16, v bfloat16"),
        (lambda: attn.sdpa(h, h, q.astype(np.float64)), "v must be float32, float16 or "
                                                        "bfloat16 .*not float64"),
        (lambda: attn.sdpa(q.astype(np.int32), h, h), "q must be float32, float16 or "
                                                      "bfloat16 .*not int32"),
        (lambda: attn.sdpa(b, b, b), "q is uint16: pass dtype=\"bf16\""),
        (lambda: attn.sdpa(h, h, h, dtype="bf16"), "dtype=\"bf16\" says what uint16 "
                                                   "arrays hold, but q, k and v are float16"),
        (lambda: attn.sdpa(h, h, h, out=np.empty_like(q)), "out must be float16 like q, k "
                                                           "and v, not float32"),
        (lambda: attn.sdpa(b, b, b, dtype="bf16", out=np.empty_like(h)),
         "out must be bfloat16 like q, k and v, not float16"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(ValueError, match="dtype must be None, \"bf16\" or \"f16\""):
        attn.sdpa(b, b, b, dtype="int16")


def test_the_float32_only_calls_refuse_16_bit_arrays_naming_the_dtype():
    """The backward, RoPE and a float32 KV cache take float32 only: a float16 or
    bfloat16 argument is a TypeError that names its dtype and says which calls take
    16 bits (a 16-bit KVCache is tested in test_kv_half.py)."""
    from attn import _attn
    q = np.zeros((1, 1, 2, 4), np.float32)
    h = q.astype(np.float16)
    lse = np.zeros((1, 1, 2), np.float32)
    msg = ("must be float32, not float16: of attn's calls only sdpa and a KVCache made "
           "with dtype=\"bf16\" or \"f16\" take 16-bit arrays")
    with pytest.raises(TypeError, match="q " + msg):
        attn.sdpa_backward(h, q, q, q, lse, q)
    with pytest.raises(TypeError, match="dout " + msg):
        attn.sdpa_backward(q, q, q, q, lse, h)
    with pytest.raises(TypeError, match="x " + msg):
        attn.rope(h)
    cache = attn.KVCache(1, 1, 4, 4)
    with pytest.raises(TypeError, match="k " + msg):
        cache.append(h, h)
    with pytest.raises(TypeError, match="q " + msg):
        cache.attend(h)


# ---------------------------------------------------------------------------
# Nothing leaks
# ---------------------------------------------------------------------------

def test_16_bit_calls_leak_nothing():
    """100000 16-bit calls (float16, bfloat16 bits, ml_dtypes bfloat16 where installed),
    half of them failing, keep the refcounts and Python's traced memory unchanged."""
    rng = np.random.default_rng(1)
    h = [rng.standard_normal((1, 1, 2, 2)).astype(np.float16) for _ in range(3)]
    b = [bf16_bits(a) for a in h]
    arrays = [h, b]
    try:
        import ml_dtypes
        arrays.append([a.view(ml_dtypes.bfloat16) for a in b])
    except ImportError:
        pass
    bad = h[0].astype(np.float32)
    out = np.empty_like(h[0])
    every = [a for group in arrays for a in group] + [bad, out]
    refs = [sys.getrefcount(a) for a in every]
    kws = [{}, {"dtype": "bf16"}, {}]

    def calls(n):
        for _ in range(n):
            for group, kw in zip(arrays, kws):
                attn.sdpa(*group, **kw)
                try:
                    attn.sdpa(group[0], bad, group[2], **kw)
                except TypeError:
                    pass
            attn.sdpa(*h, out=out)

    calls(2000)  # warm up allocator pools before measuring
    gc.collect()
    tracemalloc.start()
    snap0 = tracemalloc.get_traced_memory()[0]
    calls(100000 // (2 * len(arrays)))
    gc.collect()
    snap1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert [sys.getrefcount(a) for a in every] == refs
    assert snap1 - snap0 < 64 * 1024, "Python memory grew by %d bytes" % (snap1 - snap0)
