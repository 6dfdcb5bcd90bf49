#!/usr/bin/env python3
"""compare_torch.py - attn against PyTorch (and numpy's OpenBLAS) on the same
shapes, in the same run, and the ratios.

    python3 bench/compare_torch.py [--attn build/attn] [--threads 2] [--runs 10]
                                   [--shapes S1,S2,...] [--skip-plain-above 2e9]
                                   [--shapes-only | --mha-gemm-only] [--cpu-time]
                                   [--dtype f32|bf16|f16] [--repeat 3]
    python3 bench/compare_torch.py --decode [--prefill 4096] [--steps 128] [--dtype f32|bf16|f16]
                                   [--repeat 3] [--attn build/attn] [--threads 2]
    python3 bench/compare_torch.py --backward [--shapes S2,S3,S4,S8] [--repeat 3]
                                   [--attn build/attn] [--threads 2] [--runs 10]
                                   [--attn-before OTHER/attn]

What it runs, each figure the median of --runs timed calls after two warm-up calls
(the same method as `attn bench`), with --threads threads for everybody:

  attn       `attn bench --json` on SPEC section 5's shapes S1-S8 (the library
             default, i.e. the fused kernel on the best ISA) and on the option cases
             below (as custom shapes), `attn bench --mha`, `attn bench --gemm --size
             2048` and `attn bench --bandwidth`;
  torch SDPA torch.nn.functional.scaled_dot_product_attention (2.x: its CPU path is
             a fused flash kernel; PyTorch 1.13 has none, and the column is left
             empty: run it with Debian's torch as /usr/bin/python3 for the 1.13 peer);
  torch plain  q @ k^T * scale, masked_fill(-inf), softmax, @ v: attention the way
             PyTorch 1.13 code (and the chapter) writes it;
  torch MHA  nn.MultiheadAttention(E=768, H=12, batch_first) at T=1024, projections
             included, need_weights=False;
  numpy      np.dot of two 2048 x 2048 float32 matrices (OpenBLAS sgemm).

Grouped-query shapes (S7, S8, Hkv < H) run torch SDPA with enable_gqa=True (K and V
read in place) and torch plain with K and V repeated per query head (chapter 21's
repeat_kv). S7's bottom-right causal mask hides nothing for its one query row, so
torch gets no mask there, as a decoding loop would call it. The option cases (the
names below, all on S2's sizes unless said): W1 a causal window of 256 keys
(--window 255,0), given to torch SDPA as a float mask (0 inside, -inf outside); C1
a softcap of 50 on causal S2, which torch SDPA has no switch for, so its column is
the softcap written out in torch (c * tanh(s / c), then the causal mask and
softmax) and the plain column the same; G1 grouped-query S2 (Hkv = 3).
--shapes-only skips the multi-head, GEMM and bandwidth lines; --mha-gemm-only runs
those two lines alone (no attention shapes, no bandwidth).

--cpu-time (needs --threads 1) times both sides by the calling thread's CPU time
instead of the wall clock (attn through ATTN_BENCH_CLOCK=cpu, PyTorch and numpy
through time.thread_time, with their own thread pools at one thread, so their work
runs in the calling thread): on a machine shared with other jobs, wall-clock
figures measure the queue for a core as much as the code, and this does not.
--dtype bf16|f16 stores q, k, v and the output in 16 bits on both sides: `attn bench
--dtype` and torch SDPA (and plain) on tensors of that dtype (the window's float
mask in it too), and attn's own float32 run of the shape beside them, so each row
also says how 16-bit attn compares with float32 attn in the same run
(docs/half-precision.md): the two alternate --repeat times (3), the best median of
each kept, and a comment line gives each round's ratio. It implies --shapes-only.

--decode compares the decoding loop instead: `attn bench --decode` (a KV cache
prefilled with --prefill tokens per sequence, then --steps steps that append one
token's k and v and attend one query row per sequence, median step) against the
same loop in torch on S5's, S7's and S9's head shapes (DECODE below): a
preallocated cache [B, Hkv, prefill + steps, D] for K and for V, each step copying
the new k and v into position L and calling SDPA on the views [:, :, :L + 1] (no
mask: a single query row at the end of its sequence sees every key; enable_gqa
for S7), also timed per step, median. Both sides time the append and the
attention, and both read the same bytes of K and V. --repeat rounds (default 3)
alternate attn and torch; each side's best median step is reported. With --dtype
bf16|f16 both sides store the cache, q, the output and each step's k and v in that
dtype (`attn bench --decode --dtype`, torch tensors of it).

--backward compares the gradients: `attn bench --backward` (attn_sdpa_backward
alone, and forward with log-sum-exp + backward) against PyTorch 2.x's CPU autograd
through scaled_dot_product_attention (is_causal=True; S8's grouped-query heads
with enable_gqa=True, or K and V repeated per query head where that switch is
missing): the backward alone is out.backward(dO) on a kept graph, forward +
backward builds the graph and runs it. --repeat rounds alternate attn and torch
per shape; each side's best median is reported, with torch's time over attn's
(--attn-before OTHER/attn adds an earlier build to each round: its times, and its
backward's time over this build's). The
%peak column is the chosen attn line's peak_frac: of the FMA peak that attn bench
process measured at its start, which a loaded machine moves from one process to the
next (the header's peak is the first one's).
Before timing, torch SDPA's gradients are checked against plain autograd
(matmul, softmax, matmul) on a small causal grouped-query shape. No memory column:
a process started from Python inherits Python's peak resident size (getrusage
keeps ru_maxrss across exec), so S4's memory is measured by running `attn bench
--backward --shape S4` from a shell.

Ratios are "times faster than the peer": peer_ms / attn_ms. Shapes are measured
interleaved (attn, then the peers, shape by shape), so drift on a shared machine
hits both sides alike. Inputs are uniform in [-1, 1); each peer's output is checked
against attn's reference semantics on S1 before timing (max abs difference printed).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

# OpenBLAS reads these at load time; unset them for this process only.
for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(var, None)
# --cpu-time counts the calling thread only, so OpenBLAS (read at load time, like the
# above) must run numpy's products in it.
if "--cpu-time" in sys.argv:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")  # PyTorch 2.0 and later

# name: (B, H, Hkv, Tq, Tk, D, mask, window (left, right) or None, softcap or None)
SHAPES = {
    "S1": (2, 4, 4, 5, 5, 4, "none", None, None),
    "S2": (1, 12, 12, 1024, 1024, 64, "causal", None, None),
    "S3": (4, 12, 12, 1024, 1024, 64, "causal", None, None),
    "S4": (1, 16, 16, 4096, 4096, 64, "causal", None, None),
    "S5": (1, 32, 32, 1, 4096, 128, "none", None, None),
    "S6": (8, 8, 8, 512, 512, 64, "padding", None, None),
    "S7": (1, 32, 8, 1, 8192, 128, "causal_bottom_right", None, None),
    "S8": (1, 32, 8, 2048, 2048, 128, "causal", None, None),
    # The option cases, run by attn as custom shapes.
    "W1": (1, 12, 12, 1024, 1024, 64, "causal", (255, 0), None),
    "C1": (1, 12, 12, 1024, 1024, 64, "causal", None, 50.0),
    "G1": (1, 12, 3, 1024, 1024, 64, "causal", None, None),
}


def flops(B, H, Hkv, Tq, Tk, D, mask, window, softcap):
    """attn bench's count: causal with Tq == Tk and no window counts half;
    otherwise the visible (query, key) pairs."""
    if window is None and (mask not in ("causal", "causal_bottom_right") or Tq == Tk):
        f = 4.0 * B * H * Tq * Tk * D
        return f / 2 if mask in ("causal", "causal_bottom_right") else f
    return 4.0 * B * H * D * float(visible(Tq, Tk, mask, window).sum())


def visible(Tq, Tk, mask, window):
    """[Tq, Tk] booleans: the keys each query sees under the causal mask and the
    window (query i sits at key position i + Tk - Tq)."""
    i = torch.arange(Tq)[:, None]
    j = torch.arange(Tk)[None, :]
    ip = i + (Tk - Tq)
    vis = torch.ones(Tq, Tk, dtype=torch.bool)
    if mask == "causal":
        vis &= j <= i
    if mask == "causal_bottom_right":
        vis &= j <= ip
    if window is not None:
        if window[0] >= 0:
            vis &= j >= ip - window[0]
        if window[1] >= 0:
            vis &= j <= ip + window[1]
    return vis


def attn_args(name):
    """`attn bench` arguments for a shape: --shape for SPEC's, a custom shape for
    the option cases."""
    if name.startswith("S"):
        return ["--shape", name]
    B, H, Hkv, Tq, Tk, D, mask, window, softcap = SHAPES[name]
    args = ["--batch", str(B), "--heads", str(H), "--kv-heads", str(Hkv), "--query-len",
            str(Tq), "--key-len", str(Tk), "--head-dim", str(D)]
    if mask == "causal":
        args.append("--causal")
    elif mask == "causal_bottom_right":
        args.append("--causal-bottom-right")
    if window is not None:
        args += ["--window", f"{window[0]},{window[1]}"]
    if softcap is not None:
        args += ["--softcap", str(softcap)]
    return args


# The clock median_ms reads: the wall clock, or with --cpu-time the thread's CPU time.
CLOCK = time.perf_counter


def median_ms(fn, runs):
    fn()
    fn()
    t0 = CLOCK()
    fn()
    once = CLOCK() - t0
    reps = 1 if once > 1e-3 else int(1e-3 / max(once, 1e-7)) + 1
    samples = []
    for _ in range(runs):
        t0 = CLOCK()
        for _ in range(reps):
            fn()
        samples.append((CLOCK() - t0) / reps)
    samples.sort()
    n = len(samples)
    mid = samples[n // 2] if n % 2 else 0.5 * (samples[n // 2 - 1] + samples[n // 2])
    return mid * 1e3


def attn_json(attn, args):
    env = dict(os.environ)
    if CLOCK is time.thread_time:
        env["ATTN_BENCH_CLOCK"] = "cpu"
    out = subprocess.run([attn, "bench", "--json"] + args, check=True,
                         capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def torch_inputs(B, H, Hkv, Tq, Tk, D, mask, window, softcap, dtype=None):
    """q, k, v (in dtype, float32 by default) and the boolean mask (None when
    nothing is hidden)."""
    g = torch.Generator().manual_seed(0)
    dt = dtype or torch.float32
    q = (torch.rand(B, H, Tq, D, generator=g) * 2 - 1).to(dt)
    k = (torch.rand(B, Hkv, Tk, D, generator=g) * 2 - 1).to(dt)
    v = (torch.rand(B, Hkv, Tk, D, generator=g) * 2 - 1).to(dt)
    m = None
    if mask == "padding":
        m = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
        m[B // 2:, :, :, Tk - Tk // 4:] = False
    elif mask in ("causal", "causal_bottom_right") or window is not None:
        m = visible(Tq, Tk, mask, window)
        if bool(m.all()):
            m = None
    return q, k, v, m


class Case:
    """One shape's torch calls, with what torch needs prepared outside the timing:
    the float mask of a window, K and V repeated for plain attention under GQA."""

    def __init__(self, q, k, v, m, mask, window, softcap):
        self.q, self.k, self.v, self.m = q, k, v, m
        self.gqa = q.shape[1] != k.shape[1]
        self.softcap = softcap
        self.is_causal = mask == "causal" and window is None
        self.fmask = None
        if window is not None:
            self.fmask = torch.zeros(m.shape, dtype=q.dtype).masked_fill(~m, float("-inf"))
        group = q.shape[1] // k.shape[1]
        self.kr = k.repeat_interleave(group, dim=1) if self.gqa else k
        self.vr = v.repeat_interleave(group, dim=1) if self.gqa else v

    def sdpa(self):
        if self.softcap is not None:
            return self.plain()  # torch SDPA has no softcap: written out
        kw = {"enable_gqa": True} if self.gqa else {}
        if self.is_causal:
            return F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=True, **kw)
        mask = self.fmask if self.fmask is not None else self.m
        return F.scaled_dot_product_attention(self.q, self.k, self.v, attn_mask=mask, **kw)

    def plain(self):
        s = (self.q @ self.kr.transpose(-2, -1)) * (1.0 / math.sqrt(self.q.shape[-1]))
        if self.softcap is not None:
            s = self.softcap * torch.tanh(s / self.softcap)
        if self.m is not None:
            s = s.masked_fill(~self.m, float("-inf"))
        return torch.softmax(s, dim=-1) @ self.vr


# name: (B, H, Hkv, D) of the decoding loop (attn bench --decode runs the same).
DECODE = {"S5": (1, 32, 32, 128), "S7": (1, 32, 8, 128), "S9": (4, 16, 16, 64)}


def torch_decode_ms(B, H, Hkv, D, prefill, steps, dtype=torch.float32):
    """The median step of torch's decoding loop on a preallocated cache of dtype."""
    g = torch.Generator().manual_seed(0)
    cap = prefill + steps
    kc = torch.empty(B, Hkv, cap, D, dtype=dtype)
    vc = torch.empty(B, Hkv, cap, D, dtype=dtype)
    kc[:, :, :prefill] = torch.rand(B, Hkv, prefill, D, generator=g) * 2 - 1
    vc[:, :, :prefill] = torch.rand(B, Hkv, prefill, D, generator=g) * 2 - 1
    q = (torch.rand(B, H, 1, D, generator=g) * 2 - 1).to(dtype)
    kn = (torch.rand(steps, B, Hkv, 1, D, generator=g) * 2 - 1).to(dtype)
    vn = (torch.rand(steps, B, Hkv, 1, D, generator=g) * 2 - 1).to(dtype)
    kw = {"enable_gqa": True} if H != Hkv else {}
    times = []
    with torch.inference_mode():
        for _ in range(2):  # warm-up on the prefilled cache, as attn's loop does once
            F.scaled_dot_product_attention(q, kc[:, :, :prefill], vc[:, :, :prefill], **kw)
        for s in range(steps):
            L = prefill + s
            t0 = time.perf_counter()
            kc[:, :, L:L + 1] = kn[s]
            vc[:, :, L:L + 1] = vn[s]
            F.scaled_dot_product_attention(q, kc[:, :, :L + 1], vc[:, :, :L + 1], **kw)
            times.append(time.perf_counter() - t0)
    times.sort()
    n = len(times)
    mid = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    return mid * 1e3


