#!/usr/bin/env python3
"""Writes tests/data/learner/: the chapter's module run in PyTorch, step by step, for
inspect_self_attention's --dump, --values, --layout separate and --mistake.

tests/test_values.sh, test_layout.sh and test_mistakes.sh compare the C program's
output with these files; they need no Python. Regenerate with

    python3 tests/golden/gen_learner.py   (PyTorch 2.x, numpy)

Each case directory holds .npy files named as --dump names them (x, q, k, v,
scores, scaled_scores, masked_scores, attention, context, output) and args.txt, the
inspect_self_attention arguments that reproduce it. values_*.txt is the expected
--values text, formatted here by the rules tools/common_values.c documents (4
decimals, right-aligned columns, rows and columns labelled "pos P (id I)").

The module is the chapter's, written as a learner would (SPEC section 1):
  torch.manual_seed(seed); x = torch.randn(B, T, E)
  layout fused:    qkv = nn.Linear(E, 3E); output = nn.Linear(E, E)
                   q, k, v = qkv(x).split(E, dim=-1)
  layout separate: q_proj, k_proj, v_proj, out_proj = four nn.Linear(E, E), in order
  q, k, v viewed [B, T, H, D] and transposed to [B, H, T, D]
  scores = q @ k^T; scaled = scores / sqrt(D); masked = scaled.masked_fill(~mask, -inf)
  weights = softmax(masked, dim=-1); context = weights @ v; merged [B, T, E];
  output = out_proj(merged)
with SPEC section 2's demo token ids and mask (padding, pad id 0, AND causal), and
one classic mistake at a time where the case says so.
"""
import math
import os
import shutil

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "data", "learner"))


def demo_ids(B, T):
    ids = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        m = max(1, min(T, 3))
        real = max(1, T - 1 - b % m)
        for t in range(real):
            ids[b, t] = t + 1 + b * T
    return ids


