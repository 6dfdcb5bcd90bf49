#!/bin/bash
# test_cli_manual.sh - the manuals of the attn program say what the program does:
# `attn --help` and every subcommand's --help have a man page's sections (the
# programs that read arrays a FILES section too); every option the parser of a
# subcommand knows (its cli_opt table in tools/, macros included) is in its --help,
# and every --option its --help names is one the parser knows; every environment
# variable the library or the program reads (each getenv in src/ and tools/cmd_*,
# tools/bench_*, tools/common_cli.c) is documented in ENVIRONMENT; and `attn help
# COMMAND` is `attn COMMAND --help`. Reads the sources (ATTN_SOURCE_DIR); runs no
# attention, so it takes well under a second.
set -u
. "$(dirname "$0")/cli_lib.sh"
: "${ATTN_SOURCE_DIR:?}"

WORK="$ATTN_TEST_TMP_DIR/cli_manual"
rm -rf "$WORK"
mkdir -p "$WORK"
OUT_FILE="$WORK/stdout"
ERR_FILE="$WORK/stderr"
T="$ATTN_SOURCE_DIR/tools"

# has_line FILE LINE: FILE has a line that is exactly LINE (a section title).
has_line() { grep -qxF -- "$2" "$1"; }

say "attn --help and each subcommand's --help have NAME, SYNOPSIS, the options, NUMBERS, EXIT STATUS, ENVIRONMENT, an example and SEE ALSO"
run 0 "$ATTN" --help
cp "$OUT_FILE" "$WORK/attn.help"
for s in NAME SYNOPSIS COMMANDS NUMBERS "EXIT STATUS" ENVIRONMENT EXAMPLES "SEE ALSO"; do
    has_line "$WORK/attn.help" "$s" && ok || bad "attn --help has no section '$s'"
done
for cmd in sdpa forward decode bench; do
    run 0 "$ATTN" "$cmd" --help
    cp "$OUT_FILE" "$WORK/$cmd.help"
    sections=(NAME SYNOPSIS DESCRIPTION OPTIONS NUMBERS "EXIT STATUS" ENVIRONMENT "SEE ALSO")
    [ "$cmd" != bench ] && sections+=(FILES)
    for s in "${sections[@]}"; do
        has_line "$WORK/$cmd.help" "$s" && ok || bad "attn $cmd --help has no section '$s'"
    done
    if has_line "$WORK/$cmd.help" EXAMPLE || has_line "$WORK/$cmd.help" EXAMPLES; then ok; else
        bad "attn $cmd --help has no EXAMPLE section"
    fi
done

say "the other programs' --help (inspect_self_attention, inspect_modern_attention, train_attention) have NAME, SYNOPSIS, DESCRIPTION, OPTIONS, NUMBERS, EXIT STATUS, ENVIRONMENT, an example and SEE ALSO, and each of their options"
for prog in inspect_self_attention inspect_modern_attention train_attention; do
    run 0 "$ATTN_BUILD_DIR/$prog" --help
    cp "$OUT_FILE" "$WORK/$prog.help"
    for s in NAME SYNOPSIS DESCRIPTION OPTIONS NUMBERS "EXIT STATUS" ENVIRONMENT "SEE ALSO"; do
        has_line "$WORK/$prog.help" "$s" && ok || bad "$prog --help has no section '$s'"
    done
    if has_line "$WORK/$prog.help" EXAMPLE || has_line "$WORK/$prog.help" EXAMPLES; then ok; else
        bad "$prog --help has no EXAMPLE section"
    fi
    # Its cli_opt table and its OPTIONS section name the same options.
    known=$(grep -o '{"[a-z0-9-]*", CLI_' "$T/$prog.c" | sed 's/{"\(.*\)", CLI_/\1/' | sort -u)
    documented=$(grep -oE '^    --[a-z0-9-]+' "$WORK/$prog.help" | sed 's/^ *--//' | grep -vx help | sort -u)
    [ -n "$known" ] || bad "$prog: no cli_opt table found in tools/$prog.c"
    undocumented=$(comm -23 <(echo "$known") <(echo "$documented"))
    unknown=$(comm -13 <(echo "$known") <(echo "$documented"))
    [ -z "$undocumented" ] && ok || bad "$prog --help does not document: $(echo $undocumented)"
    [ -z "$unknown" ] && ok || bad "$prog --help documents options its parser does not know: $(echo $unknown)"
done

