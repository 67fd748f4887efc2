#!/usr/bin/env bash
# test-neon.sh: the aarch64 build and its tests, on an x86 machine. Cross-compiles
# with Debian's aarch64-linux-gnu-gcc (cmake/aarch64-toolchain.cmake) into
# build-neon/ and runs ctest under qemu-user: the suite's ISA matrix there is
# {ref, neon} (tests/CMakeLists.txt), plus test_kernels on every table qemu runs;
# then the CLI smoke test through a qemu wrapper. Exits non-zero on any failure.
#
#   scripts/test-neon.sh                            ~320 CPU-seconds under qemu
#   FA_TEST_SCALE=0.34 scripts/test-neon.sh          a third of the random cases
#   FA_NEON_CTEST_ARGS="-R neon|kernels" scripts/test-neon.sh   skip the ref half
# Most of the time goes to the tests' fp64 oracles (naive_forward, the reference
# algorithm), not to the kernels: test_property and test_semantics dominate.
#
# Not run here: install_consumer (it executes the installed examples directly,
# which needs binfmt_misc for aarch64; the container has none).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
jobs=$(nproc)
build=build-neon
# Debian 12's aarch64 gcc 12.2 dies with an internal compiler error
# (vect_transform_reduction) on tests/test_semantics.c at -O3; keeping the loop
# vectoriser off avoids it and leaves the NEON intrinsics untouched.
cflags=${FA_NEON_CFLAGS--fno-tree-loop-vectorize}
# ctest timeouts are set for native speed; qemu runs the suite ~10x slower.
timeout_scale=${FA_QEMU_TIMEOUT_SCALE:-10}

cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-toolchain.cmake -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$cflags" -DFLASHATTN_BUILD_TOOLS=ON >/dev/null
cmake --build "$build" -j "$jobs"

# Scale the TIMEOUT of every test in the generated ctest files (they are rewritten
# by each configure, so this never compounds).
find "$build" -name CTestTestfile.cmake -exec \
  perl -pi -e "s/(TIMEOUT \"?)(\\d+)/\$1.(\$2*$timeout_scale)/ge" {} +

sysroot=/usr/aarch64-linux-gnu
qemu=(qemu-aarch64 -L "$sysroot")
# The path the library picks under qemu must be neon (qemu reports ASIMD).
isa=$("${qemu[@]}" "$build/flashattn" info | awk '/^kernel path/ {print $3}')
if [ "$isa" != neon ]; then
  echo "test-neon: the library chose '$isa' under qemu, expected neon" >&2
  exit 1
fi

status=0
echo "== ctest under qemu"
# shellcheck disable=SC2086 # FA_NEON_CTEST_ARGS is a list of ctest arguments
(cd "$build" && ctest --output-on-failure -j "$jobs" -E 'cli_smoke|install_consumer' ${FA_NEON_CTEST_ARGS:-}) ||
  status=1

echo "== cli smoke under qemu"
wrapper="$build/flashattn-qemu"
printf '#!/bin/sh\nexec %s -L %s "%s" "$@"\n' "${qemu[0]}" "$sysroot" "$(pwd)/$build/flashattn" >"$wrapper"
chmod +x "$wrapper"
bash tools/smoke.sh "$wrapper" >"$build/cli_smoke.log" 2>&1 || { cat "$build/cli_smoke.log"; status=1; }
tail -n 1 "$build/cli_smoke.log"

exit $status
