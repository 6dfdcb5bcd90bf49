"""attn from Python agrees with PyTorch on the C tests' golden files.

Tolerance: |attn - torch| <= 2e-6 + 1e-5 * |torch|, the C tests' own (tests/
test_golden.c explains it: the expected values are float64 results rounded once
to float32, so the difference is attn's own float32 rounding, at most ~2.4e-7 seen,
while a real mistake moves outputs by 1e-2 or more). The arrays are read with
attn's own .npy loader, so these tests also cover attn.load_npy.
"""
import numpy as np
import pytest

import attn
from conftest import cases, read_case

ATOL, RTOL = 2e-6, 1e-5


def close(name, got, want):
    want = np.asarray(want, dtype=np.float32)
    if got.ndim == want.ndim + 1 and got.shape[0] == 1:  # a batch of one, stored without B
        got = got[0]
    assert got.shape == want.shape, "%s: shape %s, PyTorch's %s" % (name, got.shape, want.shape)
    both_inf = np.isinf(want) & (got == want)
    with np.errstate(invalid="ignore"):  # inf - inf where both are -inf: equal
        err = np.where(both_inf, 0.0, np.abs(got.astype(np.float64) - want))
    bound = ATOL + RTOL * np.abs(np.where(np.isinf(want), 0.0, want))
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), "%s at %s: attn %r, PyTorch %r" % (
        name, worst, got[worst], want[worst])


def load(folder, name):
    return attn.load_npy(folder / name)


def sdpa_kwargs(folder, c):
    kw = {}
    if c.get("mask"):
        kw["mask"] = load(folder, c["mask"])
    kw["causal"] = {"0": False, "1": True, "2": "bottom_right"}[c.get("causal", "0")]
    if c.get("scale"):
        kw["scale"] = float(c["scale"])
    if c.get("window"):
        left, right = (int(s) for s in c["window"].split(","))
        kw["window"] = (left, right)
    if c.get("softcap"):
        kw["softcap"] = float(c["softcap"])
    alibi = c.get("alibi", "0")
    if alibi == "1":
        kw["alibi"] = True
    elif alibi not in ("", "0"):
        kw["alibi"] = load(folder, alibi)
    for key in ("bias", "sinks"):
        if c.get(key):
            kw[key] = load(folder, c[key])
    kw["empty_rows"] = c.get("empty_rows") or "error"
    return kw


@pytest.mark.parametrize("folder", cases("golden", "sdpa") + cases("golden_options", "sdpa_options"))
def test_sdpa_matches_pytorch(folder):
    """attn.sdpa's output, weights and log-sum-exp equal PyTorch's for every golden case."""
    c = read_case(folder)
    q, k, v = (load(folder, c[n]) for n in ("query", "key", "value"))
    want_lse = bool(c.get("lse"))
    res = attn.sdpa(q, k, v, return_weights=True, return_lse=want_lse, **sdpa_kwargs(folder, c))
    close("out", res[0], load(folder, c["output"]))
    close("weights", res[1], load(folder, c["attention"]))
    if want_lse:
        close("lse", res[2], load(folder, c["lse"]))


def mha_mask(folder, c, B, T):
    mask = None
    if c.get("mask"):
        mask = load(folder, c["mask"])
    if c.get("token_ids"):
        # A single sequence's ids are stored as [T]; the mask wants [B, T].
        ids = load(folder, c["token_ids"]).reshape(B, T)
        pad = attn.padding_mask(ids, int(c["pad_id"]))
        mask = pad if mask is None else (mask & pad)
    return mask


@pytest.mark.parametrize("folder", cases("golden", "mha"))
def test_mha_from_safetensors_matches_pytorch(folder):
    """attn.mha_forward with weights from the case's .safetensors equals PyTorch's module."""
    c = read_case(folder)
    x = load(folder, c["input"])
    if x.ndim == 2:  # a single sequence [T, E] is a batch of one
        x = x[None]
    mask = mha_mask(folder, c, x.shape[0], x.shape[1])
    out, w = attn.mha_forward(x, folder / c["weights"], int(c["num_heads"]), prefix=c["prefix"],
                              mask=mask, causal=c["causal"] == "1",
                              empty_rows=c.get("empty_rows") or "error", return_weights=True)
    close("out", out, load(folder, c["output"]))
    close("weights", w, load(folder, c["attention"]))


@pytest.mark.parametrize("folder", cases("golden", "mha"))
def test_mha_from_a_dict_matches_pytorch(folder):
    """attn.mha_forward with the weights as a dict of numpy arrays gives the same result."""
    c = read_case(folder)
    x = load(folder, c["input"])
    if x.ndim == 2:  # a single sequence [T, E] is a batch of one
        x = x[None]
    weights = attn.load_safetensors(folder / c["weights"])
    mask = mha_mask(folder, c, x.shape[0], x.shape[1])
    out = attn.mha_forward(x, weights, int(c["num_heads"]), prefix=c["prefix"], mask=mask,
                           causal=c["causal"] == "1", empty_rows=c.get("empty_rows") or "error")
    close("out", out, load(folder, c["output"]))


@pytest.mark.parametrize("folder", cases("golden_gqa", "gqa"))
def test_gqa_matches_pytorch(folder):
    """Llama-style grouped-query attention (separate projections, Hkv < H) equals PyTorch's."""
    c = read_case(folder)
    x = load(folder, c["input"])
    if x.ndim == 2:  # a single sequence [T, E] is a batch of one
        x = x[None]
    mask = mha_mask(folder, c, x.shape[0], x.shape[1])
    out, w = attn.mha_forward(x, folder / c["weights"], int(c["num_heads"]),
                              num_kv_heads=int(c["num_kv_heads"]), prefix=c["prefix"],
                              mask=mask, causal=c["causal"] == "1", return_weights=True)
    close("out", out, load(folder, c["output"]))
    close("weights", w, load(folder, c["attention"]))


@pytest.mark.parametrize("folder", cases("golden_decode", "rope"))
def test_rope_matches_pytorch(folder):
    """attn.rope rotates as PyTorch does, for both pairings, bases and offsets."""
    c = read_case(folder)
    x = load(folder, "x.npy")
    got = attn.rope(x, pairing=c["pairing"], base=float(c["base"]), offset=int(c["offset"]))
    close("rope", got, load(folder, "out.npy"))
    # In place (out is x itself) gives the same values.
    y = x.copy()
    assert attn.rope(y, pairing=c["pairing"], base=float(c["base"]), offset=int(c["offset"]),
                     out=y) is y
    close("rope in place", y, load(folder, "out.npy"))


def test_the_cases_were_found():
    """The golden folders are where conftest looks, so the tests above are not empty."""
    n = len(cases("golden", "sdpa")) + len(cases("golden_options", "sdpa_options"))
    assert n >= 15, "found %d sdpa golden cases under the data folder" % n
