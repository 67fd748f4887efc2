#!/usr/bin/env bash
# bench/python/run.sh: runs bench_torch.py in the project venv (scripts/venv.sh)
# with the flashattn package installed from this clone (build dir build-py/,
# reused). Every argument goes to bench_torch.py (--help lists them), but
# --tier avx2|avx512|native, which sets both sides' capability tier (bench/tier.sh),
# and a first argument --flex, which runs bench_flex.py (FlexAttention, issue 32) instead.
set -euo pipefail
script=bench_torch.py
if [ "${1:-}" = --flex ]; then
  script=bench_flex.py
  shift
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/bench/tier.sh"
bench_tier_args "$@"
venv=$(bash "$repo/scripts/venv.sh")
command -v c++ >/dev/null 2>&1 || bash "$repo/scripts/deps.sh" g++ >&2
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps \
  --config-settings=build-dir="${FLASHATTN_PY_BUILD_DIR:-$repo/build-py}" "$repo" >&2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$venv/bin/python" "$here/$script" ${bench_args[@]+"${bench_args[@]}"}