def decode_main(a):
    common = ["--threads", str(a.threads), "--prefill", str(a.prefill), "--steps",
              str(a.steps), "--dtype", a.dtype]
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    # --repeat rounds, attn then torch in each, so that drift on a shared machine hits
    # both alike; each side's best median step is reported.
    best = {}
    tbest = {}
    allocs = {}
    for _ in range(a.repeat):
        mine = {r["shape"]: r for r in attn_json(a.attn, ["--decode"] + common)
                if r.get("kind") == "decode"}
        for name, (B, H, Hkv, D) in DECODE.items():
            best[name] = min(best.get(name, float("inf")), mine[name]["median_ms"])
            allocs[name] = max(allocs.get(name, 0.0), mine[name]["allocs_per_step"])
            if HAVE_SDPA:
                tms = torch_decode_ms(B, H, Hkv, D, a.prefill, a.steps, tdtype)
                tbest[name] = min(tbest.get(name, float("inf")), tms)
    print(f"# torch {torch.__version__}, {a.threads} threads; decode loop: prefill "
          f"{a.prefill}, {a.steps} steps, median step (append + attend), best of "
          f"{a.repeat} rounds; K, V, q and out stored as {a.dtype} on both sides")
    print(f"{'shape':6} {'B':>2} {'H':>3} {'Hkv':>3} {'D':>4} {'attn ms':>9} {'torch ms':>9} "
          f"{'vs SDPA':>8} {'attn allocs/step':>17}")
    for name, (B, H, Hkv, D) in DECODE.items():
        ms = best[name]
        tms = tbest.get(name, float("nan"))
        print(f"{name:6} {B:2d} {H:3d} {Hkv:3d} {D:4d} {ms:9.4f} {tms:9.4f} {tms / ms:7.2f}x "
              f"{allocs[name]:17.3f}")
        if a.json:
            print(json.dumps({"decode": name, "dtype": a.dtype, "attn_ms": ms,
                              "torch_sdpa_ms": tms,
                              "vs_sdpa": tms / ms,
                              "attn_allocs_per_step": allocs[name]}))
    return 0


