#!/usr/bin/env python3
"""A model-porter's randomized differential check of attn against PyTorch.

Draws random problems that combine SPEC sections 6-10 at once (GQA, every causal
form, a sliding window, softcap, sinks, ALiBi, an additive bias of a broadcast
shape, a boolean mask of a broadcast shape, a scale, empty rows in both modes,
Tq < Tk, Tq > Tk, Tq = 1, awkward sizes and odd head dims) and compares attn with
an oracle written here, from SPEC section 6's definitions, in plain torch
operations on float64:

  forward      attn.sdpa's output and log-sum-exp (float32)
  backward     attn.sdpa_backward's dq, dk, dv, dbias, dsinks against
               torch.autograd through the float64 oracle
  decode       attn.KVCache: append with RoPE at the cache's positions, attend
               with bottom-right causal and the options, truncate, append again;
               against a torch decode loop on float64
  half         the forward with q, k, v in bfloat16 and float16 (SPEC section 10:
               within twice PyTorch's own error in that dtype plus a floor)
  cli          a few problems through `attn sdpa` (with --grad-*), 1 and 2 threads

The float32 rule: attn's largest error against the float64 oracle is at most
4x the error of the same formula evaluated by torch in float32, plus a floor of
2^-18 of the oracle's largest magnitude (a few float32 rounding steps). Each
instruction set runs in a process of its own (ATTN_ARCH is read once): ref (the
reference kernels), scalar, avx2, avx512 and avx512bf16 (the bfloat16 kernel,
emulated with ATTN_BF16_EMULATE=1 where the CPU lacks AVX512-BF16).

Run with a Python that has torch 2.x, numpy and the attn package built from this
checkout (PYTHONPATH may point at it):

    python tools/port_check.py [--problems 300] [--seed 1] [--arch all]
    python tools/port_check.py --golden tests/data/port   # regenerate the golden set

--golden writes a small set of the random problems (inputs, the float64 oracle's
output, log-sum-exp and gradients) for tests/test_port_golden.c, which needs no
Python. Exit status 0 when every comparison holds, 1 otherwise (each
disagreement is printed with the problem that shows it).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

SIZES = (1, 2, 3, 5, 17, 33, 113)
DIMS = (1, 2, 3, 4, 5, 8, 16, 17, 33, 64, 65, 96, 128, 255, 256)
CAUSAL = (None, "top_left", "bottom_right")


# ---------------------------------------------------------------------------
# Random problems
# ---------------------------------------------------------------------------

def draw_problem(rng, small=False):
    """One random problem: a dict of numpy inputs and options (JSON-able scalars)."""
    p = {}
    B = int(rng.choice((1, 2)))
    Hkv = int(rng.choice((1, 1, 2, 3)))
    group = int(rng.choice((1, 2, 3, 4)))
    H = Hkv * group
    sizes = SIZES[:5] if small else SIZES
    Tq = int(rng.choice(sizes))
    Tk = int(rng.choice(sizes))
    if rng.random() < 0.15:
        Tq = 1
    dims = DIMS[:9] if small else DIMS
    D = int(rng.choice(dims))
    Dv = D if rng.random() < 0.7 else int(rng.choice(dims))
    if not small and rng.random() < 0.1:
        # A decoding step's shape, long enough for split-key decoding (few query
        # rows, few (batch, key/value head) pairs, many keys).
        B, Hkv = 1, int(rng.choice((1, 2)))
        H = Hkv * int(rng.choice((1, 4)))
        Tq = int(rng.choice((1, 2, 3)))
        Tk = int(rng.choice((600, 1100, 2100)))
        D = int(rng.choice((64, 65, 128)))
        Dv = D
    # Keep the float64 oracle and its autograd quick.
    while B * H * Tq * Tk * max(D, Dv) > 8_000_000:
        Tq = max(1, Tq // 2)
    p.update(B=B, H=H, Hkv=Hkv, Tq=Tq, Tk=Tk, D=D, Dv=Dv)
    amp = float(rng.choice((0.5, 1.0, 2.0, 4.0)))
    p["q"] = (rng.standard_normal((B, H, Tq, D)) * amp).astype(np.float32)
    p["k"] = rng.standard_normal((B, Hkv, Tk, D)).astype(np.float32)
    p["v"] = rng.standard_normal((B, Hkv, Tk, Dv)).astype(np.float32)
    p["dout"] = rng.standard_normal((B, H, Tq, Dv)).astype(np.float32)
    p["causal"] = CAUSAL[int(rng.integers(0, 3))]
    p["scale"] = float(rng.choice((0.05, 0.3, 1.0))) if rng.random() < 0.3 else None
    p["window"] = None
    if rng.random() < 0.35:
        left = int(rng.choice((-1, 0, 1, 2, 4, 16)))
        right = int(rng.choice((-1, 0, 0, 1, 3)))
        p["window"] = (left, right)
    p["softcap"] = float(rng.choice((1.0, 5.0, 30.0))) if rng.random() < 0.3 else None
    p["alibi"] = None
    if rng.random() < 0.25:
        p["alibi"] = True if rng.random() < 0.5 else \
            (rng.random(H) * 0.5).astype(np.float32)
    p["bias"] = None
    if rng.random() < 0.35:
        full = [B, H, Tq, Tk]
        shape = [n if rng.random() < 0.5 else 1 for n in full]
        nd = int(rng.integers(1, 5))
        shape = shape[4 - nd:]
        b = (rng.standard_normal(shape) * 1.5).astype(np.float32)
        if rng.random() < 0.3:
            b[rng.random(shape) < 0.2] = -np.inf
        p["bias"] = b
    p["mask"] = None
    if rng.random() < 0.4:
        kind = rng.random()
        if kind < 0.4:
            # A padding mask [B, 1, 1, Tk]: each sequence keeps a random prefix.
            m = np.zeros((B, 1, 1, Tk), dtype=bool)
            for b in range(B):
                m[b, ..., :int(rng.integers(0, Tk + 1))] = True
        else:
            full = [B, H, Tq, Tk]
            shape = [n if rng.random() < 0.6 else 1 for n in full]
            nd = int(rng.integers(2, 5))
            shape = shape[4 - nd:]
            m = rng.random(shape) < float(rng.choice((0.3, 0.7, 0.95)))
        p["mask"] = m
    p["sinks"] = (rng.standard_normal(H) * 2).astype(np.float32) if rng.random() < 0.3 else None
    p["empty_rows"] = "zero" if rng.random() < 0.5 else "error"
    # A porter's q, k and v often come as [B, T, H, D] and are transposed views.
    p["strided"] = bool(rng.random() < 0.3)
    return p


def alibi_default_slopes(H):
    """The ALiBi paper's slopes (Press et al., arXiv 2108.12409, and its code's
    rule for a head count that is not a power of two), written from the paper."""
    def pow2(n):
        return [2.0 ** (-8.0 * (k + 1) / n) for k in range(n)]
    if H & (H - 1) == 0:
        return pow2(H)
    n = 1 << (H.bit_length() - 1)
    return pow2(n) + pow2(2 * n)[0::2][:H - n]


# ---------------------------------------------------------------------------
# The oracle: SPEC section 6 in torch operations, any dtype
# ---------------------------------------------------------------------------

def visible(p, Tq, Tk):
    """[Tq, Tk] (or broadcast with the mask) boolean: which keys each query sees."""
    i = torch.arange(Tq)[:, None]
    j = torch.arange(Tk)[None, :]
    ip = i + Tk - Tq
    vis = torch.ones(Tq, Tk, dtype=torch.bool)
    if p["causal"] == "top_left":
        vis = vis & (j <= i)
    elif p["causal"] == "bottom_right":
        vis = vis & (j <= ip)
    if p["window"] is not None:
        left, right = p["window"]
        if left >= 0:
            vis = vis & (j >= ip - left)
        if right >= 0:
            vis = vis & (j <= ip + right)
    if p["mask"] is not None:
        vis = vis & torch.from_numpy(np.ascontiguousarray(p["mask"]))
    return vis


def oracle(p, q, k, v, bias=None, sinks=None):
    """out [B, H, Tq, Dv], lse [B, H, Tq], empty [B, H, Tq] from SPEC section 6.
    q, k, v, bias and sinks are torch tensors (may require grad)."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    g = H // Hkv
    dtype = q.dtype
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    scale = p["scale"] if p["scale"] is not None else 1.0 / math.sqrt(D)
    s = scale * (q @ kk.transpose(-1, -2))
    if p["softcap"] is not None:
        c = p["softcap"]
        s = c * torch.tanh(s / c)
    if bias is not None:
        s = s + bias
    if p["alibi"] is not None:
        slopes = alibi_default_slopes(H) if p["alibi"] is True else \
            [float(x) for x in p["alibi"]]
        sl = torch.tensor(slopes, dtype=dtype)[:, None, None]
        i = torch.arange(Tq)[:, None]
        j = torch.arange(Tk)[None, :]
        dist = (i + Tk - Tq - j).abs().to(dtype)
        s = s - sl * dist
    vis = visible(p, Tq, Tk).expand(B, H, Tq, Tk)
    ninf = torch.tensor(-math.inf, dtype=s.dtype)
    s = torch.where(vis, s, ninf)
    m = s.amax(dim=-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks[None, :, None, None].to(s.dtype))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(s - m)
    den = e.sum(dim=-1, keepdim=True)
    if sinks is not None:
        den = den + torch.exp(sinks[None, :, None, None].to(s.dtype) - m)
    empty = (den == 0)
    w = e / torch.where(empty, torch.ones_like(den), den)
    out = w @ vv
    with torch.no_grad():
        lse = torch.where(empty, ninf, m + torch.log(torch.where(empty, torch.ones_like(den),
                                                                  den)))
    hidden = ~(torch.isfinite(s)).any(dim=-1)
    oracle.last_weights = w.detach()
    return out, lse[..., 0], hidden


