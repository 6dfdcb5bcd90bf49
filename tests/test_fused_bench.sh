#!/usr/bin/env bash
# `attn bench`: its help, its JSON (one object a line, every line with SPEC §4's
# fields, whatever its kind), the paths --impl all adds, ATTN_ARCH reported in the
# header, and usage errors (exit 2, one line on stderr). Timings themselves are never asserted.
set -u
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

if "$ATTN" bench --help >"$tmp/help" 2>&1 && grep -q "S6" "$tmp/help" && grep -q "S7" "$tmp/help" \
    && grep -q "S8" "$tmp/help" && grep -q -- "--impl" "$tmp/help" && grep -q "ATTN_ARCH" "$tmp/help" \
    && grep -q -- "--kv-heads" "$tmp/help" && grep -q -- "--window" "$tmp/help" \
    && grep -q -- "--softcap" "$tmp/help" && grep -q -- "--causal-bottom-right" "$tmp/help"; then
    ok "--help names the shapes S1-S8, the options, --impl and ATTN_ARCH"
else bad "--help"; fi

# SPEC section 4's fields, first on every line and in this order; a field that means
# nothing for a line's kind is null (see attn bench --help, JSON OUTPUT).
SPEC_FIELDS='^\{"kind":"[a-z_]+","impl":"[^"]+","B":([0-9]+|null),"H":([0-9]+|null),"Tq":([0-9]+|null),"Tk":([0-9]+|null),"D":([0-9]+|null),"mask":("[a-z_]+"|null),"threads":[0-9]+,"median_ms":([0-9.]+|null),"gflops":([0-9.]+|null),"default_arch":"[a-z0-9]+","reason":"[^"]+","peak_gflops_1t":[0-9.]+,"peak_gflops":[0-9.]+(,.*)?\}$'
# every_line_has_spec_fields NAME FILE: FILE has lines, each one JSON object with them.
every_line_has_spec_fields() {
    local n bad_lines
    n=$(wc -l <"$2")
    bad_lines=$(grep -Evc "$SPEC_FIELDS" "$2")
    if [ "$n" -ge 1 ] && [ "$bad_lines" -eq 0 ]; then ok "$1: all $n lines carry SPEC's fields"
    else bad "$1: $bad_lines of $n lines lack SPEC's fields: $(grep -Ev "$SPEC_FIELDS" "$2" | head -2)"; fi
}

if "$ATTN" bench --shape S1 --runs 3 --threads 1 --json --impl all >"$tmp/json" 2>"$tmp/err"; then
    every_line_has_spec_fields "--json --impl all" "$tmp/json"
    # The first line too (it used to be a setup line without them), with S1's sizes
    # and a positive time on every sdpa line; ref, portable C and the default among
    # the paths.
    sdpa=$(grep -c '"kind":"sdpa"' "$tmp/json")
    first=$(head -n 1 "$tmp/json")
    if [ "$sdpa" -ge 3 ] && [ "$sdpa" -eq "$(wc -l <"$tmp/json")" ] &&
       [ "$(grep -c '"impl":"[^"]*","B":2,"H":4,"Tq":5,"Tk":5,"D":4,"mask":"none","threads":1,"median_ms":[0-9.]*[1-9][0-9.]*,"gflops":[0-9.]*[1-9].*"shape":"S1","runs":3,"min_ms":[0-9.]*' "$tmp/json")" -eq "$sdpa" ] &&
       case "$first" in *'"kind":"sdpa"'*'"median_ms":'[0-9]*) true ;; *) false ;; esac &&
       grep -q '"impl":"ref"' "$tmp/json" && grep -q '"impl":"fused:scalar"' "$tmp/json" &&
       grep -q '"impl":"default:' "$tmp/json"; then
        ok "--json: the first line is a measurement, S1's sizes and a time on every line, every path"
    else bad "--json content: $(cat "$tmp/json")"; fi
else bad "--json run: $(cat "$tmp/err")"; fi

