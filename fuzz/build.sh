#!/usr/bin/env bash
# fuzz/build.sh - builds the libFuzzer targets into build-fuzz/ (ignored by git).
#
#   fuzz/build.sh                 # all four targets
#   CC=clang-14 fuzz/build.sh     # another clang
#
# Each target is the library (every src/*/*.c) and its fuzz/fuzz_*.c, built with
# -fsanitize=fuzzer,address,undefined; fuzz_cli also links the attn program's
# subcommands (tools/cmd_forward.c, tools/cmd_sdpa.c, tools/common_cli.c).
# When the compiler has no libFuzzer runtime (Debian: apt-get install clang
# libclang-rt-14-dev), it says so, writes build-fuzz/SKIPPED and exits 0, so CI does
# not fail for a missing tool; fuzz/run.sh then skips too.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/build-fuzz"
CC=${CC:-clang}
JOBS=${JOBS:-2}
mkdir -p "$out/obj"
rm -f "$out/SKIPPED"

skip() {
    echo "fuzz/build.sh: skipped: $1" >&2
    echo "$1" > "$out/SKIPPED"
    exit 0
}

command -v "$CC" >/dev/null 2>&1 || skip "no C compiler '$CC' (install clang and libclang-rt-14-dev)"
probe="$out/probe"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$probe.c"
if ! "$CC" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" > "$probe.log" 2>&1; then
    skip "'$CC -fsanitize=fuzzer,address,undefined' does not link (no libFuzzer runtime? install libclang-rt-14-dev): $(head -c 300 "$probe.log" | tr '\n' ' ')"
fi

SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# Warnings are errors in the fuzz targets only: the library's own -Werror build is
# gcc's (CMake, CI), and a clang-only warning there should not stop the fuzzing.
CFLAGS="-std=c11 -g -O1 -Wall -Wextra $SAN -fsanitize=fuzzer-no-link"
# The tools' objects see the public header only (as in CMakeLists.txt); the library
# and the fuzz targets themselves also see the internal headers.
TOOL_INC="-I$root/include -I$root/tools"
INC="$TOOL_INC"
for d in "$root"/src/*/; do INC="$INC -I${d%/}"; done
X86=0
case "$(uname -m)" in x86_64|amd64|i?86) X86=1 ;; esac
# The bfloat16 kernels need a compiler that knows their instructions (CMakeLists.txt
# checks the same flags).
BF16=0
if [ $X86 = 1 ] && echo 'int main(void){return 0;}' |
    "$CC" -mavx512bf16 -mamx-tile -mamx-bf16 -x c - -o "$out/bf16probe" > /dev/null 2>&1; then
    BF16=1
fi

# The library: every src/*/*.c, ISA files with their flags (as CMakeLists.txt does).
objs=()
jobs=()
for src in "$root"/src/*/*.c; do
    name=$(basename "$src" .c)
    flags="$CFLAGS $INC"
    case "$name" in
    # Every AVX2 file with F16C, as CMakeLists.txt builds them (the avx2 path
    # requires it: float16 keys and values are widened in registers).
    *_avx2) [ $X86 = 1 ] || continue; flags="$flags -mavx2 -mfma -mf16c" ;;
    *_avx512) [ $X86 = 1 ] || continue
              flags="$flags -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma" ;;
    sdpa_bf16_dp|sdpa_bf16_amx) [ $X86 = 1 ] && [ $BF16 = 1 ] || continue
              flags="$flags -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma -mavx512bf16"
              [ $name = sdpa_bf16_amx ] && flags="$flags -mamx-tile -mamx-bf16" ;;
    esac
    [ $X86 = 1 ] && flags="$flags -DATTN_HAVE_X86=1"
    [ $X86 = 1 ] && [ $BF16 = 1 ] && flags="$flags -DATTN_HAVE_BF16_KERNELS=1"
    obj="$out/obj/$name.o"
    objs+=("$obj")
    jobs+=("$CC $flags -c $src -o $obj")
done
for src in cmd_forward cmd_sdpa common_cli; do
    jobs+=("$CC $CFLAGS $TOOL_INC -c $root/tools/$src.c -o $out/obj/tool_$src.o")
done
printf '%s\n' "${jobs[@]}" | xargs -P "$JOBS" -I{} sh -c '{}'

tool_objs=("$out/obj/tool_cmd_forward.o" "$out/obj/tool_cmd_sdpa.o" "$out/obj/tool_common_cli.o")
for t in npy safetensors weights cli; do
    extra=()
    [ $t = cli ] && extra=("${tool_objs[@]}" "-DATTN_FUZZ_DATA_DIR=\"$root/tests/data\""
                          "-DATTN_FUZZ_DIR=\"$root/fuzz\"")
    $CC $CFLAGS -Werror -fsanitize=fuzzer $INC "$root/fuzz/fuzz_$t.c" "${objs[@]}" "${extra[@]}" \
        -lm -lpthread -o "$out/fuzz_$t"
    echo "fuzz/build.sh: built $out/fuzz_$t"
done
