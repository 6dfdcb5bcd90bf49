"""The cost of one attn.sdpa call from Python against the C call and PyTorch's.

Run: python python/bench/overhead.py [--shape S1]
It times attn.sdpa (a fresh output each call, and with out=) and, when torch is
importable, torch.nn.functional.scaled_dot_product_attention on the same inputs
(torch.from_numpy: no copy; under inference_mode), and prints the time per call in
microseconds: the best and the median of 7 timed batches. Compare with
`attn bench --shape S1` (the C call, same shape, same default thread count).
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
    a = ap.parse_args()
    B, H, Tq, Tk, D, causal = SHAPES[a.shape]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, Tq, D)).astype(np.float32)
    k = rng.standard_normal((B, H, Tk, D)).astype(np.float32)
    v = rng.standard_normal((B, H, Tk, D)).astype(np.float32)
    out = np.empty_like(q)
    print("# attn %s, arch %s, %d threads" % (attn.__version__, attn.arch()["selected"],
                                              attn.arch()["threads"]))
    print("# shape call                       best_us  median_us")
    t = per_call(lambda: attn.sdpa(q, k, v, causal=causal))
    print("%s attn.sdpa                %9.3f %9.3f" % (a.shape, t[0] * 1e6, t[1] * 1e6))
    t = per_call(lambda: attn.sdpa(q, k, v, causal=causal, out=out))
    print("%s attn.sdpa(out=)          %9.3f %9.3f" % (a.shape, t[0] * 1e6, t[1] * 1e6))
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("# torch not importable: no comparison")
        return
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    with torch.inference_mode():
        t = per_call(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal))
    print("%s torch sdpa               %9.3f %9.3f  (torch %s, %d threads)" % (
        a.shape, t[0] * 1e6, t[1] * 1e6, torch.__version__, torch.get_num_threads()))
    ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).numpy()
    got = attn.sdpa(q, k, v, causal=causal)
    print("# max |attn - torch| = %.3g" % float(np.abs(got - ref).max()))


if __name__ == "__main__":
    main()
