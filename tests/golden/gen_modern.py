#!/usr/bin/env python3
"""Writes tests/data/golden_modern/: chapter 21's experiment run in PyTorch, for
inspect_modern_attention. tests/test_modern_values.sh compares the C program's
output with these files; it needs no Python. Regenerate with

    /work/venv-torch/bin/python tests/golden/gen_modern.py   (PyTorch 2.x, numpy)

Each case directory holds args.txt (the inspect_modern_attention arguments),
lines.txt (the lines it prints by default) and values_b<S>_h<N>.txt (what --values
--sample S --head N prints after them), formatted here by the rules
tools/inspect_modern_attention.c documents.

The block is a Llama-style attention layer written in torch, as a learner would
after the tutorial's chapter 21 (its concepts; the code is our own):
  torch.manual_seed(seed); x = torch.randn(B, T, E)
  q_proj = nn.Linear(E, H*D, bias=False); k_proj, v_proj = nn.Linear(E, Hkv*D,
  bias=False) each; o_proj = nn.Linear(H*D, E, bias=False), in that order
  q [B, H, T, D], k and v [B, Hkv, T, D] after the head split
  RoPE on q and k (float32 angles: inv_freq = 1 / base ** (arange(0, D, 2) / D),
  angle = position * inv_freq); interleaved pairs (2k, 2k+1) or half pairs
  (k, k+D/2, rotate_half)
  GQA by repeat_interleave of k and v over the query heads (head h reads h // (H/Hkv))
  the sliding-window causal mask 0 <= i - j < w; scores * float32(1/sqrt(D));
  softmax; weights @ v; merge; o_proj
and decoding: a cache of rotated keys and values grown by torch.cat one position
at a time, each new query (rotated at its position) attending to it with the
window, compared with the full pass's output row.
"""
import math
import os
import shutil

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "data", "golden_modern"))