def run(seed, B, T, E, H, layout="fused", mistake="none"):
    torch.manual_seed(seed)
    x = torch.randn(B, T, E)
    D = E // H
    if layout == "fused":
        qkv = nn.Linear(E, 3 * E)
        out = nn.Linear(E, E)
        q, k, v = qkv(x).split(E, dim=-1)
    else:
        q_proj, k_proj, v_proj, out = (nn.Linear(E, E) for _ in range(4))
        q, k, v = q_proj(x), k_proj(x), v_proj(x)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
    ids = demo_ids(B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    if mistake == "mask-queries":
        mask = (ids != 0)[:, None, :, None] & causal
    else:
        mask = (ids != 0)[:, None, None, :] & causal
    scores = q @ k.transpose(-2, -1)
    scaled = scores if mistake == "no-scale" else scores / math.sqrt(D)
    if mistake == "inverted-mask":
        masked = scaled.masked_fill(mask, float("-inf"))
    elif mistake == "mask-zero":
        masked = scaled.masked_fill(~mask, 0.0)
    else:
        masked = scaled.masked_fill(~mask, float("-inf"))
    weights = masked.softmax(dim=-2 if mistake == "softmax-wrong-axis" else -1)
    context = weights @ v
    merged = context.transpose(1, 2).reshape(B, T, E)
    output = out(merged)
    arrays = dict(x=x, q=q, k=k, v=v, scores=scores, scaled_scores=scaled,
                  masked_scores=masked, attention=weights, context=context, output=output)
    return {n: a.detach().contiguous().numpy().astype(np.float32) for n, a in arrays.items()}, ids, merged.detach().numpy()


# (dir, seed, B, T, E, H, layout, mistake)
CASES = [
    ("chapter_s42", 42, 2, 5, 16, 4, "fused", "none"),
    ("tail_s7", 7, 3, 7, 12, 3, "fused", "none"),
    ("separate_s42", 42, 2, 5, 16, 4, "separate", "none"),
    ("separate_s3", 3, 3, 6, 8, 2, "separate", "none"),
] + [("mistake_" + m.replace("-", "_"), 42, 2, 5, 16, 4, "fused", m)
     for m in ["no-scale", "inverted-mask", "mask-queries", "softmax-wrong-axis", "mask-zero"]]


def number(v):
    v = float(v)
    return "nan" if math.isnan(v) else "%.4f" % v


def matrix(lines, title, a, ids, col_tokens):
    rows, cols = a.shape
    lab = lambda i: "pos %d (id %d)" % (i, ids[i])
    lines.append("")
    lines.append(title)
    label_w = max(len(lab(i)) for i in range(rows))
    heads = [lab(j) if col_tokens else str(j) for j in range(cols)]
    width = [max([len(heads[j])] + [len(number(a[i, j])) for i in range(rows)]) for j in range(cols)]
    lines.append(("query \\ key" if col_tokens else "").rjust(label_w)
                 + "".join("  " + heads[j].rjust(width[j]) for j in range(cols)))
    for i in range(rows):
        lines.append(lab(i).ljust(label_w)
                     + "".join("  " + number(a[i, j]).rjust(width[j]) for j in range(cols)))


def values_text(r, ids, merged, b, h, T, E, H):
    D = E // H
    ids = [int(i) for i in ids[b]]
    L = ["== values: sample %d, head %d of %d (D = E/H = %d), token ids [%s], rounded to 4 decimals"
         % (b, h, H, D, ", ".join(map(str, ids))),
         "   a row or column 'pos P (id I)' is position P of the sequence, holding token id I "
         "(id 0 is padding)"]
    matrix(L, "x[%d]  [T, E] = [%d, %d]  the input, one row per token" % (b, T, E), r["x"][b], ids, 0)
    for part, n in enumerate("qkv"):
        lo = part * E + h * D
        matrix(L, "%s[%d, %d]  [T, D] = [%d, %d]  = x W_%s^T + b_%s, columns %d..%d of qkv "
               "(rows %d..%d of qkv.weight)" % (n, b, h, T, D, n, n, lo, lo + D - 1, lo, lo + D - 1),
               r[n][b, h], ids, 0)
    scale = float(np.float32(1.0 / math.sqrt(D)))
    matrix(L, "scores[%d, %d]  [T, T] = [%d, %d]  = q k^T (rows: queries, columns: keys)"
           % (b, h, T, T), r["scores"][b, h], ids, 1)
    matrix(L, "scaled scores[%d, %d]  [%d, %d]  = q k^T / sqrt(%d) = q k^T * %s"
           % (b, h, T, T, D, "%.9g" % scale), r["scaled_scores"][b, h], ids, 1)
    matrix(L, "masked scores[%d, %d]  [%d, %d]  = scaled scores, -inf where the combined mask "
           "is false (may not attend)" % (b, h, T, T), r["masked_scores"][b, h], ids, 1)
    matrix(L, "weights[%d, %d]  [%d, %d]  = softmax(masked scores) over the keys: each row sums "
           "to 1" % (b, h, T, T), r["attention"][b, h], ids, 1)
    matrix(L, "context[%d, %d]  [T, D] = [%d, %d]  = weights v" % (b, h, T, D),
           r["context"][b, h], ids, 0)
    matrix(L, "merged heads[%d]  [T, E] = [%d, %d]  every head's context side by side: head %d "
           "is columns %d..%d" % (b, T, E, h, h * D, h * D + D - 1), merged[b], ids, 0)
    matrix(L, "output[%d]  [T, E] = [%d, %d]  = merged W_o^T + b_o" % (b, T, E),
           r["output"][b], ids, 0)
    return "\n".join(L) + "\n"


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for name, seed, B, T, E, H, layout, mistake in CASES:
        d = os.path.join(OUT, name)
        os.makedirs(d)
        r, ids, merged = run(seed, B, T, E, H, layout, mistake)
        for n, a in r.items():
            np.save(os.path.join(d, n + ".npy"), a)
        args = "--seed %d --batch-size %d --seq-len %d --embed-dim %d --num-heads %d" % (seed, B, T, E, H)
        if layout != "fused":
            args += " --layout " + layout
        if mistake != "none":
            args += " --mistake " + mistake
        with open(os.path.join(d, "args.txt"), "w") as f:
            f.write(args + "\n")
        if mistake == "none" and layout == "fused":
            for b, h in ([(0, 0), (1, 2)] if name == "chapter_s42" else [(2, 1)]):
                with open(os.path.join(d, "values_b%d_h%d.txt" % (b, h)), "w") as f:
                    f.write(values_text(r, ids, merged, b, h, T, E, H))
    with open(os.path.join(OUT, "version.txt"), "w") as f:
        f.write("torch %s, numpy %s\n" % (torch.__version__, np.__version__))


if __name__ == "__main__":
    main()
