#!/usr/bin/env bash
# An embedder's view of `cmake --install`: the library, header, pkg-config file and
# CMake package land in a prefix, and a program outside the tree builds against
# them every way the README and attn.h offer - pkg-config (shared, and static with
# nothing but what attn.pc says), plain `cc -I -L -lattn`, the static archive with
# attn.h's -lm -lpthread, C++ (attn.h's extern "C"), find_package(attn) - and the
# header compiles alone as strict C99 and C11. The versions agree everywhere (header,
# library at run time, attn.pc, the CMake package, the soname, the Python package);
# a DESTDIR install is relocatable; and removing what install_manifest.txt lists
# leaves no file behind.
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL: $*"; fail=1; }

cmake --install "$ATTN_BUILD_DIR" --prefix "$prefix" >"$tmp/install.log" 2>&1 \
    || { echo "FAIL: cmake --install"; cat "$tmp/install.log"; exit 1; }
cp "$ATTN_BUILD_DIR/install_manifest.txt" "$tmp/manifest"
for f in include/attn.h lib/libattn.a lib/libattn.so lib/pkgconfig/attn.pc lib/cmake/attn/attnConfig.cmake \
         bin/attn bin/inspect_self_attention bin/inspect_modern_attention bin/train_attention; do
    found=$(ls "$prefix"/$f "$prefix"/lib*/${f#lib/} 2>/dev/null | head -1)
    [ -n "$found" ] || bad "$f not installed"
done
libdir=$(dirname "$(ls "$prefix"/lib*/libattn.a | head -1)")
export PKG_CONFIG_PATH="$libdir/pkgconfig"
src="$ATTN_SOURCE_DIR/tests/consumer/consumer.c"
cc=${CC:-cc}

# Every place that states the version states the same one.
v_header=$(sed -n 's/^#define ATTN_VERSION_STRING "\(.*\)"$/\1/p' "$prefix/include/attn.h")
v_cmake=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$libdir/cmake/attn/attnConfigVersion.cmake")
v_python=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ATTN_SOURCE_DIR/python/pyproject.toml")
[ -n "$v_header" ] && [ "$v_cmake" = "$v_header" ] && [ "$v_python" = "$v_header" ] \
    && ok "the version is $v_header in attn.h, the CMake package and python/pyproject.toml" \
    || bad "versions differ: attn.h '$v_header', attnConfigVersion.cmake '$v_cmake', pyproject.toml '$v_python'"
# Before 1.0 the soname carries the minor version (CMakeLists.txt says why).
major=${v_header%%.*}; minor=${v_header#*.}; minor=${minor%%.*}
want_soname=libattn.so.$major; [ "$major" = 0 ] && want_soname=libattn.so.$major.$minor
soname=$(readelf -d "$libdir/libattn.so" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$soname" = "$want_soname" ] && ok "the shared library's soname is $soname" \
    || bad "the shared library's soname is '$soname', want '$want_soname' for version $v_header"

if command -v pkg-config >/dev/null; then
    v_pc=$(pkg-config --modversion attn)
    [ "$v_pc" = "$v_header" ] && ok "pkg-config --modversion attn says $v_pc" \
        || bad "pkg-config --modversion attn says '$v_pc', attn.h '$v_header'"
    # The README's command, plus an rpath since the prefix is not the loader's.
    $cc -std=c11 "$src" $(pkg-config --cflags --libs attn) -Wl,-rpath,"$libdir" -o "$tmp/pc_shared" \
        && "$tmp/pc_shared" && ok "pkg-config, shared library" || bad "pkg-config shared"
    # Static with nothing but attn.pc's own flags: a folder holding only libattn.a
    # makes -lattn pick it, so Libs.private must name every library it needs.
    mkdir "$tmp/static_only" && cp "$libdir/libattn.a" "$tmp/static_only/"
    $cc -std=c11 "$src" $(pkg-config --cflags attn) \
        $(pkg-config --define-variable=libdir="$tmp/static_only" --static --libs attn) -o "$tmp/pc_static" \
        && "$tmp/pc_static" && ok "pkg-config --static, the static library with attn.pc's Libs.private alone" \
        || bad "pkg-config --static (does Libs.private name -lm and -lpthread?)"
else
    bad "pkg-config is not installed (.ci/run installs Debian's pkgconf)"
fi

# Without pkg-config: the flags attn.h's opening comment gives.
$cc -std=c11 "$src" -I"$prefix/include" -L"$libdir" -lattn -Wl,-rpath,"$libdir" -o "$tmp/plain_shared" \
    && "$tmp/plain_shared" && ok "cc -I -L -lattn, shared library" || bad "cc -I -L -lattn"
# Without an rpath the program finds the library through LD_LIBRARY_PATH (README).
$cc -std=c11 "$src" -I"$prefix/include" -L"$libdir" -lattn -o "$tmp/no_rpath" \
    && LD_LIBRARY_PATH="$libdir" "$tmp/no_rpath" && ok "without an rpath, through LD_LIBRARY_PATH" \
    || bad "cc -I -L -lattn without an rpath, run with LD_LIBRARY_PATH"
$cc -std=c11 "$src" -I"$prefix/include" "$libdir/libattn.a" -lm -lpthread -o "$tmp/plain_static" \
    && "$tmp/plain_static" && ok "cc libattn.a -lm -lpthread, static library" || bad "cc libattn.a -lm -lpthread"

# The header alone under the strictest flags a C program might use.
printf '#include <attn.h>\nint main(void) { return attn_status_name(ATTN_OK)[0] == 0; }\n' >"$tmp/header.c"
for std in c99 c11; do
    $cc -std=$std -pedantic -Wall -Wextra -Werror -Wstrict-prototypes -Wshadow -I"$prefix/include" \
        -c "$tmp/header.c" -o "$tmp/header.o" && ok "attn.h compiles with -std=$std -pedantic -Wall -Wextra -Werror" \
        || bad "attn.h with -std=$std -pedantic -Werror"
done

# C++: the consumer compiled as C++ links against the C library only if attn.h
# declares its functions extern "C".
cxx=""
for c in ${CXX:-} c++ g++ clang++; do command -v "$c" >/dev/null && { cxx=$c; break; }; done
if [ -n "$cxx" ]; then
    $cxx -x c++ -std=c++11 -pedantic -Wall -Wextra -Werror "$src" -I"$prefix/include" -L"$libdir" -lattn \
        -Wl,-rpath,"$libdir" -o "$tmp/cxx" && "$tmp/cxx" && ok "C++ ($cxx -std=c++11 -pedantic): extern \"C\" links" \
        || bad "the consumer compiled as C++ with $cxx"
else
    echo "skip C++: no C++ compiler (c++, g++ or clang++) on this machine"
fi

cmake -S "$ATTN_SOURCE_DIR/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cfg.log" 2>&1 \
    && cmake --build "$tmp/consumer" >"$tmp/build.log" 2>&1 \
    && "$tmp/consumer/consumer_shared" && "$tmp/consumer/consumer_static" && "$tmp/consumer/consumer_default" \
    && ok "find_package(attn): attn::attn_shared, attn::attn_static and attn::attn" \
    || { bad "find_package consumer"; cat "$tmp/cfg.log" "$tmp/build.log"; }

# A packager's install: DESTDIR stages the tree for /opt/attn; attn.pc and the
# CMake package find their files from where they lie, so the staged tree works
# before it is moved.
DESTDIR="$tmp/stage" cmake --install "$ATTN_BUILD_DIR" --prefix /opt/attn >"$tmp/dest.log" 2>&1 \
    || { bad "DESTDIR=... cmake --install"; cat "$tmp/dest.log"; }
staged="$tmp/stage/opt/attn"
slib=$(dirname "$(ls "$staged"/lib*/libattn.a 2>/dev/null | head -1)")
if [ -f "$slib/pkgconfig/attn.pc" ] && command -v pkg-config >/dev/null; then
    $cc -std=c11 "$src" $(PKG_CONFIG_PATH="$slib/pkgconfig" pkg-config --cflags --libs attn) \
        -Wl,-rpath,"$slib" -o "$tmp/staged" && "$tmp/staged" \
        && ok "a DESTDIR install: pkg-config from the staged tree" || bad "pkg-config from a DESTDIR install"
else
    bad "a DESTDIR install has no attn.pc under $staged"
fi
# Restore the prefix's manifest (the DESTDIR install wrote its own).
cp "$tmp/manifest" "$ATTN_BUILD_DIR/install_manifest.txt"

# A packager's absolute libdir (-DCMAKE_INSTALL_LIBDIR=/abs/path) cannot be found
# from attn.pc's own place: attn.pc must then name the configured paths as they are.
# Configuring alone writes attn.pc, so no second build is needed.
if command -v pkg-config >/dev/null; then
    cmake -S "$ATTN_SOURCE_DIR" -B "$tmp/abs" -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_TOOLS=OFF \
        -DCMAKE_INSTALL_PREFIX="$tmp/absprefix" -DCMAKE_INSTALL_LIBDIR="$tmp/abslib" >"$tmp/abs.log" 2>&1 \
        || { bad "configure with an absolute CMAKE_INSTALL_LIBDIR"; cat "$tmp/abs.log"; }
    got_libdir=$(PKG_CONFIG_PATH="$tmp/abs" pkg-config --variable=libdir attn)
    got_cflags=$(PKG_CONFIG_PATH="$tmp/abs" pkg-config --cflags attn)
    [ "$got_libdir" = "$tmp/abslib" ] && [ "$(echo $got_cflags)" = "-I$tmp/absprefix/include" ] \
        && ok "an absolute CMAKE_INSTALL_LIBDIR: attn.pc names it as it is" \
        || bad "with CMAKE_INSTALL_LIBDIR=$tmp/abslib attn.pc says libdir '$got_libdir', cflags '$got_cflags'"
fi

# A project that takes the source tree by add_subdirectory() gets the library
# only: attn's tests, programs and exercises stay out of its build, its own build
# type is left alone, and attn::attn names the library as find_package's does.
# Configuring and generating alone shows all of it (an unknown attn::attn stops
# the generate step), so nothing is built.
mkdir -p "$tmp/sub"
cat >"$tmp/sub/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(embedder LANGUAGES C)
add_subdirectory("$ATTN_SOURCE_DIR" attn)
add_executable(consumer_sub "$src")
target_link_libraries(consumer_sub PRIVATE attn::attn)
EOF
if cmake -S "$tmp/sub" -B "$tmp/sub/b" >"$tmp/sub.log" 2>&1; then
    sub_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=\(.*\)$/\1/p' "$tmp/sub/b/CMakeCache.txt")
    sub_targets=$(cmake --build "$tmp/sub/b" --target help 2>/dev/null)
    echo "$sub_targets" | grep -q consumer_sub || bad "add_subdirectory: the target list lacks the project's own target"
    [ -z "$sub_type" ] && ok "add_subdirectory: the project's build type is left unset" \
        || bad "add_subdirectory: attn set the project's CMAKE_BUILD_TYPE to '$sub_type'"
    leaked=$(echo "$sub_targets" | grep -E '\.\.\. (test_args|inspect_self_attention|grade_solutions)$')
    [ -z "$leaked" ] && ok "add_subdirectory: no tests, programs or exercises in the project's build" \
        || bad "add_subdirectory brought in: $leaked"
else
    bad "a project that does add_subdirectory(attn) and links attn::attn does not configure"
    cat "$tmp/sub.log"
fi

# Uninstall: CMake has no uninstall target; install_manifest.txt lists what the
# install put in place, and removing those leaves no file or link in the prefix.
unlisted=$(cd "$prefix" && find . \( -type f -o -type l \) | sed "s|^\.|$prefix|" | sort | comm -23 - <(sort "$tmp/manifest"))
[ -z "$unlisted" ] || bad "installed but not in install_manifest.txt: $unlisted"
xargs rm -f <"$tmp/manifest"
left=$(find "$prefix" \( -type f -o -type l \))
[ -z "$left" ] && ok "removing install_manifest.txt's $(wc -l <"$tmp/manifest") files leaves none in the prefix" \
    || bad "left after removing install_manifest.txt's files: $left"
exit $fail