BACKWARD = ("S2", "S3", "S4", "S8")


def torch_backward_ms(B, H, Hkv, Tq, Tk, D, runs):
    """Median ms of torch's SDPA backward alone and of forward + backward, causal."""
    q, k, v, _ = torch_inputs(B, H, Hkv, Tq, Tk, D, "causal", None, None)
    gqa = H != Hkv
    native = gqa and "enable_gqa" in F.scaled_dot_product_attention.__doc__
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = torch.rand(B, H, Tq, D, generator=torch.Generator().manual_seed(1)) * 2 - 1

    def forward():
        kk, vv = k, v
        kw = {}
        if gqa and native:
            kw["enable_gqa"] = True
        elif gqa:
            kk = k.repeat_interleave(H // Hkv, dim=1)
            vv = v.repeat_interleave(H // Hkv, dim=1)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **kw)

    out = forward()

    def backward():
        q.grad = k.grad = v.grad = None
        out.backward(dout, retain_graph=True)

    def both():
        q.grad = k.grad = v.grad = None
        forward().backward(dout)

    return median_ms(backward, runs), median_ms(both, runs)


def backward_check():
    """torch SDPA's gradients against plain autograd on a small shape: the largest
    absolute difference over dq, dk and dv."""
    B, H, Hkv, T, D = 2, 4, 2, 37, 16
    q, k, v, m = torch_inputs(B, H, Hkv, T, T, D, "causal", None, None)
    dout = torch.rand(B, H, T, D, generator=torch.Generator().manual_seed(2)) * 2 - 1
    grads = []
    for fn in ("sdpa", "plain"):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        kr, vr = kk.repeat_interleave(H // Hkv, dim=1), vv.repeat_interleave(H // Hkv, dim=1)
        if fn == "sdpa":
            out = F.scaled_dot_product_attention(qq, kr, vr, is_causal=True)
        else:
            s = (qq @ kr.transpose(-2, -1)) / math.sqrt(D)
            out = torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1) @ vr
        out.backward(dout)
        grads.append([qq.grad, kk.grad, vv.grad])
    return max(float((a - b).abs().max()) for a, b in zip(*grads))


def backward_main(a):
    if not HAVE_SDPA:
        print("compare_torch.py --backward needs PyTorch 2.x (scaled_dot_product_attention)")
        return 1
    common = ["--threads", str(a.threads), "--runs", str(a.runs)]
    # --peak times FMA chains alone and refuses --runs (it has nothing to repeat).
    setup = attn_json(a.attn, ["--peak", "--threads", str(a.threads)])[0]
    print(f"# torch {torch.__version__}, {a.threads} threads; FP32 FMA peak "
          f"{setup['peak_gflops']:.1f} GFLOP/s (attn bench --peak); best of {a.repeat} "
          f"rounds of medians of {a.runs}")
    print(f"# check: torch SDPA's gradients vs plain autograd, max |diff| "
          f"{backward_check():.2e}")
    names = [n for n in a.shapes.split(",") if n in BACKWARD] if a.shapes_given else BACKWARD
    before = f" {'before bwd':>10} {'after/bef':>9} {'before f+b':>10}" if a.attn_before else ""
    print(f"{'shape':6} {'attn bwd':>9} {'%peak':>6} {'torch bwd':>10} {'vs torch':>9} "
          f"{'attn f+b':>9} {'torch f+b':>10} {'vs torch':>9}{before}")
    for name in names:
        B, H, Hkv, Tq, Tk, D = SHAPES[name][:6]
        best = {}
        for _ in range(a.repeat):
            # attn, then (with --attn-before) the earlier build, then torch, each round.
            for tag, exe in (("", a.attn), ("before_", a.attn_before)):
                if not exe:
                    continue
                for r in attn_json(exe, ["--backward", "--shape", name] + common):
                    if r.get("kind") in ("sdpa_backward", "sdpa_fwd_bwd"):
                        kind = tag + r["kind"]
                        if kind not in best or r["median_ms"] < best[kind]["median_ms"]:
                            best[kind] = r
            tb, tfb = torch_backward_ms(B, H, Hkv, Tq, Tk, D, a.runs)
            best["torch_bwd"] = min(best.get("torch_bwd", float("inf")), tb)
            best["torch_fwd_bwd"] = min(best.get("torch_fwd_bwd", float("inf")), tfb)
        ab, afb = best["sdpa_backward"], best["sdpa_fwd_bwd"]
        tb, tfb = best["torch_bwd"], best["torch_fwd_bwd"]
        extra = ""
        if a.attn_before:
            bb, bfb = best["before_sdpa_backward"], best["before_sdpa_fwd_bwd"]
            extra = (f" {bb['median_ms']:10.3f} {bb['median_ms'] / ab['median_ms']:8.2f}x "
                     f"{bfb['median_ms']:10.3f}")
        print(f"{name:6} {ab['median_ms']:9.3f} {100 * ab['peak_frac']:5.1f}% {tb:10.3f} "
              f"{tb / ab['median_ms']:8.2f}x {afb['median_ms']:9.3f} {tfb:10.3f} "
              f"{tfb / afb['median_ms']:8.2f}x{extra}")
        if a.json:
            print(json.dumps({"backward": name, "attn_bwd_ms": ab["median_ms"],
                              "attn_bwd_peak_frac": ab["peak_frac"],
                              "torch_bwd_ms": tb, "vs_torch_bwd": tb / ab["median_ms"],
                              "attn_fwd_bwd_ms": afb["median_ms"], "torch_fwd_bwd_ms": tfb,
                              "vs_torch_fwd_bwd": tfb / afb["median_ms"]}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attn", default=os.path.join("build", "attn"))
    ap.add_argument("--attn-before", default=None,
                    help="--backward: an earlier build's attn, timed in the same rounds "
                         "(its backward and forward + backward, and after/before: its "
                         "backward's time over this one's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--shapes", default="S1,S2,S3,S4,S5,S6,S7,S8,W1,C1,G1")
    ap.add_argument("--skip-plain-above", type=float, default=float("inf"),
                    help="skip torch plain on shapes above this many FLOPs")
    ap.add_argument("--json", action="store_true", help="print one JSON object per line")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the calling thread's CPU time (with --threads 1 only)")
    ap.add_argument("--shapes-only", action="store_true",
                    help="skip the multi-head, GEMM and bandwidth comparisons")
    ap.add_argument("--mha-gemm-only", action="store_true",
                    help="run the multi-head and GEMM comparisons alone")
    ap.add_argument("--decode", action="store_true",
                    help="compare the decoding loop through a KV cache instead")
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3,
                    help="--decode, --backward: rounds of attn then torch; --dtype "
                    "bf16|f16: rounds of attn's float32 and 16-bit runs; the best of "
                    "each is kept")
    ap.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32",
                    help="storage of q, k, v and the output on both sides")
    ap.add_argument("--backward", action="store_true",
                    help="compare the backward (and forward + backward) on S2, S3, S4, S8")
    a = ap.parse_args()
    a.shapes_given = "--shapes" in sys.argv or any(x.startswith("--shapes=") for x in sys.argv)
    if a.cpu_time:
        global CLOCK
        if a.threads != 1 or a.decode:
            ap.error("--cpu-time times the calling thread only: it needs --threads 1 "
                     "and no --decode")
        CLOCK = time.thread_time
    half = a.dtype != "f32"
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    if half and a.backward:
        ap.error("--backward runs float32 only (attn's backward stores float32)")
    if half:
        a.shapes_only = True
    torch.set_num_threads(a.threads)
    if a.decode:
        return decode_main(a)
    if a.backward:
        return backward_main(a)
    common = ["--threads", str(a.threads), "--runs", str(a.runs)]

    # --peak times FMA chains alone and refuses --runs (it has nothing to repeat).
    setup = attn_json(a.attn, ["--peak", "--threads", str(a.threads)])[0]
    peak = setup["peak_gflops"]
    print(f"# torch {torch.__version__}, numpy {np.__version__}, {a.threads} threads; "
          f"FP32 FMA peak {peak:.1f} GFLOP/s (attn bench --peak)")
    rows = []
    f32_ms = {}
    for name in [] if a.mha_gemm_only else a.shapes.split(","):
        shape = SHAPES[name]
        mine = None
        # With a 16-bit dtype, attn's float32 run of the same shape and its 16-bit run
        # alternate --repeat times, so that a slow minute of the machine falls on both
        # sides of 'vs f32'; the best median of each is kept.
        pairs = []
        for _ in range(a.repeat if half else 1):
            if half:
                f32 = [r for r in attn_json(a.attn, attn_args(name) + common)
                       if r.get("kind") == "sdpa"][0]["median_ms"]
                f32_ms[name] = min(f32_ms.get(name, f32), f32)
            run = [r for r in attn_json(a.attn, attn_args(name) + common + ["--dtype", a.dtype])
                   if r.get("kind") == "sdpa"][0]
            if half:
                pairs.append(f32 / run["median_ms"])
            if mine is None or run["median_ms"] < mine["median_ms"]:
                mine = run
        if half:
            print(f"# {name}: attn float32 / {a.dtype} in each round: "
                  + ", ".join(f"{x:.2f}" for x in pairs))
        c = Case(*torch_inputs(*shape, dtype=tdtype), shape[6], shape[7], shape[8])
        with torch.inference_mode():
            sdpa = None
            if HAVE_SDPA:
                diff = (c.sdpa() - c.plain()).abs().max()
                print(f"# check on {name}: |torch SDPA - plain| max {float(diff):.2e}")
                sdpa = median_ms(c.sdpa, a.runs)
            plain = None
            if flops(*shape) <= a.skip_plain_above:
                plain = median_ms(c.plain, a.runs)
        rows.append((name, mine, sdpa, plain))
        del c

    if half:
        print(f"# dtype {a.dtype}: attn and torch both store q, k, v and out in it; "
              f"'vs f32' is attn's float32 time over its {a.dtype} time")
    print(f"{'shape':6} {'attn ms':>10} {'GFLOP/s':>8} {'%peak':>6} {'SDPA ms':>10} "
          f"{'plain ms':>10} {'vs SDPA':>8} {'vs plain':>9}" + (f" {'vs f32':>7}" if half else ""))
    for name, mine, sdpa, plain in rows:
        ms = mine["median_ms"]
        nan = float("nan")
        line = (f"{name:6} {ms:10.4f} {mine['gflops']:8.1f} {100 * mine['peak_frac']:5.1f}% "
                f"{sdpa if sdpa is not None else nan:10.4f} "
                f"{plain if plain is not None else nan:10.4f} "
                f"{(sdpa / ms if sdpa is not None else nan):7.2f}x "
                f"{(plain / ms if plain is not None else float('nan')):8.2f}x")
        if half:
            line += f" {f32_ms[name] / ms:6.2f}x"
        print(line)
        if a.json:
            print(json.dumps({"shape": name, "dtype": a.dtype, "attn_ms": ms,
                              "attn_f32_ms": f32_ms.get(name), "torch_sdpa_ms": sdpa,
                              "torch_plain_ms": plain,
                              "vs_sdpa": (sdpa / ms) if sdpa else None,
                              "vs_plain": (plain / ms) if plain else None}))

    if a.shapes_only:
        return 0

    # Multi-head attention end to end (projections included).
    T, E, NH = 1024, 768, 12
    mine = [r for r in attn_json(a.attn, ["--mha"] + common) if r.get("kind") == "mha"][0]
    mha = torch.nn.MultiheadAttention(E, NH, batch_first=True)
    x = torch.rand(1, T, E) * 2 - 1
    with torch.inference_mode():
        tmha = median_ms(lambda: mha(x, x, x, need_weights=False), a.runs)
    print(f"mha T={T} E={E} H={NH}: attn {mine['median_ms']:.3f} ms, "
          f"nn.MultiheadAttention {tmha:.3f} ms: {tmha / mine['median_ms']:.2f}x")

    # The GEMM against OpenBLAS sgemm (through numpy) and torch.mm.
    n = 2048
    mine = [r for r in attn_json(a.attn, ["--gemm", "--size", str(n)] + common)
            if r.get("kind") == "gemm"][0]
    xa = np.random.default_rng(0).random((n, n), dtype=np.float32)
    wa = np.random.default_rng(1).random((n, n), dtype=np.float32)
    tnp = median_ms(lambda: np.dot(xa, wa.T), a.runs)
    xt, wt = torch.from_numpy(xa), torch.from_numpy(wa)
    ttorch = median_ms(lambda: torch.mm(xt, wt.t()), a.runs)
    gf = lambda ms: 2.0 * n ** 3 / ms / 1e6  # noqa: E731
    print(f"gemm {n}^3 (y = x W^T): attn {mine['median_ms']:.3f} ms ({mine['gflops']:.0f} "
          f"GFLOP/s), numpy/OpenBLAS {tnp:.3f} ms ({gf(tnp):.0f} GFLOP/s), torch.mm "
          f"{ttorch:.3f} ms ({gf(ttorch):.0f} GFLOP/s): attn is {tnp / mine['median_ms']:.2f}x "
          f"OpenBLAS and {ttorch / mine['median_ms']:.2f}x torch.mm")

    if a.mha_gemm_only:
        return 0
    bw = attn_json(a.attn, ["--bandwidth"] + common)
    kv = [r for r in bw if r.get("kind") == "kv_stream"]
    st = [r for r in bw if r.get("kind") == "bandwidth"]
    for line in kv:
        if st:
            print(f"{line['shape']} K/V streaming: {st[0]['gbs']:.1f} GB/s measured; attn "
                  f"reads K and V at {line['kv_gbs']:.1f} GB/s "
                  f"({100 * line['fraction']:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
