#!/usr/bin/env python3
"""Generates the golden cases of tests/data/golden/: inputs, weights and the outputs
PyTorch computes for them, so that the C tests (tests/test_golden.c) and the shell
tests (tests/test_cli_golden.sh) can check attn against PyTorch without PyTorch.

    python3 tests/golden/gen_golden.py        # from the repository root

Needs torch (2.x; from PyPI, or Debian's python3-torch), numpy and safetensors. The
torch version that made the files is written into MANIFEST and every case.txt.

Each case is a folder with .npy / .safetensors files and a case.txt of key=value
lines (shell-sourceable: no spaces in values):

  kind=mha   weights, prefix, num_heads, input, token_ids, pad_id, causal, mask,
             empty_rows, output, attention; w_qkv/b_qkv/w_o/b_o are the fused
             weights every name set must load as
  kind=sdpa  query, key, value, mask, causal, scale, empty_rows, output, attention

How the expected values are made: inputs and weights are drawn in float32 and
stored exactly; PyTorch then computes in float64 from those same float32 values
(nn.MultiheadAttention for kind=mha, plain matmul + masked softmax for kind=sdpa),
and the float64 results are rounded once to float32. So the expected files are the
exact answer to within half a float32 ulp, and the C tests' tolerance measures
attn's own float32 error.
"""
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")
DT = torch.float64


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def write_case(name, files, keys):
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    for fname, arr in files.items():
        np.save(os.path.join(d, fname), arr)
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("# made by tests/golden/gen_golden.py with torch %s\n" % torch.__version__)
        for k, v in keys.items():
            v = "" if v is None else str(v)
            assert " " not in v, (k, v)
            f.write("%s=%s\n" % (k, v))
    return d


def rand_mask(rng, shape, diag_true):
    """A random boolean mask; with diag_true every query row keeps at least one key."""
    m = rng.random(shape) < 0.6
    if diag_true:
        Tq, Tk = shape[-2], shape[-1]
        for i in range(Tq):
            m[..., i, min(i, Tk - 1)] = True
    return m


def demo_ids(B, T, pad):
    """Token ids with a pad tail in every sample but the first (SPEC's demo rule)."""
    ids = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        real = max(1, T - 1 - (b % max(1, min(T, 3))))
        ids[b, :real] = np.arange(1, real + 1) + b * T
        ids[b, real:] = pad
    return ids


