#!/usr/bin/env bash
# bench/peers/run.sh: sets up what the peer benchmark needs and runs it.
#
# The Python environment (a venv outside the repo with torch, numpy and
# matplotlib) is scripts/venv.sh's: see there for where it lives and why torch
# comes as the full wheel. Builds the library (Release) if build/libflashattn.so
# is missing, then runs torch_sdpa.py with the arguments given here, but --tier
# avx2|avx512|native, which sets both sides' capability tier (bench/tier.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
say() { echo "peers: $*" >&2; }

. "$repo/bench/tier.sh"
bench_tier_args "$@"
venv=$(bash "$repo/scripts/venv.sh")

if [ ! -f "$repo/build/libflashattn.so" ]; then
  say "building libflashattn (Release)"
  cmake -S "$repo" -B "$repo/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$repo/build" -j2 --target flashattn >/dev/null
fi

exec "$venv/bin/python" "$here/torch_sdpa.py" --lib "$repo/build/libflashattn.so" ${bench_args[@]+"${bench_args[@]}"}
