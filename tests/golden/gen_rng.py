#!/usr/bin/env python3
"""Writes tests/data/rng/: PyTorch's own draws and the chapter module's results.

tests/test_rng.c checks that libattn (src/core/rng.c and the forward pass) reproduces
these files. Run from anywhere with a PyTorch 2.x CPU build:

    python3 tests/golden/gen_rng.py            # writes next to this script's ../data/rng

Format (kept simple so the C test needs no .npy reader):
  - every array is a raw little-endian float32 file (*.f32), C order, no header;
  - manifest.txt lists what was drawn, one case per line, fields separated by spaces:
      model   DIR SEED B T E H
          DIR/x.f32 [B,T,E], DIR/qkv_weight.f32 [3E,E], DIR/qkv_bias.f32 [3E],
          DIR/output_weight.f32 [E,E], DIR/output_bias.f32 [E],
          DIR/output.f32 [B,T,E], DIR/attention.f32 [B,H,T,T]
      randn   FILE FLAVOR SEED N1,N2,...   consecutive torch.randn(Ni) after one seed,
                                           concatenated
      uniform FILE FLAVOR SEED N LO HI     torch.empty(N).uniform_(LO, HI) after a seed
      linear  FILE FLAVOR SEED IN OUT      nn.Linear(IN, OUT): weight then bias
    FLAVOR is avx2 (torch's default dispatch on an x86-64 CPU with AVX2 or AVX-512)
    or default (the same script re-run with ATEN_CPU_CAPABILITY=default).
  - version.txt records torch's version and the CPU capability it used.

To check another PyTorch against the stored files without rewriting them (e.g.
Debian's 1.13 from `apt install python3-torch`, which runs as /usr/bin/python3):

    /usr/bin/python3 tests/golden/gen_rng.py --compare

It re-draws every case with the running torch and prints, per case, how many floats
differ in their bits (it needs only torch and numpy). Run it with
ATEN_CPU_CAPABILITY=default to compare torch's baseline kernels instead.

The chapter module (SPEC section 1), written out here as PyTorch code:
  qkv = Linear(E, 3E); q, k, v = qkv(x).split(E, dim=-1);
  each viewed [B, T, H, D] and transposed to [B, H, T, D];
  scores = q @ k^T / sqrt(D); scores.masked_fill(~mask, -inf); softmax(-1);
  context = weights @ v, merged back to [B, T, E]; output = Linear(E, E)(context).
The mask is SPEC section 2's: padding from the demo token ids (pad id 0), shape
[B, 1, 1, T], AND the causal mask [1, 1, T, T].
"""
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "data", "rng"))

# (dir, seed, B, T, E, H). Element counts of x: 160 (the chapter, a multiple of 16),
# 12 and 8 (below 16: the scalar path), 252 and 360 (not multiples of 16: the
# re-drawn tail), 60 with a seed above 2^32 (only its low 32 bits count).
MODEL_CASES = [
    ("chapter_s42", 42, 2, 5, 16, 4),
    ("small_s0", 0, 1, 3, 4, 2),
    ("tail_s7", 7, 3, 7, 12, 3),
    ("tiny_s123456789", 123456789, 1, 1, 8, 1),
    ("bigseed", 2**32 + 5, 2, 5, 6, 2),
    ("odd_s31337", 31337, 2, 9, 20, 5),
]

# Consecutive randn calls after one seed: the odd small sizes leave a cached normal
# that the next small call must use; 20 and 33 take the 16-block path in between.
RANDN_CASES = [
    ("randn_seq_s5", 5, [3, 5, 1, 20, 2, 33, 7]),
    ("randn_s2024", 2024, [1000]),
    ("randn_s1", 1, [15, 16, 17]),
]
UNIFORM_CASES = [
    ("uniform_s9", 9, 777, -0.25, 0.25),
    ("uniform_s10", 10, 500, -1.0 / math.sqrt(48), 1.0 / math.sqrt(48)),
]
LINEAR_CASES = [
    ("linear_s11", 11, 7, 5),
    ("linear_s12", 12, 48, 16),
]


def save(path, tensor):
    arr = np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype="<f4")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arr.tofile(path)


def demo_token_ids(B, T):
    ids = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        real_len = max(1, T - 1 - (b % max(1, min(T, 3))))
        for t in range(real_len):
            ids[b, t] = t + 1 + b * T
    return ids