def mha_case(name, rng, B, T, E, H, names, prefix="", store_dtype=torch.float32,
             single=False, causal=False, pad=None, mask=False, drop_bias=(),
             x_dtype=np.float32, extra=None):
    # Weights drawn in float32, then rounded to the stored dtype, so the file holds
    # exactly what the expected output was computed from.
    bound = 1.0 / np.sqrt(E)
    w_qkv = torch.from_numpy(f32(rng.uniform(-bound, bound, (3 * E, E))))
    b_qkv = torch.from_numpy(f32(rng.uniform(-bound, bound, (3 * E,))))
    w_o = torch.from_numpy(f32(rng.uniform(-bound, bound, (E, E))))
    b_o = torch.from_numpy(f32(rng.uniform(-bound, bound, (E,))))
    w_qkv, b_qkv, w_o, b_o = (t.to(store_dtype).to(torch.float32) for t in (w_qkv, b_qkv, w_o, b_o))
    # A bias the file leaves out is zero (that is what attn loads it as).
    if "q" in drop_bias:
        b_qkv[:E] = 0
    if "k" in drop_bias:
        b_qkv[E:2 * E] = 0
    if "v" in drop_bias:
        b_qkv[2 * E:] = 0
    if "o" in drop_bias:
        b_o[:] = 0

    tensors = {}
    if names == "chapter":
        tensors = {"qkv.weight": w_qkv, "qkv.bias": b_qkv, "output.weight": w_o,
                   "output.bias": b_o}
    elif names == "torch":
        tensors = {"in_proj_weight": w_qkv, "in_proj_bias": b_qkv,
                   "out_proj.weight": w_o, "out_proj.bias": b_o}
    else:
        for i, p in enumerate("qkv"):
            tensors["%s_proj.weight" % p] = w_qkv[i * E:(i + 1) * E]
            if p not in drop_bias:
                tensors["%s_proj.bias" % p] = b_qkv[i * E:(i + 1) * E]
        tensors["o_proj.weight"] = w_o
        if "o" not in drop_bias:
            tensors["o_proj.bias"] = b_o
    st = {prefix + k: v.to(store_dtype).contiguous() for k, v in tensors.items()}
    if extra:
        st.update(extra)

    x = f32(rng.standard_normal((T, E) if single else (B, T, E)))
    xb = torch.from_numpy(x.reshape(B, T, E).astype(np.float64))

    mha = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    with torch.no_grad():
        mha.in_proj_weight.copy_(w_qkv.to(DT))
        mha.in_proj_bias.copy_(b_qkv.to(DT))
        mha.out_proj.weight.copy_(w_o.to(DT))
        mha.out_proj.bias.copy_(b_o.to(DT))

    # attn's masks say "may attend"; PyTorch's boolean masks say "may NOT attend".
    allowed = np.ones((B, H, T, T), dtype=bool)
    files = {}
    keys = {"kind": "mha", "num_heads": H, "prefix": prefix, "causal": int(causal),
            "token_ids": "", "pad_id": "", "mask": "", "empty_rows": "error"}
    if pad is not None:
        ids = demo_ids(B, T, pad)
        allowed &= (ids != pad)[:, None, None, :]
        files["ids.npy"] = ids[0] if single else ids
        keys.update(token_ids="ids.npy", pad_id=pad)
    if mask:
        m = rand_mask(rng, (B, 1, T, T), diag_true=True)
        allowed &= m
        files["mask.npy"] = m[0] if single else m
        keys["mask"] = "mask.npy"
    if causal:
        allowed &= np.tril(np.ones((T, T), dtype=bool))
    assert allowed.any(-1).all(), "a golden mha case must not have an empty row"
    attn_mask = torch.from_numpy(~allowed.reshape(B * H, T, T))
    with torch.no_grad():
        out, weights = mha(xb, xb, xb, attn_mask=attn_mask, need_weights=True,
                           average_attn_weights=False)
    out = out.numpy()
    weights = weights.numpy()
    files.update({
        "x.npy": x.astype(x_dtype),
        "out.npy": f32(out[0] if single else out),
        "attn.npy": f32(weights[0] if single else weights),
        "w_qkv.npy": f32(w_qkv), "b_qkv.npy": f32(b_qkv), "w_o.npy": f32(w_o),
        "b_o.npy": f32(b_o),
    })
    keys.update(weights="weights.safetensors", input="x.npy", output="out.npy",
                attention="attn.npy", names=names, store_dtype=str(store_dtype).split(".")[1])
    d = write_case(name, files, keys)
    save_file(st, os.path.join(d, "weights.safetensors"))
    os.chmod(os.path.join(d, "weights.safetensors"), 0o644)
    return name


