"""Shared helpers: where the C tests' golden files are, and how to read a case."""
import os
import pathlib

import pytest

# The golden files live in the repository (tests/data/golden*/); ATTN_TEST_DATA
# points elsewhere when the package is tested away from a checkout.
DATA = pathlib.Path(os.environ.get("ATTN_TEST_DATA",
                                   pathlib.Path(__file__).resolve().parents[2] / "tests" / "data"))


def read_case(folder):
    """case.txt as a dict (key=value lines; '#' lines are comments)."""
    case = {}
    for line in (folder / "case.txt").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            case[k] = v
    return case


def cases(family, kind):
    """Every case folder of DATA/family whose kind= is `kind`, for parametrize."""
    root = DATA / family
    if not root.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason="no %s here" % root))]
    out = []
    for name in sorted(os.listdir(root)):
        folder = root / name
        if (folder / "case.txt").is_file() and read_case(folder).get("kind") == kind:
            out.append(pytest.param(folder, id=name))
    return out
