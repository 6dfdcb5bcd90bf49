"""A model-porter's check: random combinations of SPEC sections 6-10 against PyTorch.

A fast slice of tools/port_check.py (which see for the oracle and the bounds): random
problems mixing GQA, every causal form, windows, softcap, sinks, ALiBi, broadcast
biases and masks, scales, empty rows, strided views, Tq < Tk, Tq > Tk and Tq = 1,
compared with a float64 oracle written in torch from SPEC section 6 - the forward,
the log-sum-exp, the weights and the backward (attn.sdpa_backward against
torch.autograd) - plus the KV cache's decode loop (append with RoPE, attend,
truncate, the batch path) in float32, bfloat16 and float16, and the 16-bit forward
against twice PyTorch's own error (SPEC section 10). Also what a PyTorch user expects
where the contract leaves a choice: empty_rows="zero" gives PyTorch 2.x's zeros for a
row that sees no key, forward and backward. Skips without torch 2.5 or later (its
scaled_dot_product_attention's enable_gqa and scale), as on the Debian variant of CI
(1.13) and the PyPI one (no torch). About 5 s.
"""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):
    pytest.skip("the port check needs torch 2.5 or later, not %s" % torch.__version__,
                allow_module_level=True)

import attn  # noqa: E402

_TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "port_check.py"
if not _TOOL.is_file():
    pytest.skip("tools/port_check.py is not here (the package tested away from a "
                "checkout)", allow_module_level=True)
_spec = importlib.util.spec_from_file_location("port_check", _TOOL)
pc = importlib.util.module_from_spec(_spec)
sys.modules["port_check"] = pc
_spec.loader.exec_module(pc)


def _report(rep):
    return "\n".join(rep.failures[:10])


@pytest.mark.parametrize("seed", [101, 102])
def test_random_problems_forward_and_backward_agree_with_torch(seed):
    """Random combinations of the options: attn's output, log-sum-exp, weights and
    gradients within the float32 bound of the float64 oracle, or refused exactly
    where a row sees no key in error mode."""
    rep = pc.Report()
    rng = np.random.default_rng(seed)
    for n in range(40):
        p = pc.draw_problem(rng)
        pc.check_f32(attn, p, rep, "seed %d problem %d %s" % (seed, n, pc.describe(p)))
    assert rep.checked > 150, rep.checked
    assert not rep.failures, _report(rep)


def test_half_precision_forward_within_twice_torch_error():
    """bfloat16 and float16 q, k, v: the output within twice PyTorch's own error in
    that dtype plus a floor; weights and log-sum-exp (float32) within the float32
    bound. bfloat16 goes in as ml_dtypes.bfloat16 where that is installed, else as
    uint16 bits with dtype="bf16"."""
    rep = pc.Report()
    rng = np.random.default_rng(103)
    for n in range(25):
        p = pc.draw_problem(rng)
        for dt in ("bf16", "f16"):
            pc.check_half(attn, p, rep, "problem %d %s" % (n, pc.describe(p)), dt)
    assert rep.checked > 50, rep.checked
    assert not rep.failures, _report(rep)


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16", "f16"])
def test_kv_cache_decode_loop_agrees_with_torch(kv_dtype):
    """Prefill, decode steps, a truncate and more steps through attn.KVCache (RoPE at
    the cache's positions, GQA, windows, softcap, sinks, ALiBi, a bias and a mask on
    attend, the batch path) against a torch decode loop in float64."""
    rep = pc.Report()
    rng = np.random.default_rng(104)
    for n in range(3):
        pc.check_decode(attn, rng, rep, "decode %d kv=%s" % (n, kv_dtype), kv_dtype)
    assert rep.checked > 10, rep.checked
    assert not rep.failures, _report(rep)


def test_empty_rows_zero_is_what_torch_gives():
    """PyTorch 2.x gives zeros (and zero gradients) for a query that sees no key; attn
    refuses such a row by default (SPEC section 1) and gives PyTorch's answer with
    empty_rows="zero"."""
    rng = np.random.default_rng(105)
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    do = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    with pytest.raises(ValueError, match="empty_rows"):
        attn.sdpa(q, k, v, mask=mask)
    out, lse = attn.sdpa(q, k, v, mask=mask, empty_rows="zero", return_lse=True)
    dq, dk, dv = attn.sdpa_backward(q, k, v, out, lse, do, mask=mask, empty_rows="zero")
    qt, kt, vt = (torch.from_numpy(x).double().requires_grad_() for x in (q, k, v))
    ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                          attn_mask=torch.from_numpy(mask))
    ot.backward(torch.from_numpy(do).double())
    assert (ot[:, :, 1] == 0).all() and (out[:, :, 1] == 0).all()
    for name, mine, theirs in (("out", out, ot.detach()), ("dq", dq, qt.grad),
                               ("dk", dk, kt.grad), ("dv", dv, vt.grad)):
        err = np.abs(mine - theirs.numpy()).max()
        assert err < 2e-6, "%s: max |attn - torch| = %g" % (name, err)


def test_expanded_bias_gets_each_elements_gradient():
    """A bias made with np.broadcast_to (stride 0 on full-size axes) gets the
    gradient of each element, as its contiguous copy and torch.autograd do (dbias
    held unwritten memory before the fix; tests/test_port_bias_view.c in C)."""
    rng = np.random.default_rng(106)
    q = rng.standard_normal((2, 4, 3, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 5, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 5, 16)).astype(np.float32)
    do = rng.standard_normal((2, 4, 3, 16)).astype(np.float32)
    small = rng.standard_normal((1, 4, 3, 1)).astype(np.float32)
    view = np.broadcast_to(small, (2, 4, 3, 5))
    got = []
    for bias in (view, np.ascontiguousarray(view)):
        out, lse = attn.sdpa(q, k, v, bias=bias, return_lse=True)
        got.append(attn.sdpa_backward(q, k, v, out, lse, do, bias=bias)[3])
    assert np.array_equal(got[0], got[1]), (got[0][0, 0], got[1][0, 0])
    qt, kt, vt = (torch.from_numpy(x).double() for x in (q, k, v))
    bt = torch.from_numpy(np.ascontiguousarray(view)).double().requires_grad_()
    ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=bt,
                                                          enable_gqa=True)
    ot.backward(torch.from_numpy(do).double())
    err = np.abs(got[0] - bt.grad.numpy()).max()
    assert err < 2e-6, "max |dbias - torch| = %g" % err