def sdpa_case(name, rng, lead, Tq, Tk, D, Dv, mask_shape=None, causal=False, scale=None,
              empty_rows="error", force_empty=False):
    q = f32(rng.standard_normal(lead + (Tq, D)))
    k = f32(rng.standard_normal(lead + (Tk, D)))
    v = f32(rng.standard_normal(lead + (Tk, Dv)))
    qt, kt, vt = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
    s = (1.0 / np.sqrt(D)) if scale is None else float(np.float32(scale))
    scores = torch.matmul(qt, kt.transpose(-1, -2)) * s
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    files = {"q.npy": q, "k.npy": k, "v.npy": v}
    keys = {"kind": "sdpa", "query": "q.npy", "key": "k.npy", "value": "v.npy",
            "mask": "", "causal": int(causal), "scale": "" if scale is None else scale,
            "empty_rows": empty_rows, "output": "out.npy", "attention": "attn.npy"}
    if mask_shape is not None:
        m = rand_mask(rng, mask_shape, diag_true=not force_empty)
        if force_empty:
            m[..., 0, :] = False  # query 0 sees no key at all
        allowed = allowed & torch.from_numpy(m)
        files["mask.npy"] = m
        keys["mask"] = "mask.npy"
    if causal:
        allowed = allowed & torch.ones(Tq, Tk, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    empty = ~allowed.any(-1, keepdim=True)
    assert force_empty == bool(empty.any()), name
    # 'zero' mode: a fully masked row gets zero weights and zero output (softmax of
    # all -inf is NaN in PyTorch).
    weights = torch.where(empty, torch.zeros_like(weights), weights)
    out = torch.matmul(weights, vt)
    files.update({"out.npy": f32(out.numpy()), "attn.npy": f32(weights.numpy())})
    write_case(name, files, keys)
    return name


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    torch.manual_seed(0)
    rng = np.random.default_rng(20261129)
    cases = [
        # E not a power of two, padding + causal, the chapter's names.
        mha_case("mha_chapter_pad_causal", rng, B=2, T=5, E=12, H=3, names="chapter",
                 causal=True, pad=0),
        # nn.MultiheadAttention's names under a prefix, next to unrelated tensors,
        # with a random boolean mask [B, 1, T, T].
        mha_case("mha_torch_prefix_mask", rng, B=3, T=7, E=20, H=4, names="torch",
                 prefix="layers.0.attn.", mask=True,
                 extra={"layers.0.norm.weight": torch.ones(20),
                        "embed.weight": torch.zeros(11, 20)}),
        # Separate projections, T = 1, two biases missing.
        mha_case("mha_separate_t1", rng, B=2, T=1, E=6, H=2, names="separate",
                 drop_bias=("k", "o")),
        # Separate projections stored as float16, causal, a prime E.
        mha_case("mha_separate_f16_causal", rng, B=2, T=6, E=14, H=7, names="separate",
                 store_dtype=torch.float16, causal=True, prefix="attn."),
        # One sequence [T, E] given as float64, ids [T], padding + causal + a mask.
        mha_case("mha_single_f64_all_masks", rng, B=1, T=6, E=8, H=2, names="torch",
                 single=True, causal=True, pad=5, mask=True, x_dtype=np.float64),
        # bfloat16 weights by the chapter's names, padding only, one head.
        mha_case("mha_chapter_bf16_pad", rng, B=3, T=4, E=9, H=1, names="chapter",
                 store_dtype=torch.bfloat16, pad=0),
        # Cross-attention shapes (Tq != Tk, Dv != D) with a random mask [B, 1, Tq, Tk].
        sdpa_case("sdpa_cross_mask", rng, (2, 3), Tq=4, Tk=7, D=5, Dv=6,
                  mask_shape=(2, 1, 4, 7)),
        # Causal with a caller's scale.
        sdpa_case("sdpa_causal_scale", rng, (1, 2), Tq=6, Tk=6, D=8, Dv=8, causal=True,
                  scale=0.3),
        # [H, T, D] arrays, one query against 9 keys (a decode step), a (1, 9) mask.
        sdpa_case("sdpa_3d_decode", rng, (4,), Tq=1, Tk=9, D=16, Dv=16,
                  mask_shape=(1, 9)),
        # Padding mask [B, 1, 1, T] and causal together.
        sdpa_case("sdpa_pad_causal", rng, (2, 2), Tq=5, Tk=5, D=4, Dv=3,
                  mask_shape=(2, 1, 1, 5), causal=True),
        # A fully masked query row, with --empty-rows zero.
        sdpa_case("sdpa_empty_rows_zero", rng, (2, 1), Tq=4, Tk=4, D=3, Dv=3,
                  mask_shape=(2, 1, 4, 4), empty_rows="zero", force_empty=True),
    ]
    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# golden cases made by tests/golden/gen_golden.py\n")
        f.write("# torch %s, numpy %s\n" % (torch.__version__, np.__version__))
        for c in cases:
            f.write(c + "\n")
    total = sum(os.path.getsize(os.path.join(dp, fn))
                for dp, _, fns in os.walk(ROOT) for fn in fns)
    print("torch %s: %d cases, %d bytes in %s" % (torch.__version__, len(cases), total,
                                                    os.path.normpath(ROOT)))


if __name__ == "__main__":
    main()