def opts_for_attn(p):
    """The keyword arguments of attn.sdpa / sdpa_backward for problem p."""
    o = {"causal": p["causal"] or False, "empty_rows": p["empty_rows"]}
    for key in ("scale", "softcap", "mask", "bias", "sinks"):
        if p[key] is not None:
            o[key] = p[key]
    if p["window"] is not None:
        o["window"] = tuple(p["window"])
    if p["alibi"] is not None:
        o["alibi"] = p["alibi"]
    return o


def t(a, dtype, grad=False):
    x = torch.from_numpy(np.ascontiguousarray(a)).to(dtype)
    return x.requires_grad_(grad)


def oracle_with_grads(p, dtype):
    """The oracle's out, lse, empty rows and autograd gradients in dtype."""
    q, k, v = (t(p[n], dtype, True) for n in ("q", "k", "v"))
    bias = t(p["bias"], dtype, True) if p["bias"] is not None else None
    sinks = t(p["sinks"], dtype, True) if p["sinks"] is not None else None
    out, lse, hidden = oracle(p, q, k, v, bias, sinks)
    leaves = [q, k, v] + [x for x in (bias, sinks) if x is not None]
    grads = torch.autograd.grad(out, leaves, t(p["dout"], dtype), allow_unused=True)
    grads = [np.zeros(x.shape) if gr is None else gr.detach().numpy().astype(np.float64)
             for x, gr in zip(leaves, grads)]
    return (out.detach().numpy().astype(np.float64), lse.numpy().astype(np.float64),
            hidden.numpy(), grads)


def sum_to(x, shape):
    """x summed over the axes that `shape` broadcasts along (numpy's rule)."""
    while x.dim() > len(shape):
        x = x.sum(dim=0)
    for a, n in enumerate(shape):
        if n == 1 and x.shape[a] != 1:
            x = x.sum(dim=a, keepdim=True)
    return x


def magnitudes(p):
    """Each result's sum of absolute terms, from the float64 oracle's weights: the
    size of what cancels. A float32 result may be off by a few units of this even
    where the exact result is 0 (a row with one key has dq = 0 exactly, as a sum
    of terms of the size of dO.v), so the bounds include 2^-20 of it elementwise.
    Returns a dict of arrays: out, dq, dk, dv, dbias, dsinks."""
    q, k, v, do = (t(p[n], torch.float64) for n in ("q", "k", "v", "dout"))
    bias = t(p["bias"], torch.float64) if p["bias"] is not None else None
    sinks = t(p["sinks"], torch.float64) if p["sinks"] is not None else None
    out, _, _ = oracle(p, q, k, v, bias, sinks)
    w = oracle.last_weights
    B, H, Tq, D = q.shape
    g = H // k.shape[1]
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scale = p["scale"] if p["scale"] is not None else 1.0 / math.sqrt(D)
    # The scores' own rounding: s_ij is a sum of terms of size scale*|q_i|.|k_j|
    # (plus |bias| and the ALiBi term), so a weight is off by about
    # w_ij * eps * kappa_ij, relatively (exp's condition number is its argument).
    kappa = scale * (q.abs() @ kk.abs().transpose(-1, -2))
    if bias is not None:
        kappa = kappa + torch.where(torch.isfinite(bias), bias.abs(), torch.zeros_like(bias))
    if p["alibi"] is not None:
        kappa = kappa + kk.shape[2]
    wa = w * (1.0 + kappa)
    dp = do.abs() @ vv.abs().transpose(-1, -2)
    dd = (do.abs() * (wa @ vv.abs())).sum(dim=-1, keepdim=True)
    ds = wa * (dp + dd)
    m = {"out": wa @ vv.abs(), "dq": scale * ds @ kk.abs(),
         "dk": scale * (ds.transpose(-1, -2) @ q.abs()),
         "dv": wa.transpose(-1, -2) @ do.abs()}
    Hkv = k.shape[1]
    m["dk"] = m["dk"].reshape(B, Hkv, g, *m["dk"].shape[2:]).sum(dim=2)
    m["dv"] = m["dv"].reshape(B, Hkv, g, *m["dv"].shape[2:]).sum(dim=2)
    if bias is not None:
        m["dbias"] = sum_to(ds, tuple(p["bias"].shape))
    if sinks is not None:
        psink = (1.0 - w.sum(dim=-1)).clamp(min=0.0)
        m["dsinks"] = (psink * dd[..., 0]).sum(dim=(0, 2))
    m["weights64"] = w
    m["weights_terms"] = wa
    oracle(p, q.float(), k.float(), v.float(), bias.float() if bias is not None else None,
           sinks.float() if sinks is not None else None)
    m["weights32"] = oracle.last_weights
    return {n: x.numpy() for n, x in m.items()}


