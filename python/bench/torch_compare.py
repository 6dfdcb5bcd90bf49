"""attn from Python against PyTorch from Python, on SPEC section 5's shapes.

Run: python python/bench/torch_compare.py [--shapes S1,...,S6] [--runs 7] [--no-mha]
                                          [--torch-threads 2]

Attention (forward, float32, the same inputs, under torch.inference_mode):
  attn.sdpa      the numpy API (causal=True on the causal shapes, S6's padding
                 mask [B, 1, 1, Tk] otherwise; no weights)
  attn.torch     attn.torch.scaled_dot_product_attention, the chapter's API: a bool
                 mask tensor, and it returns the weights [B, H, Tq, Tk] too
  plain          the chapter's three steps in PyTorch (matmul, masked_fill,
                 softmax, matmul), which also makes the weights
  torch.sdpa     torch.nn.functional.scaled_dot_product_attention (is_causal=True
                 on the causal shapes, the bool mask on S6; no weights)
Multi-head self-attention, attn.torch.MultiHeadSelfAttention against the same
module in plain PyTorch (python/tests/chapter/plain_attention.py), with equal
parameters: the forward under no_grad, and a training step (forward, a sum of
the output, backward).

Each implementation is timed in turn, round after round (interleaved, so a change
in the machine's load touches all of them alike); a round times a batch of calls
long enough to be measured (at least ~20 ms); the figure is the median of the
rounds. Ratios are against torch.sdpa (attention) or the plain module (MHA).
Both libraries use 2 threads (torch.set_num_threads(2); attn's default is the
cores the process may run on, printed). Prints the CPU model and the load average.
"""
import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
import torch

import attn
import attn.torch as attention

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "chapter"))
import plain_attention as plain  # noqa: E402

SHAPES = {  # SPEC section 5: B, H, Tq, Tk, D, mask
    "S1": (2, 4, 5, 5, 4, "none"),
    "S2": (1, 12, 1024, 1024, 64, "causal"),
    "S3": (4, 12, 1024, 1024, 64, "causal"),
    "S4": (1, 16, 4096, 4096, 64, "causal"),
    "S5": (1, 32, 1, 4096, 128, "none"),
    "S6": (8, 8, 512, 512, 64, "padding"),
}
MHA = {  # name: B, T, E, H, causal
    "chapter": (2, 5, 16, 4, False),
    "gpt2-layer": (1, 1024, 768, 12, True),
}


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def batch_size(fn, floor=0.02):
    """How many calls make one timed batch of at least `floor` seconds."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= floor or n >= 1 << 20:
            return n
        n *= 2


def interleaved(fns, runs):
    """{name: median seconds per call}, the names timed in turn, `runs` rounds."""
    sizes = {name: batch_size(fn) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            n = sizes[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n)
    return {name: statistics.median(t) for name, t in times.items()}


def attention_row(name, runs):
    B, H, Tq, Tk, D, mask = SHAPES[name]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for T in (Tq, Tk, Tk))
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    if mask == "causal":
        m = attention.make_causal_attention_mask(Tk)  # Tq == Tk on the causal shapes
        np_opts, torch_opts = {"causal": True}, {"is_causal": True}
    elif mask == "padding":
        ids = torch.ones(B, Tk, dtype=torch.long)
        ids[B // 2:, Tk - Tk // 4:] = 0  # samples b >= B/2: the last quarter are pads
        m = attention.make_padding_attention_mask(ids, pad_id=0)
        np_opts, torch_opts = {"mask": m.numpy()}, {"attn_mask": m}
    else:
        m, np_opts, torch_opts = None, {}, {}
    F = torch.nn.functional
    fns = {
        "attn.sdpa": lambda: attn.sdpa(qn, kn, vn, **np_opts),
        "attn.torch": lambda: attention.scaled_dot_product_attention(q, k, v, attention_mask=m),
        "plain": lambda: plain.scaled_dot_product_attention(q, k, v, attention_mask=m),
        "torch.sdpa": lambda: F.scaled_dot_product_attention(q, k, v, **torch_opts),
    }
    # The four agree before they are timed (the weights-free ones on the output).
    ref = F.scaled_dot_product_attention(q, k, v, **torch_opts)
    for impl in ("attn.sdpa", "attn.torch"):
        got = fns[impl]()
        got = torch.from_numpy(got) if isinstance(got, np.ndarray) else got[0]
        err = (got - ref).abs().max().item()
        if err > 1e-4:
            raise SystemExit("%s %s differs from torch.sdpa by %g" % (name, impl, err))
    with torch.inference_mode():
        return interleaved(fns, runs)


def mha_rows(name, runs):
    B, T, E, H, causal = MHA[name]
    torch.manual_seed(0)
    ours = attention.MultiHeadSelfAttention(E, H)
    torch.manual_seed(0)
    theirs = plain.MultiHeadSelfAttention(E, H)
    x = torch.randn(B, T, E)
    m = attention.make_causal_attention_mask(T) if causal else None

    def forward(module):
        def run():
            with torch.no_grad():
                module(x, attention_mask=m)
        return run

    def train_step(module):
        def run():
            module.zero_grad()
            module(x, attention_mask=m).sum().backward()
        return run

    fwd = interleaved({"attn.torch": forward(ours), "plain": forward(theirs)}, runs)
    step = interleaved({"attn.torch": train_step(ours), "plain": train_step(theirs)}, runs)
    return fwd, step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="S1,S2,S3,S4,S5,S6")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--no-mha", action="store_true")
    ap.add_argument("--torch-threads", type=int, default=2,
                    help="PyTorch's threads (attn's: the cores the process may run on; attn reads no ATTN_THREADS)")
    a = ap.parse_args()
    torch.set_num_threads(a.torch_threads)
    info = attn.arch()
    print("# %s; attn %s (%s kernels, %d threads), torch %s (%d threads), numpy %s"
          % (cpu_model(), attn.__version__, info["selected"], info["threads"],
             torch.__version__, torch.get_num_threads(), np.__version__))
    print("# load average %s; median of %d interleaved rounds" %
          (" ".join("%.2f" % x for x in os.getloadavg()), a.runs))
    print("# shape      attn.sdpa   attn.torch        plain   torch.sdpa   (ms; ratio to "
          "torch.sdpa below)")
    for name in a.shapes.split(","):
        t = attention_row(name, a.runs)
        ref = t["torch.sdpa"]
        print("%-6s %12.4f %12.4f %12.4f %12.4f" % (name, t["attn.sdpa"] * 1e3,
                                                    t["attn.torch"] * 1e3, t["plain"] * 1e3,
                                                    ref * 1e3))
        print("%-6s %11.2fx %11.2fx %11.2fx %11.2fx" % ("", t["attn.sdpa"] / ref,
                                                        t["attn.torch"] / ref,
                                                        t["plain"] / ref, 1.0))
        sys.stdout.flush()
    if a.no_mha:
        return
    print("# MultiHeadSelfAttention    attn.torch ms    plain ms   ratio")
    for name in MHA:
        fwd, step = mha_rows(name, a.runs)
        for what, t in (("forward", fwd), ("train step", step)):
            print("%-11s %-12s %12.4f %11.4f %7.2fx" % (name, what, t["attn.torch"] * 1e3,
                                                      t["plain"] * 1e3,
                                                      t["attn.torch"] / t["plain"]))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
