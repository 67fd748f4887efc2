#!/usr/bin/env bash
# The whole test suite, as CI runs it: a Release build and an ASan+UBSan build,
# each built from scratch and run through ctest. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

# Sanitizers: -O1 keeps ASan's slowdown small while still catching everything.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DFLASHATTN_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "$jobs")

# NEON: cross-built for aarch64 and run under qemu (x86 hosts; FA_SKIP_NEON=1 skips).
if [ "$(uname -m)" = x86_64 ] && [ "${FA_SKIP_NEON:-0}" != 1 ]; then
  bash scripts/test-neon.sh
fi
