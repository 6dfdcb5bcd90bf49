#!/usr/bin/env python3
"""Generates tests/data/golden_mha_grads/: the gradients of the chapter's multi-head
self-attention module (a fused qkv Linear, heads, masked softmax, an output
Linear) computed by PyTorch 2.x autograd, so that tests/test_mha_backward.c (and
the command-line tests) can check attn_mha_backward against PyTorch without
PyTorch.

    python3 tests/golden/gen_mha_grads.py        # from the repository root

Needs torch, numpy and safetensors. The torch version is written into MANIFEST and
every case.txt.

How the expected values are made: x, the weights and the output's gradient dY are
drawn in float32 and stored exactly; the module runs in float64 from those values,
the loss is sum(dY * out), and autograd's gradients with respect to x and the four
parameters are rounded once to float32. The generator also differentiates
torch.nn.MultiheadAttention with the same weights and asserts that both agree to
1e-12, so the module below is the one PyTorch ships.

Each case is a folder with case.txt (num_heads, causal, mask: key=value lines),
the inputs x.npy, dy.npy, mask.npy (bool, "may attend", or absent), the weights
as .npy files and as weights.safetensors under the chapter's names (qkv.weight,
qkv.bias, output.weight, output.bias), the output out.npy, and the gradients
dx.npy, dw_qkv.npy, db_qkv.npy, dw_o.npy and db_o.npy; weights_torch_prefixed
.safetensors holds the same weights under PyTorch's names with the prefix
'layer.0.' and without the output bias (which changes no gradient).

experiment_s<seed>_<B>_<T>_<E>_<H>.txt: inspect_self_attention --grad's numbers
(the loss, then each tensor's name, shape, norm and first four values) for the
chapter's experiment with those options, in float64 from the same float32 draws.
"""
import math
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_mha_grads")
DT = torch.float64


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