def rope(x, positions, base, half):
    """x [..., T, D] turned pair by pair at `positions` [T] (float32 recipe)."""
    D = x.shape[-1]
    inv_freq = 1.0 / (torch.tensor(base, dtype=torch.float32)
                      ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    angle = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    c, s = angle.cos(), angle.sin()
    if half:
        a, b = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def pair_norms(x, half):
    D = x.shape[-1]
    if half:
        a, b = x[..., : D // 2], x[..., D // 2:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    return torch.hypot(a.double(), b.double())


def window_mask(Tq, Tk, w):
    """Query i (at position Tk - Tq + i) sees key j when 0 <= pos_i - j < w."""
    qi = torch.arange(Tk - Tq, Tk)[:, None]
    kj = torch.arange(Tk)[None, :]
    d = qi - kj
    return (d >= 0) & (d < w)


def attend(q, k, v, mask, H, Hkv, D):
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    scale = float(np.float32(1.0 / math.sqrt(D)))
    scores = (q @ k.transpose(-2, -1)) * scale
    masked = scores.masked_fill(~mask, float("-inf"))
    weights = masked.softmax(dim=-1)
    return masked, weights, weights @ v


def run(seed, B, T, E, H, Hkv, w, half, base):
    D = E // H
    torch.manual_seed(seed)
    x = torch.randn(B, T, E)
    q_proj = nn.Linear(E, H * D, bias=False)
    k_proj = nn.Linear(E, Hkv * D, bias=False)
    v_proj = nn.Linear(E, Hkv * D, bias=False)
    o_proj = nn.Linear(H * D, E, bias=False)
    with torch.no_grad():
        q = q_proj(x).view(B, T, H, D).transpose(1, 2)
        k = k_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        v = v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        pos = torch.arange(T)
        qr, kr = rope(q, pos, base, half), rope(k, pos, base, half)
        change = 0.0
        for a, b in ((q, qr), (k, kr)):
            n0, n1 = pair_norms(a, half), pair_norms(b, half)
            ok = n0 > 0
            change = max(change, float(((n1 - n0).abs()[ok] / n0[ok]).max()))
        masked, weights, context = attend(qr, kr, v, window_mask(T, T, w), H, Hkv, D)
        output = o_proj(context.transpose(1, 2).reshape(B, T, H * D))
        ck = cv = None
        diffs = []
        for t in range(T):
            kt = rope(k[:, :, t:t + 1], pos[t:t + 1], base, half)
            vt = v[:, :, t:t + 1]
            ck = kt if ck is None else torch.cat([ck, kt], dim=2)
            cv = vt if cv is None else torch.cat([cv, vt], dim=2)
            qt = rope(q[:, :, t:t + 1], pos[t:t + 1], base, half)
            _, _, ct = attend(qt, ck, cv, window_mask(1, t + 1, w), H, Hkv, D)
            yt = o_proj(ct.transpose(1, 2).reshape(B, 1, H * D))
            diffs.append((float((yt[:, 0] - output[:, t]).abs().max()), ck.shape))
    return dict(x=x, q=q, k=k, v=v, qr=qr, kr=kr, masked=masked, weights=weights,
                context=context, output=output, change=change, diffs=diffs, D=D)


def rounded(v):
    """The C program's print_rounded: "%.4f", then trailing zeros go, keeping one."""
    v = float(v)
    if math.isnan(v):
        return "nan"
    s = "%.4f" % v
    while len(s) > 2 and s[-1] == "0" and s[-2] != ".":
        s = s[:-1]
    return s


def shape(t):
    return "(" + ", ".join(str(int(n)) for n in t) + ")"


def lines(r, B, T, E, H, Hkv, w):
    D = r["D"]
    L = ["x_shape=" + shape((B, T, E)),
         "q_shape=" + shape(r["q"].shape),
         "k_shape=" + shape(r["k"].shape),
         "v_shape=" + shape(r["v"].shape),
         "kv_head_of_query_head=[%s]" % ", ".join(str(h // (H // Hkv)) for h in range(H)),
         "rope_largest_pair_norm_change=" + rounded(r["change"])]
    m = window_mask(T, T, w)
    L.append("sliding_window_causal_mask=[%s]" % ", ".join(
        "[" + ", ".join(str(int(b)) for b in row) + "]" for row in m))
    L.append("last_query_head0_weights=[%s]" % ", ".join(rounded(x) for x in r["weights"][0, 0, T - 1]))
    for t, (d, s) in enumerate(r["diffs"]):
        L.append("decode_step=%d cache_k_shape=%s largest_diff_from_full=%s"
                 % (t + 1, shape((B, Hkv, s[2], D)), rounded(d)))
    return L


def number(v):
    v = float(v)
    return "nan" if math.isnan(v) else "%.4f" % v


def matrix(L, title, a, note, col_pos):
    rows, cols = a.shape
    lab = lambda i: "pos %d%s" % (i, note)
    corner = "query \\ key" if col_pos else ""
    L.append("")
    L.append(title)
    label_w = max([len(corner)] + [len(lab(i)) for i in range(rows)])
    heads = [("pos %d" % j) if col_pos else str(j) for j in range(cols)]
    width = [max([len(heads[j])] + [len(number(a[i, j])) for i in range(rows)]) for j in range(cols)]
    L.append(corner.ljust(label_w) + "".join("  " + heads[j].rjust(width[j]) for j in range(cols)))
    for i in range(rows):
        L.append(lab(i).ljust(label_w)
                 + "".join("  " + number(a[i, j]).rjust(width[j]) for j in range(cols)))


def values(r, s, h, T, E, H, Hkv, w, half, base):
    D = r["D"]
    g = h // (H // Hkv)
    L = ["== values: sample %d, query head %d of %d, which reads kv head %d of %d (%d // %d); "
         "D = %d, rounded to 4 decimals" % (s, h, H, g, Hkv, h, H // Hkv, D),
         "   a row or column 'pos P' is position P of the sequence; RoPE turns it by P"]
    pairs = "features k, k+D/2" if half else "features 2k, 2k+1"
    note = ", kv head %d" % g
    matrix(L, "q[%d, %d]  [T, D] = [%d, %d]  = x W_q^T, head %d (rows %d..%d of q_proj), before RoPE"
           % (s, h, T, D, h, h * D, h * D + D - 1), r["q"][s, h], "", 0)
    matrix(L, "q'[%d, %d]  [%d, %d]  = rope(q): pair k (%s) of pos P turned by P * %g^(-2k/%d)"
           % (s, h, T, D, pairs, base, D), r["qr"][s, h], "", 0)
    matrix(L, "k[%d, %d]  [%d, %d]  = x W_k^T, kv head %d (rows %d..%d of k_proj), before RoPE"
           % (s, g, T, D, g, g * D, g * D + D - 1), r["k"][s, g], note, 0)
    matrix(L, "k'[%d, %d]  [%d, %d]  = rope(k), kv head %d: what the KV cache stores"
           % (s, g, T, D, g), r["kr"][s, g], note, 0)
    matrix(L, "v[%d, %d]  [%d, %d]  = x W_v^T, kv head %d (no RoPE on values)"
           % (s, g, T, D, g), r["v"][s, g], note, 0)
    matrix(L, "masked scores[%d, %d]  [%d, %d]  = q' k'^T / sqrt(%d), -inf unless 0 <= query - key "
           "< %d (keys of kv head %d)" % (s, h, T, T, D, w, g), r["masked"][s, h], "", 1)
    matrix(L, "weights[%d, %d]  [%d, %d]  = softmax(masked scores) over the keys: each row sums to 1"
           % (s, h, T, T), r["weights"][s, h], "", 1)
    matrix(L, "context[%d, %d]  [%d, %d]  = weights v" % (s, h, T, D), r["context"][s, h], "", 0)
    matrix(L, "output[%d]  [T, E] = [%d, %d]  = merged heads W_o^T (the full pass; decoding gives "
           "the same rows)" % (s, T, E), r["output"][s], "", 0)
    return L


# (dir, seed, B, T, E, H, Hkv, window, rope, base, [(sample, head), ...])
CASES = [
    ("default_s42", 42, 2, 6, 32, 4, 2, 3, "interleaved", 10000.0, [(0, 0), (1, 3)]),
    ("half_s7", 7, 1, 9, 24, 6, 3, 4, "half", 500.0, [(0, 5)]),
    ("mqa_s3", 3, 3, 5, 16, 2, 1, 5, "interleaved", 10000.0, [(2, 1)]),
    ("mha_s11", 11, 2, 7, 12, 3, 3, 2, "half", 10000.0, [(1, 2)]),
]


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    for name, seed, B, T, E, H, Hkv, w, pairing, base, shows in CASES:
        d = os.path.join(OUT, name)
        os.makedirs(d)
        half = pairing == "half"
        args = ("--seed %d --batch-size %d --seq-len %d --embed-dim %d --num-heads %d "
                "--num-kv-heads %d --window %d --rope %s --rope-base %g"
                % (seed, B, T, E, H, Hkv, w, pairing, base))
        with open(os.path.join(d, "args.txt"), "w") as f:
            f.write(args + "\n")
        r = run(seed, B, T, E, H, Hkv, w, half, base)
        with open(os.path.join(d, "lines.txt"), "w") as f:
            f.write("\n".join(lines(r, B, T, E, H, Hkv, w)) + "\n")
        for s, h in shows:
            with open(os.path.join(d, "values_b%d_h%d.txt" % (s, h)), "w") as f:
                f.write("\n".join(values(r, s, h, T, E, H, Hkv, w, half, base)) + "\n")
        print("wrote", d)


if __name__ == "__main__":
    main()