say "every manual fits a terminal of 80 columns"
for h in "$WORK"/*.help; do
    long=$(awk 'length > 80 { printf "%d: %s\n", NR, $0 }' "$h")
    [ -z "$long" ] && ok || bad "$(basename "$h" .help) --help has lines over 80 columns: $long"
done

# parser_options CMD: the option names of the subcommand's cli_opt table, one a line:
# the entries {"name", CLI_... of tools/cmd_CMD.c and of the option macros it uses.
parser_options() {
    local src="$T/cmd_$1.c"
    {
        grep -o '{"[a-z0-9-]*", CLI_' "$src"
        if grep -q 'FWD_OPTIONS(' "$src"; then
            grep -o '{"[a-z0-9-]*", CLI_' "$T/cmd_forward.h"
        fi
        local m
        for m in CLI_SDPA_OPTIONS CLI_ROPE_OPTIONS; do
            if grep -q -e "$m(" -e 'FWD_OPTIONS(' "$src"; then
                sed -n "/#define $m(/,/^\$/p" "$T/common_cli.h" | grep -o '{"[a-z0-9-]*", CLI_'
            fi
        done
    } | sed 's/{"\(.*\)", CLI_/\1/' | sort -u
}

say "every line of every manual fits in 80 columns, as a terminal's man page does"
for h in attn sdpa forward decode bench; do
    long=$(awk 'length > 80 { printf "%d: %s\n", NR, $0 }' "$WORK/$h.help")
    [ -z "$long" ] && ok || bad "the $h help has lines over 80 columns: $long"
done

say "every option a subcommand's parser knows is in its --help, and every --option its --help names is known to the parser"
for cmd in sdpa forward decode bench; do
    n=0
    for name in $(parser_options "$cmd"); do
        n=$((n + 1))
        grep -q -- "--$name\b" "$WORK/$cmd.help" && ok || bad "attn $cmd knows --$name but its --help does not mention it"
    done
    # A table of fewer options than the smallest (bench's shapes, sdpa's files) means
    # the extraction above stopped working, not that all is well.
    [ "$n" -ge 20 ] && ok || bad "found only $n options in attn $cmd's parser"
    # A name with a '*' ("the --grad-* outputs") stands for several and is skipped.
    for opt in $(grep -o -- '--[a-z][a-z0-9-]*[*]\?' "$WORK/$cmd.help" | grep -v '[*]$' |
        sed 's/-*$//' | sort -u); do
        case "$opt" in --help) continue ;; esac
        # Two unknown options after it, so that the parser always stops with a
        # usage error (a flag or a value option alike) and nothing ever runs.
        "$ATTN" "$cmd" "$opt" --zz-unknown --zz-unknown2 >/dev/null 2>"$ERR_FILE"
        if grep -qF "unknown option '$opt'" "$ERR_FILE"; then
            bad "attn $cmd --help names $opt, which attn $cmd does not know"
        else ok; fi
    done
done

say "every environment variable the library and the program read is documented in the ENVIRONMENT of attn --help and of each subcommand"
vars=$(cat "$ATTN_SOURCE_DIR"/src/*/*.c "$T"/cmd_*.c "$T"/bench_*.c "$T"/common_cli.c |
    grep -o 'getenv("[A-Z0-9_]*")' | sed 's/getenv("\(.*\)")/\1/' | sort -u)
[ "$(echo "$vars" | wc -w)" -ge 6 ] && ok || bad "found only these getenv calls: $vars"
for v in $vars; do
    for h in attn sdpa forward decode bench; do
        # attn bench's clock is documented where bench is: its own page and attn's.
        [ "$v" = ATTN_BENCH_CLOCK ] && [ "$h" != bench ] && [ "$h" != attn ] && continue
        sed -n '/^ENVIRONMENT$/,/^[A-Z]/p' "$WORK/$h.help" | grep -q "^    $v\b" && ok ||
            bad "$v is read by the code but not in the ENVIRONMENT of the $h help"
    done
done

say "attn help COMMAND prints COMMAND's manual; attn help with an unknown command is a usage error"
for cmd in sdpa forward decode bench; do
    run 0 "$ATTN" help "$cmd"
    cmp -s "$OUT_FILE" "$WORK/$cmd.help" && ok || bad "attn help $cmd differs from attn $cmd --help"
done
run 2 "$ATTN" help nosuch
err_has "no command 'nosuch'"

cli_summary test_cli_manual
