#!/usr/bin/env bash
# The output writer through the programs (include/attn.h, "Output sets";
# docs/reliability.md): every claim of the guarantee, tried the way issue 10 tried
# it. `attn sdpa` writes --output and --attention; inspect_self_attention writes
# --dump and --heatmap; both write through one output set per run.
set -u
: "${ATTN:?}" "${INSPECT:?}" "${ATTN_TEST_DATA_DIR:?}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
d="$ATTN_TEST_DATA_DIR/golden/sdpa_cross_mask"
fails=0
checks=0
ok() { checks=$((checks + 1)); echo "ok   $*"; }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL $*"; }
# sdpa OUT ATT: one run of attn sdpa on the golden cross-attention case. A run the
# signal tests start in the background spells the program out ("$ATTN" sdpa
# "${inputs[@]}" ... &), so that $! is the program itself and not a subshell.
inputs=(--query "$d/q.npy" --key "$d/k.npy" --value "$d/v.npy" --mask "$d/mask.npy")
sdpa() { "$ATTN" sdpa "${inputs[@]}" --output "$1" --attention "$2"; }
# No temporary file ("NAME.tmp.RANDOM") anywhere under the folder.
no_temps() { [ -z "$(find "$1" -name '*.tmp.*' 2>/dev/null)" ]; }

mkdir -p "$tmp/ref"
sdpa "$tmp/ref/o.npy" "$tmp/ref/a.npy" || { echo "FAIL the reference run failed"; exit 1; }

# --- a failed run replaces no existing output --------------------------------------
w="$tmp/w"; mkdir -p "$w/adir"
printf 'old output' >"$w/keep.npy"; cp "$w/keep.npy" "$w/keep.orig"
sdpa "$w/keep.npy" "$w/adir" 2>"$tmp/err"; rc=$?
if [ $rc -eq 1 ] && cmp -s "$w/keep.npy" "$w/keep.orig" && no_temps "$w"; then
    ok "--output keep.npy --attention adir (a directory) exits 1 and keep.npy is unchanged: $(cat "$tmp/err")"
else
    bad "--attention adir: exit $rc, keep.npy $(cmp -s "$w/keep.npy" "$w/keep.orig" && echo unchanged || echo CHANGED), temporaries: $(find "$w" -name '*.tmp.*')"
fi

# --- devices -----------------------------------------------------------------------
if sdpa /dev/null /dev/zero 2>"$tmp/err" && [ -c /dev/null ] && [ -c /dev/zero ]; then
    ok "--output /dev/null --attention /dev/zero succeed and both stay character devices"
else
    bad "/dev/null, /dev/zero as outputs: $(cat "$tmp/err"); /dev/null is now: $(ls -l /dev/null)"
fi
sdpa /dev/full "$w/new_a.npy" 2>"$tmp/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "No space left on device" "$tmp/err" && [ ! -e "$w/new_a.npy" ] && [ -c /dev/full ]; then
    ok "--output /dev/full fails with 'no space' and the other output is not created: $(cat "$tmp/err")"
else
    bad "/dev/full: exit $rc, stderr '$(cat "$tmp/err")', new_a.npy $([ -e "$w/new_a.npy" ] && echo exists || echo absent)"
fi
sdpa "$w/keep.npy" /dev/full 2>/dev/null
cmp -s "$w/keep.npy" "$w/keep.orig" && no_temps "$w" \
    && ok "a failing device leaves the run's regular outputs as they were" \
    || bad "--attention /dev/full changed keep.npy or left a temporary file"

# --- a FIFO with a reader, and "-" ---------------------------------------------------
mkfifo "$w/fifo"
cat "$w/fifo" >"$w/from_fifo" & reader=$!
sdpa "$w/fifo" "$w/fa.npy" 2>"$tmp/err"; rc=$?
wait $reader
if [ $rc -eq 0 ] && [ -p "$w/fifo" ] && cmp -s "$w/from_fifo" "$tmp/ref/o.npy"; then
    ok "--output FIFO: the reader gets the whole .npy and the FIFO stays a FIFO"