class SelfAttention(torch.nn.Module):
    """The chapter's module: one Linear makes q, k and v, the heads attend with a
    boolean mask ("may attend"), and a second Linear mixes the heads."""

    def __init__(self, E, H):
        super().__init__()
        self.H = H
        self.qkv = torch.nn.Linear(E, 3 * E, dtype=DT)
        self.output = torch.nn.Linear(E, E, dtype=DT)

    def forward(self, x, allowed):
        B, T, E = x.shape
        D = E // self.H
        q, k, v = self.qkv(x).split(E, dim=-1)
        q, k, v = (t.view(B, T, self.H, D).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        s = s.masked_fill(~allowed, float("-inf"))
        ctx = torch.softmax(s, dim=-1) @ v
        return self.output(ctx.transpose(1, 2).reshape(B, T, E))


def case(name, rng, B, T, E, H, causal=False, mask=None):
    bound = 1.0 / np.sqrt(E)
    w_qkv = f32(rng.uniform(-bound, bound, (3 * E, E)))
    b_qkv = f32(rng.uniform(-bound, bound, (3 * E,)))
    w_o = f32(rng.uniform(-bound, bound, (E, E)))
    b_o = f32(rng.uniform(-bound, bound, (E,)))
    x = f32(rng.standard_normal((B, T, E)))
    dy = f32(rng.standard_normal((B, T, E)))

    allowed = np.ones((B, 1, T, T), dtype=bool)
    files = {}
    if mask is not None:
        allowed = allowed & mask
        files["mask.npy"] = mask
    if causal:
        allowed = allowed & np.tril(np.ones((T, T), dtype=bool))
    assert allowed.any(-1).all(), "a case must not have an empty row"

    m = SelfAttention(E, H)
    with torch.no_grad():
        m.qkv.weight.copy_(torch.from_numpy(w_qkv))
        m.qkv.bias.copy_(torch.from_numpy(b_qkv))
        m.output.weight.copy_(torch.from_numpy(w_o))
        m.output.bias.copy_(torch.from_numpy(b_o))
    xt = torch.from_numpy(x).to(DT).requires_grad_(True)
    out = m(xt, torch.from_numpy(allowed))
    (out * torch.from_numpy(dy).to(DT)).sum().backward()

    # The same gradients through torch.nn.MultiheadAttention.
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    with torch.no_grad():
        ref.in_proj_weight.copy_(m.qkv.weight)
        ref.in_proj_bias.copy_(m.qkv.bias)
        ref.out_proj.weight.copy_(m.output.weight)
        ref.out_proj.bias.copy_(m.output.bias)
    xr = torch.from_numpy(x).to(DT).requires_grad_(True)
    am = torch.from_numpy(~np.broadcast_to(allowed, (B, H, T, T)).reshape(B * H, T, T))
    out_r, _ = ref(xr, xr, xr, attn_mask=am, need_weights=False)
    (out_r * torch.from_numpy(dy).to(DT)).sum().backward()
    for a, b in ((out, out_r), (xt.grad, xr.grad), (m.qkv.weight.grad, ref.in_proj_weight.grad),
                 (m.qkv.bias.grad, ref.in_proj_bias.grad),
                 (m.output.weight.grad, ref.out_proj.weight.grad),
                 (m.output.bias.grad, ref.out_proj.bias.grad)):
        assert torch.allclose(a, b, atol=1e-12, rtol=0), name

    files.update({
        "x.npy": x, "dy.npy": dy, "w_qkv.npy": w_qkv, "b_qkv.npy": b_qkv, "w_o.npy": w_o,
        "b_o.npy": b_o, "out.npy": f32(out.detach().numpy()), "dx.npy": f32(xt.grad.numpy()),
        "dw_qkv.npy": f32(m.qkv.weight.grad.numpy()), "db_qkv.npy": f32(m.qkv.bias.grad.numpy()),
        "dw_o.npy": f32(m.output.weight.grad.numpy()),
        "db_o.npy": f32(m.output.bias.grad.numpy()),
    })
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    for fname, arr in files.items():
        np.save(os.path.join(d, fname), arr)
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("# made by tests/golden/gen_mha_grads.py with torch %s\n" % torch.__version__)
        f.write("num_heads=%d\ncausal=%d\nmask=%s\n" % (H, int(causal),
                                                        "mask.npy" if mask is not None else ""))
    st = {"qkv.weight": torch.from_numpy(w_qkv), "qkv.bias": torch.from_numpy(b_qkv),
          "output.weight": torch.from_numpy(w_o), "output.bias": torch.from_numpy(b_o)}
    save_file(st, os.path.join(d, "weights.safetensors"))
    os.chmod(os.path.join(d, "weights.safetensors"), 0o644)
    # The same weights under PyTorch's names with a prefix and without the output
    # bias: b_o only shifts the output, so every gradient stays the same, and the
    # gradients' file must name exactly the three tensors this file has.
    st = {"layer.0.in_proj_weight": torch.from_numpy(w_qkv),
          "layer.0.in_proj_bias": torch.from_numpy(b_qkv),
          "layer.0.out_proj.weight": torch.from_numpy(w_o)}
    save_file(st, os.path.join(d, "weights_torch_prefixed.safetensors"))
    os.chmod(os.path.join(d, "weights_torch_prefixed.safetensors"), 0o644)
    return name


def experiment_grads(seed, B, T, E, H):
    """inspect_self_attention --grad's lines for these sizes: the chapter's experiment
    as tests/golden/gen_learner.py runs it (torch.manual_seed, x = randn, the fused
    qkv and output Linear layers, the demo padding AND causal mask), in float64 from
    the float32 draws, with loss = output.mean(); each tensor's norm and first four
    values as the program prints them."""
    from gen_learner import demo_ids
    torch.manual_seed(seed)
    x = torch.randn(B, T, E)
    qkv_l = torch.nn.Linear(E, 3 * E)
    out_l = torch.nn.Linear(E, E)
    D = E // H
    x = x.to(DT).requires_grad_(True)
    qkv_l, out_l = qkv_l.to(DT), out_l.to(DT)
    qkv = qkv_l(x)
    qkv.retain_grad()
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(E, dim=-1))
    for t in (q, k, v):
        t.retain_grad()
    ids = demo_ids(B, T)
    mask = (ids != 0)[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    s = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~mask, float("-inf"))
    merged = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, E)
    merged.retain_grad()
    out = out_l(merged)
    out.retain_grad()
    loss = out.mean()
    loss.backward()
    rows = [("output", out.grad), ("W_o", out_l.weight.grad), ("b_o", out_l.bias.grad),
            ("context", merged.grad), ("v", v.grad), ("k", k.grad), ("q", q.grad),
            ("qkv", qkv.grad), ("W_qkv", qkv_l.weight.grad), ("b_qkv", qkv_l.bias.grad),
            ("x", x.grad)]
    lines = ["loss %.9e" % loss.item()]
    for name, g in rows:
        g = g.contiguous().reshape(-1)
        lines.append("%s %s %.9e %s" % (name, "x".join(str(d) for d in
                                                       dict(rows)[name].shape),
                                        g.norm().item(),
                                        " ".join("%.9e" % g[i].item() for i in range(min(4, g.numel())))))
    return "\n".join(lines) + "\n"


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    rng = np.random.default_rng(14)
    pad = np.ones((2, 1, 1, 6), dtype=bool)
    pad[1, 0, 0, 4:] = False  # the second sequence's last two tokens are padding
    names = [
        case("plain", rng, 2, 5, 8, 2),
        case("causal", rng, 1, 6, 12, 3, causal=True),
        case("padding_causal", rng, 2, 6, 8, 4, causal=True, mask=pad),
        case("one_head", rng, 3, 4, 6, 1),
    ]
    # inspect_self_attention --grad's numbers: name, shape, norm, first values.
    for seed, B, T, E, H in ((42, 2, 5, 16, 4), (7, 3, 7, 12, 3)):
        with open(os.path.join(ROOT, "experiment_s%d_%d_%d_%d_%d.txt" % (seed, B, T, E, H)),
                  "w") as f:
            f.write(experiment_grads(seed, B, T, E, H))
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# made by tests/golden/gen_mha_grads.py with torch %s\n" % torch.__version__)
        for n in names:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
