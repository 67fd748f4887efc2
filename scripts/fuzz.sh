#!/usr/bin/env bash
# scripts/fuzz.sh SECONDS [libFuzzer args...]: builds the fuzz target tests/fuzz/fuzz_api.c
# with clang (libFuzzer + ASan + UBSan, -fno-sanitize-recover) in build-fuzz/ and runs it
# for SECONDS on a copy of the seed corpus tests/fuzz/corpus/ (the copy grows, the
# committed seeds do not). Prints executions, coverage (cov/ft) and the corpus size at the
# end. Exits non-zero on a finding; its reproducer is in build-fuzz/artifacts/ (rerun:
# build-fuzz/tests/fuzz/fuzz_api FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:?usage: scripts/fuzz.sh SECONDS [libFuzzer args...]}
shift
command -v clang >/dev/null 2>&1 || bash scripts/deps.sh clang libclang-rt-14-dev
bash scripts/deps.sh
CC=clang cmake -S . -B build-fuzz -DFLASHATTN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j 2 --target fuzz_api >/dev/null

work=build-fuzz/corpus-run
rm -rf "$work"
mkdir -p "$work" build-fuzz/artifacts
cp tests/fuzz/corpus/* "$work"/
log=build-fuzz/fuzz.log
set +e
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  build-fuzz/tests/fuzz/fuzz_api -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -max_len=512 \
  -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/ "$@" "$work" >"$log" 2>&1
rc=$?
set -e
last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
echo "fuzz: ${secs}s, ${execs:-?} executions; last status: ${last:-none}"
echo "fuzz: corpus $(ls "$work" | wc -l) inputs ($(ls tests/fuzz/corpus | wc -l) seeds)"
if [ $rc -ne 0 ]; then
  echo "fuzz: FINDING (exit $rc); the report:" >&2
  grep -v '^#[0-9]' "$log" | tail -60 >&2
  ls -1 build-fuzz/artifacts/ >&2
  exit 1
fi
