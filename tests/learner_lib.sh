# learner_lib.sh - helpers for the shell tests of inspect_self_attention's learner
# options (tests/test_values.sh, test_layout.sh, test_mistakes.sh), sourced by them.
# Needs only bash, od and awk: the PyTorch numbers they compare with are .npy files
# in tests/data/learner/, written by tests/golden/gen_learner.py.

LEARNER_DATA="$ATTN_TEST_DATA_DIR/learner"

# npy_header FILE: the header dict of an .npy file (version 1 or 2).
npy_header() {
    local f=$1 major hlen hstart
    major=$(od -An -t u1 -j 6 -N 1 "$f" | tr -d ' ')
    if [ "$major" = 1 ]; then hlen=$(od -An -t u2 -j 8 -N 2 --endian=little "$f" | tr -d ' '); hstart=10
    else hlen=$(od -An -t u4 -j 8 -N 4 --endian=little "$f" | tr -d ' '); hstart=12; fi
    head -c $((hstart + hlen)) "$f" | tail -c "$hlen"
}

# npy_shape FILE: "(2, 4, 5, 4)".
npy_shape() { npy_header "$1" | sed -n "s/.*'shape': \(([^)]*)\).*/\1/p"; }

# npy_floats FILE: the float32 data of an .npy file, one number per line as od
# prints it (enough digits to tell float32 values apart at our tolerance; inf, -inf,
# nan and -nan as such).
npy_floats() {
    local f=$1 major hlen hstart
    major=$(od -An -t u1 -j 6 -N 1 "$f" | tr -d ' ')
    if [ "$major" = 1 ]; then hlen=$(od -An -t u2 -j 8 -N 2 --endian=little "$f" | tr -d ' '); hstart=10
    else hlen=$(od -An -t u4 -j 8 -N 4 --endian=little "$f" | tr -d ' '); hstart=12; fi
    od -An -v -t f4 -w4 --endian=little -j $((hstart + hlen)) "$f" | tr -d ' '
}

# npy_compare GOT WANT: prints "COUNT BAD MAXDIFF FIRST" - how many numbers, how
# many differ by more than 2e-6 + 2e-6 * |want| (or are not the same non-finite
# value: -inf must be -inf, a NaN of either sign must be NaN), the largest finite
# difference and the index of the first bad one (-1 if none). The tolerance: the C
# program and PyTorch add the same float32 products in other orders (torch's GEMM
# blocks and vectorises them), which moves results of size about 1 by a few units in
# the last place (1.2e-7 each) on these small sizes; a real error (a wrong scale,
# mask or axis) is larger than 1e-3.
npy_compare() {
    paste <(npy_floats "$1") <(npy_floats "$2") | awk '
        function nf(s) { return s ~ /nan|inf/ }
        { n++; a = $1; b = $2
          if (nf(a) || nf(b)) {
              na = a; nb = b; sub(/^-nan$/, "nan", na); sub(/^-nan$/, "nan", nb)
              if (na != nb) { bad++; if (first < 0) first = n - 1 }
              next
          }
          d = a - b; if (d < 0) d = -d
          if (d > max) max = d
          m = b < 0 ? -b : b
          if (d > 2e-6 + 2e-6 * m) { bad++; if (first < 0) first = n - 1 } }
        BEGIN { first = -1; bad = 0; max = 0; n = 0 }
        END { printf "%d %d %.3g %d\n", n, bad, max, first }'
}
