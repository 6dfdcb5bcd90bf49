#!/usr/bin/env python3
"""Generates tests/data/golden_gqa_rope/: attention blocks WITH RoPE, computed by
PyTorch, so that `attn forward --rope` (tests/test_cli_decode.sh) and
attn_mha_forward_packed_rope (tests/test_mha.c) are checked against PyTorch
without PyTorch; and the inputs tests/test_cli_decode.sh decodes.

    /work/venv-torch/bin/python tests/golden/gen_gqa_rope.py   # from the repository root

The block is Llama's: q, k, v projections, q and k split into heads and rotated
by their positions, attention (query head h reads key/value head h / (H / Hkv)),
the heads merged, the output projection. One case stores the chapter's fused
weights (qkv.weight [3E, E], output.weight [E, E]) instead of separate
projections; the computation is the same.

RoPE follows SPEC section 7 and gen_decode.py: positions and the exponents 2k/D
are float32, inv_freq = 1 / base ** (2k/D) in float32, the angles their float32
outer product, then cos and sin in float32 (as the tutorial's chapter 21 and
Hugging Face's Llama compute them). The rotation is written out twice, the
interleaved pairing (features 2k, 2k+1: chapter 21's apply_rope) by even/odd
slices and the half pairing (k, k + D/2) by Hugging Face's rotate_half. Like
gen_gqa.py, the weights and the input are drawn in float32 and stored exactly,
the block runs in float64 on those values (the float32 cos and sin widened) and
the results are rounded once to float32. The attention runs through
F.scaled_dot_product_attention(enable_gqa=True) and written out with repeat_kv;
the two must agree to 1e-12 before anything is written.

case.txt keys: kind=gqa_rope, layout (separate or fused), weights, prefix,
num_heads, num_kv_heads, head_dim, rope (interleaved or half), rope_base,
rope_offset, input, token_ids, pad_id, causal, output, attention, lse.

sdpa_tail/ is a case for `attn sdpa --rope`: q [1, 4, 3, 8] and k, v [1, 2, 10, 8]
(unrotated, float32), the keys at positions 7 .. 16 and the queries at the last
three (14, 15, 16: the bottom-right alignment), half pairing, base 500000, causal
bottom-right; out.npy is the attention of the rotated arrays in float64, rounded
once.

decode/ holds inputs for `attn decode` [2, T, 32] (every case has E = 32) for
T = 1, 3 and 17, and token ids [2, 17]: pad id 0 at the end of the second
sequence (ids_right.npy) or at its start (ids_left.npy).
"""
import os
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_gqa_rope")
PREFIX = "model.layers.0.self_attn."
DT = torch.float64
E = 32


def rope_cos_sin(offset, T, D, base):
    positions = torch.arange(offset, offset + T, dtype=torch.float32)
    dims = torch.arange(0, D, 2, dtype=torch.float32)
    inv_freq = 1.0 / (base ** (dims / D))
    freqs = torch.outer(positions, inv_freq)
    return freqs.cos(), freqs.sin()


def rope(x, offset, base, pairing):
    """x [B, H, T, D] float64, rows at positions offset .. offset+T-1."""
    T, D = x.shape[-2], x.shape[-1]
    cos, sin = rope_cos_sin(offset, T, D, base)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if pairing == "interleaved":
        cos = cos.view(1, 1, T, -1)
        sin = sin.view(1, 1, T, -1)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out
    cos2 = torch.cat([cos, cos], dim=-1).view(1, 1, T, D)
    sin2 = torch.cat([sin, sin], dim=-1).view(1, 1, T, D)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos2 + torch.cat([-x2, x1], dim=-1) * sin2


class RopeAttention(nn.Module):
    """Separate projections, H query heads, Hkv key/value heads, RoPE on q and k."""

    def __init__(self, H, Hkv, D, biases):
        super().__init__()
        self.H, self.Hkv, self.D = H, Hkv, D
        self.q_proj = nn.Linear(E, H * D, bias="q" in biases)
        self.k_proj = nn.Linear(E, Hkv * D, bias="k" in biases)
        self.v_proj = nn.Linear(E, Hkv * D, bias="v" in biases)
        self.o_proj = nn.Linear(H * D, E, bias="o" in biases)

    def heads(self, x, offset, base, pairing):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        return rope(q, offset, base, pairing), rope(k, offset, base, pairing), v

    def merge(self, ctx):
        B, H, T, D = ctx.shape
        return self.o_proj(ctx.transpose(1, 2).reshape(B, T, H * D))

    def forward_sdpa(self, x, allowed, *r):
        q, k, v = self.heads(x, *r)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        return self.merge(ctx)

    def forward_explicit(self, x, allowed, *r):
        q, k, v = self.heads(x, *r)
        group = self.H // self.Hkv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-2, -1) / (self.D ** 0.5)
        scores = scores.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.softmax(scores, dim=-1)
        return self.merge(weights @ v), weights, lse


def f32(t):
    return np.ascontiguousarray(t.detach().numpy().astype(np.float32))


def pad_tail_ids(B, T):
    """Every sample but the first ends in two pad tokens (id 0)."""
    ids = np.arange(1, B * T + 1, dtype=np.int64).reshape(B, T)
    ids[1:, T - 2:] = 0
    return ids


