#!/usr/bin/env python3
"""mca_backward.py - models the fused backward's innermost loops with llvm-mca.

    python3 bench/mca_backward.py [--mca /usr/lib/llvm-19/bin/llvm-mca] [--cc cc]

It compiles src/kernels/sdpa_fused_backward_avx512.c (and, with --isa avx2, the
AVX2 file) to assembly with the library's release flags (-O3 -DNDEBUG plus that
file's ISA flags, as CMakeLists.txt gives them), finds in each of the backward's
three product functions the innermost loops that hold FMAs (a label followed,
further down, by a conditional jump back to it with no other label between), and
runs llvm-mca on each loop body for Sapphire Rapids and Zen 4. It prints, per loop,
the FMAs in one iteration, the cycles per iteration llvm-mca predicts in the steady
state and the FMAs per cycle that gives. These are modelled figures, not
measurements: they leave out the code around the loops, the caches and the other
thread. Read them against each model's own FMA bound: LLVM 19's Sapphire Rapids
model issues a 512-bit FMA on port 0 only (one per cycle, where the chip has two
units: `attn bench --peak` measures 64 FLOP per cycle), and Zen 4 runs a 512-bit
FMA as two 256-bit halves (one per cycle; two 256-bit FMAs per cycle).

The functions: fb_rows_tile (the scores S = q k^T and dP = dO v^T: one d step for
eight rows and two key vectors), fb_outer_acc (dK += dS^T q, dV += P^T dO: one
row's terms into a tile of four keys by four vectors of d) and fb_dq_rows
(dQ += dS k: one key's terms into eight rows by two vectors of d).

Needs an llvm-mca that knows znver4: LLVM 16 or later (Debian: apt install llvm-19).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUNCS = ("fb_rows_tile_fast", "fb_block_tile", "fb_outer_acc", "fb_dq_rows")
ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
}
CPUS = ("sapphirerapids", "znver4")


def compile_asm(cc, isa, out):
    incs = [f"-I{os.path.join(ROOT, d)}" for d in
            ("include", "src/core", "src/kernels", "src/runtime", "src/attention", "src/io")]
    src = os.path.join(ROOT, "src", "kernels", f"sdpa_fused_backward_{isa}.c")
    subprocess.run([cc, "-O3", "-DNDEBUG", "-std=c11", "-DATTN_HAVE_X86=1", "-fPIC",
                    "-fvisibility=hidden", *ISA_FLAGS[isa], *incs, "-S", "-o", out, src],
                   check=True)


def functions(lines):
    """{name: [lines]} for the functions of interest (also their clones, name.*)."""
    out, cur = {}, None
    for line in lines:
        m = re.match(r"^([A-Za-z_][\w.]*):\s*$", line)
        if m:
            base = m.group(1).split(".")[0]
            cur = m.group(1) if base in FUNCS else None
            if cur:
                out[cur] = []
            continue
        if cur:
            if line.strip().startswith(".cfi_endproc"):
                cur = None
                continue
            out[cur].append(line)
    return out


def inner_loops(body):
    """Loop bodies (instruction lines) that end in a jump back to their label, with
    no label in between, that hold at least one FMA."""
    loops = []
    for k, line in enumerate(body):
        m = re.match(r"^\s+j\w+\s+(\.L\w+)\s*$", line)
        if not m:
            continue
        label = m.group(1) + ":"
        start = None
        for s in range(k - 1, -1, -1):
            if body[s].strip() == label:
                start = s
                break
            if re.match(r"^\.L\w+:", body[s].strip()):
                break
        if start is None:
            continue
        insns = [x for x in body[start + 1:k + 1]
                 if x.strip() and not x.strip().startswith((".", "#"))]
        fmas = sum(1 for x in insns if "vfmadd" in x)
        if fmas:
            loops.append((fmas, insns))
    return loops


def mca(tool, cpu, insns):
    text = "\n".join(insns) + "\n"
    r = subprocess.run([tool, "-mtriple=x86_64", f"-mcpu={cpu}", "-iterations=200"],
                       input=text, capture_output=True, text=True, check=True).stdout
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", r).group(1))
    iters = int(re.search(r"Iterations:\s+(\d+)", r).group(1))
    return cycles / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mca", default="/usr/lib/llvm-19/bin/llvm-mca")
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--isa", default="avx512", choices=sorted(ISA_FLAGS))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asm = os.path.join(tmp, "bwd.s")
        compile_asm(a.cc, a.isa, asm)
        with open(asm) as f:
            funcs = functions(f.read().splitlines())
    print(f"# llvm-mca model of the fused backward's inner loops ({a.isa} build, "
          f"{a.cc} -O3); cycles per iteration and FMAs per cycle, modelled")
    print(f"{'function':24} {'FMAs':>4} {'insns':>5} " +
          " ".join(f"{c + ' cyc':>19} {'FMA/c':>5}" for c in CPUS))
    for name in sorted(funcs):
        # Every distinct loop with eight FMAs or more: the products' main bodies
        # (and, in fb_rows_tile, the exp polynomial's loop); the tails for the
        # last vector of d or the last keys have fewer.
        seen = set()
        for fmas, insns in sorted(inner_loops(funcs[name]), key=lambda t: -t[0]):
            key = "\n".join(insns)
            if fmas < 8 or key in seen:
                continue
            seen.add(key)
            cells = []
            for cpu in CPUS:
                cyc = mca(a.mca, cpu, insns)
                cells.append(f"{cyc:19.2f} {fmas / cyc:5.2f}")
            exp = any("vcvtps2dq" in x or "vscalefps" in x or "vpslld" in x for x in insns)
            print(f"{name + (' (exp)' if exp else ''):24} {fmas:4d} {len(insns):5d} " +
                  " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