class ChapterSelfAttention(nn.Module):
    """The chapter's multi-head self-attention (SPEC section 1)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.output = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, mask):
        B, T, E = x.shape
        q, k, v = self.qkv(x).split(E, dim=-1)

        def heads(t):
            return t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        context = (weights @ v).transpose(1, 2).contiguous().view(B, T, E)
        return self.output(context), weights


def model_case(name, seed, B, T, E, H, lines):
    torch.manual_seed(seed)
    x = torch.randn(B, T, E)
    module = ChapterSelfAttention(E, H)  # draws qkv weight, bias, output weight, bias
    ids = demo_token_ids(B, T)
    padding = (ids != 0).view(B, 1, 1, T)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)
    with torch.no_grad():
        out, weights = module(x, padding & causal)
    d = os.path.join(OUT, name)
    save(os.path.join(d, "x.f32"), x)
    save(os.path.join(d, "qkv_weight.f32"), module.qkv.weight)
    save(os.path.join(d, "qkv_bias.f32"), module.qkv.bias)
    save(os.path.join(d, "output_weight.f32"), module.output.weight)
    save(os.path.join(d, "output_bias.f32"), module.output.bias)
    save(os.path.join(d, "output.f32"), out)
    save(os.path.join(d, "attention.f32"), weights)
    lines.append(f"model {name} {seed} {B} {T} {E} {H}")


def draw_cases(flavor, lines):
    suffix = "" if flavor == "avx2" else "_default"
    for name, seed, sizes in RANDN_CASES:
        torch.manual_seed(seed)
        parts = [torch.randn(n) for n in sizes]
        save(os.path.join(OUT, name + suffix + ".f32"), torch.cat(parts))
        lines.append(f"randn {name}{suffix}.f32 {flavor} {seed} {','.join(map(str, sizes))}")
    for name, seed, n, lo, hi in UNIFORM_CASES:
        torch.manual_seed(seed)
        t = torch.empty(n).uniform_(lo, hi)
        save(os.path.join(OUT, name + suffix + ".f32"), t)
        lines.append(f"uniform {name}{suffix}.f32 {flavor} {seed} {n} {lo!r} {hi!r}")
    for name, seed, fan_in, fan_out in LINEAR_CASES:
        torch.manual_seed(seed)
        layer = nn.Linear(fan_in, fan_out)
        both = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()])
        save(os.path.join(OUT, name + suffix + ".f32"), both)
        lines.append(f"linear {name}{suffix}.f32 {flavor} {seed} {fan_in} {fan_out}")


def compare():
    """Re-draws every manifest case with the running torch; returns the number of
    cases whose floats differ in any bit from the stored files."""
    def stored(rel):
        return np.fromfile(os.path.join(OUT, rel), dtype="<f4")

    def report(label, got, want):
        got = np.ascontiguousarray(got, dtype="<f4").ravel()
        if got.size != want.size:
            print(f"{label}: {got.size} values drawn, {want.size} stored")
            return 1
        diff = int(np.sum(got.view("<u4") != want.view("<u4")))
        worst = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
        print(f"{label}: {diff} of {got.size} floats differ in their bits (largest difference {worst:.3g})")
        return 1 if diff else 0

    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
    print(f"torch {torch.__version__}, CPU capability {capability}, "
          f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '(unset)')}")
    # The stored 'default' flavor is what torch's baseline kernels draw, the 'avx2' one
    # (and the model cases) what its AVX2/AVX-512 kernels draw: compare like with like.
    env = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    flavor_now = "default" if env == "default" or str(capability).upper() == "DEFAULT" else "avx2"
    print(f"comparing the '{flavor_now}' flavor cases")
    bad = 0
    with open(os.path.join(OUT, "manifest.txt")) as f:
        lines = [line.split() for line in f if line.strip()]
    for fields in lines:
        kind = fields[0]
        if (fields[2] if kind != "model" else "avx2") != flavor_now:
            continue
        if kind == "model":
            name, seed, B, T, E, H = fields[1], int(fields[2]), *map(int, fields[3:7])
            torch.manual_seed(seed)
            x = torch.randn(B, T, E)
            module = ChapterSelfAttention(E, H)
            bad += report(f"model {name} x", x.numpy(), stored(f"{name}/x.f32"))
            params = [module.qkv.weight, module.qkv.bias, module.output.weight, module.output.bias]
            got = np.concatenate([p.detach().numpy().ravel() for p in params])
            want = np.concatenate([stored(f"{name}/{n}.f32") for n in
                                   ["qkv_weight", "qkv_bias", "output_weight", "output_bias"]])
            bad += report(f"model {name} weights", got, want)
            continue
        rel, flavor, seed = fields[1], fields[2], int(fields[3])
        torch.manual_seed(seed)
        if kind == "randn":
            got = torch.cat([torch.randn(int(n)) for n in fields[4].split(",")]).numpy()
        elif kind == "uniform":
            got = torch.empty(int(fields[4])).uniform_(float(fields[5]), float(fields[6])).numpy()
        elif kind == "linear":
            layer = nn.Linear(int(fields[4]), int(fields[5]))
            got = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()]).numpy()
        else:
            print(f"unknown manifest line: {' '.join(fields)}")
            bad += 1
            continue
        bad += report(f"{kind} {rel} ({flavor} flavor)", got, stored(rel))
    return bad


def main():
    torch.set_num_threads(1)
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        bad = compare()
        print(f"{bad} case(s) differ")
        sys.exit(1 if bad else 0)
    if len(sys.argv) > 1 and sys.argv[1] == "--default-flavor-only":
        # Child process started with ATEN_CPU_CAPABILITY=default: print manifest lines.
        lines = []
        draw_cases("default", lines)
        print("\n".join(lines))
        return
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        sys.exit(f"gen_rng.py: torch runs with CPU capability {capability}; the 'avx2' "
                 "flavor needs an x86-64 CPU with AVX2")
    os.makedirs(OUT, exist_ok=True)
    lines = []
    for case in MODEL_CASES:
        model_case(*case, lines)
    draw_cases("avx2", lines)
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    child = subprocess.run([sys.executable, __file__, "--default-flavor-only"], env=env,
                           check=True, capture_output=True, text=True)
    lines += child.stdout.strip().splitlines()
    with open(os.path.join(OUT, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(OUT, "version.txt"), "w") as f:
        f.write(f"torch {torch.__version__}\nnumpy {np.__version__}\n"
                f"cpu_capability {capability}\n")
    print(f"wrote {len(lines)} cases to {OUT} with torch {torch.__version__}")


if __name__ == "__main__":
    main()
