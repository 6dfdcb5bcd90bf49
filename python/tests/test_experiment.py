"""The chapter's experiment from Python: PyTorch's random numbers and the seven lines."""
import subprocess
import sys

import numpy as np

from conftest import DATA

# docs/python.md's experiment, run as a script: it must print SPEC section 2's lines.
EXPERIMENT = '''
import numpy as np
import attn

B, T, E, H, seed = 2, 5, 16, 4, 42
g = attn.Generator(seed)                       # torch.manual_seed(42)
x = g.randn(B, T, E)                           # torch.randn(B, T, E)
w_qkv, b_qkv = g.linear(E, 3 * E)              # nn.Linear(E, 3E)
w_o, b_o = g.linear(E, E)                      # nn.Linear(E, E)
ids = np.zeros((B, T), np.int64)
for b in range(B):
    n = max(1, T - 1 - (b % max(1, min(T, 3))))
    ids[b, :n] = np.arange(1, n + 1) + b * T
mask = attn.padding_mask(ids, 0) & attn.causal_mask(T)
out, weights = attn.mha_forward(x, {"qkv.weight": w_qkv, "qkv.bias": b_qkv,
                                    "output.weight": w_o, "output.bias": b_o},
                                H, mask=mask, return_weights=True)
last = int((ids[0] != 0).sum()) - 1
print("x_shape=%s" % (x.shape,))
print("token_ids=%s" % ids.tolist())
print("output_shape=%s" % (out.shape,))
print("attention_shape=%s" % (weights.shape,))
print("combined_mask_shape=%s" % (mask.shape,))
print("first_head_weights_row0=%s" % [round(float(w), 4) for w in weights[0, 0, 0]])
print("last_real_query_can_attend_to=%s" % mask[0, 0, last].astype(int).tolist())
'''

SEVEN_LINES = """x_shape=(2, 5, 16)
token_ids=[[1, 2, 3, 4, 0], [6, 7, 8, 0, 0]]
output_shape=(2, 5, 16)
attention_shape=(2, 4, 5, 5)
combined_mask_shape=(2, 1, 5, 5)
first_head_weights_row0=[1.0, 0.0, 0.0, 0.0, 0.0]
last_real_query_can_attend_to=[1, 1, 1, 1, 0]
"""


def test_the_experiment_prints_the_seven_lines():
    """The chapter's experiment written with attn in Python prints SPEC section 2's lines."""
    got = subprocess.run([sys.executable, "-c", EXPERIMENT], capture_output=True, text=True,
                         check=True).stdout
    assert got == SEVEN_LINES, "got:\n%s\nwant:\n%s" % (got, SEVEN_LINES)


def test_generator_draws_what_torch_draws():
    """attn.Generator(42) gives torch's x and nn.Linear weights bit for bit (tests/data/rng)."""
    import attn

    folder = DATA / "rng" / "chapter_s42"
    B, T, E = 2, 5, 16
    g = attn.Generator(42)
    x = g.randn(B, T, E)
    w_qkv, b_qkv = g.linear(E, 3 * E)
    w_o, b_o = g.linear(E, E)
    for name, got in (("x", x), ("qkv_weight", w_qkv), ("qkv_bias", b_qkv),
                      ("output_weight", w_o), ("output_bias", b_o)):
        want = np.fromfile(folder / (name + ".f32"), dtype="<f4").reshape(got.shape)
        diff = np.flatnonzero(got != want)
        assert diff.size == 0, "%s differs at flat index %d: attn %r, torch %r" % (
            name, diff[0], got.flat[diff[0]], want.flat[diff[0]])
