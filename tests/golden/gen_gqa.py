#!/usr/bin/env python3
"""Generates the grouped-query attention cases of tests/data/golden_gqa/: a
Llama-style attention block without RoPE (four nn.Linear layers q_proj, k_proj,
v_proj, o_proj, H query heads and Hkv key/value heads of size D), its weights saved
as a .safetensors file under the prefix 'model.layers.0.self_attn.', an input, and
what PyTorch computes. tests/test_golden.c (kind=gqa) and tests/test_cli_gqa.sh
check attn_gqa_forward and `attn forward --num-kv-heads` against them without
Python.

    python3 tests/golden/gen_gqa.py   # from the repository root

How the expected values are made (as in gen_golden.py): the weights are drawn in
float32 (nn.Linear's own initialisation, seeded) and the input with torch.randn,
stored exactly; the block then runs in float64 on those same values and the
results are rounded once to float32. The attention runs twice, through
F.scaled_dot_product_attention(..., enable_gqa=True) and written out with
repeat_kv (chapter 21's way: each key/value head repeated H / Hkv times); the two
must agree to 1e-12 before anything is written. The written-out path also gives
the attention weights [B, H, T, T] and the log-sum-exp [B, H, T].

case.txt keys: kind=gqa, weights, prefix, num_heads, num_kv_heads, head_dim,
biases (which projections have one: a subset of qkvo, or 'none'), input,
token_ids, pad_id, causal, output, attention, lse.
"""
import os
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_gqa")
PREFIX = "model.layers.0.self_attn."
DT = torch.float64


class LlamaStyleAttention(nn.Module):
    """Separate projections, H query heads, Hkv key/value heads, no RoPE."""

    def __init__(self, E, H, Hkv, D, biases):
        super().__init__()
        self.H, self.Hkv, self.D = H, Hkv, D
        self.q_proj = nn.Linear(E, H * D, bias="q" in biases)
        self.k_proj = nn.Linear(E, Hkv * D, bias="k" in biases)
        self.v_proj = nn.Linear(E, Hkv * D, bias="v" in biases)
        self.o_proj = nn.Linear(H * D, E, bias="o" in biases)

    def heads(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        return q, k, v

    def merge(self, ctx):
        B, H, T, D = ctx.shape
        return self.o_proj(ctx.transpose(1, 2).reshape(B, T, H * D))

    def forward_sdpa(self, x, allowed):
        q, k, v = self.heads(x)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        return self.merge(ctx)

    def forward_explicit(self, x, allowed):
        """repeat_kv, scores, mask, softmax, weighted sum: every step visible."""
        q, k, v = self.heads(x)
        group = self.H // self.Hkv
        k = k.repeat_interleave(group, dim=1)  # [B, H, T, D]: head h reads h // group
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-2, -1) / (self.D ** 0.5)
        scores = scores.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.softmax(scores, dim=-1)
        return self.merge(weights @ v), weights, lse


def demo_ids(B, T, pad):
    """Token ids with a pad tail in every sample but the first (SPEC's demo rule)."""
    ids = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        real = max(1, T - 1 - (b % max(1, min(T, 3))))
        ids[b, :real] = np.arange(1, real + 1) + b * T
        ids[b, real:] = pad
    return ids


def f32(t):
    return np.ascontiguousarray(t.detach().numpy().astype(np.float32))


def gqa_case(name, seed, B, T, E, H, Hkv, D, biases, causal, pad, single=False):
    torch.manual_seed(seed)
    m = LlamaStyleAttention(E, H, Hkv, D, biases)  # float32 draws
    x = torch.randn(B, T, E)
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    ids = None
    if pad:
        ids = demo_ids(B, T, 0)
        allowed = allowed & torch.from_numpy(ids != 0).view(B, 1, 1, T)
    if causal:
        allowed = allowed & torch.tril(torch.ones(T, T, dtype=torch.bool))
    state = {PREFIX + k: v.detach().contiguous() for k, v in m.state_dict().items()}

    m64 = LlamaStyleAttention(E, H, Hkv, D, biases).to(DT)
    m64.load_state_dict({k: v.to(DT) for k, v in m.state_dict().items()})
    with torch.no_grad():
        x64 = x.to(DT)
        out_sdpa = m64.forward_sdpa(x64, allowed)
        out, weights, lse = m64.forward_explicit(x64, allowed)
    diff = (out_sdpa - out).abs().max().item()
    assert diff < 1e-12, (name, diff)

    d = os.path.join(ROOT, name)
    os.makedirs(d)
    xs, outs = f32(x), f32(out)
    if single:
        xs, outs = xs[0], outs[0]
    np.save(os.path.join(d, "x.npy"), xs)
    np.save(os.path.join(d, "out.npy"), outs)
    np.save(os.path.join(d, "attn.npy"), f32(weights[0] if single else weights))
    np.save(os.path.join(d, "lse.npy"), f32(lse[0] if single else lse))
    if ids is not None:
        np.save(os.path.join(d, "ids.npy"), ids[0] if single else ids)
    save_file(state, os.path.join(d, "weights.safetensors"))
    os.chmod(os.path.join(d, "weights.safetensors"), 0o644)  # save_file makes it 0600
    keys = dict(kind="gqa", weights="weights.safetensors", prefix=PREFIX, num_heads=H,
                num_kv_heads=Hkv, head_dim=D, biases=biases or "none", input="x.npy",
                token_ids="ids.npy" if pad else "", pad_id=0 if pad else "",
                causal=int(causal), output="out.npy", attention="attn.npy", lse="lse.npy")
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("# made by tests/golden/gen_gqa.py with torch %s\n" % torch.__version__)
        for k, v in keys.items():
            assert " " not in str(v), (k, v)
            f.write("%s=%s\n" % (k, v))
    print("%-28s B=%d T=%d E=%d H=%d Hkv=%d D=%d biases=%s sdpa vs explicit %.1e"
          % (name, B, T, E, H, Hkv, D, biases or "none", diff))
    return name


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    names = [
        # Hkv = H: plain multi-head attention through the separate projections.
        gqa_case("gqa_h4_kv4_bias_causal", 1, B=2, T=5, E=16, H=4, Hkv=4, D=4,
                 biases="qkvo", causal=True, pad=False),
        # Hkv = H / 2, no biases at all (Llama).
        gqa_case("gqa_h4_kv2_nobias_causal", 2, B=2, T=6, E=16, H=4, Hkv=2, D=4,
                 biases="", causal=True, pad=False),
        # Hkv = 1 (multi-query), biases, a padding mask AND causal.
        gqa_case("gqa_h6_kv1_bias_pad_causal", 3, B=3, T=7, E=12, H=6, Hkv=1, D=2,
                 biases="qkvo", causal=True, pad=True),
        # H*D != E (D from the weights), q/k/v biases but none on o (Qwen2).
        gqa_case("gqa_h4_kv2_d3_qkvbias_pad", 4, B=2, T=5, E=10, H=4, Hkv=2, D=3,
                 biases="qkv", causal=True, pad=True),
        # One sequence [T, E], Hkv = 1, padding only (not causal).
        gqa_case("gqa_single_h2_kv1_pad", 5, B=1, T=6, E=8, H=2, Hkv=1, D=4,
                 biases="qkvo", causal=False, pad=True, single=True),
    ]
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# grouped-query cases made by tests/golden/gen_gqa.py\n")
        f.write("# torch %s, numpy %s\n" % (torch.__version__, np.__version__))
        for n in names:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
