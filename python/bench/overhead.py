"""The cost of one attn.sdpa call from Python against the C call and PyTorch's.

Run: python python/bench/overhead.py [--shape S1] [--threads N]
It times attn.sdpa (a fresh output each call, and with out=) and, when torch is
importable, torch.nn.functional.scaled_dot_product_attention on the same inputs
(torch.from_numpy: no copy), and prints the best-of-7 median per call in
microseconds. Compare with `attn bench --shape S1` (the C call, same shape).
"""
import argparse
import timeit

import numpy as np

import attn

SHAPES = {  # SPEC section 5: B, H, Tq, Tk, D, causal
    "S1": (2, 4, 5, 5, 4, False),
    "S2": (1, 12, 1024, 1024, 64, True),
    "S5": (1, 32, 1, 4096, 128, False),
}


def per_call(fn, budget=0.2):
    fn()
    n = 1
    while timeit.timeit(fn, number=n) < budget / 10:
        n *= 2
    return min(timeit.repeat(fn, number=n, repeat=7)) / n


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
    t = per_call(lambda: attn.sdpa(q, k, v, causal=causal))
    print("%s attn.sdpa                %9.3f us" % (a.shape, t * 1e6))
    t = per_call(lambda: attn.sdpa(q, k, v, causal=causal, out=out))
    print("%s attn.sdpa(out=)          %9.3f us" % (a.shape, t * 1e6))
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("# torch not importable: no comparison")
        return
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    with torch.inference_mode():
        t = per_call(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal))
    print("%s torch sdpa (%s, %d thr) %9.3f us" % (a.shape, torch.__version__,
                                                    torch.get_num_threads(), t * 1e6))
    ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).numpy()
    got = attn.sdpa(q, k, v, causal=causal)
    print("# max |attn - torch| = %.3g" % float(np.abs(got - ref).max()))


if __name__ == "__main__":
    main()
