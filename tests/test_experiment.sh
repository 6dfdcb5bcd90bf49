#!/usr/bin/env bash
# The chapter's experiment prints exactly the chapter's seven lines for the defaults,
# the lines that other sizes imply (derived by hand from SPEC §2 in tests/expected/),
# and refuses bad flags with one line on stderr and exit status 2.
set -u
fail=0
exp="$ATTN_SOURCE_DIR/tests/expected"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

same() { # name, expected file, args...
    local name=$1 want=$2; shift 2
    if ! "$INSPECT" "$@" >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL $name: exit status $? ($(cat "$tmp/err"))"; fail=1; return
    fi
    if ! cmp -s "$tmp/out" "$want"; then
        echo "FAIL $name: output differs from $want"; diff "$want" "$tmp/out"; fail=1; return
    fi
    [ -s "$tmp/err" ] && { echo "FAIL $name: wrote to stderr: $(cat "$tmp/err")"; fail=1; return; }
    echo "ok   $name"
}

refuse() { # name, expected stderr substring, args...
    local name=$1 want=$2; shift 2
    "$INSPECT" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    local lines; lines=$(wc -l <"$tmp/err")
    if [ "$rc" -ne 2 ]; then echo "FAIL $name: exit status $rc, expected 2"; fail=1; return; fi
    if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr, expected 1"; cat "$tmp/err"; fail=1; return; fi
    if [ -s "$tmp/out" ]; then echo "FAIL $name: printed to stdout"; fail=1; return; fi
    if ! grep -q -- "$want" "$tmp/err"; then echo "FAIL $name: stderr '$(cat "$tmp/err")' lacks '$want'"; fail=1; return; fi
    echo "ok   $name: $(cat "$tmp/err")"
}

same "defaults print the chapter's seven lines" "$exp/experiment_default.txt"
same "explicit defaults print the same" "$exp/experiment_default.txt" \
    --batch-size 2 --seq-len 5 --embed-dim 16 --num-heads 4 --seed 42
same "another seed changes none of the seven lines" "$exp/experiment_default.txt" --seed 7
same "B=3 T=4 E=12 H=3 changes the lines accordingly" "$exp/experiment_b3_t4_e12_h3.txt" \
    --batch-size=3 --seq-len=4 --embed-dim=12 --num-heads=3
same "T=1 keeps one real token" "$exp/experiment_b1_t1_e3_h1.txt" \
    --batch-size 1 --seq-len 1 --embed-dim 3 --num-heads 1

refuse "a size below 1 is refused" "--seq-len must be in 1..1048576 (got 0)" --seq-len 0
refuse "a negative size is refused" "--batch-size must be in 1..1048576 (got -3)" --batch-size -3
refuse "E not divisible by H is refused" "--embed-dim 16 is not divisible by --num-heads 3" --num-heads 3
refuse "a non-number is refused" "--embed-dim takes a whole number, not 'abc'" --embed-dim abc
refuse "trailing junk is refused" "--num-heads takes a whole number, not '4x'" --num-heads 4x
refuse "a leading '+' is refused" "--num-heads takes a whole number, not '+4'" --num-heads +4
refuse "hex is refused" "--seq-len takes a whole number, not '0x10'" --seq-len 0x10
refuse "a seed beyond 64 bits is refused" "--seed does not fit in 64 bits (got 99999999999999999999)" --seed 99999999999999999999
refuse "a sample outside the batch is refused" "--sample 2 is out of range for --batch-size 2" --sample 2 --values
refuse "--sample alone (it would change nothing) is refused" "--sample picks the sample that --values, --heatmap and --show show" --sample 1
refuse "--head without --values (the seven lines show head 0) is refused" "--head picks the head that --values shows" --head 2
refuse "--head with --show alone is refused too" "--head picks the head that --values shows" --head 1 --show
refuse "an unknown flag is refused" "unknown option '--bogus'" --bogus
refuse "a missing value is refused" "--seed needs a value" --seed
refuse "sizes too large for memory are refused" "too large" --seq-len 1000000 --batch-size 1000000

if "$INSPECT" --help >"$tmp/out" 2>"$tmp/err" && [ ! -s "$tmp/err" ] && grep -q -- "--batch-size" "$tmp/out" \
    && grep -q "^EXIT STATUS" "$tmp/out" && grep -q "^NUMBERS" "$tmp/out"; then
    echo "ok   --help describes the flags, the number rule and the exit statuses"
else echo "FAIL --help: $(head -3 "$tmp/out") $(cat "$tmp/err")"; fail=1; fi

[ $fail -eq 0 ] && echo "test_experiment: all passed"
exit $fail