else
    bad "FIFO: exit $rc ($(cat "$tmp/err")), reader got $(wc -c <"$w/from_fifo") bytes"
fi
sdpa - "$w/sa.npy" >"$w/stdout.npy" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$w/stdout.npy" "$tmp/ref/o.npy" && cmp -s "$w/sa.npy" "$tmp/ref/a.npy" \
    && ok "--output - writes the .npy to standard output (redirected to a file)" \
    || bad "--output - > file: exit $rc, $(cat "$tmp/err")"
sdpa - "$w/sa2.npy" 2>"$tmp/err" | cat >"$w/piped.npy"
cmp -s "$w/piped.npy" "$tmp/ref/o.npy" \
    && ok "--output - writes the .npy into a pipe" || bad "--output - | cat: $(cat "$tmp/err")"
sdpa - "$w/same_as_stdout.npy" >"$w/same_as_stdout.npy" 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "same file" "$tmp/err" \
    && ok "'-' and the file standard output goes to are one file: refused" \
    || bad "- and its redirect target: exit $rc, $(cat "$tmp/err")"

# --- the same file by two names --------------------------------------------------------
cp "$w/keep.orig" "$w/same.npy"
ln -s same.npy "$w/sym.npy"
ln "$w/same.npy" "$w/hard.npy"
for other in "$w/./same.npy" "$w/sym.npy" "$w/hard.npy" "$w/adir/../same.npy"; do
    sdpa "$w/same.npy" "$other" 2>"$tmp/err"; rc=$?
    if [ $rc -eq 1 ] && grep -q "same file" "$tmp/err" && cmp -s "$w/same.npy" "$w/keep.orig" && no_temps "$w"; then
        ok "--output same.npy --attention ${other#"$w"/} is refused before anything is written"
    else
        bad "same file as ${other#"$w"/}: exit $rc, $(cat "$tmp/err")"
    fi
done
(cd "$w" && sdpa fresh.npy ./fresh.npy 2>"$tmp/err"); rc=$?
[ $rc -eq 1 ] && grep -q "same file" "$tmp/err" && [ ! -e "$w/fresh.npy" ] \
    && ok "a new file named 'fresh.npy' and './fresh.npy' is refused too" \
    || bad "new file by two names: exit $rc, $(cat "$tmp/err")"

# --- symbolic links, permission bits, long names ---------------------------------------
cp "$w/keep.orig" "$w/real.npy"; ln -s real.npy "$w/link.npy"
sdpa "$w/link.npy" "$w/la.npy" 2>"$tmp/err"
[ -L "$w/link.npy" ] && cmp -s "$w/real.npy" "$tmp/ref/o.npy" \
    && ok "an output that is a link to a file writes the file and keeps the link" \
    || bad "link output: link $([ -L "$w/link.npy" ] && echo kept || echo replaced), $(cat "$tmp/err")"
cp "$w/keep.orig" "$w/private.npy"; chmod 600 "$w/private.npy"
cp "$w/keep.orig" "$w/shared.npy"; chmod 640 "$w/shared.npy"
sdpa "$w/private.npy" "$w/shared.npy" 2>"$tmp/err"
p1=$(stat -c %a "$w/private.npy"); p2=$(stat -c %a "$w/shared.npy")
[ "$p1" = 600 ] && [ "$p2" = 640 ] && cmp -s "$w/private.npy" "$tmp/ref/o.npy" \
    && ok "replacing a 0600 and a 0640 file keeps 600 and 640" \
    || bad "permission bits after replacing: $p1 (want 600), $p2 (want 640); $(cat "$tmp/err")"
for n in 245 250 255; do
    long=$(printf 'o%.0s' $(seq "$n"))
    sdpa "$w/$long" "$w/${long:0:200}.a" 2>"$tmp/err"; rc=$?
    [ $rc -eq 0 ] && cmp -s "$w/$long" "$tmp/ref/o.npy" && no_temps "$w" \
        && ok "an output named with $n characters is written (its temporary name fits NAME_MAX)" \
        || bad "$n-character name: exit $rc, $(cat "$tmp/err")"
    sdpa "$w/$long" "$w/${long:0:200}.a" 2>/dev/null
    [ $? -eq 0 ] || bad "replacing the $n-character output failed"