# Each attention line's peak_frac is of the peak of the instruction set its path
# runs on (peak_isa, isa_peak_gflops): the reference and the portable build against
# the portable chains, the AVX2 build against 256-bit chains, the default path on
# the best ISA against the run's own peak_gflops.
if [ -s "$tmp/json" ]; then
    isa_ok=1
    grep -q '"impl":"ref".*"peak_isa":"scalar","isa_peak_gflops":[0-9.]*[1-9]' "$tmp/json" || isa_ok=0
    grep -q '"impl":"fused:scalar".*"peak_isa":"scalar","isa_peak_gflops":[0-9.]*[1-9]' "$tmp/json" || isa_ok=0
    if grep -q '"impl":"fused:avx2"' "$tmp/json"; then
        grep -q '"impl":"fused:avx2".*"peak_isa":"avx2","isa_peak_gflops":[0-9.]*[1-9]' "$tmp/json" || isa_ok=0
    fi
    # The default line's ISA peak is the run's peak_gflops, the same figure.
    def=$(grep '"impl":"default:' "$tmp/json" | head -n 1)
    pk=$(printf '%s' "$def" | sed -n 's/.*"peak_gflops":\([0-9.]*\).*/\1/p')
    ipk=$(printf '%s' "$def" | sed -n 's/.*"isa_peak_gflops":\([0-9.]*\).*/\1/p')
    case "$(printf '%s' "$def" | sed -n 's/.*"impl":"default:\([a-z0-9]*\)".*/\1/p')" in
        ref | scalar | avx2) ;; # read against another probe than the best ISA's
        *) [ -n "$pk" ] && [ "$pk" = "$ipk" ] || isa_ok=0 ;;
    esac
    if [ "$isa_ok" -eq 1 ]; then ok "--json: each line's %peak is of its own ISA's peak (peak_isa, isa_peak_gflops)"
    else bad "peak_isa fields: $(grep -o '"impl":"[^"]*"\|"peak_isa":"[^"]*","isa_peak_gflops":[0-9.]*\|"peak_gflops":[0-9.]*' "$tmp/json" | tr '\n' ' ')"; fi
fi
if grep -q "peak of the instruction" "$tmp/help" && grep -q "256-bit" "$tmp/help"; then
    ok "--help says %peak is of the peak of the ISA a line runs on"
else bad "--help does not say which peak %peak is of"; fi

# The other kinds: their lines carry the same fields (null where meaningless) and
# their own figures.
if "$ATTN" bench --peak --threads 1 --json >"$tmp/peak" 2>"$tmp/err"; then
    every_line_has_spec_fields "--peak --json" "$tmp/peak"
    grep -q '"kind":"peak","impl":"fma:[a-z0-9]*","B":null,.*"median_ms":null,"gflops":[0-9.]*[1-9]' "$tmp/peak" \
        && ok "--peak: gflops is the peak, no time" || bad "--peak line: $(cat "$tmp/peak")"
else bad "--peak run: $(cat "$tmp/err")"; fi
if "$ATTN" bench --gemm --size 48 --runs 2 --threads 1 --json >"$tmp/gemm" 2>"$tmp/err"; then
    every_line_has_spec_fields "--gemm --json" "$tmp/gemm"
    grep -q '"kind":"gemm",.*"mask":null,"threads":1,"median_ms":[0-9.]*[1-9].*"M":48,"N":48,"K":48' "$tmp/gemm" \
        && ok "--gemm: M, N, K and a time" || bad "--gemm line: $(cat "$tmp/gemm")"
else bad "--gemm run: $(cat "$tmp/err")"; fi
if "$ATTN" bench --mha --seq-len 16 --embed-dim 32 --num-heads 4 --causal --runs 2 --threads 1 --json \
    >"$tmp/mha" 2>"$tmp/err"; then
    every_line_has_spec_fields "--mha --json" "$tmp/mha"
    grep -q '"kind":"mha","impl":"default","B":1,"H":4,"Tq":16,"Tk":16,"D":8,"mask":"causal","threads":1,.*"E":32' "$tmp/mha" \
        && ok "--mha: the attention shape and E" || bad "--mha line: $(cat "$tmp/mha")"
else bad "--mha run: $(cat "$tmp/err")"; fi
if "$ATTN" bench --bandwidth --runs 1 --threads 1 --json >"$tmp/bw" 2>"$tmp/err"; then
    every_line_has_spec_fields "--bandwidth --json" "$tmp/bw"
    grep -q '"kind":"bandwidth","impl":"stream",.*"gflops":null,.*"gbs":[0-9.]*[1-9]' "$tmp/bw" &&
        grep -q '"kind":"kv_stream",.*"B":1,"H":32,"Tq":1,"Tk":4096,"D":128,.*"kv_gbs":[0-9.]*[1-9]' "$tmp/bw" \
        && ok "--bandwidth: the stream rate and S5 against it" || bad "--bandwidth lines: $(cat "$tmp/bw")"
    # The probe and every decode shape read copies that together exceed the
    # last-level cache (at least 2 of them), and each shape's fraction comes from
    # at least 5 pairs interleaved with the probe: a figure read from a cache, or
    # against a bandwidth measured at another moment, is not what it claims.
    copies=$(grep -c '"cold_copies":\([2-9]\|[1-9][0-9]\)[,}]' "$tmp/bw")
    pairs=$(grep -c '"kind":"kv_stream",.*"pairs":\([5-9]\|[1-9][0-9]\),' "$tmp/bw")
    [ "$copies" = 4 ] && [ "$pairs" = 3 ] \
        && ok "--bandwidth: the probe, S5, S7 and S9 rotate through copies; S5, S7, S9 in pairs" \
        || bad "--bandwidth: $copies lines with 2 or more copies (want 4), $pairs kv_stream lines with 5 or more pairs (want 3): $(cat "$tmp/bw")"
