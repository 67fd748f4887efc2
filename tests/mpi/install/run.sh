#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds tests/mpi/install/example.c
# the two ways a user would: find_package(flashattn_mpi) and mpicc with pkg-config;
# runs each on two ranks. usage: run.sh BUILD_DIR SOURCE_DIR MPIEXEC
set -euo pipefail
build=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
step() { if "$@" >"$work/log" 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $*"; cat "$work/log"; fi; }
run2() { "$mpiexec" --oversubscribe -np 2 "$@"; }

step cmake --install "$build" --prefix "$work/prefix"
step cmake -S "$src/tests/mpi/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix"
step cmake --build "$work/consumer"
step run2 "$work/consumer/example_shared"
step run2 "$work/consumer/example_static"
libdir=$(dirname "$(find "$work/prefix" -name flashattn_mpi.pc | head -n1)")/..
flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs flashattn_mpi)
# shellcheck disable=SC2086 # flags is a list
step mpicc -std=c11 "$src/tests/mpi/install/example.c" $flags -lm -Wl,-rpath,"$libdir" -o "$work/example_pc"
step run2 "$work/example_pc"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