# ---------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------

class Report:
    def __init__(self):
        self.failures = []
        self.checked = 0
        self.worst = {}

    def compare(self, what, got, want, err32, label, floor_rel=2.0 ** -18, factor=4.0,
                terms=None):
        """|got - want| <= factor * err32 + floor_rel * max|want| (+ 2^-20 * terms,
        elementwise, where `terms` is the sum of absolute terms); infinities must
        match."""
        self.checked += 1
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            self.failures.append("%s: %s shape %s, oracle %s" % (label, what, got.shape,
                                                                  want.shape))
            return
        inf_w = ~np.isfinite(want)
        if (np.isfinite(got) != ~inf_w).any() or (got[inf_w] != want[inf_w]).any():
            bad = np.argwhere((np.isfinite(got) != ~inf_w) |
                              (inf_w & (got != want)))[0]
            self.failures.append("%s: %s at %s is %r, oracle %r" % (
                label, what, tuple(bad), got[tuple(bad)], want[tuple(bad)]))
            return
        fin = ~inf_w
        if not fin.any():
            return
        err = np.abs(got[fin] - want[fin]).max()
        mag = np.abs(want[fin]).max()
        tol = factor * err32 + floor_rel * max(mag, 1e-30) + 1e-30
        tol_e = np.full(want.shape, tol)
        if terms is not None:
            tol_e = tol_e + 2.0 ** -20 * np.broadcast_to(terms, want.shape)
        with np.errstate(invalid="ignore"):
            over = np.where(fin, np.abs(got - want) / tol_e, 0.0)
        ratio = float(over.max())
        self.worst[what] = max(self.worst.get(what, 0.0), ratio)
        if ratio > 1.0:
            where = np.argwhere(over == ratio)
            with np.errstate(invalid="ignore"):
                err = float(np.abs(got - want)[tuple(where[0])])
            tol = float(tol_e[tuple(where[0])])
            self.failures.append("%s: %s max error %.3g > bound %.3g (torch float32's %.3g, "
                                 "|oracle| up to %.3g) at %s: %r vs %r" % (
                                     label, what, err, tol, err32, mag,
                                     tuple(where[0]) if len(where) else "?",
                                     got[tuple(where[0])] if len(where) else None,
                                     want[tuple(where[0])] if len(where) else None))


def err_of(a32, a64):
    a32 = np.asarray(a32, dtype=np.float64)
    fin = np.isfinite(a64)
    return float(np.abs(a32[fin] - a64[fin]).max()) if fin.any() else 0.0


def describe(p):
    d = {k: p[k] for k in ("B", "H", "Hkv", "Tq", "Tk", "D", "Dv", "causal", "scale", "window",
                           "softcap", "empty_rows", "strided")}
    d["alibi"] = None if p["alibi"] is None else ("default" if p["alibi"] is True else "slopes")
    d["bias"] = None if p["bias"] is None else list(p["bias"].shape)
    d["mask"] = None if p["mask"] is None else list(p["mask"].shape)
    d["sinks"] = p["sinks"] is not None
    return json.dumps(d)


def check_f32(attn, p, rep, label):
    out64, lse64, hidden, g64 = oracle_with_grads(p, torch.float64)
    out32, lse32, _, g32 = oracle_with_grads(p, torch.float32)
    opts = opts_for_attn(p)
    need_error = p["empty_rows"] == "error" and p["sinks"] is None and hidden.any()
    q, k, v = p["q"], p["k"], p["v"]
    if p.get("strided"):
        q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
                   for x in (q, k, v))
        # A bias and a mask broadcast by numpy (stride 0), as a porter makes them.
        full = (p["B"], p["H"], p["Tq"], p["Tk"])
        if p["bias"] is not None and p["bias"].ndim == 4:
            opts["bias"] = np.broadcast_to(p["bias"], full)
        if p["mask"] is not None:
            opts["mask"] = np.broadcast_to(p["mask"], full)
    try:
        out, lse = attn.sdpa(q, k, v, return_lse=True, **opts)
    except ValueError as e:
        if not need_error:
            rep.failures.append("%s: sdpa raised %s" % (label, e))
        return None
    if need_error:
        rep.failures.append("%s: sdpa returned although a row sees no key (empty_rows="
                            "error, no sinks)" % label)
        return None
    mags = magnitudes(p)
    rep.compare("out", out, out64, err_of(out32, out64), label, terms=mags["out"])
    rep.compare("lse", lse, lse64, err_of(lse32, lse64), label)
    # The weights [B, H, Tq, Tk] when asked for (another plan: the split-key path
    # cannot write them), and the output written into a caller's strided buffer, a
    # [B, Tq, H, Dv] array seen as [B, H, Tq, Dv].
    buf = np.full((p["B"], p["Tq"], p["H"], p["Dv"]), np.nan, dtype=np.float32)
    o2, wts = attn.sdpa(q, k, v, return_weights=True, out=buf.transpose(0, 2, 1, 3), **opts)
    rep.compare("out_weights_call", buf.transpose(0, 2, 1, 3), out64, err_of(out32, out64),
                label, terms=mags["out"])
    rep.compare("weights", wts, mags["weights64"], err_of(mags["weights32"], mags["weights64"]),
                label, terms=mags["weights_terms"])
    try:
        grads = attn.sdpa_backward(q, k, v, out, lse, p["dout"], **opts)
    except ValueError as e:
        rep.failures.append("%s: sdpa_backward raised %s" % (label, e))
        return None
    names = ["dq", "dk", "dv"] + (["dbias"] if p["bias"] is not None else []) + \
        (["dsinks"] if p["sinks"] is not None else [])
    if len(grads) != len(names):
        rep.failures.append("%s: sdpa_backward gave %d arrays, expected %s" % (
            label, len(grads), names))
        return None
    for name, got, w64, w32 in zip(names, grads, g64, g32):
        if name == "dbias" and got.shape != w64.shape:
            # The bias was given broadcast (a stride-0 view of the full shape): its
            # gradient has the view's shape, and sums to the bias's own.
            got = sum_to(torch.from_numpy(np.asarray(got, dtype=np.float64)),
                         w64.shape).numpy()
        rep.compare(name, got, w64, err_of(w32, w64), label, terms=mags[name])
    return out64, lse64, g64


# ---------------------------------------------------------------------------
# 16 bits: SPEC section 10's rule
# ---------------------------------------------------------------------------