done

# --- the heatmap: no fixed temporary name, nothing followed -------------------------------
printf 'victim' >"$w/victim"; ln -s victim "$w/h.svg.tmp"; printf 'pre-existing' >"$w/h.svg.tmp.1"
"$INSPECT" --heatmap "$w/h.svg" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(cat "$w/victim")" = victim ] && [ -L "$w/h.svg.tmp" ] && [ "$(cat "$w/h.svg.tmp.1")" = pre-existing ] \
    && grep -q '</svg>' "$w/h.svg" \
    && ok "--heatmap F neither follows a link at F.tmp nor touches F.tmp.1" \
    || bad "--heatmap with F.tmp planted: exit $rc, $(cat "$tmp/err"), victim: $(cat "$w/victim")"
"$INSPECT" --heatmap - >"$w/h_stdout.svg" 2>"$tmp/err"
tail -c 7 "$w/h_stdout.svg" | grep -q '</svg>' \
    && ok "--heatmap - writes the SVG after the seven lines on standard output" \
    || bad "--heatmap -: $(cat "$tmp/err")"

# --- SIGINT and SIGTERM leave no temporary file ------------------------------------------
# ATTN_TEST_OUTPUT_PAUSE_MS (a test hook, docs/reliability.md) holds the run after
# every temporary file is complete and before any rename.
for sig in INT TERM; do
    s="$tmp/sig_$sig"; mkdir -p "$s/dump"
    ATTN_TEST_OUTPUT_PAUSE_MS=20000 "$ATTN" sdpa "${inputs[@]}" --output "$s/o.npy" \
        --attention "$s/a.npy" 2>/dev/null & pid=$!
    for _ in $(seq 200); do [ -n "$(find "$s" -name '*.tmp.*')" ] && break; sleep 0.05; done
    n_tmp=$(find "$s" -name '*.tmp.*' | wc -l)
    kill -s $sig $pid; wait $pid; rc=$?
    want=$((128 + $(kill -l $sig)))
    if [ "$n_tmp" -eq 2 ] && [ $rc -eq $want ] && no_temps "$s" && [ ! -e "$s/o.npy" ]; then
        ok "SIG$sig while both outputs wait to be renamed: the run ends with status $rc and leaves nothing"
    else
        bad "SIG$sig: $n_tmp temporaries seen, exit $rc (want $want), left: $(ls -A "$s")"
    fi
    ATTN_TEST_OUTPUT_PAUSE_MS=20000 "$INSPECT" --dump "$s/dump" --heatmap "$s/h.svg" >/dev/null 2>&1 & pid=$!
    for _ in $(seq 200); do [ "$(find "$s" -name '*.tmp.*' | wc -l)" -ge 9 ] && break; sleep 0.05; done
    kill -s $sig $pid; wait $pid; rc=$?
    [ $rc -eq $want ] && no_temps "$s" && [ ! -e "$s/h.svg" ] && [ -z "$(ls -A "$s/dump")" ] \
        && ok "SIG$sig during inspect_self_attention --dump --heatmap leaves no file" \
        || bad "SIG$sig inspect: exit $rc, left: $(find "$s" -type f)"
    # --dump into a directory the run makes: the signal removes it too (empty).
    ATTN_TEST_OUTPUT_PAUSE_MS=20000 "$INSPECT" --dump "$s/newdump" >/dev/null 2>&1 & pid=$!
    for _ in $(seq 200); do [ "$(find "$s" -name '*.tmp.*' | wc -l)" -ge 9 ] && break; sleep 0.05; done
    kill -s $sig $pid; wait $pid; rc=$?
    [ $rc -eq $want ] && no_temps "$s" && [ ! -e "$s/newdump" ] \
        && ok "SIG$sig during inspect_self_attention --dump NEWDIR removes NEWDIR it made" \
        || bad "SIG$sig inspect --dump NEWDIR: exit $rc, left: $(ls -A "$s")"
