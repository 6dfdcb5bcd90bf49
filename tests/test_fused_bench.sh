#!/usr/bin/env bash
# `attn bench`: its help, its JSON (one object a line with SPEC §4's fields), the
# paths --impl all adds, ATTN_ARCH reported on the setup line, and usage errors
# (exit 2, one line on stderr). Timings themselves are never asserted.
set -u
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

if "$ATTN" bench --help >"$tmp/help" 2>&1 && grep -q "S6" "$tmp/help" && grep -q -- "--impl" "$tmp/help" \
    && grep -q "ATTN_ARCH" "$tmp/help"; then ok "--help names the shapes, --impl and ATTN_ARCH"
else bad "--help"; fi

if "$ATTN" bench --shape S1 --runs 3 --threads 1 --json --impl all >"$tmp/json" 2>"$tmp/err"; then
    # Every line an object; one setup line naming the path and why; every sdpa line
    # with SPEC's fields, S1's sizes and a positive time; ref, portable C and the
    # default among the paths.
    sdpa=$(grep -c '"kind":"sdpa"' "$tmp/json")
    if [ "$(grep -vc '^{.*}$' "$tmp/json")" -eq 0 ] &&
       [ "$(grep -c '"kind":"setup","default_arch":"[a-z0-9]*","reason":"[^"]' "$tmp/json")" -eq 1 ] &&
       [ "$sdpa" -ge 3 ] &&
       [ "$(grep '"kind":"sdpa"' "$tmp/json" | grep -c '"impl":"[^"]*","B":2,"H":4,"Tq":5,"Tk":5,"D":4,"mask":"none","threads":1,"runs":3,"median_ms":[0-9.]*[1-9][0-9.]*,"min_ms":[0-9.]*,"gflops":[0-9.]*[1-9]')" -eq "$sdpa" ] &&
       grep -q '"impl":"ref"' "$tmp/json" && grep -q '"impl":"fused:scalar"' "$tmp/json" &&
       grep -q '"impl":"default:' "$tmp/json"; then
        ok "--json: one object a line, SPEC fields, every path"
    else bad "--json content: $(cat "$tmp/json")"; fi
else bad "--json run: $(cat "$tmp/err")"; fi

if ATTN_ARCH=scalar "$ATTN" bench --shape S1 --runs 1 --threads 1 >"$tmp/out" 2>&1 \
    && grep -q "forced by ATTN_ARCH=scalar" "$tmp/out" && grep -q "default:scalar" "$tmp/out"; then
    ok "ATTN_ARCH=scalar is what the default path runs, and the header says so"
else bad "ATTN_ARCH report: $(head -3 "$tmp/out")"; fi

if "$ATTN" bench --batch 1 --heads 2 --query-len 17 --key-len 33 --head-dim 8 --padding --runs 2 --json \
    >"$tmp/custom" 2>&1 && grep -q '"Tq":17,"Tk":33,"D":8,"mask":"padding"' "$tmp/custom"; then
    ok "a custom shape with a padding mask"
else bad "custom shape: $(cat "$tmp/custom")"; fi

refuse() { # name, args...
    local name=$1; shift
    "$ATTN" bench "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ]; then
        ok "$name: $(cat "$tmp/err")"
    else bad "$name: exit $rc, stderr '$(cat "$tmp/err")'"; fi
}
refuse "unknown shape" --shape S9
refuse "unknown impl" --impl fastest
refuse "causal with Tq != Tk" --query-len 4 --key-len 5 --head-dim 2 --causal
refuse "a non-number" --threads two
refuse "an unknown option" --frobnicate
exit $fail
