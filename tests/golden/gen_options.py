#!/usr/bin/env python3
"""Generates tests/data/golden_options/: attention with the options of current models
(grouped-query heads, causal alignment, windows, softcap, ALiBi, additive bias, sinks,
log-sum-exp), computed by PyTorch 2.x, so that tests/test_golden.c can check attn
against PyTorch without PyTorch.

    python3 tests/golden/gen_options.py        # from the repository root

Needs torch >= 2.5 (enable_gqa), numpy and safetensors' absence is fine. The torch
version is written into MANIFEST and every case.txt.

How the expected values are made: inputs are drawn in float32 and stored exactly;
PyTorch computes in float64 from those values and the results are rounded once to
float32. Where PyTorch has the option itself, its own function computes the output:
torch.nn.functional.scaled_dot_product_attention with enable_gqa=True, is_causal
(top-left), torch.nn.attention.bias.causal_lower_right (bottom-right), and a float
attn_mask carrying the bias, ALiBi and the window (-inf outside it). The softcap and
the sink have no PyTorch switch, so they are written out in torch as the contract
states them (c * tanh(s / c); a sink logit concatenated to each row before the
softmax and dropped after). The weights and the log-sum-exp always come from that
written-out form, and the generator asserts that both forms give the same output
wherever both apply.

Each case is a folder of .npy files and a case.txt of key=value lines:
  kind=sdpa_options  query, key, value, mask, causal (0 none, 1 top-left,
                     2 bottom-right), scale, window (LEFT,RIGHT or empty), softcap,
                     alibi (0, 1 default slopes, or a slopes file), bias, sinks,
                     empty_rows, output, attention, lse
"""
import math
import os
import shutil

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_options")
DT = torch.float64


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def alibi_default_slopes(n):
    """The ALiBi paper's slopes: 2^(-8k/n) for a power of two n, else those of the
    largest power of two m below n followed by every other slope of 2m heads."""
    def pow2(n):
        return [2.0 ** (-8.0 * (k + 1) / n) for k in range(n)]
    if math.log2(n).is_integer():
        return pow2(n)
    m = 2 ** math.floor(math.log2(n))
    return pow2(m) + pow2(2 * m)[0::2][: n - m]


def visible(B, H, Tq, Tk, causal, window, mask):
    """[B, H, Tq, Tk] booleans: the keys each query may see (mask: true = may)."""
    i = torch.arange(Tq)[:, None]
    j = torch.arange(Tk)[None, :]
    ip = i + (Tk - Tq)
    vis = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal == 1:
        vis &= j <= i
    if causal == 2:
        vis &= j <= ip
    if window is not None:
        left, right = window
        if left >= 0:
            vis &= j >= ip - left
        if right >= 0:
            vis &= j <= ip + right
    vis = vis.expand(B, H, Tq, Tk).clone()
    if mask is not None:
        vis &= torch.from_numpy(mask)
    return vis


def written_out(q, k, v, scale, vis, softcap, bias, alibi, sinks, group):
    """The contract's order, step by step, in float64."""
    kr = k.repeat_interleave(group, dim=1)
    vr = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, kr.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if alibi is not None:
        s = s + alibi
    vis = vis & ~torch.isneginf(s if bias is None else bias.expand_as(s))
    s = s.masked_fill(~vis, float("-inf"))
    B, H, Tq, Tk = s.shape
    if sinks is not None:
        sink_col = sinks.view(1, H, 1, 1).expand(B, H, Tq, 1)
        full = torch.cat([s, sink_col], dim=-1)
    else:
        full = s
    lse = torch.logsumexp(full, dim=-1)
    w = torch.exp(full - lse[..., None])[..., :Tk]
    empty = ~vis.any(-1)
    w = torch.where(empty[..., None], torch.zeros_like(w), w)
    w = torch.nan_to_num(w, nan=0.0)  # rows with nothing visible and no sink
    out = torch.matmul(w, vr)
    return out, w, lse, empty


