"""The cost of one attn.sdpa call from Python against the C call and PyTorch's.

Run: python python/bench/overhead.py [--shape S1] [--dtype f32|f16|bf16|bf16-bits]
It times attn.sdpa (a fresh output each call, and with out=) and, when torch is
importable, torch.nn.functional.scaled_dot_product_attention on the same inputs
(torch.from_numpy: no copy; under inference_mode), and prints the time per call in
microseconds: the best and the median of 7 timed batches. Compare with
`attn bench --shape S1` (the C call, same shape, same default thread count).

--dtype gives q, k and v in 16 bits (docs/python.md, "16 bits"): f16 numpy's
float16, bf16 ml_dtypes.bfloat16 arrays (needs ml_dtypes), bf16-bits uint16 arrays
of bfloat16 bits with dtype="bf16"; PyTorch then runs in the same dtype.
"""
import argparse
import timeit

import numpy as np

import attn

SHAPES = {  # SPEC section 5: B, H, Tq, Tk, D, causal (S6's padding is not timed here)
    "S1": (2, 4, 5, 5, 4, False),
    "S2": (1, 12, 1024, 1024, 64, True),
    "S3": (4, 12, 1024, 1024, 64, True),
    "S4": (1, 16, 4096, 4096, 64, True),
    "S5": (1, 32, 1, 4096, 128, False),
}


def per_call(fn, budget=0.2):
    """(best, median) seconds per call over 7 batches of about budget/7 s each."""
    fn()
    n = 1
    while timeit.timeit(fn, number=n) < budget / 7:
        n *= 2
    t = sorted(x / n for x in timeit.repeat(fn, number=n, repeat=7))
    return t[0], t[3]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="S1", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16", "bf16-bits"])
    a = ap.parse_args()
    B, H, Tq, Tk, D, causal = SHAPES[a.shape]
    rng = np.random.default_rng(0)
    q32 = rng.standard_normal((B, H, Tq, D)).astype(np.float32)
    k32 = rng.standard_normal((B, H, Tk, D)).astype(np.float32)
    v32 = rng.standard_normal((B, H, Tk, D)).astype(np.float32)
    q, k, v = (in_dtype(x, a.dtype) for x in (q32, k32, v32))
    kw = {"dtype": "bf16"} if a.dtype == "bf16-bits" else {}
    out = np.empty_like(q)
    print("# attn %s, arch %s, %d threads, q k v %s" % (
        attn.__version__, attn.arch()["selected"], attn.arch()["threads"], q.dtype))
    print("# shape call                       best_us  median_us")
    t = per_call(lambda: attn.sdpa(q, k, v, causal=causal, **kw))
    print("%s attn.sdpa                %9.3f %9.3f" % (a.shape, t[0] * 1e6, t[1] * 1e6))
    t = per_call(lambda: attn.sdpa(q, k, v, causal=causal, out=out, **kw))
    print("%s attn.sdpa(out=)          %9.3f %9.3f" % (a.shape, t[0] * 1e6, t[1] * 1e6))
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("# torch not importable: no comparison")
        return
    tdtype = {"f32": torch.float32, "f16": torch.float16}.get(a.dtype, torch.bfloat16)
    # The 16-bit values attn reads, in PyTorch's tensors of the same dtype.
    tq, tk, tv = (torch.from_numpy(widen(x, a.dtype)).to(tdtype) for x in (q, k, v))
    with torch.inference_mode():
        t = per_call(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal))
    print("%s torch sdpa               %9.3f %9.3f  (torch %s, %d threads)" % (
        a.shape, t[0] * 1e6, t[1] * 1e6, torch.__version__, torch.get_num_threads()))
    ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).float().numpy()
    got = widen(attn.sdpa(q, k, v, causal=causal, **kw), a.dtype)
    print("# max |attn - torch| = %.3g" % float(np.abs(got - ref).max()))


def in_dtype(x, dtype):
    """float32 x as the --dtype's kind of array."""
    if dtype == "f32":
        return x
    if dtype == "f16":
        return x.astype(np.float16)
    if dtype == "bf16":
        import ml_dtypes  # --dtype bf16 is ml_dtypes' array; bf16-bits does without it
        return x.astype(ml_dtypes.bfloat16)
    u = x.view(np.uint32).astype(np.uint64)  # round to nearest even, as bits
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def widen(x, dtype):
    """An array of the --dtype's kind as float32 (exact)."""
    if dtype == "bf16-bits":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


if __name__ == "__main__":
    main()
