"""A training step's attention from PyTorch: forward and backward of attn.torch.sdpa
(eager, and compiled with torch.compile(fullgraph=True), whose attention is attn's
custom operators) against torch.nn.functional.scaled_dot_product_attention on the
same inputs, on SPEC section 5's shapes (S2 and S8 by default). Rounds are
interleaved (each round runs every contender once per shape); the best round is
printed, in ms, with its ratio to PyTorch's.

    python python/bench/torch_sdpa_train.py [--shapes S2,S8] [--rounds 3] [--threads 2]

attn uses one worker thread per core the process may run on; --threads sets PyTorch's.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F

import attn
import attn.torch as at

# (B, H, Hkv, T, D): SPEC section 5's causal training shapes.
SHAPES = {"S2": (1, 12, 12, 1024, 64), "S3": (4, 12, 12, 1024, 64),
          "S4": (1, 16, 16, 4096, 64), "S8": (1, 32, 8, 2048, 128)}


def step(fn, q, k, v, dout):
    """One forward and backward; returns the seconds it took."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    t0 = time.perf_counter()
    out = fn(*leaves, is_causal=True, enable_gqa=True)
    out.backward(dout)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="S2,S8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    compiled = torch.compile(lambda q, k, v, **kw: at.sdpa(q, k, v, **kw), fullgraph=True)
    contenders = [("attn.torch.sdpa", at.sdpa), ("compiled attn.torch.sdpa", compiled),
                  ("torch F.sdpa", F.scaled_dot_product_attention)]
    print("attn %s (%s), torch %s with %d threads, %d rounds, load %s"
          % (attn.__version__, attn.arch()["selected"], torch.__version__, args.threads,
             args.rounds, " ".join("%.1f" % x for x in os.getloadavg())))
    for name in args.shapes.split(","):
        B, H, Hkv, T, D = SHAPES[name]
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, H, T, D, generator=g)
        k, v = (torch.randn(B, Hkv, T, D, generator=g) for _ in range(2))
        dout = torch.randn(B, H, T, D, generator=g)
        for _, fn in contenders:  # warm-up (and compile)
            step(fn, q, k, v, dout)
        best = {n: float("inf") for n, _ in contenders}
        for _ in range(args.rounds):
            for n, fn in contenders:
                best[n] = min(best[n], step(fn, q, k, v, dout))
        ref = best["torch F.sdpa"]
        for n, _ in contenders:
            print("%s  %-26s forward+backward %8.1f ms  (%.2fx PyTorch's)"
                  % (name, n, 1e3 * best[n], best[n] / ref))


if __name__ == "__main__":
    main()
