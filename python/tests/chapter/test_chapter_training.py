"""python/examples/train_reverse.py: the chapter's module trained through attn.torch."""
import importlib.util
import pathlib
import re

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed in this environment: attn.torch needs it "
    "(CI runs these tests on Debian's python3-torch)")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_reverse.py"


def test_training_through_attn_torch_makes_the_loss_fall(capsys):
    """100 SGD steps on the reverse task take the loss from about ln 7 to under a quarter
    of it, and the accuracy on a new batch above 0.9 (the C trainer learns it too)."""
    spec = importlib.util.spec_from_file_location("train_reverse", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    status = example.main(["--steps", "100", "--seed", "3"])
    out = capsys.readouterr().out
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]
    accuracy = float(re.search(r"final loss \S+  accuracy (\S+)", out).group(1))
    assert status == 0, out
    assert losses[-1] < losses[0] / 4, "loss did not fall: %s\n%s" % (losses, out)
    assert accuracy > 0.9, "final accuracy %.3f\n%s" % (accuracy, out)
