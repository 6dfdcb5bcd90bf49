#!/usr/bin/env bash
# The API example in README.md compiles against the public header and the built
# library, runs, and prints the causal weights it promises (row 1 sees keys 0 and 1).
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
readme="$ATTN_SOURCE_DIR/README.md"
awk '/<!-- example:begin/{on=1; next} /<!-- example:end/{on=0} on' "$readme" \
    | sed -e '/^```/d' > "$tmp/example.c"
if [ ! -s "$tmp/example.c" ]; then echo "FAIL: no example block in README.md"; exit 1; fi
lib="$ATTN_BUILD_DIR/libattn.a"
cc=${CC:-cc}
if ! "$cc" -std=c11 -Wall -Wextra -Werror -I"$ATTN_SOURCE_DIR/include" "$tmp/example.c" "$lib" \
        -lm -lpthread -o "$tmp/example" 2>"$tmp/cc.log"; then
    echo "FAIL: README example does not compile:"; cat "$tmp/cc.log"; exit 1
fi
out=$("$tmp/example") || { echo "FAIL: README example exited with $?"; exit 1; }
echo "example printed: $out"
# Row 1 under the causal mask sees keys 0 and 1 only: the third weight is exactly 0,
# and the first two sum to 1.
echo "$out" | awk '{ if ($NF != "0.0000" || ($(NF-2) + $(NF-1)) < 0.9999 || ($(NF-2) + $(NF-1)) > 1.0001) exit 1 }' \
    || { echo "FAIL: unexpected weights"; exit 1; }
echo "ok   the README example compiles, runs and prints causal weights"
