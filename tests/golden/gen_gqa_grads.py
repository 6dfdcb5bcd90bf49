#!/usr/bin/env python3
"""Generates tests/data/golden_gqa_grads/: the gradients of grouped-query attention
with separate projections (Llama's block: q_proj, k_proj, v_proj, o_proj, H query
heads reading Hkv key/value heads), with and without RoPE, and of the chapter's
fused module with RoPE, computed by PyTorch 2.x autograd, so that
tests/test_gqa_backward.c (attn_gqa_backward) and tests/test_cli_gqa_grad.sh
(`attn forward --num-kv-heads ... --rope ... --grad-*`) check attn against PyTorch
without PyTorch.

    /work/venv-torch/bin/python tests/golden/gen_gqa_grads.py   # from the repository root

Needs torch, numpy and safetensors. The torch version is written into MANIFEST and
every case.txt.

How the expected values are made: the weights, x and the output's gradient dY are
drawn in float32 and stored exactly; the block runs in float64 on those values
(RoPE's cos and sin computed in float32 as SPEC section 7 says, then widened: the
rope() of gen_gqa_rope.py), the loss is sum(dY * out), and autograd's gradients
with respect to x and every parameter are rounded once to float32. The attention
runs through F.scaled_dot_product_attention(enable_gqa=True); the generator also
differentiates the block written out with repeat_interleave and an explicit
softmax and asserts that both agree to 1e-12, so the expected values are PyTorch's
own GQA and not a model of it.

Each case is a folder with case.txt (key=value lines: layout separate or fused,
prefix, num_heads, num_kv_heads, causal, mask, rope (none, interleaved or half),
rope_base, rope_offset), the inputs x.npy, dy.npy and mask.npy (bool [B, 1, 1, T],
"may attend", or absent), weights.safetensors under the names the loader reads
(prefix + q_proj.weight ... or qkv.weight ...), the output out.npy, dx.npy, and
the gradient of each tensor of weights.safetensors as grad_<its name>.npy.
"""
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_gqa_rope import rope  # noqa: E402  (the float32 cos/sin recipe of SPEC section 7)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_gqa_grads")
DT = torch.float64


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def block(x, p, H, Hkv, D, allowed, pairing, base, offset, explicit):
    """Llama's attention block in float64 on the parameters p (a dict of tensors;
    a missing bias is none)."""
    B, T, E = x.shape

    def lin(t, w, b):
        y = t @ p[w].T
        return y + p[b] if b in p else y

    q = lin(x, "wq", "bq").view(B, T, H, D).transpose(1, 2)
    k = lin(x, "wk", "bk").view(B, T, Hkv, D).transpose(1, 2)
    v = lin(x, "wv", "bv").view(B, T, Hkv, D).transpose(1, 2)
    if pairing != "none":
        q, k = rope(q, offset, base, pairing), rope(k, offset, base, pairing)
    if explicit:
        g = H // Hkv
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = (q @ k.transpose(-2, -1) / D ** 0.5).masked_fill(~allowed, float("-inf"))
        ctx = torch.softmax(s, dim=-1) @ v
    else:
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    return lin(ctx.transpose(1, 2).reshape(B, T, H * D), "wo", "bo")


