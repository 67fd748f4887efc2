#!/usr/bin/env bash
# scripts/test-python.sh: the Python package's tests (python/tests, pytest).
#
# Gets the project venv (scripts/venv.sh), installs the package from this clone
# into it (a real, non-editable pip install, so the test sees what a user gets;
# the CMake build dir build-py/ is kept, so a rerun rebuilds only what changed),
# then runs pytest from python/tests. Extra arguments go to pytest (e.g. -k dropout).
# Exits non-zero on any failure, and also when pytest collects no tests (pytest's
# exit code 5): an empty run must not pass for a green one.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$repo/scripts/venv.sh")
# the extension is C++ (nanobind); deps.sh installs only the C compiler
command -v c++ >/dev/null 2>&1 || bash "$repo/scripts/deps.sh" g++ >&2
py="$venv/bin/python"
build_dir=${FLASHATTN_PY_BUILD_DIR:-$repo/build-py}

echo "test-python: installing flashattn from $repo into $venv (build dir $build_dir)" >&2
# --no-build-isolation: the venv already has scikit-build-core and nanobind, so the
# build needs no network and reuses build_dir.
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  "$py" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps \
  --config-settings=build-dir="$build_dir" "$repo" >&2

# Nothing may be downloaded by the tests (the model is built from a config).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
# Run from the tests directory, never the repo root, so `import flashattn` is the
# installed package and not python/flashattn from the source tree.
cd "$repo/python/tests"
set +e
"$py" -m pytest -ra -p no:cacheprovider "$@"
rc=$?
set -e
case $rc in
  0) echo "test-python: passed" >&2 ;;
  5) echo "test-python: ERROR: pytest collected no tests" >&2; exit 1 ;;
  *) echo "test-python: FAILED (pytest exit $rc)" >&2 ;;
esac
exit $rc
