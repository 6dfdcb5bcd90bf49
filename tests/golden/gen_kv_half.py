#!/usr/bin/env python3
"""Generates tests/data/golden_kv_half/: attention as a 16-bit KV cache runs it (the
queries at the end of each sequence, so causal is bottom-right or none), on
bfloat16 and float16 inputs, with the float64 oracle and PyTorch's own error in
that dtype, so that tests/test_kv_half.c can hold the cache to the accuracy rule
of tests/test_half.c (FlashAttention's) without PyTorch.

    /work/venv-torch/bin/python tests/golden/gen_kv_half.py   # from the repository root

Each case is made by gen_half.case (same files, same case.txt keys, same oracle
and the same PyTorch error), written under golden_kv_half instead of golden_half.
The shapes are the cache's awkward ones: 1, 3, 17, 113 and 1100 keys (the last
long enough for the 16-bit split into cache-sized chunks), grouped-query heads,
several query rows (the prefill's tile path), a window and softcap.
"""
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_half  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_kv_half")


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(20261201)
    gen_half.ROOT = ROOT
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    c = gen_half.case
    names = []
    for dt in ("bf16", "f16"):
        # name, B, H, Hkv, Tq, Tk, D, Dv, options
        names += [
            c(dt + "_kv_one", rng, dt, 1, 1, 1, 1, 1, 8, 8, causal=2),
            c(dt + "_kv_tk3", rng, dt, 1, 2, 1, 1, 3, 16, 16, causal=2),
            c(dt + "_kv_tk17", rng, dt, 2, 4, 2, 3, 17, 32, 24, causal=2),
            c(dt + "_kv_tk113", rng, dt, 1, 8, 2, 1, 113, 128, 128, causal=2),
            c(dt + "_kv_plain", rng, dt, 2, 2, 2, 1, 113, 64, 64),
            c(dt + "_kv_prefill", rng, dt, 1, 4, 2, 40, 40, 32, 32, causal=2),
            c(dt + "_kv_window", rng, dt, 1, 4, 1, 2, 113, 64, 64, causal=2, window=(16, 0)),
            c(dt + "_kv_softcap", rng, dt, 1, 4, 4, 1, 113, 64, 64, causal=2, softcap=5.0),
            c(dt + "_kv_long", rng, dt, 1, 2, 1, 1, 1100, 64, 64, causal=2),
        ]
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# tests/golden/gen_kv_half.py, torch %s\n" % torch.__version__)
        for n in names:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