def torch_sdpa_16(p, q, k, v, dtype):
    """PyTorch's own answer in dtype: scaled_dot_product_attention when it has
    every option the problem uses, else the oracle's formula evaluated in dtype."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if p["softcap"] is not None or p["sinks"] is not None:
        bias = t(p["bias"], dtype) if p["bias"] is not None else None
        sinks = t(p["sinks"], dtype) if p["sinks"] is not None else None
        return oracle(p, q, k, v, bias, sinks)[0]
    add = torch.zeros(Tq, Tk, dtype=torch.float64)
    if p["alibi"] is not None:
        slopes = alibi_default_slopes(H) if p["alibi"] is True else \
            [float(x) for x in p["alibi"]]
        i = torch.arange(Tq)[:, None]
        j = torch.arange(Tk)[None, :]
        dist = (i + Tk - Tq - j).abs().to(torch.float64)
        add = -torch.tensor(slopes, dtype=torch.float64)[:, None, None] * dist
    if p["bias"] is not None:
        add = add + t(p["bias"], torch.float64)
    vis = visible(p, Tq, Tk)
    add = torch.where(vis, add, torch.tensor(-math.inf, dtype=torch.float64))
    add = add.expand(B, H, Tq, Tk)
    empty = ~torch.isfinite(add).any(dim=-1, keepdim=True)
    add = torch.where(empty, torch.zeros_like(add), add)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=add.to(dtype), scale=p["scale"], enable_gqa=True)
    return torch.where(empty, torch.zeros_like(out), out)


def check_half(attn, p, rep, label, dtype_name):
    tdt = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    q16, k16, v16 = (torch.from_numpy(p[n]).to(tdt) for n in ("q", "k", "v"))
    # The oracle on the 16-bit inputs' exact values.
    q64, k64, v64 = (x.to(torch.float64) for x in (q16, k16, v16))
    bias = t(p["bias"], torch.float64) if p["bias"] is not None else None
    sinks = t(p["sinks"], torch.float64) if p["sinks"] is not None else None
    out64, lse64, hidden = oracle(p, q64, k64, v64, bias, sinks)
    w64 = oracle.last_weights.numpy()
    out64, lse64 = out64.numpy(), lse64.numpy()
    if p["empty_rows"] == "error" and p["sinks"] is None and hidden.any():
        return
    # The weights and the log-sum-exp stay float32 (SPEC section 10): they are held
    # to the float32 rule, against torch's float32 formula on the same 16-bit values.
    o32 = oracle(p, q64.float(), k64.float(), v64.float(),
                 bias.float() if bias is not None else None,
                 sinks.float() if sinks is not None else None)
    lse32, w32 = o32[1].numpy(), oracle.last_weights.numpy()
    mine = torch_sdpa_16(p, q16, k16, v16, tdt).to(torch.float64).numpy()
    qa, ka, va = (as_16bit(x.to(torch.float32).numpy(), dtype_name) for x in (q16, k16, v16))
    bits = {"dtype": "bf16"} if qa.dtype == np.uint16 else {}  # bfloat16 without ml_dtypes
    try:
        out, wts, lse = attn.sdpa(qa, ka, va, return_weights=True, return_lse=True,
                                  **opts_for_attn(p), **bits)
        out_nw, lse_nw = attn.sdpa(qa, ka, va, return_lse=True, **opts_for_attn(p), **bits)
    except (ValueError, TypeError) as e:
        rep.failures.append("%s: %s sdpa raised %s" % (label, dtype_name, e))
        return
    rep.compare("lse_" + dtype_name, lse_nw, lse64, err_of(lse32, lse64), label)
    rep.compare("lse_w_" + dtype_name, lse, lse64, err_of(lse32, lse64), label)
    rep.compare("weights_" + dtype_name, wts, w64, err_of(w32, w64), label)
    out = widen16(out, dtype_name)
    floor_unit = 2.0 ** -8 if dtype_name == "bf16" else 2.0 ** -11
    rep.compare("out_" + dtype_name, out, out64, err_of(mine, out64), label,
                floor_rel=floor_unit, factor=2.0)


# ---------------------------------------------------------------------------
# The KV cache decode loop
# ---------------------------------------------------------------------------

def rope_ref(x, positions, pairing, base, dtype):
    """RoPE as SPEC section 7 states it: inv_freq and the angles in float32 (the
    tutorial's chapter 21), then the rotation in dtype."""
    D = x.shape[-1]
    inv = 1.0 / (torch.tensor(base, dtype=torch.float32) **
                 (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.tensor(positions, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang.to(dtype)), torch.sin(ang.to(dtype))
    x = x.to(dtype)
    if pairing == "interleaved":
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = torch.empty_like(x)
        y[..., 0::2] = x0 * cos - x1 * sin
        y[..., 1::2] = x0 * sin + x1 * cos
        return y
    h = D // 2
    x0, x1 = x[..., :h], x[..., h:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)


def as_16bit(q, kv_dtype):
    """q (float32 holding values of a 16-bit dtype) in that dtype: float16, or for
    bfloat16 an ml_dtypes.bfloat16 array where ml_dtypes is installed and the uint16
    bits otherwise (the same values: attn.sdpa(..., dtype="bf16") and a "bf16" cache
    read uint16 as bfloat16 bits, docs/python.md), so the checks run without the
    optional package."""
    if kv_dtype != "bf16":
        return q.astype(np.float16)
    try:
        import ml_dtypes
    except ImportError:
        return (np.ascontiguousarray(q, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return q.astype(ml_dtypes.bfloat16)


def widen16(x, kv_dtype):
    """A 16-bit view of the cache as float64 (bfloat16 comes as uint16 bits)."""
    x = np.asarray(x)
    if kv_dtype == "bf16" and x.dtype == np.uint16:
        x = (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float64)


def check_decode(attn, rng, rep, label, kv_dtype="f32"):
    """Prefill, decode steps, a truncate and more steps, sequence by sequence, through
    attn.KVCache; the oracle keeps the unrotated keys and values per sequence."""
    B = int(rng.choice((1, 2)))
    Hkv = int(rng.choice((1, 2)))
    H = Hkv * int(rng.choice((1, 2, 4)))
    D = int(rng.choice((2, 4, 8, 16, 34, 64)))
    pairing = str(rng.choice(("interleaved", "half")))
    base = float(rng.choice((10000.0, 500000.0, 7.5)))
    cap = 64
    opts_p = {"causal": "bottom_right", "scale": None, "mask": None, "empty_rows": "zero",
              "window": (int(rng.choice((-1, 0, 3, 7))), 0) if rng.random() < 0.5 else None,
              "softcap": 20.0 if rng.random() < 0.3 else None,
              "alibi": True if rng.random() < 0.25 else None, "bias": None,
              "sinks": (rng.standard_normal(H)).astype(np.float32) if rng.random() < 0.3
              else None}
    # Some caches are long enough for split-key decoding (one or two query rows
    # against many keys).
    if rng.random() < 0.25:
        cap = 800
        plan = [int(rng.choice((600, 700)))] + [1] * int(rng.integers(2, 5))
    else:
        plan = [int(rng.choice((1, 5, 17)))] + [1] * int(rng.integers(2, 5))
    cache = attn.KVCache(B, Hkv, cap, D, rope_base=base, dtype=kv_dtype)
    keys = [[] for _ in range(B)]  # per sequence: list of (k [Hkv, D], v [Hkv, D]) rows
    vals = [[] for _ in range(B)]
    trunc_at = len(plan) - 1
    plan += [int(rng.choice((1, 2, 3)))] * 2
    kw = {k: v for k, v in opts_for_attn(opts_p).items()}
    tdt = {"f32": None, "bf16": torch.bfloat16, "f16": torch.float16}[kv_dtype]
    for step, tnew in enumerate(plan):
        if step == trunc_at:
            for b in range(B):
                n = max(1, len(keys[b]) - int(rng.integers(1, 4)))
                cache.truncate(n, b)
                keys[b], vals[b] = keys[b][:n], vals[b][:n]
        kb = rng.standard_normal((B, Hkv, tnew, D)).astype(np.float32)
        vb = rng.standard_normal((B, Hkv, tnew, D)).astype(np.float32)
        qb = rng.standard_normal((B, H, tnew, D)).astype(np.float32)
        # Every sequence at once (each at its own length after the truncate: the
        # batch path), or one sequence at a time.
        batch = B > 1 and rng.random() < 0.5
        # With a 16-bit cache, q (and so out) in the cache's dtype half the time:
        # q is then rounded before RoPE turns it, and out rounded once.
        q16 = tdt is not None and rng.random() < 0.5
        if q16:
            qb = torch.from_numpy(qb).to(tdt).float().numpy()
            qarg = as_16bit(qb, kv_dtype)
        else:
            qarg = qb
        if batch:
            cache.append(kb, vb, first=0, rope=pairing)
            outb, lseb = cache.attend(qarg, first=0, rope=pairing, return_lse=True, **kw)
        for b in range(B):
            kn, vn, qn = kb[b:b + 1], vb[b:b + 1], qb[b:b + 1]
            if not batch:
                cache.append(kn, vn, first=b, rope=pairing)
            off = len(keys[b])
            kr = rope_ref(torch.from_numpy(kn), list(range(off, off + tnew)), pairing, base,
                          torch.float64)
            if tdt is not None:
                # The cache stores keys rotated in float32 and rounded once.
                kr32 = rope_ref(torch.from_numpy(kn), list(range(off, off + tnew)), pairing,
                                base, torch.float32)
                kr = kr32.to(tdt).to(torch.float64)
                vq = torch.from_numpy(vn).to(tdt).to(torch.float64)
            else:
                vq = torch.from_numpy(vn).to(torch.float64)
            for r in range(tnew):
                keys[b].append(kr[0, :, r])
                vals[b].append(vq[0, :, r])
            L = len(keys[b])
            extra = {}
            if not batch and rng.random() < 0.3:
                # A bias and a mask over this sequence's keys (a key position the
                # model wants hidden): their key axis is the cache's capacity, and
                # attend reads the first L entries only (NaN past them here).
                bias = np.full((1, H, tnew, cap), np.nan, dtype=np.float32)
                bias[..., :L] = rng.standard_normal((1, H, tnew, L))
                mask = np.ones((1, 1, tnew, cap), dtype=bool)
                mask[..., :L] = rng.random((1, 1, tnew, L)) < 0.8
                extra = {"bias": bias, "mask": mask}
            if batch:
                out, lse = outb[b:b + 1], lseb[b:b + 1]
            else:
                out, lse = cache.attend(qarg[b:b + 1], first=b, rope=pairing, return_lse=True,
                                        **dict(kw, **extra))
            if tdt is not None:
                # The stored keys are the float32 rotation rounded once: a key whose
                # float32 rotation here and in attn differ by one float32 unit may
                # round to neighbouring 16-bit values, so the stored keys are held
                # to one 16-bit unit of ours, and the attention to the stored keys.
                kv16, vv16 = cache.view(b)
                kv16, vv16 = (widen16(x, kv_dtype) for x in (kv16, vv16))
                mine16 = torch.stack(keys[b], dim=1)[None].numpy()
                unit = 2.0 ** -7 if kv_dtype == "bf16" else 2.0 ** -10
                rep.checked += 1
                # One unit of the 16-bit value, plus the float32 rotation's own
                # rounding, which is relative to the pair's size, not the result's.
                row = np.abs(mine16).max(axis=-1, keepdims=True)
                off16 = np.abs(kv16 - mine16) > unit * np.abs(mine16) + 2.0 ** -21 * row
                if off16.any():
                    rep.failures.append("%s decode step %d seq %d: the cache's rotated key "
                                        "%s is %r, RoPE here gives %r" % (
                                            label, step, b, tuple(np.argwhere(off16)[0]),
                                            kv16[off16][0], mine16[off16][0]))
                keys[b] = [torch.from_numpy(kv16[0, :, r]) for r in range(L)]
                vals[b] = [torch.from_numpy(vv16[0, :, r]) for r in range(L)]
            K = torch.stack(keys[b], dim=1)[None]  # [1, Hkv, L, D]
            V = torch.stack(vals[b], dim=1)[None]
            pos = list(range(L - tnew, L))
            q64 = rope_ref(torch.from_numpy(qn), pos, pairing, base, torch.float64)
            q32 = rope_ref(torch.from_numpy(qn), pos, pairing, base, torch.float32)
            sinks64 = t(opts_p["sinks"], torch.float64) if opts_p["sinks"] is not None else None
            sinks32 = t(opts_p["sinks"], torch.float32) if opts_p["sinks"] is not None else None
            op = dict(opts_p, mask=extra["mask"][..., :L] if extra else None)
            b64 = t(extra["bias"][..., :L], torch.float64) if extra else None
            b32 = t(extra["bias"][..., :L], torch.float32) if extra else None
            want, want_lse, _ = oracle(op, q64, K, V, b64, sinks64)
            mine, mine_lse, _ = oracle(op, q32, K.to(torch.float32), V.to(torch.float32), b32,
                                       sinks32)
            got = widen16(out, kv_dtype).astype(np.float32)
            lab = "%s step %d seq %d%s (B=%d H=%d Hkv=%d D=%d %s base=%g len=%d new=%d %s)" % (
                label, step, b, " batch" if batch else (" bias+mask" if extra else ""), B, H, Hkv, D, pairing, base, L, tnew,
                json.dumps({k: (v if not isinstance(v, np.ndarray) else "array")
                            for k, v in opts_p.items()}))
            rep.compare("decode_lse", lse, want_lse.numpy(),
                        err_of(mine_lse.numpy(), want_lse.numpy()), lab)
            if tdt is None:
                rep.compare("decode", got, want.numpy(), err_of(mine.numpy(), want.numpy()), lab)
            elif q16:
                # A 16-bit out is the float32 result rounded once: one unit of the
                # dtype at the output's magnitude (SPEC section 10's floor) on top.
                rep.compare("decode_" + kv_dtype + "_q16", got, want.numpy(),
                            err_of(mine.numpy(), want.numpy()), lab,
                            floor_rel=2.0 ** -8 if kv_dtype == "bf16" else 2.0 ** -11)
            else:
                # 16-bit cache: q stays float32, K and V were rounded (the oracle used
                # the rounded values), so only float32 arithmetic separates them.
                rep.compare("decode_" + kv_dtype, got, want.numpy(),
                            err_of(mine.numpy(), want.numpy()), lab)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

def cli_args(attn_bin, p, path):
    """attn sdpa's command line for problem p, its files written under path()."""
    args = [attn_bin, "sdpa"]
    for n, flag in (("q", "--query"), ("k", "--key"), ("v", "--value")):
        np.save(path(n + ".npy"), p[n])
        args += [flag, path(n + ".npy")]
    np.save(path("do.npy"), p["dout"])
    if p["causal"] == "top_left":
        args.append("--causal")
    elif p["causal"] == "bottom_right":
        args.append("--causal-bottom-right")
    if p["window"] is not None:
        args += ["--window", "%d,%d" % tuple(p["window"])]
    if p["softcap"] is not None:
        args += ["--softcap", repr(p["softcap"])]
    if p["scale"] is not None:
        args += ["--scale", repr(p["scale"])]
    if p["alibi"] is True:
        args.append("--alibi")
    elif p["alibi"] is not None:
        np.save(path("slopes.npy"), p["alibi"])
        args += ["--alibi-slopes", path("slopes.npy")]
    if p["bias"] is not None:
        np.save(path("bias.npy"), p["bias"])
        args += ["--bias", path("bias.npy"), "--grad-bias", path("db.npy")]
    if p["sinks"] is not None:
        np.save(path("sinks.npy"), p["sinks"])
        args += ["--sinks", path("sinks.npy"), "--grad-sinks", path("ds.npy")]
    if p["mask"] is not None:
        np.save(path("mask.npy"), p["mask"])
        args += ["--mask", path("mask.npy")]
    args += ["--empty-rows", p["empty_rows"], "--output", path("o.npy"),
             "--lse", path("lse.npy"), "--grad-output", path("do.npy"),
             "--grad-query", path("dq.npy"), "--grad-key", path("dk.npy"),
             "--grad-value", path("dv.npy")]
    return args


def check_cli(attn_bin, p, rep, label, exact):
    with tempfile.TemporaryDirectory() as d:
        def path(n):
            return os.path.join(d, n)
        args = cli_args(attn_bin, p, path)
        results = []
        for threads in (1, 2):
            r = subprocess.run(args + ["--threads", str(threads)], capture_output=True,
                               text=True)
            if r.returncode != 0:
                rep.failures.append("%s: attn sdpa exited %d: %s (%s)" % (
                    label, r.returncode, r.stderr.strip(), " ".join(args)))
                return
            names = ["o", "lse", "dq", "dk", "dv"] + \
                (["db"] if p["bias"] is not None else []) + \
                (["ds"] if p["sinks"] is not None else [])
            results.append({n: np.load(path(n + ".npy")) for n in names})
        for n in results[0]:
            rep.checked += 1
            if results[0][n].tobytes() != results[1][n].tobytes():
                rep.failures.append("%s: attn sdpa --%s differs between 1 and 2 threads" % (
                    label, n))
        # The command line must give exactly what the Python call gave: both run
        # attn_sdpa and attn_sdpa_backward on the same float32 inputs.
        for n, want in exact.items():
            rep.checked += 1
            got = results[0][n]
            if got.shape != want.shape or got.astype(np.float32).tobytes() != \
                    np.asarray(want, dtype=np.float32).tobytes():
                rep.failures.append("%s: attn sdpa's %s differs from attn.sdpa's" % (label, n))


def check_cli_rope(attn_bin, p, rep, label):
    """attn sdpa --rope (keys at offset .. offset+Tk-1, queries at the last Tq of
    those) with --grad-*, against the oracle through RoPE in float64 autograd: the
    gradients are those of the unrotated q and k."""
    pairing = "half" if p["D"] % 4 == 0 else "interleaved"
    base, offset = 10000.0, 3
    Tq, Tk = p["Tq"], p["Tk"]
    kpos = list(range(offset, offset + Tk))
    qpos = kpos[Tk - Tq:] if Tq <= Tk else None
    if qpos is None:
        return
    res = {}
    for dtype in (torch.float64, torch.float32):
        q, k, v = (t(p[n], dtype, True) for n in ("q", "k", "v"))
        bias = t(p["bias"], dtype, True) if p["bias"] is not None else None
        sinks = t(p["sinks"], dtype, True) if p["sinks"] is not None else None
        qr, kr = rope_ref(q, qpos, pairing, base, dtype), rope_ref(k, kpos, pairing, base, dtype)
        out, lse, _ = oracle(p, qr, kr, v, bias, sinks)
        leaves = [q, k, v] + [x for x in (bias, sinks) if x is not None]
        g = torch.autograd.grad(out, leaves, t(p["dout"], dtype), allow_unused=True)
        res[dtype] = [out.detach().numpy(), lse.numpy()] + [
            np.zeros(x.shape) if gg is None else gg.numpy() for x, gg in zip(leaves, g)]
    pr = dict(p)
    pr["q"] = rope_ref(t(p["q"], torch.float64), qpos, pairing, base, torch.float64).numpy()
    pr["k"] = rope_ref(t(p["k"], torch.float64), kpos, pairing, base, torch.float64).numpy()
    mags = magnitudes(pr)
    with tempfile.TemporaryDirectory() as d:
        def path(n):
            return os.path.join(d, n)
        args = cli_args(attn_bin, p, path) + ["--rope", pairing, "--rope-base", repr(base),
                                              "--rope-offset", str(offset)]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            rep.failures.append("%s: attn sdpa --rope exited %d: %s" % (
                label, r.returncode, r.stderr.strip()))
            return
        names = ["o", "lse", "dq", "dk", "dv"] + (["db"] if p["bias"] is not None else []) + \
            (["ds"] if p["sinks"] is not None else [])
        mag_names = ["out", None, "dq", "dk", "dv", "dbias", "dsinks"]
        mag_names = mag_names[:5] + (["dbias"] if p["bias"] is not None else []) + \
            (["dsinks"] if p["sinks"] is not None else [])
        for n, mn, w64, w32 in zip(names, mag_names, res[torch.float64], res[torch.float32]):
            terms = None
            if mn is not None:
                terms = mags[mn]
                if mn in ("dq", "dk"):
                    # RoPE mixes each pair: bound each element by its row's largest.
                    terms = np.broadcast_to(terms.max(axis=-1, keepdims=True), terms.shape)
            rep.compare("cli_rope_" + n, np.load(path(n + ".npy")), w64, err_of(w32, w64),
                        label + " --rope %s" % pairing, terms=terms)


def llama_block(p, x, w, dtype):
    """A Llama-style attention block in torch (separate projections, GQA, RoPE at
    positions offset .. offset+T-1, SPEC section 6's options): y [B, T, E]."""
    B, T, E = x.shape
    H, Hkv, D = p["H"], p["Hkv"], p["D"]

    def proj(name, heads):
        y = x @ w[name + ".weight"].T
        if name + ".bias" in w:
            y = y + w[name + ".bias"]
        return y.reshape(B, T, heads, D).transpose(1, 2)
    q, k, v = proj("q_proj", H), proj("k_proj", Hkv), proj("v_proj", Hkv)
    if p["rope"]:
        pos = list(range(p["offset"], p["offset"] + T))
        q = rope_ref(q, pos, p["rope"], p["base"], dtype)
        k = rope_ref(k, pos, p["rope"], p["base"], dtype)
    o, _, _ = oracle(p, q, k, v, None, w.get("sinks"))
    y = o.transpose(1, 2).reshape(B, T, H * D) @ w["o_proj.weight"].T
    if "o_proj.bias" in w:
        y = y + w["o_proj.bias"]
    return y


def check_forward_cli(attn_bin, rng, rep, label):
    """attn forward (and its --grad-*) on a Llama-style block with GQA and random
    options, against llama_block in float64 autograd; attn decode against the
    same block with causal."""
    from safetensors.numpy import save_file
    Hkv = int(rng.choice((1, 2)))
    H = Hkv * int(rng.choice((1, 2, 3)))
    D = int(rng.choice((2, 4, 8, 16)))
    E = int(rng.choice((8, 12, 24)))
    B, T = int(rng.choice((1, 2))), int(rng.choice((1, 3, 17, 33)))
    p = {"H": H, "Hkv": Hkv, "D": D, "causal": "top_left" if rng.random() < 0.7 else None,
         "scale": None, "mask": None, "empty_rows": "zero",
         "window": (int(rng.choice((0, 2, 5))), 0) if rng.random() < 0.4 else None,
         "softcap": 10.0 if rng.random() < 0.3 else None,
         "alibi": True if rng.random() < 0.2 else None,
         "rope": str(rng.choice(("interleaved", "half"))) if rng.random() < 0.7 else None,
         "base": float(rng.choice((10000.0, 500000.0))), "offset": int(rng.choice((0, 7)))}
    w = {"q_proj.weight": rng.standard_normal((H * D, E)) / math.sqrt(E),
         "k_proj.weight": rng.standard_normal((Hkv * D, E)) / math.sqrt(E),
         "v_proj.weight": rng.standard_normal((Hkv * D, E)) / math.sqrt(E),
         "o_proj.weight": rng.standard_normal((E, H * D)) / math.sqrt(H * D)}
    if rng.random() < 0.5:
        w["q_proj.bias"] = rng.standard_normal(H * D) * 0.1
        w["o_proj.bias"] = rng.standard_normal(E) * 0.1
    w = {n: a.astype(np.float32) for n, a in w.items()}
    sinks = rng.standard_normal(H).astype(np.float32) if rng.random() < 0.3 else None
    x = rng.standard_normal((B, T, E)).astype(np.float32)
    dy = rng.standard_normal((B, T, E)).astype(np.float32)
    desc = "%s (B=%d T=%d E=%d H=%d Hkv=%d D=%d %s sinks=%s)" % (
        label, B, T, E, H, Hkv, D, json.dumps({k: p[k] for k in (
            "causal", "window", "softcap", "alibi", "rope", "base", "offset")}),
        sinks is not None)

    def run_torch(dtype):
        xt = t(x, dtype, True)
        wt = {n: t(a, dtype, True) for n, a in w.items()}
        if sinks is not None:
            wt["sinks"] = t(sinks, dtype)
        y = llama_block(p, xt, wt, dtype)
        leaves = [xt] + [wt[n] for n in w]
        g = torch.autograd.grad(y, leaves, t(dy, dtype))
        return y.detach().numpy(), {n: gg.numpy() for n, gg in zip(["x"] + list(w), g)}
    y64, g64 = run_torch(torch.float64)
    y32, g32 = run_torch(torch.float32)
    with tempfile.TemporaryDirectory() as d:
        def path(n):
            return os.path.join(d, n)
        save_file(w, path("w.safetensors"))
        np.save(path("x.npy"), x)
        np.save(path("dy.npy"), dy)
        args = [attn_bin, "forward", "--weights", path("w.safetensors"), "--num-heads", str(H),
                "--num-kv-heads", str(Hkv), "--input", path("x.npy"),
                "--empty-rows", "zero"]
        if p["window"] is not None:
            args += ["--window", "%d,%d" % p["window"]]
        if p["softcap"] is not None:
            args += ["--softcap", repr(p["softcap"])]
        if p["alibi"]:
            args.append("--alibi")
        if sinks is not None:
            np.save(path("s.npy"), sinks)
            args += ["--sinks", path("s.npy")]
        if p["rope"]:
            args += ["--rope", p["rope"], "--rope-base", repr(p["base"]),
                     "--rope-offset", str(p["offset"])]
        fwd = args + (["--causal"] if p["causal"] else []) + [
            "--output", path("y.npy"), "--grad-output", path("dy.npy"),
            "--grad-input", path("dx.npy"), "--grad-weights", path("g.safetensors")]
        r = subprocess.run(fwd, capture_output=True, text=True)
        if r.returncode != 0:
            rep.failures.append("%s: attn forward exited %d: %s" % (desc, r.returncode,
                                                                     r.stderr.strip()))
            return
        from safetensors.numpy import load_file
        rep.compare("forward_y", np.load(path("y.npy")), y64, err_of(y32, y64), desc)
        rep.compare("forward_dx", np.load(path("dx.npy")), g64["x"], err_of(g32["x"], g64["x"]),
                    desc)
        gw = load_file(path("g.safetensors"))
        for n in w:
            if n not in gw:
                rep.failures.append("%s: --grad-weights has no %s (it has %s)" % (
                    desc, n, sorted(gw)))
                continue
            # q's and k's gradients come through dS = P (dP - rowsum(dO o O)), which
            # cancels terms of the size of the value path's gradient (exactly, to 0,
            # where a row sees one key), so they are bounded with 16x that size as
            # the terms (2^-16 of it).
            terms = None
            if n.startswith(("q_proj", "k_proj")):
                terms = 16.0 * np.abs(g64["v_proj.weight"]).max()
            rep.compare("forward_d" + n, gw[n], g64[n], err_of(g32[n], g64[n]), desc,
                        terms=terms)
        if p["causal"] and T > 1:
            # Decoding token by token through the cache reproduces the causal pass.
            prefill = int(rng.integers(1, T))
            dec = [attn_bin, "decode"] + args[2:]
            r = subprocess.run(dec + ["--prefill", str(prefill), "--output", path("yd.npy")],
                               capture_output=True, text=True)
            if r.returncode != 0:
                rep.failures.append("%s: attn decode exited %d: %s" % (
                    desc, r.returncode, r.stderr.strip()))
                return
            rep.compare("decode_cli_y", np.load(path("yd.npy")), y64, err_of(y32, y64),
                        desc + " decode --prefill %d" % prefill)


# ---------------------------------------------------------------------------
# Golden files for the C test
# ---------------------------------------------------------------------------

def bound(want, err32, terms, factor=4.0, floor_rel=2.0 ** -18):
    """Report.compare's bound, elementwise, for the golden files (inf where the
    oracle is not finite: there the C test asks for the same value exactly)."""
    fin = np.isfinite(want)
    mag = np.abs(want[fin]).max() if fin.any() else 0.0
    b = factor * err32 + floor_rel * max(mag, 1e-30) + 2.0 ** -20 * np.broadcast_to(
        terms, want.shape)
    return np.where(fin, b, np.inf).astype(np.float32)


def write_golden(folder, problems):
    """One safetensors file per problem: the inputs, the float64 oracle's results
    rounded to float32 and, beside each result, the elementwise bound that
    Report.compare uses (tol_*), so that the C test applies the same rule
    without Python; and one MANIFEST line per problem with its options."""
    from safetensors.numpy import save_file
    os.makedirs(folder, exist_ok=True)
    lines = ["# made by tools/port_check.py --golden --seed %d with torch %s, numpy %s" % (
        problems[0]["seed"], torch.__version__, np.__version__),
        "# name B H Hkv Tq Tk D Dv causal scale has_window left right softcap alibi "
        "bias mask sinks empty_rows_zero refused (causal: 0 none, 1 top-left, 2 bottom-right; "
        "scale 0: 1/sqrt(D); alibi: 0 off, 1 the paper's slopes, 2 slopes in the file; refused 1: "
        "a row sees no key in error mode, so attn must refuse the call)"]
    for n, p in enumerate(problems):
        out64, lse64, hidden, g64 = oracle_with_grads(p, torch.float64)
        out32, lse32, _, g32 = oracle_with_grads(p, torch.float32)
        mags = magnitudes(p)
        tens = {"q": p["q"], "k": p["k"], "v": p["v"], "dout": p["dout"],
                "out": out64, "lse": lse64,
                "tol_out": bound(out64, err_of(out32, out64), mags["out"]),
                "tol_lse": bound(lse64, err_of(lse32, lse64), 0.0)}
        names = ["dq", "dk", "dv"] + (["dbias"] if p["bias"] is not None else []) + \
            (["dsinks"] if p["sinks"] is not None else [])
        for name, w64, w32 in zip(names, g64, g32):
            tens[name] = w64
            tens["tol_" + name] = bound(w64, err_of(w32, w64), mags[name])
        if p["bias"] is not None:
            tens["bias"] = p["bias"]
        if p["sinks"] is not None:
            tens["sinks"] = p["sinks"]
        if p["mask"] is not None:
            tens["mask"] = p["mask"].astype(np.uint8)
        if p["alibi"] is not None and p["alibi"] is not True:
            tens["slopes"] = p["alibi"]
        tens = {k: np.ascontiguousarray(v, dtype=np.uint8 if k == "mask" else np.float32)
                for k, v in tens.items()}
        name = "p%02d" % n
        save_file(tens, os.path.join(folder, name + ".safetensors"))
        causal = {None: 0, "top_left": 1, "bottom_right": 2}[p["causal"]]
        win = p["window"] if p["window"] is not None else (-1, -1)
        refused = p["empty_rows"] == "error" and p["sinks"] is None and hidden.any()
        lines.append("%s %d %d %d %d %d %d %d %d %.9g %d %d %d %.9g %d %d %d %d %d %d" % (
            name, p["B"], p["H"], p["Hkv"], p["Tq"], p["Tk"], p["D"], p["Dv"], causal,
            p["scale"] or 0.0, p["window"] is not None, win[0], win[1], p["softcap"] or 0.0,
            0 if p["alibi"] is None else (1 if p["alibi"] is True else 2),
            p["bias"] is not None, p["mask"] is not None, p["sinks"] is not None,
            p["empty_rows"] == "zero", refused))
    with open(os.path.join(folder, "MANIFEST"), "w") as f:
        f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------

def run_worker(args):
    import attn
    rep = Report()
    rng = np.random.default_rng(args.seed)
    for n in range(args.problems):
        p = draw_problem(rng)
        label = "%s problem %d %s" % (args.arch, n, describe(p))
        check_f32(attn, p, rep, label)
        if n % 3 == 0:
            for dt in ("bf16", "f16"):
                check_half(attn, p, rep, label, dt)
    drng = np.random.default_rng(args.seed + 1000)
    for n in range(args.decode):
        for kvdt in ("f32", "bf16", "f16"):
            check_decode(attn, drng, rep, "%s decode %d kv=%s" % (args.arch, n, kvdt), kvdt)
    frng = np.random.default_rng(args.seed + 3000)
    for n in range(args.cli * 3):
        check_forward_cli(args.attn_bin, frng, rep, "%s forward cli %d" % (args.arch, n))
    if args.cli:
        crng = np.random.default_rng(args.seed + 2000)
        done = 0
        while done < args.cli:
            p = draw_problem(crng, small=True)
            if p["empty_rows"] == "error":
                p["empty_rows"] = "zero"
            label = "%s cli %d %s" % (args.arch, done, describe(p))
            ref = check_f32(attn, p, rep, label)
            if ref is None:
                continue
            out, lse = attn.sdpa(p["q"], p["k"], p["v"], return_lse=True, **opts_for_attn(p))
            grads = attn.sdpa_backward(p["q"], p["k"], p["v"], out, lse, p["dout"],
                                       **opts_for_attn(p))
            # The command line is held to the Python call's exact values.
            exact = {"o": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
            i = 3
            if p["bias"] is not None:
                exact["db"] = grads[i]
                i += 1
            if p["sinks"] is not None:
                exact["ds"] = grads[i]
            check_cli(args.attn_bin, p, rep, label, exact)
            if p["D"] % 2 == 0:
                check_cli_rope(args.attn_bin, p, rep, label)
            done += 1
    print(json.dumps({"arch": args.arch, "checked": rep.checked, "failures": rep.failures,
                      "worst_ratio": rep.worst}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=300)
    ap.add_argument("--decode", type=int, default=12)
    ap.add_argument("--cli", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arch", default="all")
    ap.add_argument("--attn-bin", default=os.path.join("build", "attn"))
    ap.add_argument("--golden", help="write the golden set into this folder and stop")
    ap.add_argument("--golden-count", type=int, default=40)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.golden:
        rng = np.random.default_rng(args.seed)
        probs = []
        while len(probs) < args.golden_count:
            p = draw_problem(rng)
            # Small problems only (the set stays well under 2 MB), but some past a
            # 64-row tile (Tq or Tk = 113) or with a head dim above 128.
            if p["B"] * p["H"] * p["Tq"] * p["Tk"] > 16000 or \
                    p["B"] * p["H"] * max(p["Tq"], p["Tk"]) * max(p["D"], p["Dv"]) > 8000:
                continue
            p["seed"] = args.seed
            probs.append(p)
        write_golden(args.golden, probs)
        return 0
    if args.worker:
        os.environ["ATTN_ARCH"] = args.arch
        run_worker(args)
        return 0
    import attn
    arches = ["ref", "scalar", "avx2", "avx512", "avx512bf16"] if args.arch == "all" \
        else args.arch.split(",")
    bad = 0
    for a in arches:
        env = dict(os.environ, ATTN_ARCH=a)
        if a == "avx512bf16":
            # The bfloat16 kernel's vdpbf16ps emulated with AVX-512 where the CPU
            # lacks AVX512-BF16 (src/runtime/dispatch.c); the real one where it has it.
            env["ATTN_BF16_EMULATE"] = "1"
        r = subprocess.run([sys.executable, __file__, "--worker", "--arch", a,
                            "--problems", str(args.problems), "--decode", str(args.decode),
                            "--cli", str(args.cli), "--seed", str(args.seed),
                            "--attn-bin", args.attn_bin], env=env, capture_output=True,
                           text=True)
        if r.returncode != 0:
            print("%s: the worker failed:\n%s" % (a, r.stderr[-4000:]))
            bad += 1
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        print("%s: %d comparisons, %d disagreements; worst error / bound: %s" % (
            a, res["checked"], len(res["failures"]),
            ", ".join("%s %.2f" % kv for kv in sorted(res["worst_ratio"].items()))))
        for f in res["failures"][:40]:
            print("  " + f)
        bad += len(res["failures"])
    print("torch %s, attn %s" % (torch.__version__, attn.__version__))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