else bad "--bandwidth run: $(cat "$tmp/err")"; fi

if ATTN_ARCH=scalar "$ATTN" bench --shape S1 --runs 1 --threads 1 >"$tmp/out" 2>&1 \
    && grep -q "forced by ATTN_ARCH=scalar" "$tmp/out" && grep -q "default:scalar" "$tmp/out"; then
    ok "ATTN_ARCH=scalar is what the default path runs, and the header says so"
else bad "ATTN_ARCH report: $(head -3 "$tmp/out")"; fi

if "$ATTN" bench --batch 1 --heads 2 --query-len 17 --key-len 33 --head-dim 8 --padding --runs 2 --json \
    >"$tmp/custom" 2>&1 && grep -q '"Tq":17,"Tk":33,"D":8,"mask":"padding"' "$tmp/custom"; then
    ok "a custom shape with a padding mask"
else bad "custom shape: $(cat "$tmp/custom")"; fi

# Section 6's options on a custom shape: the JSON line carries them, and a window's
# FLOPs count only the pairs it leaves visible (Tq = Tk = 1024, window 63,0: 64*65/2
# + 960*64 = 63520 pairs, 4*H*D = 256 FLOPs each), so gflops * median_ms = 16.26 MFLOP.
if "$ATTN" bench --batch 1 --heads 4 --kv-heads 2 --query-len 3 --key-len 40 --head-dim 8 --causal-bottom-right \
    --window 5,0 --softcap 30 --runs 2 --threads 1 --json --impl all >"$tmp/opts" 2>"$tmp/err"; then
    every_line_has_spec_fields "options --json --impl all" "$tmp/opts"
    n=$(wc -l <"$tmp/opts")
    if [ "$n" -ge 3 ] && [ "$(grep -c '"H":4,"Tq":3,"Tk":40,"D":8,"mask":"causal_bottom_right",.*"kv_heads":2,"window":\[5,0\],"softcap":30[,}]' "$tmp/opts")" -eq "$n" ]; then
        ok "--kv-heads, --causal-bottom-right, --window and --softcap reach every JSON line"
    else bad "options JSON: $(head -2 "$tmp/opts")"; fi
else bad "options run: $(cat "$tmp/err")"; fi
if "$ATTN" bench --query-len 1024 --head-dim 64 --window 63,0 --runs 2 --threads 1 --json >"$tmp/win" 2>"$tmp/err" &&
    grep -q '"window":\[63,0\],"softcap":null' "$tmp/win" &&
    awk -F'"median_ms":|,"gflops":|,"default_arch"' '{ f = $2 * $3 * 1e6; r = f / 16261120; exit !(r > 0.99 && r < 1.01) }' "$tmp/win"; then
    ok "a window's FLOPs are its visible pairs' (16.26 MFLOP for 1024 rows, window 63,0)"
else bad "window FLOPs: $(cat "$tmp/win" "$tmp/err")"; fi
if "$ATTN" bench --query-len 4 --key-len 9 --head-dim 2 --causal --runs 1 --threads 1 --json >"$tmp/tl" 2>"$tmp/err" &&
    grep -q '"Tq":4,"Tk":9,"D":2,"mask":"causal"' "$tmp/tl"; then
    ok "--causal with Tq != Tk runs (top-left is defined for any Tq, Tk)"
else bad "causal Tq != Tk: $(cat "$tmp/tl" "$tmp/err")"; fi
if "$ATTN" bench --shape S7 --runs 1 --threads 1 --json >"$tmp/s7" 2>"$tmp/err" &&
    grep -q '"B":1,"H":32,"Tq":1,"Tk":8192,"D":128,"mask":"causal_bottom_right",.*"shape":"S7",.*"kv_heads":8,"window":null' "$tmp/s7"; then
    ok "S7 is SPEC's GQA decode step (H 32, Hkv 8, Tk 8192, bottom-right causal)"
else bad "S7: $(cat "$tmp/s7" "$tmp/err")"; fi

