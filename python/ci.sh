#!/usr/bin/env bash
# The Python package's CI step (.ci/run calls it as one step): builds and installs
# python/ into a fresh virtual environment over Debian's python3 with
# --system-site-packages, so Debian's numpy and pytest are the ones used (pip takes
# only the build backend, scikit-build-core, and a CMake >= 3.26 when the
# machine's is older, from PyPI), then runs pytest on python/tests.
#
# Fails when the install fails, when any test fails, and when pytest collects no
# test at all (its exit status 5 is a failure here, never a pass).
set -euo pipefail
cd "$(dirname "$0")/.."

py=${ATTN_CI_PYTHON:-}
if [ -z "$py" ]; then
    if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi
fi
venv=${ATTN_CI_VENV:-build-python/venv}
rm -rf "$venv"
mkdir -p build-python "$(dirname "$venv")"
"$py" -m venv --system-site-packages "$venv"
venv=$(cd "$venv" && pwd)
"$venv/bin/python" -c 'import numpy, pytest; print("numpy", numpy.__version__, "pytest", pytest.__version__)'
# Warnings are errors here as in the C build (a scikit-build-core setting).
CMAKE_BUILD_PARALLEL_LEVEL=2 "$venv/bin/python" -m pip install --quiet \
    --config-settings=cmake.define.ATTN_WERROR=ON ./python
# Run from outside the checkout so that `import attn` finds the installed package.
cd build-python
rc=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider ../python/tests || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "python/ci.sh: pytest collected no tests (exit 5): that is a failure"
fi
exit "$rc"
