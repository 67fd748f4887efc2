#!/usr/bin/env bash
# The whole test suite, as CI runs it: a Release build with the MPI component and an
# ASan+UBSan build (each built and run through ctest), a ThreadSanitizer build of the
# threaded tests, the Python package's pytest suite (scripts/test-python.sh), a
# short fixed fuzz run (scripts/fuzz.sh) and the NEON build under qemu. Exits
# non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

# The Release build includes the MPI component (libflashattn_mpi) and its tests
# (ctest label "mpi", run under mpirun): Open MPI comes from Debian's packages.
bash scripts/deps.sh libopenmpi-dev openmpi-bin
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_MPI=ON >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

# Sanitizers: -O1 keeps ASan's slowdown small while still catching everything.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DFLASHATTN_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "$jobs")

# ThreadSanitizer on the tests that run host or pool threads (ctest label "threads",
# test_amx_model among them: two threads each with its own tile state):
# -O1 as above; only those targets are built.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DFA_TSAN=ON \
  -DCMAKE_C_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -DFLASHATTN_BUILD_TOOLS=OFF >/dev/null
cmake --build build-tsan -j "$jobs" --target test_threads test_host_pool test_api test_inference test_amx_model
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --output-on-failure -j "$jobs" -L threads)

# The Python package (pip install . into the cached venv of scripts/venv.sh, which
# it builds when absent) and its pytest suite; pytest's "no tests collected" fails.
bash scripts/test-python.sh

# A short fixed fuzz run of tests/fuzz (clang's libFuzzer; skipped, loudly, without clang).
if command -v clang >/dev/null 2>&1 || bash scripts/deps.sh clang libclang-rt-14-dev; then
  # a fixed seed and count: CI replays the same inputs every time (scripts/fuzz.sh alone explores)
  bash scripts/fuzz.sh 180 -seed=20261201 -runs=60000
else
  echo "test: clang with libFuzzer is not installable here; the fuzz run is skipped" >&2
fi

# NEON: cross-built for aarch64 and run under qemu (x86 hosts; FA_SKIP_NEON=1 skips).
if [ "$(uname -m)" = x86_64 ] && [ "${FA_SKIP_NEON:-0}" != 1 ]; then
  bash scripts/test-neon.sh
fi
