"""attn.torch on every instruction-set path (ATTN_ARCH), against plain PyTorch.

The dispatch is decided once per process, so each path runs in its own interpreter:
the module's forward, weights and all gradients (a loss on the output and on the
weights, combined padding + causal mask, awkward sizes) are compared there with
the plain-PyTorch module, under the tolerance test_chapter_module.py states.
"""
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed in this environment: attn.torch needs it "
    "(CI runs these tests on Debian's python3-torch)")

import attn  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ORDER = ["ref", "scalar", "avx2", "avx512", "avx512bf16", "amx"]

CHECK = '''
import sys
import torch
import attn, attn.torch as attention
import plain_attention as plain

assert attn.arch()["selected"] == sys.argv[1], attn.arch()
worst = 0.0
for B, T, E, H, fused in ((2, 7, 12, 3, True), (3, 70, 16, 2, True), (2, 17, 8, 2, False)):
    ids = torch.ones(B, T, dtype=torch.long)
    ids[-1, T // 2:] = 0
    mask = (attention.make_padding_attention_mask(ids, pad_id=0)
            & attention.make_causal_attention_mask(T))
    results = []
    for module in (attention, plain):
        torch.manual_seed(T)
        m = module.MultiHeadSelfAttention(E, H)
        x = torch.randn(B, T, E, requires_grad=True)
        g = torch.Generator().manual_seed(1)
        if fused:  # the fused C forward and attn_mha_backward
            out = m(x, attention_mask=mask)
            loss = (out * torch.randn(out.shape, generator=g)).sum()
        else:      # with the weights in the loss: attn_sdpa_backward and the weights' part
            out, w = m(x, attention_mask=mask, return_attention=True)
            loss = (out * torch.randn(out.shape, generator=g)).sum() + (w * w).sum()
        loss.backward()
        results.append([out, x.grad] + [p.grad for p in m.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
        worst = max(worst, (a - b).abs().max().item())
print("ok", sys.argv[1], worst)
'''


@pytest.mark.parametrize("arch", ORDER)
def test_every_instruction_set_path_gives_plain_pytorchs_gradients(arch):
    """With ATTN_ARCH forcing each path this CPU has, the module's output and gradients
    equal plain PyTorch's."""
    best = attn.arch()["best"]
    if ORDER.index(arch) > ORDER.index(best):
        pytest.skip("this CPU's best path is %s, so %s cannot run here" % (best, arch))
    env = dict(os.environ, ATTN_ARCH=arch,
               PYTHONPATH=os.pathsep.join([str(HERE)] + sys.path))
    r = subprocess.run([sys.executable, "-c", CHECK, arch], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0 and r.stdout.startswith("ok"), \
        "ATTN_ARCH=%s:\nstdout: %s\nstderr: %s" % (arch, r.stdout, r.stderr)
