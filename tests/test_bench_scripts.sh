#!/bin/bash
# test_bench_scripts.sh - bench/compare_torch.py still drives this build's `attn bench`:
# every figure the README quotes against PyTorch comes from that script, and a change
# to attn bench's options once made its first call (`--peak` with `--runs`) a usage
# error, so the script stopped before timing anything. Runs the script's forward and
# decode modes on tiny shapes (S1, a 64-key cache): about two seconds. Needs a Python
# with numpy and PyTorch (ATTN_TEST_PYTHON, else Debian's /usr/bin/python3, which .ci/run
# gives python3-torch, else python3); without one the test says so and is skipped (77).
set -u
. "$(dirname "$0")/cli_lib.sh"

PY=""
for p in ${ATTN_TEST_PYTHON:-} /usr/bin/python3 python3; do
    if "$p" -c 'import numpy, torch' >/dev/null 2>&1; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    echo "test_bench_scripts: skipped: no Python with numpy and PyTorch (set ATTN_TEST_PYTHON)"
    exit 77
fi
WORK="$ATTN_TEST_TMP_DIR/bench_scripts"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
SCRIPT="$ATTN_SOURCE_DIR/bench/compare_torch.py"
echo "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"

say "the forward mode times S1 with attn and PyTorch and prints its line"
run 0 "$PY" "$SCRIPT" --attn "$ATTN" --threads 1 --runs 2 --shapes S1 --shapes-only
out_has "FMA peak"
if grep -Eq '^S1 +[0-9]+\.[0-9]+ ' "$OUT_FILE"; then ok
else bad "no timed S1 line in: $(tail -3 "$OUT_FILE")"; fi

say "the decode mode times a short decode loop"
run 0 "$PY" "$SCRIPT" --attn "$ATTN" --threads 1 --runs 2 --decode --prefill 64 --steps 4 --repeat 1
if grep -Eq '^S5 +[0-9]' "$OUT_FILE"; then ok
else bad "no timed S5 line in: $(tail -3 "$OUT_FILE")"; fi

cli_summary test_bench_scripts