# S9 runs through the KV cache: one batched step over sequences of 1024 .. 4096
# positions, the longest as Tk and the lengths on the line.
if "$ATTN" bench --shape S9 --runs 1 --threads 1 --json >"$tmp/s9" 2>"$tmp/err" &&
    grep -q '"kind":"sdpa","impl":"kv:[a-z0-9]*","B":4,"H":16,"Tq":1,"Tk":4096,"D":64,"mask":"causal_bottom_right",.*"shape":"S9",.*"lengths":\[1024,2048,3072,4096\],"kv_gbs":[0-9.]*[1-9]' "$tmp/s9"; then
    every_line_has_spec_fields "S9 --json" "$tmp/s9"
    ok "S9 is SPEC's batched decode step (B 4, H 16, one length per sequence), through the KV cache"
else bad "S9: $(cat "$tmp/s9" "$tmp/err")"; fi
# The decode loop: one line per head shape (S5, S7, S9), a positive median step, and
# the allocations its steps made, which must be none.
if "$ATTN" bench --decode --prefill 40 --steps 5 --threads 2 --json >"$tmp/dec" 2>"$tmp/err"; then
    every_line_has_spec_fields "--decode --json" "$tmp/dec"
    if [ "$(grep -c '"kind":"decode",.*"Tq":1,"Tk":45,.*"median_ms":[0-9.]*[1-9].*"prefill":40,"steps":5,.*"allocs":0,"allocs_per_step":0.000' "$tmp/dec")" -eq 3 ] &&
        grep -q '"shape":"S7","kv_heads":8' "$tmp/dec" && grep -q '"B":4,"H":16,.*"shape":"S9"' "$tmp/dec"; then
        ok "--decode: S5, S7 and S9's head shapes, a median step each, zero allocations per step"
    else bad "--decode lines: $(cat "$tmp/dec")"; fi
else bad "--decode run: $(cat "$tmp/err")"; fi
# Steps of several tokens (--tq): each step appends 12 tokens per sequence and
# attends their 12 query rows, so the capacity is 40 + 3 x 12 = 76; still no
# allocation in the steps (16-bit: the tile path's batch, issue 16).
if "$ATTN" bench --decode --prefill 40 --steps 3 --tq 12 --dtype bf16 --threads 2 --json >"$tmp/dec" 2>"$tmp/err"; then
    if [ "$(grep -c '"kind":"decode",.*"Tq":12,"Tk":76,.*"median_ms":[0-9.]*[1-9].*"prefill":40,"steps":3,.*"allocs":0,"allocs_per_step":0.000,"dtype":"bfloat16"' "$tmp/dec")" -eq 3 ]; then
        ok "--decode --tq 12: steps of 12 tokens on S5, S7 and S9's head shapes, no allocation"
    else bad "--decode --tq lines: $(cat "$tmp/dec")"; fi
else bad "--decode --tq run: $(cat "$tmp/err")"; fi
# --backward: two lines per path, the backward alone (2.5 x the forward's FLOPs)
# and forward + backward (3.5 x), with SPEC's fields and positive times.
if "$ATTN" bench --backward --batch 2 --heads 4 --kv-heads 2 --query-len 17 --head-dim 8 --causal \
    --runs 2 --threads 2 --json >"$tmp/bwd" 2>"$tmp/err"; then
    every_line_has_spec_fields "--backward --json" "$tmp/bwd"
    if grep -q '"kind":"sdpa_backward",.*"B":2,"H":4,"Tq":17,"Tk":17,"D":8,"mask":"causal",.*"median_ms":[0-9.]*[1-9].*"kv_heads":2,"flop_factor":2.5' "$tmp/bwd" &&
        grep -q '"kind":"sdpa_fwd_bwd",.*"median_ms":[0-9.]*[1-9].*"flop_factor":3.5' "$tmp/bwd" &&
        [ "$(wc -l <"$tmp/bwd")" -eq 2 ]; then
        ok "--backward: the backward and forward + backward, 2.5x and 3.5x the forward's FLOPs"
    else bad "--backward lines: $(cat "$tmp/bwd")"; fi
else bad "--backward run: $(cat "$tmp/err")"; fi
# A custom shape with both --causal and --padding is named for both in the mask
# field (it said "causal" alone).
if "$ATTN" bench --backward --batch 2 --heads 2 --query-len 9 --head-dim 4 --causal --padding \
    --runs 1 --threads 1 --json >"$tmp/bwdp" 2>"$tmp/err"; then
    if [ "$(grep -c '"mask":"causal_padding"' "$tmp/bwdp")" -eq 2 ]; then
        ok "--backward --causal --padding: the mask field says causal_padding"
    else bad "--backward --causal --padding lines: $(cat "$tmp/bwdp")"; fi
