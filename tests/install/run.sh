#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds the README example the
# two ways a user would: find_package(flashattn) and pkg-config. Runs all three.
# usage: run.sh BUILD_DIR SOURCE_DIR C_COMPILER
set -euo pipefail
build=$1 src=$2 cc=${3:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
step() { if "$@" >"$work/log" 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $*"; cat "$work/log"; fi; }

step cmake --install "$build" --prefix "$work/prefix"
step cmake -S "$src/tests/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_C_COMPILER="$cc"
step cmake --build "$work/consumer"
step "$work/consumer/example_shared"
step "$work/consumer/example_static"
libdir=$(dirname "$(find "$work/prefix" -name flashattn.pc | head -n1)")/..
flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs flashattn)
step "$cc" -std=c11 "$src/tests/install/example.c" $flags -Wl,-rpath,"$libdir" -o "$work/example_pc"
step "$work/example_pc"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