def case(name, rng, B, T, E, H, Hkv, D, biases="qkvo", layout="separate", prefix="",
         causal=False, pad=False, pairing="none", base=10000.0, offset=0):
    shapes = {"wq": (H * D, E), "wk": (Hkv * D, E), "wv": (Hkv * D, E), "wo": (E, H * D),
              "bq": (H * D,), "bk": (Hkv * D,), "bv": (Hkv * D,), "bo": (E,)}
    bound = 1.0 / np.sqrt(E)
    arrs = {k: f32(rng.uniform(-bound, bound, s)) for k, s in shapes.items()
            if k[0] == "w" or k[1] in biases}
    x = f32(rng.standard_normal((B, T, E)))
    dy = f32(rng.standard_normal((B, T, E)))
    allowed = np.ones((B, 1, T, T), dtype=bool)
    files = {}
    if pad:
        m = np.ones((B, 1, 1, T), dtype=bool)
        m[1:, 0, 0, T - 2:] = False  # every sequence but the first ends in two pads
        allowed = allowed & m
        files["mask.npy"] = m
    if causal:
        allowed = allowed & np.tril(np.ones((T, T), dtype=bool))
    assert allowed.any(-1).all(), "a case must not have an empty row"

    grads = []
    for explicit in (False, True):
        p = {k: torch.from_numpy(a).to(DT).requires_grad_(True) for k, a in arrs.items()}
        xt = torch.from_numpy(x).to(DT).requires_grad_(True)
        out = block(xt, p, H, Hkv, D, torch.from_numpy(allowed), pairing, base, offset, explicit)
        (out * torch.from_numpy(dy).to(DT)).sum().backward()
        grads.append((out.detach(), xt.grad, {k: t.grad for k, t in p.items()}))
    (out, dx, gp), (out_e, dx_e, gp_e) = grads
    assert torch.allclose(out, out_e, atol=1e-12, rtol=0), name
    assert torch.allclose(dx, dx_e, atol=1e-12, rtol=0), name
    for k in gp:
        assert torch.allclose(gp[k], gp_e[k], atol=1e-12, rtol=0), (name, k)

    # The tensors of the weights file and their gradients, under the loader's names.
    if layout == "fused":
        assert H == Hkv and H * D == E and biases == "qkvo"
        cat = lambda a, b, c: np.concatenate([a, b, c])  # noqa: E731
        named = {"qkv.weight": (cat(arrs["wq"], arrs["wk"], arrs["wv"]),
                                cat(gp["wq"], gp["wk"], gp["wv"])),
                 "qkv.bias": (cat(arrs["bq"], arrs["bk"], arrs["bv"]),
                              cat(gp["bq"], gp["bk"], gp["bv"])),
                 "output.weight": (arrs["wo"], gp["wo"]), "output.bias": (arrs["bo"], gp["bo"])}
    else:
        proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
        named = {}
        for k in arrs:
            kind = "weight" if k[0] == "w" else "bias"
            named["%s.%s" % (proj[k[1]], kind)] = (arrs[k], gp[k].numpy())
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    files.update({"x.npy": x, "dy.npy": dy, "out.npy": f32(out.numpy()), "dx.npy": f32(dx.numpy())})
    for n, (_, g) in named.items():
        files["grad_%s%s.npy" % (prefix, n)] = f32(g)
    for fname, arr in files.items():
        np.save(os.path.join(d, fname), arr)
    save_file({prefix + n: torch.from_numpy(a) for n, (a, _) in named.items()},
              os.path.join(d, "weights.safetensors"))
    os.chmod(os.path.join(d, "weights.safetensors"), 0o644)
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("# made by tests/golden/gen_gqa_grads.py with torch %s\n" % torch.__version__)
        f.write("layout=%s\nprefix=%s\nnum_heads=%d\nnum_kv_heads=%d\ncausal=%d\nmask=%s\n"
                "rope=%s\nrope_base=%r\nrope_offset=%d\n"
                % (layout, prefix, H, Hkv, int(causal), "mask.npy" if pad else "", pairing,
                   base, offset))
    return name


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    rng = np.random.default_rng(1414)
    names = [
        case("gqa_causal", rng, 2, 5, 16, 4, 2, 4, causal=True),
        case("mqa_nobias_pad", rng, 3, 6, 12, 4, 1, 4, biases="", causal=True, pad=True,
             prefix="model.layers.0.self_attn."),
        case("gqa_rope_interleaved", rng, 2, 5, 8, 2, 1, 6, biases="qv",
             pairing="interleaved", offset=0),
        case("gqa_rope_half", rng, 2, 6, 12, 6, 2, 4, causal=True, pad=True, pairing="half",
             base=500000.0, offset=3),
        case("mha_rope_interleaved", rng, 2, 5, 8, 2, 2, 4, layout="fused", causal=True,
             pairing="interleaved", offset=2),
        case("mha_rope_half", rng, 2, 6, 16, 4, 4, 4, layout="fused", pad=True,
             pairing="half", base=1000.0, offset=0),
    ]
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# made by tests/golden/gen_gqa_grads.py with torch %s\n" % torch.__version__)
        for n in names:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
