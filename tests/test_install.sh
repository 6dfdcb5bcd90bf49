#!/usr/bin/env bash
# `cmake --install` puts the library, header, pkg-config file and CMake package in a
# prefix, and a program outside the tree builds against them both ways: with
# pkg-config (shared and static) and with find_package(attn).
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
fail=0
cmake --install "$ATTN_BUILD_DIR" --prefix "$prefix" >"$tmp/install.log" 2>&1 \
    || { echo "FAIL: cmake --install"; cat "$tmp/install.log"; exit 1; }
for f in include/attn.h lib/libattn.a lib/pkgconfig/attn.pc lib/cmake/attn/attnConfig.cmake bin/attn bin/inspect_self_attention; do
    found=$(ls "$prefix"/$f "$prefix"/lib*/${f#lib/} 2>/dev/null | head -1)
    [ -n "$found" ] || { echo "FAIL: $f not installed"; fail=1; }
done
libdir=$(dirname "$(ls "$prefix"/lib*/libattn.a | head -1)")
export PKG_CONFIG_PATH="$libdir/pkgconfig"
src="$ATTN_SOURCE_DIR/tests/consumer/consumer.c"
if command -v pkg-config >/dev/null; then
    cc -std=c11 "$src" $(pkg-config --cflags --libs attn) -Wl,-rpath,"$libdir" -o "$tmp/pc_shared" \
        && "$tmp/pc_shared" && echo "ok   pkg-config, shared library" || { echo "FAIL: pkg-config shared"; fail=1; }
    cc -std=c11 "$src" $(pkg-config --cflags attn) "$libdir/libattn.a" $(pkg-config --libs-only-other --static attn) -lm -lpthread -o "$tmp/pc_static" \
        && "$tmp/pc_static" && echo "ok   pkg-config, static library" || { echo "FAIL: pkg-config static"; fail=1; }
else
    echo "FAIL: pkg-config is not installed (.ci/run installs Debian's pkgconf)"; fail=1
fi
cmake -S "$ATTN_SOURCE_DIR/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cfg.log" 2>&1 \
    && cmake --build "$tmp/consumer" >"$tmp/build.log" 2>&1 \
    && "$tmp/consumer/consumer_shared" && "$tmp/consumer/consumer_static" \
    && echo "ok   find_package(attn), shared and static" \
    || { echo "FAIL: find_package consumer"; cat "$tmp/cfg.log" "$tmp/build.log"; fail=1; }
exit $fail
