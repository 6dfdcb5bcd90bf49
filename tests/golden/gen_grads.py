#!/usr/bin/env python3
"""Generates tests/data/golden_grads/: the gradients of attention with the options of
current models (grouped-query heads, causal alignment, windows, softcap, ALiBi,
additive bias, sinks, empty rows), computed by PyTorch 2.x autograd, so that
tests/test_sdpa_backward.c and tests/test_cli_grad.sh can check attn's backward
against PyTorch without PyTorch.

    python3 tests/golden/gen_grads.py        # from the repository root

Needs torch >= 2.5 (enable_gqa) and numpy. The torch version is written into
MANIFEST and every case.txt.

How the expected values are made: inputs (and the output's gradient dO) are drawn
in float32 and stored exactly; PyTorch computes in float64 from those values, the
loss is sum(dO * out), and autograd's gradients with respect to q, k, v, the bias
and the sinks are rounded once to float32. The forward is the contract's order
written out in torch (tests/golden/gen_options.py's visible() and slopes, the
softcap c * tanh(s / c), the sink as one more logit of each row's softmax, a row
that sees no key giving zero). Where PyTorch has every option a case uses, its own
torch.nn.functional.scaled_dot_product_attention is differentiated too (is_causal,
causal_lower_right, enable_gqa, a float attn_mask carrying the bias, ALiBi and the
window, with requires_grad for the bias) and the generator asserts that both give
the same gradients to 1e-12.

Each case is a folder of .npy files and a case.txt with gen_options.py's keys
(kind=sdpa_grads) plus:
  grad_output (dO), grad_query, grad_key, grad_value, grad_bias, grad_sinks
(empty when the case has no bias or no sinks), and, for the cases with RoPE on q and
k before the attention (as `attn sdpa --rope` applies it), rope (the pairing),
rope_base and rope_offset; their gradients are those of the unrotated q and k.
"""
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_gqa_rope  # noqa: E402
from gen_options import alibi_default_slopes, f32, visible  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_grads")
DT = torch.float64


def forward(q, k, v, scale, vis, softcap, bias, alibi, sinks, group):
    """The contract's order, step by step, in float64, safe to differentiate: a row
    that sees no key has its scores replaced by zeros before the softmax and its
    weights by zeros after, so no NaN enters autograd."""
    kr = k.repeat_interleave(group, dim=1)
    vr = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, kr.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
        vis = vis & ~torch.isneginf(bias.detach()).expand_as(s)
    if alibi is not None:
        s = s + alibi
    empty = ~vis.any(-1, keepdim=True)
    s = s.masked_fill(~vis, float("-inf")).masked_fill(empty, 0.0)
    B, H, Tq, Tk = s.shape
    if sinks is not None:
        full = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, Tq, 1)], dim=-1)
    else:
        full = s
    w = torch.softmax(full, dim=-1)[..., :Tk]
    w = w.masked_fill(empty, 0.0)
    return torch.matmul(w, vr), empty