def case(name, rng, B, H, Hkv, Tq, Tk, D, Dv, causal=0, window=None, softcap=0.0,
         alibi=0, bias_shape=None, bias_ninf=0.0, mask_shape=None, sinks=False,
         scale=None, qscale=1.0, empty_rows="error", want_empty=False):
    q = f32(rng.standard_normal((B, H, Tq, D)) * qscale)
    k = f32(rng.standard_normal((B, Hkv, Tk, D)))
    v = f32(rng.standard_normal((B, Hkv, Tk, Dv)))
    qt, kt, vt = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
    sc = 1.0 / math.sqrt(D) if scale is None else float(np.float32(scale))
    files = {"q.npy": q, "k.npy": k, "v.npy": v}
    keys = {"kind": "sdpa_options", "query": "q.npy", "key": "k.npy", "value": "v.npy",
            "mask": "", "causal": causal, "scale": "" if scale is None else scale,
            "window": "" if window is None else "%d,%d" % window,
            "softcap": softcap if softcap else "", "alibi": "0", "bias": "", "sinks": "",
            "empty_rows": empty_rows, "output": "out.npy", "attention": "attn.npy",
            "lse": "lse.npy"}
    mask = None
    if mask_shape is not None:
        mask = rng.random(mask_shape) < 0.7
        files["mask.npy"] = mask
        keys["mask"] = "mask.npy"
    bias = None
    if bias_shape is not None:
        b = f32(rng.standard_normal(bias_shape))
        b[rng.random(bias_shape) < bias_ninf] = -np.inf
        if want_empty and bias_ninf:
            b[(0,) * (b.ndim - 1)] = -np.inf  # one query row sees no key at all
        files["bias.npy"] = b
        keys["bias"] = "bias.npy"
        bias = torch.from_numpy(b.astype(np.float64))
    alibi_t = None
    if alibi:
        if alibi == 1:
            slopes = f32(alibi_default_slopes(H))
            keys["alibi"] = "1"
        else:
            slopes = f32(rng.uniform(0.01, 0.5, H))
            files["slopes.npy"] = slopes
            keys["alibi"] = "slopes.npy"
        i = torch.arange(Tq)[:, None] + (Tk - Tq)
        j = torch.arange(Tk)[None, :]
        dist = (i - j).abs().to(DT)
        alibi_t = -torch.from_numpy(slopes.astype(np.float64)).view(1, H, 1, 1) * dist
    sinks_t = None
    if sinks:
        sk = f32(rng.standard_normal(H))
        files["sinks.npy"] = sk
        keys["sinks"] = "sinks.npy"
        sinks_t = torch.from_numpy(sk.astype(np.float64))

    vis = visible(B, H, Tq, Tk, causal, window, mask)
    out, w, lse, empty = written_out(qt, kt, vt, sc, vis, softcap, bias, alibi_t, sinks_t,
                                     H // Hkv)
    assert bool(empty.any()) == want_empty, name

    # PyTorch's own function, where it has every option the case uses.
    if not softcap and not sinks and not bool(empty.any()):
        add = torch.zeros(B, H, Tq, Tk, dtype=DT)
        if bias is not None:
            add = add + bias
        if alibi_t is not None:
            add = add + alibi_t
        own_vis = visible(B, H, Tq, Tk, 0, window, mask)
        add = add.masked_fill(~own_vis, float("-inf"))
        kwargs = dict(scale=sc, enable_gqa=Hkv != H)
        if causal == 1:
            if (add == 0).all() and Tq == Tk:
                ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **kwargs)
            else:
                add = add.masked_fill(~visible(B, H, Tq, Tk, 1, None, None), float("-inf"))
                ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=add, **kwargs)
        elif causal == 2:
            from torch.nn.attention.bias import causal_lower_right
            if (add == 0).all():
                ref = F.scaled_dot_product_attention(
                    qt, kt.repeat_interleave(H // Hkv, 1), vt.repeat_interleave(H // Hkv, 1),
                    attn_mask=causal_lower_right(Tq, Tk), scale=sc)
            else:
                add = add.masked_fill(~visible(B, H, Tq, Tk, 2, None, None), float("-inf"))
                ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=add, **kwargs)
        else:
            ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=add, **kwargs)
        diff = (ref - out).abs().max().item()
        assert diff < 1e-12, (name, diff)
        keys["checked_against"] = "scaled_dot_product_attention"
    else:
        keys["checked_against"] = "written_out"

    files.update({"out.npy": f32(out.numpy()), "attn.npy": f32(w.numpy()),
                  "lse.npy": f32(lse.numpy())})
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    for fname, arr in files.items():
        np.save(os.path.join(d, fname), arr)
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("# made by tests/golden/gen_options.py with torch %s\n" % torch.__version__)
        for key, val in keys.items():
            val = str(val)
            assert " " not in val, (key, val)
            f.write("%s=%s\n" % (key, val))
    return name


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    rng = np.random.default_rng(20261130)
    cases = [
        case("gqa_causal", rng, B=2, H=8, Hkv=2, Tq=9, Tk=9, D=8, Dv=8, causal=1),
        case("mqa_bottom_right", rng, B=1, H=4, Hkv=1, Tq=3, Tk=11, D=6, Dv=5, causal=2),
        case("top_left_tq_gt_tk", rng, B=1, H=2, Hkv=2, Tq=7, Tk=4, D=5, Dv=5, causal=1),
        case("bottom_right_tq_gt_tk", rng, B=1, H=2, Hkv=1, Tq=6, Tk=4, D=4, Dv=4, causal=2,
             empty_rows="zero", want_empty=True),
        case("window_causal", rng, B=1, H=3, Hkv=3, Tq=13, Tk=13, D=8, Dv=8, window=(3, 0)),
        case("window_two_sided", rng, B=2, H=2, Hkv=1, Tq=5, Tk=12, D=4, Dv=4, window=(2, 2)),
        case("softcap", rng, B=1, H=2, Hkv=2, Tq=6, Tk=8, D=8, Dv=8, softcap=5.0, qscale=4.0,
             causal=1),
        case("alibi_default_6_heads", rng, B=1, H=6, Hkv=3, Tq=4, Tk=9, D=4, Dv=4, alibi=1,
             causal=2),
        case("alibi_slopes", rng, B=2, H=4, Hkv=4, Tq=5, Tk=5, D=4, Dv=3, alibi=2),
        case("bias_heads", rng, B=2, H=3, Hkv=3, Tq=4, Tk=6, D=5, Dv=5, bias_shape=(1, 3, 1, 6)),
        case("bias_full_ninf", rng, B=2, H=2, Hkv=1, Tq=5, Tk=7, D=4, Dv=4,
             bias_shape=(2, 1, 5, 7), bias_ninf=0.2, mask_shape=(2, 1, 1, 7),
             empty_rows="zero", want_empty=True),
        case("sinks", rng, B=1, H=4, Hkv=2, Tq=5, Tk=5, D=8, Dv=8, sinks=True, causal=1),
        case("sinks_empty_rows", rng, B=1, H=2, Hkv=2, Tq=4, Tk=6, D=4, Dv=4, sinks=True,
             window=(0, 0), causal=2, mask_shape=(1, 1, 4, 6), want_empty=True),
        case("everything", rng, B=2, H=4, Hkv=2, Tq=5, Tk=9, D=8, Dv=6, causal=2,
             window=(4, 0), softcap=8.0, alibi=1, bias_shape=(1, 4, 5, 9), sinks=True,
             scale=0.3),
    ]
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# golden cases made by tests/golden/gen_options.py\n")
        f.write("# torch %s, numpy %s\n" % (torch.__version__, np.__version__))
        for c in cases:
            f.write(c + "\n")
    print("torch %s: %d cases in %s" % (torch.__version__, len(cases), os.path.normpath(ROOT)))


if __name__ == "__main__":
    main()