def case(name, seed, B, T, H, Hkv, D, biases, layout, pairing, base, offset, pad):
    torch.manual_seed(seed)
    m = RopeAttention(H, Hkv, D, biases)  # float32 draws
    x = torch.randn(B, T, E)
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool)).expand(B, 1, T, T)
    ids = None
    if pad:
        ids = pad_tail_ids(B, T)
        allowed = allowed & torch.from_numpy(ids != 0).view(B, 1, 1, T)
    sd = m.state_dict()
    if layout == "fused":
        # The chapter's names: one [3E, E] projection (q rows, then k, then v).
        assert H == Hkv and H * D == E and biases == "qkvo"
        state = {"qkv.weight": torch.cat([sd["q_proj.weight"], sd["k_proj.weight"],
                                          sd["v_proj.weight"]]),
                 "qkv.bias": torch.cat([sd["q_proj.bias"], sd["k_proj.bias"],
                                        sd["v_proj.bias"]]),
                 "output.weight": sd["o_proj.weight"], "output.bias": sd["o_proj.bias"]}
        prefix = ""
    else:
        state = {PREFIX + k: v for k, v in sd.items()}
        prefix = PREFIX
    state = {k: v.detach().contiguous() for k, v in state.items()}

    m64 = RopeAttention(H, Hkv, D, biases).to(DT)
    m64.load_state_dict({k: v.to(DT) for k, v in sd.items()})
    r = (offset, base, pairing)
    with torch.no_grad():
        x64 = x.to(DT)
        out_sdpa = m64.forward_sdpa(x64, allowed, *r)
        out, weights, lse = m64.forward_explicit(x64, allowed, *r)
    diff = (out_sdpa - out).abs().max().item()
    assert diff < 1e-12, (name, diff)

    d = os.path.join(ROOT, name)
    os.makedirs(d)
    np.save(os.path.join(d, "x.npy"), f32(x))
    np.save(os.path.join(d, "out.npy"), f32(out))
    np.save(os.path.join(d, "attn.npy"), f32(weights))
    np.save(os.path.join(d, "lse.npy"), f32(lse))
    if ids is not None:
        np.save(os.path.join(d, "ids.npy"), ids)
    save_file(state, os.path.join(d, "weights.safetensors"))
    os.chmod(os.path.join(d, "weights.safetensors"), 0o644)  # save_file makes it 0600
    keys = dict(kind="gqa_rope", layout=layout, weights="weights.safetensors", prefix=prefix,
                num_heads=H, num_kv_heads=Hkv, head_dim=D, rope=pairing, rope_base=base,
                rope_offset=offset, input="x.npy", token_ids="ids.npy" if pad else "",
                pad_id=0 if pad else "", causal=1, output="out.npy", attention="attn.npy",
                lse="lse.npy")
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("# made by tests/golden/gen_gqa_rope.py with torch %s\n" % torch.__version__)
        for k, v in keys.items():
            assert " " not in str(v), (k, v)
            f.write("%s=%s\n" % (k, v))
    print("%-34s B=%d T=%d H=%d Hkv=%d D=%d %s base=%g offset=%d sdpa vs explicit %.1e"
          % (name, B, T, H, Hkv, D, pairing, base, offset, diff))
    return name


def decode_inputs():
    d = os.path.join(ROOT, "decode")
    os.makedirs(d)
    g = torch.Generator().manual_seed(99)
    for T in (1, 3, 17):
        np.save(os.path.join(d, "x_t%d.npy" % T), f32(torch.randn(2, T, E, generator=g)))
    ids = np.arange(1, 35, dtype=np.int64).reshape(2, 17)
    right = ids.copy()
    right[1, 14:] = 0
    left = ids.copy()
    left[1, :2] = 0
    np.save(os.path.join(d, "ids_right.npy"), right)
    np.save(os.path.join(d, "ids_left.npy"), left)


def sdpa_tail():
    d = os.path.join(ROOT, "sdpa_tail")
    os.makedirs(d)
    g = torch.Generator().manual_seed(7)
    H, Hkv, Tq, Tk, D, offset, base = 4, 2, 3, 10, 8, 7, 500000.0
    q = torch.randn(1, H, Tq, D, generator=g)
    k = torch.randn(1, Hkv, Tk, D, generator=g)
    v = torch.randn(1, Hkv, Tk, D, generator=g)
    qr = rope(q.to(DT), offset + Tk - Tq, base, "half")
    kr = rope(k.to(DT), offset, base, "half")
    allowed = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    out = F.scaled_dot_product_attention(qr, kr, v.to(DT), attn_mask=allowed, enable_gqa=True)
    for name, a in (("q", q), ("k", k), ("v", v), ("out", out)):
        np.save(os.path.join(d, name + ".npy"), f32(a))


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    names = [
        # Llama 3's shape of things: Hkv = H / 2, no biases, half pairing, base 500000.
        case("rope_gqa_half_base500k", 11, B=2, T=7, H=4, Hkv=2, D=8, biases="",
             layout="separate", pairing="half", base=500000.0, offset=0, pad=False),
        # Multi-query, q/k/v biases (Qwen2), interleaved, positions from 37, padding.
        case("rope_mqa_interleaved_offset37_pad", 12, B=2, T=6, H=4, Hkv=1, D=8,
             biases="qkv", layout="separate", pairing="interleaved", base=10000.0, offset=37,
             pad=True),
        # The chapter's fused weights, interleaved pairing, a non-default base.
        case("rope_chapter_interleaved_base500k", 13, B=2, T=5, H=4, Hkv=4, D=8,
             biases="qkvo", layout="fused", pairing="interleaved", base=500000.0, offset=0,
             pad=False),
        # Half pairing with an offset and a base that is not a power of ten.
        case("rope_gqa_half_base2500_offset5", 14, B=1, T=9, H=8, Hkv=2, D=4, biases="qkvo",
             layout="separate", pairing="half", base=2500.0, offset=5, pad=False),
    ]
    decode_inputs()
    sdpa_tail()
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# attention blocks with RoPE made by tests/golden/gen_gqa_rope.py\n")
        f.write("# torch %s, numpy %s\n" % (torch.__version__, np.__version__))
        for n in names:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