def case(name, rng, B, H, Hkv, Tq, Tk, D, Dv, causal=0, window=None, softcap=0.0,
         alibi=0, bias_shape=None, bias_ninf=0.0, mask_shape=None, sinks=False,
         scale=None, qscale=1.0, empty_rows="error", want_empty=False, rope=None):
    q = f32(rng.standard_normal((B, H, Tq, D)) * qscale)
    k = f32(rng.standard_normal((B, Hkv, Tk, D)))
    v = f32(rng.standard_normal((B, Hkv, Tk, Dv)))
    do = f32(rng.standard_normal((B, H, Tq, Dv)))
    sc = 1.0 / math.sqrt(D) if scale is None else float(np.float32(scale))
    files = {"q.npy": q, "k.npy": k, "v.npy": v, "do.npy": do}
    keys = {"kind": "sdpa_grads", "query": "q.npy", "key": "k.npy", "value": "v.npy",
            "mask": "", "causal": causal, "scale": "" if scale is None else scale,
            "window": "" if window is None else "%d,%d" % window,
            "softcap": softcap if softcap else "", "alibi": "0", "bias": "", "sinks": "",
            "empty_rows": empty_rows, "output": "out.npy", "lse": "", "grad_output": "do.npy",
            "grad_query": "dq.npy", "grad_key": "dk.npy", "grad_value": "dv.npy",
            "grad_bias": "", "grad_sinks": ""}
    if rope is not None:
        keys["rope"], keys["rope_base"], keys["rope_offset"] = rope[0], rope[1], rope[2]
    mask = None
    if mask_shape is not None:
        mask = rng.random(mask_shape) < 0.7
        if want_empty:
            mask[..., 0, :] = False  # query 0 sees no key at all
        files["mask.npy"] = mask
        keys["mask"] = "mask.npy"
    b = None
    if bias_shape is not None:
        b = f32(rng.standard_normal(bias_shape))
        b[rng.random(bias_shape) < bias_ninf] = -np.inf
        files["bias.npy"] = b
        keys["bias"] = "bias.npy"
        keys["grad_bias"] = "dbias.npy"
    alibi_t = None
    if alibi:
        slopes = f32(alibi_default_slopes(H))
        keys["alibi"] = "1"
        i = torch.arange(Tq)[:, None] + (Tk - Tq)
        j = torch.arange(Tk)[None, :]
        alibi_t = -torch.from_numpy(slopes.astype(np.float64)).view(1, H, 1, 1) * \
            (i - j).abs().to(DT)
    sk = None
    if sinks:
        sk = f32(rng.standard_normal(H))
        files["sinks.npy"] = sk
        keys["sinks"] = "sinks.npy"
        keys["grad_sinks"] = "dsinks.npy"

    def leaves():
        t = [torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (q, k, v)]
        bt = torch.from_numpy(b.astype(np.float64)).requires_grad_() if b is not None else None
        st = torch.from_numpy(sk.astype(np.float64)).requires_grad_() if sk is not None else None
        return t[0], t[1], t[2], bt, st

    def rotated(qx, kx):
        """With RoPE the attention sees the rotated q and k (keys at positions
        offset .. offset+Tk-1, the queries at the last Tq of them, as `attn sdpa
        --rope` places them); the gradients are those of the unrotated inputs."""
        if rope is None:
            return qx, kx
        pairing, base, offset = rope
        return (gen_gqa_rope.rope(qx, offset + Tk - Tq, base, pairing),
                gen_gqa_rope.rope(kx, offset, base, pairing))

    dot = torch.from_numpy(do.astype(np.float64))
    vis = visible(B, H, Tq, Tk, causal, window, mask)
    qt, kt, vt, bt, st = leaves()
    out, empty = forward(*rotated(qt, kt), vt, sc, vis, softcap, bt, alibi_t, st, H // Hkv)
    assert bool(empty.any()) == want_empty, name
    (out * dot).sum().backward()
    grads = {"dq.npy": qt.grad, "dk.npy": kt.grad, "dv.npy": vt.grad}
    if bt is not None:
        grads["dbias.npy"] = bt.grad
    if st is not None:
        grads["dsinks.npy"] = st.grad

    # PyTorch's own function, differentiated, where it has every option the case uses.
    if not softcap and not sinks and not want_empty and mask is None:
        q2l, k2l, v2, b2, _ = leaves()
        q2, k2 = rotated(q2l, k2l)
        add = torch.zeros(B, H, Tq, Tk, dtype=DT)
        if b2 is not None:
            add = add + b2
        if alibi_t is not None:
            add = add + alibi_t
        add = add.masked_fill(~visible(B, H, Tq, Tk, causal, window, None), float("-inf"))
        kwargs = dict(scale=sc, enable_gqa=Hkv != H)
        if causal == 1 and window is None and b2 is None and alibi_t is None and Tq == Tk:
            ref = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, **kwargs)
        elif causal == 2 and window is None and b2 is None and alibi_t is None:
            from torch.nn.attention.bias import causal_lower_right
            g = H // Hkv
            ref = F.scaled_dot_product_attention(
                q2, k2.repeat_interleave(g, 1), v2.repeat_interleave(g, 1),
                attn_mask=causal_lower_right(Tq, Tk), scale=sc)
        else:
            ref = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=add, **kwargs)
        (ref * dot).sum().backward()
        own = {"dq.npy": q2l.grad, "dk.npy": k2l.grad, "dv.npy": v2.grad}
        if b2 is not None:
            own["dbias.npy"] = b2.grad
        for fname, g_own in own.items():
            diff = (g_own - grads[fname]).abs().max().item()
            assert diff < 1e-12, (name, fname, diff)
        keys["checked_against"] = "scaled_dot_product_attention"
    else:
        keys["checked_against"] = "written_out"

    files["out.npy"] = f32(out.detach().numpy())
    for fname, g in grads.items():
        files[fname] = f32(g.numpy())
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    for fname, arr in files.items():
        np.save(os.path.join(d, fname), arr)
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("# made by tests/golden/gen_grads.py with torch %s\n" % torch.__version__)
        for key, val in keys.items():
            val = str(val)
            assert " " not in val, (key, val)
            f.write("%s=%s\n" % (key, val))
    return name


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    rng = np.random.default_rng(20261201)
    cases = [
        case("plain", rng, B=2, H=2, Hkv=2, Tq=5, Tk=5, D=4, Dv=3),
        case("gqa_causal", rng, B=2, H=4, Hkv=2, Tq=6, Tk=6, D=4, Dv=4, causal=1),
        case("mqa_bottom_right", rng, B=1, H=3, Hkv=1, Tq=3, Tk=7, D=4, Dv=5, causal=2),
        case("top_left_tq_gt_tk", rng, B=1, H=2, Hkv=2, Tq=6, Tk=4, D=3, Dv=3, causal=1),
        case("window_two_sided", rng, B=2, H=2, Hkv=1, Tq=5, Tk=8, D=4, Dv=4, window=(2, 1)),
        case("softcap", rng, B=1, H=2, Hkv=2, Tq=5, Tk=6, D=4, Dv=4, softcap=2.0, qscale=3.0,
             causal=1),
        case("alibi", rng, B=1, H=4, Hkv=2, Tq=4, Tk=6, D=4, Dv=3, alibi=1, causal=2),
        case("bias_heads", rng, B=2, H=3, Hkv=3, Tq=4, Tk=5, D=4, Dv=4, bias_shape=(1, 3, 1, 5)),
        case("bias_full_ninf_empty_rows", rng, B=2, H=2, Hkv=1, Tq=4, Tk=6, D=3, Dv=3,
             bias_shape=(2, 1, 4, 6), bias_ninf=0.2, mask_shape=(2, 1, 4, 6),
             empty_rows="zero", want_empty=True),
        case("sinks", rng, B=1, H=4, Hkv=2, Tq=5, Tk=5, D=4, Dv=4, sinks=True, causal=1),
        case("sinks_empty_rows", rng, B=1, H=2, Hkv=2, Tq=4, Tk=6, D=4, Dv=4, sinks=True,
             window=(0, 0), causal=2, mask_shape=(1, 1, 4, 6), want_empty=True),
        case("everything", rng, B=2, H=4, Hkv=2, Tq=4, Tk=7, D=4, Dv=3, causal=2,
             window=(3, 0), softcap=3.0, alibi=1, bias_shape=(1, 4, 4, 7), sinks=True,
             scale=0.6),
        # RoPE on q and k before the attention (`attn sdpa --rope`): the gradients
        # of the unrotated inputs, so the backward turns dq and dk back.
        case("rope_interleaved_causal", rng, B=1, H=2, Hkv=2, Tq=6, Tk=6, D=8, Dv=4,
             causal=1, rope=("interleaved", 10000.0, 3)),
        case("rope_half_gqa_bottom_right", rng, B=2, H=4, Hkv=2, Tq=3, Tk=7, D=8, Dv=8,
             causal=2, rope=("half", 500000.0, 5)),
    ]
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# golden cases made by tests/golden/gen_grads.py\n")
        f.write("# torch %s, numpy %s\n" % (torch.__version__, np.__version__))
        for c in cases:
            f.write(c + "\n")
    print("torch %s: %d cases in %s" % (torch.__version__, len(cases), os.path.normpath(ROOT)))


if __name__ == "__main__":
    main()
