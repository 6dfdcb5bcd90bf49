#!/usr/bin/env python3
"""Generates tests/data/golden_half/: attention on bfloat16 and float16 inputs, with
the float64 oracle and PyTorch's own error in that dtype, so that tests/test_half.c
can hold attn to FlashAttention's accuracy rule without PyTorch: attn's largest
error against the float64 oracle must be within twice PyTorch's largest error on
the same inputs, plus a floor stated in the test.

    /work/venv-torch/bin/python tests/golden/gen_half.py   # from the repository root

Needs torch >= 2.5 and numpy. The torch version is written into MANIFEST and every
case.txt.

Each case draws q, k, v in float32, rounds them to the case's dtype, and stores
them as float32 .npy files holding exactly those 16-bit values (the C test
converts them back to 16 bits without loss). The oracle is the contract written
out in float64 on those values (gen_options.written_out). PyTorch's error is that
of torch.nn.functional.scaled_dot_product_attention called in the dtype itself
(q, k, v and the additive mask in bfloat16 or float16), where it has every option
the case uses; softcap and sinks have no switch there, so for those cases it is
the written-out form evaluated in the dtype (torch's matmul and softmax on 16-bit
tensors), which the case.txt names as torch_path=written_out.

case.txt keys: dtype (bf16|f16), causal, window (LEFT,RIGHT or empty), softcap,
alibi (0|1), bias, mask, sinks (file names or empty), torch_err, torch_path, torch.
"""
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_options import alibi_default_slopes, visible, written_out  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_half")
DT = torch.float64
TORCH_DT = {"bf16": torch.bfloat16, "f16": torch.float16}


def rounded(rng, shape, dtype, scale=1.0):
    """float32 values that are exactly representable in dtype."""
    a = torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))
    return a.to(TORCH_DT[dtype]).to(torch.float32).numpy()


def case(name, rng, dtype, B, H, Hkv, Tq, Tk, D, Dv, causal=0, window=None, softcap=0.0,
         alibi=0, bias=False, mask=False, sinks=False):
    q = rounded(rng, (B, H, Tq, D), dtype)
    k = rounded(rng, (B, Hkv, Tk, D), dtype)
    v = rounded(rng, (B, Hkv, Tk, Dv), dtype)
    files = {"q.npy": q, "k.npy": k, "v.npy": v}
    keys = {"dtype": dtype, "causal": causal, "window": "" if window is None else "%d,%d" % window,
            "softcap": softcap if softcap else "", "alibi": alibi, "bias": "", "mask": "",
            "sinks": "", "torch": torch.__version__}
    qt, kt, vt = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
    sc = 1.0 / math.sqrt(D)
    m = None
    if mask:
        m = rng.random((B, 1, Tq, Tk)) < 0.8
        m[..., 0] = True  # no empty rows: those are tested in float32
        files["mask.npy"] = m
        keys["mask"] = "mask.npy"
    bias_t = None
    if bias:
        b = rng.standard_normal((1, H, Tq, Tk)).astype(np.float32)
        files["bias.npy"] = b
        keys["bias"] = "bias.npy"
        bias_t = torch.from_numpy(b.astype(np.float64))
    alibi_t = None
    if alibi:
        slopes = np.asarray(alibi_default_slopes(H), dtype=np.float32)
        i = torch.arange(Tq)[:, None] + (Tk - Tq)
        j = torch.arange(Tk)[None, :]
        alibi_t = -torch.from_numpy(slopes.astype(np.float64)).view(1, H, 1, 1) * (i - j).abs().to(DT)
    sinks_t = None
    if sinks:
        sk = rng.standard_normal(H).astype(np.float32)
        files["sinks.npy"] = sk
        keys["sinks"] = "sinks.npy"
        sinks_t = torch.from_numpy(sk.astype(np.float64))

    vis = visible(B, H, Tq, Tk, causal, window, m)
    out, _, _, empty = written_out(qt, kt, vt, sc, vis, softcap, bias_t, alibi_t, sinks_t, H // Hkv)
    assert not bool(empty.any()), name

    lo = TORCH_DT[dtype]
    if not softcap and not sinks:
        add = torch.zeros(B, H, Tq, Tk, dtype=DT)
        if bias_t is not None:
            add = add + bias_t
        if alibi_t is not None:
            add = add + alibi_t
        add = add.masked_fill(~vis, float("-inf"))
        got = F.scaled_dot_product_attention(qt.to(lo), kt.to(lo), vt.to(lo), attn_mask=add.to(lo),
                                             scale=sc, enable_gqa=Hkv != H)
        keys["torch_path"] = "scaled_dot_product_attention"
    else:
        got, _, _, _ = written_out(qt.to(lo), kt.to(lo), vt.to(lo), sc, vis, softcap,
                                   None if bias_t is None else bias_t.to(lo),
                                   None if alibi_t is None else alibi_t.to(lo),
                                   None if sinks_t is None else sinks_t.to(lo), H // Hkv)
        keys["torch_path"] = "written_out"
    keys["torch_err"] = "%.9g" % (got.to(DT) - out).abs().max().item()
    files["out64.npy"] = out.numpy()

    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    for fname, arr in files.items():
        np.save(os.path.join(d, fname), arr)
    with open(os.path.join(d, "case.txt"), "w") as f:
        for key, val in keys.items():
            f.write("%s=%s\n" % (key, val))
    return name


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(20261130)
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    names = []
    for dt in ("bf16", "f16"):
        names += [
            case(dt + "_one", rng, dt, 1, 1, 1, 1, 1, 8, 8),
            case(dt + "_tiny", rng, dt, 1, 2, 1, 3, 17, 16, 16),
            case(dt + "_plain", rng, dt, 1, 2, 2, 17, 113, 64, 64),
            case(dt + "_causal", rng, dt, 1, 4, 2, 113, 113, 32, 48, causal=1),
            # Top-left causal with fewer queries than keys: the last keys are seen
            # by no row, yet the tile path loads them with their tile.
            case(dt + "_causal_short", rng, dt, 1, 2, 2, 40, 150, 32, 32, causal=1),
            case(dt + "_bottom_right", rng, dt, 1, 2, 1, 17, 113, 64, 64, causal=2),
            case(dt + "_window", rng, dt, 1, 2, 2, 65, 130, 64, 64, causal=2, window=(31, 0)),
            case(dt + "_softcap", rng, dt, 1, 2, 2, 33, 70, 64, 64, softcap=5.0),
            case(dt + "_alibi", rng, dt, 1, 4, 2, 40, 40, 32, 32, causal=1, alibi=1),
            case(dt + "_bias", rng, dt, 1, 2, 2, 17, 50, 32, 32, bias=True),
            case(dt + "_mask", rng, dt, 2, 2, 1, 20, 33, 16, 24, mask=True),
            case(dt + "_sinks", rng, dt, 1, 2, 2, 9, 77, 64, 64, sinks=True),
            case(dt + "_decode", rng, dt, 1, 4, 1, 1, 520, 64, 64, causal=2),
            case(dt + "_wide", rng, dt, 1, 1, 1, 130, 150, 128, 128),
            # Long enough for the 16-bit split into cache-sized chunks, with a
            # window so that the widened range is clipped at both ends.
            case(dt + "_long", rng, dt, 1, 2, 1, 2, 1100, 64, 64, causal=2, window=(700, 0)),
        ]
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# tests/golden/gen_half.py, torch %s\n" % torch.__version__)
        for n in names:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
