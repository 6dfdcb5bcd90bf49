#!/usr/bin/env bash
# The Python package's CI steps (.ci/run calls it once per variant). It builds and
# installs python/ into a fresh virtual environment, then runs pytest on
# python/tests. Two variants, chosen by ATTN_CI_NUMPY:
#
#   debian (default)  a venv over Debian's python3 with --system-site-packages, so
#                     Debian's numpy, pytest and python3-torch (PyTorch 1.13) are
#                     the ones used; torch must import here, so attn.torch's tests
#                     (python/tests/chapter, test_torch_half.py) run and never
#                     skip. Debian packages no ml_dtypes, so the 16-bit tests pass
#                     bfloat16 as uint16 bits here and the ml_dtypes one skips;
#   pypi              a venv of its own with numpy, pytest and ml_dtypes from PyPI
#                     and no PyTorch: the numpy API's tests run on PyPI's numpy,
#                     ml_dtypes must import, so the ml_dtypes.bfloat16 test runs,
#                     and the attn.torch tests skip, saying why.
#
# pip takes only the build backend, scikit-build-core, and a CMake >= 3.26 when
# the machine's is older, from PyPI (and in the pypi variant numpy, pytest and
# ml_dtypes).
#
# Fails when the install fails, when any test fails, and when pytest collects no
# test at all (its exit status 5 is a failure here, never a pass).
set -euo pipefail
cd "$(dirname "$0")/.."

py=${ATTN_CI_PYTHON:-}
if [ -z "$py" ]; then
    if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi
fi
variant=${ATTN_CI_NUMPY:-debian}
case "$variant" in
debian) venv=${ATTN_CI_VENV:-build-python/venv} ;;
pypi) venv=${ATTN_CI_VENV:-build-python/venv-pypi} ;;
*) echo "python/ci.sh: ATTN_CI_NUMPY must be debian or pypi, not '$variant'" >&2; exit 2 ;;
esac
rm -rf "$venv"
mkdir -p build-python "$(dirname "$venv")"
if [ "$variant" = debian ]; then
    "$py" -m venv --system-site-packages "$venv"
else
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet numpy pytest ml_dtypes
fi
venv=$(cd "$venv" && pwd)
"$venv/bin/python" -c 'import numpy, pytest; print("numpy", numpy.__version__, numpy.__file__, "pytest", pytest.__version__)'
if [ "$variant" = pypi ]; then
    # Without it the ml_dtypes.bfloat16 test would skip in both variants.
    "$venv/bin/python" -c 'import ml_dtypes; print("ml_dtypes", ml_dtypes.__version__)'
fi
if [ "$variant" = debian ]; then
    # .ci/run installs python3-torch; without it attn.torch would go untested.
    "$venv/bin/python" -c 'import torch; print("torch", torch.__version__, torch.__file__)'
fi
# Warnings are errors here as in the C build (a scikit-build-core setting).
CMAKE_BUILD_PARALLEL_LEVEL=2 "$venv/bin/python" -m pip install --quiet \
    --config-settings=cmake.define.ATTN_WERROR=ON ./python
# Run from outside the checkout so that `import attn` finds the installed package.
cd build-python
rc=0
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider ../python/tests || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "python/ci.sh: pytest collected no tests (exit 5): that is a failure"
fi
exit "$rc"