done

# A real write, not the hook: a large --attention ([1, 8, 1024, 1024], 32 MiB) with
# SIGTERM as soon as its temporary file appears. Either the signal came first (then
# nothing is left) or the run finished (then both files are whole).
big="$tmp/big"; mkdir -p "$big/out"
npy_zeros() { # FILE D0 D1 D2 D3: a float32 .npy of zeros
    local hdr="{'descr': '<f4', 'fortran_order': False, 'shape': ($2, $3, $4, $5), }"
    while [ $(((10 + ${#hdr} + 1) % 64)) -ne 0 ]; do hdr="$hdr "; done
    { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $(((${#hdr} + 1) % 256)))\\x$(printf %02x $(((${#hdr} + 1) / 256)))"
      printf '%s\n' "$hdr"; head -c $(($2 * $3 * $4 * $5 * 4)) /dev/zero; } >"$1"
}
npy_zeros "$big/q.npy" 1 8 1024 64
"$ATTN" sdpa --query "$big/q.npy" --key "$big/q.npy" --value "$big/q.npy" \
    --output "$big/out/o.npy" --attention "$big/out/a.npy" 2>/dev/null & pid=$!
for _ in $(seq 400); do [ -n "$(find "$big/out" -name '*.tmp.*')" ] && break; sleep 0.01; done
kill -TERM $pid 2>/dev/null; wait $pid; rc=$?
if [ $rc -eq 143 ] && no_temps "$big/out" && [ -z "$(ls -A "$big/out")" ]; then
    ok "SIGTERM while a 32 MiB output is written: no file left"
elif [ $rc -eq 0 ] && [ "$(stat -c %s "$big/out/a.npy")" -eq $((8 * 1024 * 1024 * 4 + 128)) ]; then
    ok "the 32 MiB run finished before SIGTERM arrived, and its files are whole"
else
    bad "SIGTERM during a large write: exit $rc, left: $(ls -l "$big/out")"
fi

# --- 8 concurrent runs writing the same targets ------------------------------------------
c="$tmp/conc"; mkdir -p "$c"
"$INSPECT" --heatmap "$tmp/ref/h.svg" --dump "$tmp/ref/dump" >/dev/null
for round in 1 2 3; do
    pids=()
    for i in 1 2 3 4 5 6 7 8; do
        if [ $((i % 2)) -eq 0 ]; then sdpa "$c/o.npy" "$c/a.npy" 2>"$c/err$i" & pids+=($!)
        else "$INSPECT" --heatmap "$c/h.svg" --dump "$c/dump" >/dev/null 2>"$c/err$i" & pids+=($!); fi
    done
    st=0; for p in "${pids[@]}"; do wait "$p" || st=1; done
    good=1
    cmp -s "$c/o.npy" "$tmp/ref/o.npy" && cmp -s "$c/a.npy" "$tmp/ref/a.npy" && cmp -s "$c/h.svg" "$tmp/ref/h.svg" || good=0
    for f in "$tmp"/ref/dump/*; do cmp -s "$f" "$c/dump/$(basename "$f")" || good=0; done
    if [ $st -eq 0 ] && [ $good -eq 1 ] && no_temps "$c"; then
        ok "round $round: 8 concurrent runs (4 attn sdpa, 4 inspect --heatmap --dump) on the same targets leave whole, identical files"
    else
        bad "round $round: status $st, files identical: $good, errors: $(cat "$c"/err*), temporaries: $(find "$c" -name '*.tmp.*')"
    fi
done
if command -v xmllint >/dev/null 2>&1; then
    xmllint --noout "$c/h.svg" && ok "the SVG the concurrent runs left is valid XML" || bad "xmllint refuses the SVG"
fi

echo "test_output_cli: $checks checks, $fails failed"
[ $fails -eq 0 ]
