#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Install a built ferry into a scratch prefix the way a user would
# (cmake --install BUILD --prefix P), then build and run a program against it
# with pkg-config and with find_package(ferry) (shared and static), and check
# that every place the version shows agrees with project(ferry VERSION ...):
# the installed header, the library, ferry.pc, the CMake package, and the
# Python package's metadata (python/setup.py) and __version__.
#
#   run_install_test.sh BUILD WORK VERSION CMAKE CC PYTHON [CFLAGS]
#
# CFLAGS (one word list) goes to every compile and link: the sanitizer flags
# of a sanitized build, whose libferry needs its runtime in the program.
set -eu
build=$1 work=$2 version=$3 cmake=$4 cc=$5 python=$6 flags=${7:-}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prefix=$work/prefix

fail() { echo "install: $*" >&2; exit 1; }
same() { [ "$2" = "$version" ] || fail "$1 says version '$2', project() says '$version'"; }

rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install failed"; }
# the libraries may sit in lib/, lib64/ or lib/<multiarch>/ (GNUInstallDirs)
pc=$(find "$prefix" -name ferry.pc -path '*/pkgconfig/*')
[ -n "$pc" ] || fail "no ferry.pc under $prefix"
libdir=$(dirname "$(dirname "$pc")")
[ -f "$prefix/include/ferry_version.h" ] || fail "ferry_version.h not installed beside ferry.h"

echo "== pkg-config ($pc)"
command -v pkg-config >/dev/null || fail "no pkg-config (apt-get install pkgconf)"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
same ferry.pc "$(pkg-config --modversion ferry)"
cflags=$(pkg-config --cflags ferry) libs=$(pkg-config --libs ferry)
echo "cflags: $cflags"
echo "libs: $libs"
# shellcheck disable=SC2086 # word lists
"$cc" $flags $cflags -o "$work/consumer_pc" "$here/consumer.c" $libs
out=$(LD_LIBRARY_PATH="$libdir" "$work/consumer_pc") || fail "consumer_pc failed: $out"
echo "$out"
same "the pkg-config consumer" "${out##* }"
# the .pc names the prefix given to cmake --install, not the configured one
[ "$(pkg-config --variable=prefix ferry)" = "$prefix" ] ||
    fail "ferry.pc says prefix=$(pkg-config --variable=prefix ferry), installed with --prefix $prefix"
# a tree moved after installing: pkg-config --define-prefix finds it (from
# lib/pkgconfig or lib64/pkgconfig, two levels under the prefix)
case ${libdir#"$prefix"/} in
*/*) ;;
*)
    mv "$prefix" "$work/moved"
    PKG_CONFIG_PATH="$work/moved/${libdir#"$prefix"/}/pkgconfig" pkg-config --define-prefix --cflags --libs ferry |
        grep -q "$work/moved/" || fail "pkg-config --define-prefix does not follow the installed tree when it is moved"
    mv "$work/moved" "$prefix"
    ;;
esac

echo "== find_package(ferry)"
gen=""
command -v ninja >/dev/null && gen="-G Ninja"
# shellcheck disable=SC2086
"$cmake" -S "$here" -B "$work/consumer" $gen -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$work/consumer.log" ||
    { cat "$work/consumer.log"; fail "configuring the find_package(ferry) consumer failed"; }
same "find_package(ferry)" "$(cat "$work/consumer/ferry_version.txt")"
"$cmake" --build "$work/consumer" >>"$work/consumer.log" || { cat "$work/consumer.log"; fail "building it failed"; }
for t in consumer_shared consumer_static; do
    out=$("$work/consumer/$t") || fail "$t failed: $out"
    echo "$t: $out"
    same "$t" "${out##* }"
done
# ferry::ferry is the installed libferry.so (found through its RUNPATH), not a copy
if command -v ldd >/dev/null; then
    ldd "$work/consumer/consumer_shared" | grep -q "$libdir/libferry.so" || fail "consumer_shared does not use $libdir/libferry.so"
fi

echo "== Python package"
same "python/setup.py --version" "$(cd "$root/python" && "$python" setup.py --version 2>/dev/null | tail -1)"
if [ -z "$flags" ]; then  # a sanitized libferry.so does not load into a plain python
    same "ferry.__version__" "$(FERRY_LIBRARY="$libdir/libferry.so" PYTHONPATH="$root/python" PYTHONDONTWRITEBYTECODE=1 \
        "$python" -c 'import ferry; print(ferry.__version__)')"
fi
echo "install: all agree on $version"
