#!/bin/bash
# test_cli_help_examples.sh - every example that `attn --help`, `attn sdpa --help`,
# `attn forward --help`, `attn decode --help`, `inspect_self_attention --help`,
# `inspect_modern_attention --help` and `train_attention --help` print runs as
# printed: exit 0 and every file it names for output written. The commands are read
# from the help text itself (its EXAMPLE section, continuation lines joined), so an
# example that drifts from the program fails here. Each runs in a folder of its own
# holding the inputs it names (tests/data/help_examples/, made by
# tests/golden/gen_help_examples.py). `attn bench --help`'s examples are timing runs
# of seconds each and are not run here; test_fused_bench.sh runs their options on
# small shapes.
set -u
. "$(dirname "$0")/cli_lib.sh"
: "${INSPECT:?INSPECT must name inspect_self_attention}"
MODERN="${ATTN_BUILD_DIR:?}/inspect_modern_attention"
TRAIN="$ATTN_BUILD_DIR/train_attention"

WORK="$ATTN_TEST_TMP_DIR/cli_help_examples"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
DATA="$ATTN_TEST_DATA_DIR/help_examples"

# examples HELP_FILE: the example commands of a --help text, one a line, from the
# line after "EXAMPLE" or "EXAMPLES" to the first empty line, with each line that
# ends in a backslash joined to the next.
examples() {
    awk '/^EXAMPLES?$/ { on = 1; next }
         on && /^$/ { exit }
         on { sub(/^ +/, ""); if (sub(/\\$/, "")) { cmd = cmd $0; next } print cmd $0; cmd = "" }' "$1"
}

# run_examples NAME DATA_SUBDIRS EXPECTED_COUNT HELP_CMD...: runs every example of
# HELP_CMD --help in a fresh folder holding the files of DATA_SUBDIRS (a
# space-separated list, or empty).
run_examples() {
    local name=$1 sub=$2 want=$3
    shift 3
    "$@" --help >"$WORK/$name.help" 2>/dev/null
    local n=0 line
    while IFS= read -r line; do
        n=$((n + 1))
        local dir="$WORK/$name.$n"
        mkdir -p "$dir"
        local s
        for s in $sub; do cp "$DATA/$s"/* "$dir/"; done
        local -a words
        read -r -a words <<<"$line"
        # The program as the help names it, then its arguments.
        local -a cmd
        case "${words[0]}" in
        attn) cmd=("$ATTN" "${words[@]:1}") ;;
        inspect_self_attention) cmd=("$INSPECT" "${words[@]:1}") ;;
        inspect_modern_attention) cmd=("$MODERN" "${words[@]:1}") ;;
        train_attention) cmd=("$TRAIN" "${words[@]:1}") ;;
        *) bad "$name example $n starts with an unknown program: $line"; continue ;;
        esac
        say "$name example $n runs as printed: $line"
        (cd "$dir" && "${cmd[@]}" >"$OUT_FILE" 2>"$ERR_FILE")
        local rc=$?
        if [ "$rc" -ne 0 ]; then
            bad "exit $rc: $line ($(head -c 300 "$ERR_FILE"))"
            continue
        fi
        ok
        # Every file named after an output option exists and is not empty.
        local i
        for ((i = 1; i < ${#words[@]} - 1; i++)); do
            case "${words[i]}" in
            --output | --attention | --lse | --grad-query | --grad-key | --grad-value | \
                --grad-input | --grad-weights | --grad-bias | --grad-sinks | --heatmap)
                if [ -s "$dir/${words[i + 1]}" ]; then ok; else
                    bad "$line: ${words[i]} ${words[i + 1]} was not written"
                fi
                ;;
            esac
        done
    done < <(examples "$WORK/$name.help")
    if [ "$n" -eq "$want" ]; then ok; else
        bad "$name --help has $n examples, expected $want (is the EXAMPLE section still there?)"
    fi
}

run_examples attn "sdpa forward" 2 "$ATTN"
run_examples sdpa sdpa 4 "$ATTN" sdpa
run_examples forward forward 4 "$ATTN" forward
run_examples decode decode 1 "$ATTN" decode
run_examples inspect "" 4 "$INSPECT"
run_examples modern "" 2 "$MODERN"
run_examples train "" 2 "$TRAIN"

cli_summary test_cli_help_examples