else bad "--backward --causal --padding run: $(cat "$tmp/err")"; fi
# The decoding loop out of memory (a 1M-token cache under a 4 GB address-space
# limit) says why on each shape's line; the benchmark's own allocations used to
# print an empty message. A sanitizer's runtime reserves more address space than
# the limit, so the check runs on plain builds only.
if ldd "$ATTN" 2>/dev/null | grep -q 'libasan\|libtsan'; then
    ok "--decode out of memory: skipped under a sanitizer (it needs ulimit -v)"
else
    (ulimit -v 4000000; "$ATTN" bench --decode --prefill 1048576 --steps 1048576 --threads 1) \
        >"$tmp/out" 2>"$tmp/err"; rc=$?
    if [ "$rc" -eq 1 ] && [ "$(grep -c 'failed: out of memory' "$tmp/err")" -eq 3 ] &&
        ! grep -q 'failed: $' "$tmp/err"; then
        ok "--decode out of memory: exit 1, each shape's line says out of memory"
    else bad "--decode out of memory: exit $rc, stderr: $(cat "$tmp/err")"; fi
fi

refuse() { # name, args...
    local name=$1; shift
    "$ATTN" bench "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ]; then
        ok "$name: $(cat "$tmp/err")"
    else bad "$name: exit $rc, stderr '$(cat "$tmp/err")'"; fi
}
refuse "unknown shape" --shape S10
refuse "unknown impl" --impl fastest
refuse "--causal with --causal-bottom-right" --query-len 4 --head-dim 2 --causal --causal-bottom-right
refuse "--kv-heads that does not divide --heads" --heads 6 --kv-heads 4 --query-len 4 --head-dim 2
refuse "a window side below -1" --query-len 4 --head-dim 2 --window -2,0
refuse "a window that is not LEFT,RIGHT" --query-len 4 --head-dim 2 --window 3
refuse "a softcap of 0" --query-len 4 --head-dim 2 --softcap 0
refuse "a negative softcap" --query-len 4 --head-dim 2 --softcap -1
refuse "--window without a custom shape" --shape S2 --window 3,0
refuse "--softcap without a custom shape" --softcap 30
refuse "--causal-bottom-right without a custom shape" --causal-bottom-right
refuse "a non-number" --threads two
refuse "an unknown option" --frobnicate
refuse "more threads than 64 bits hold" --threads 99999999999999999999
refuse "two benchmarks at once" --peak --mha
refuse "--decode with --bandwidth" --decode --bandwidth
refuse "--backward with --peak" --backward --peak
refuse "--backward on S9 (a decode step)" --backward --shape S9
refuse "--decode with a shape" --decode --shape S5
refuse "--prefill without --decode" --prefill 16
refuse "--steps without --decode" --shape S1 --steps 4
refuse "--decode with --runs (it times each step once)" --decode --runs 3
refuse "--decode with an --impl (it runs the default path)" --decode --impl avx2
refuse "--tq without --decode" --shape S1 --tq 16
refuse "--tq 0" --decode --tq 0
refuse "a SPEC shape and a custom shape at once" --shape S1 --query-len 4 --head-dim 2
refuse "a custom shape without --head-dim" --query-len 4
refuse "--padding without a custom shape" --padding
refuse "--mha with an impl it does not run" --mha --impl avx2
refuse "--embed-dim not divisible by --num-heads" --mha --embed-dim 10 --num-heads 3
refuse "--backward with --impl avx512bf16 (the backward is float32, where it is avx512)" \
    --backward --impl avx512bf16 --query-len 4 --head-dim 2

# An --impl path this CPU cannot run is an error (exit 1, one line naming it), not a
# table with no line and exit 0 (what it was); where the CPU runs it, its line is
# printed.
for isa in amx avx512bf16 avx512 avx2; do
    "$ATTN" bench --impl "$isa" --dtype bf16 --query-len 4 --head-dim 2 --runs 1 --threads 1 \
        --json >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "--impl $isa" "$tmp/err" &&
        [ ! -s "$tmp/out" ]; then
        ok "--impl $isa where this CPU cannot run it: $(cat "$tmp/err")"
    elif [ "$rc" -eq 0 ] && grep -q "\"impl\":\"fused:$isa\"" "$tmp/out"; then
        ok "--impl $isa runs here and prints its line"
    else bad "--impl $isa: exit $rc, stderr '$(cat "$tmp/err")', $(wc -l <"$tmp/out") lines"; fi
done
exit $fail
