"""The chapter's experiment on attn.torch: the seven lines, and the same numbers as the
plain-PyTorch module when only the import line differs."""
import pathlib

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed in this environment: attn.torch needs it "
    "(CI runs these tests on Debian's python3-torch)")

SCRIPT = pathlib.Path(__file__).with_name("inspect_self_attention.py")
IMPORT = "import attn.torch as attention\n"

# SPEC section 2: what the chapter's experiment prints with its defaults.
SEVEN_LINES = """x_shape=(2, 5, 16)
token_ids=[[1, 2, 3, 4, 0], [6, 7, 8, 0, 0]]
output_shape=(2, 5, 16)
attention_shape=(2, 4, 5, 5)
combined_mask_shape=(2, 1, 5, 5)
first_head_weights_row0=[1.0, 0.0, 0.0, 0.0, 0.0]
last_real_query_can_attend_to=[1, 1, 1, 1, 0]
"""


def run_script(import_line, argv, capsys):
    """Runs the experiment with its import line replaced; returns (stdout, output, weights)."""
    source = SCRIPT.read_text()
    assert source.count(IMPORT) == 1, "the script's import line is not %r" % IMPORT
    namespace = {"__name__": "experiment"}
    exec(compile(source.replace(IMPORT, import_line), str(SCRIPT), "exec"), namespace)
    capsys.readouterr()
    output, weights = namespace["main"](argv)
    return capsys.readouterr().out, output, weights


def test_the_experiment_on_attn_prints_the_chapters_seven_lines(capsys):
    """With the defaults, the experiment on attn.torch prints SPEC section 2's lines."""
    out, _, _ = run_script(IMPORT, [], capsys)
    assert out == SEVEN_LINES, "got:\n%s\nwant:\n%s" % (out, SEVEN_LINES)


@pytest.mark.parametrize("argv", [[], ["--batch-size", "3", "--seq-len", "7", "--embed-dim",
                                       "24", "--num-heads", "3", "--seed", "1"]])
def test_only_the_import_differs_and_so_do_no_numbers(argv, capsys):
    """The experiment prints the same lines and computes the same output and weights on
    attn.torch as on the plain-PyTorch module (same seed, same parameters)."""
    ours = run_script(IMPORT, argv, capsys)
    theirs = run_script("import plain_attention as attention\n", argv, capsys)
    assert ours[0] == theirs[0], "attn.torch printed:\n%s\nplain printed:\n%s" % (ours[0],
                                                                               theirs[0])
    for name, a, b in (("output", ours[1], theirs[1]), ("weights", ours[2], theirs[2])):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4,
                                   msg=lambda m: "%s: %s\n%s\n%s" % (name, m, a, b))
