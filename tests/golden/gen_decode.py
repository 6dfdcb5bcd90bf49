#!/usr/bin/env python3
"""Generates tests/data/golden_decode/: RoPE (both pairings, position offsets, a
non-default base) and a grouped-query decode sequence, computed by PyTorch 2.x, so
that tests/test_rope.c and tests/test_kv_cache.c can check attn against PyTorch
without PyTorch.

    python3 tests/golden/gen_decode.py   # from the repository root

RoPE follows the float32 recipe of the tutorial's chapter 21 (build_rope_cache in
src/llm_tutor/models/modern_attention.py of fengjikui/llm-tutor): positions and
the exponents 2k / D are float32 tensors, inv_freq = 1 / base ** (2k / D) in
float32, the angles are their float32 outer product, then cos and sin. The
interleaved pairing rotates features (2k, 2k + 1) as the chapter's apply_rope
does; the half pairing rotates (k, k + D/2) as Hugging Face's Llama does with
rotate_half (x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)).

The decode case: q [1, H, T, D], k and v [1, Hkv, T, D] drawn in float32; q and k
rotated at positions 0 .. T-1 by the recipe above (in float32, stored as
k_rope.npy and q_rope.npy); then attention over the whole sequence, causal (with
Tq == Tk the two alignments agree), optionally with a sliding window, by
torch.nn.functional.scaled_dot_product_attention(enable_gqa=True) in float64 from
the rotated float32 values, rounded once to float32 (out.npy). A decoder that
prefills the first N tokens and then feeds one token at a time through a KV cache
must give the same rows.

Each case is a folder of .npy files and a case.txt of key=value lines.
"""
import os
import shutil

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_decode")


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def rope_cos_sin(offset, T, D, base):
    positions = torch.arange(offset, offset + T, dtype=torch.float32)
    dims = torch.arange(0, D, 2, dtype=torch.float32)
    inv_freq = 1.0 / (base ** (dims / D))
    freqs = torch.outer(positions, inv_freq)
    return inv_freq, freqs.cos(), freqs.sin()


def rope(x, offset, base, pairing):
    """x [B, H, T, D] float32, rows at positions offset .. offset+T-1."""
    T, D = x.shape[-2], x.shape[-1]
    inv_freq, cos, sin = rope_cos_sin(offset, T, D, base)
    if pairing == "interleaved":
        cos = cos.view(1, 1, T, -1)
        sin = sin.view(1, 1, T, -1)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
    else:
        cos2 = torch.cat([cos, cos], dim=-1).view(1, 1, T, D)
        sin2 = torch.cat([sin, sin], dim=-1).view(1, 1, T, D)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        rotated = torch.cat([-x2, x1], dim=-1)
        out = x * cos2 + rotated * sin2
    return inv_freq, out


def write_case(name, arrays, params):
    d = os.path.join(ROOT, name)
    os.makedirs(d)
    for key, a in arrays.items():
        np.save(os.path.join(d, key + ".npy"), f32(a))
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("torch=%s\n" % torch.__version__)
        for key, value in params.items():
            f.write("%s=%s\n" % (key, value))


def rope_case(name, B, H, T, D, offset, base, pairing, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, T, D, generator=g, dtype=torch.float32)
    inv_freq, out = rope(x, offset, base, pairing)
    write_case(name, {"x": x, "out": out, "inv_freq": inv_freq},
               {"kind": "rope", "pairing": pairing, "base": base, "offset": offset})


def decode_case(name, H, Hkv, T, D, base, pairing, window, prefill, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T, D, generator=g, dtype=torch.float32)
    k = torch.randn(1, Hkv, T, D, generator=g, dtype=torch.float32)
    v = torch.randn(1, Hkv, T, D, generator=g, dtype=torch.float32)
    _, q_rope = rope(q, 0, base, pairing)
    _, k_rope = rope(k, 0, base, pairing)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    visible = j <= i
    if window > 0:
        visible = visible & (j >= i - (window - 1))
    out = F.scaled_dot_product_attention(q_rope.double(), k_rope.double(), v.double(),
                                         attn_mask=visible.view(1, 1, T, T), enable_gqa=True)
    write_case(name, {"q": q, "k": k, "v": v, "q_rope": q_rope, "k_rope": k_rope, "out": out},
               {"kind": "decode", "H": H, "Hkv": Hkv, "T": T, "D": D, "pairing": pairing,
                "base": base, "window_left": window - 1 if window > 0 else -1,
                "prefill": prefill})


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    rope_case("rope_interleaved_d8", 2, 3, 5, 8, 0, 10000.0, "interleaved", 1)
    rope_case("rope_half_d8", 2, 3, 5, 8, 0, 10000.0, "half", 2)
    rope_case("rope_interleaved_offset", 1, 2, 7, 16, 37, 10000.0, "interleaved", 3)
    rope_case("rope_half_offset", 1, 2, 7, 16, 37, 10000.0, "half", 4)
    rope_case("rope_interleaved_base500k", 1, 2, 9, 128, 4090, 500000.0, "interleaved", 5)
    rope_case("rope_half_base500k", 1, 2, 9, 128, 4090, 500000.0, "half", 6)
    decode_case("decode_gqa_half", 8, 2, 13, 16, 10000.0, "half", 0, 5, 7)
    decode_case("decode_gqa_interleaved_window", 6, 2, 21, 32, 500000.0, "interleaved", 6, 1, 8)
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("generated by tests/golden/gen_decode.py with torch %s\n" % torch.__version__)
        for name in sorted(os.listdir(ROOT)):
            if name != "MANIFEST":
                f.write(name + "\n")


if __name__ == "__main__":
    main()
