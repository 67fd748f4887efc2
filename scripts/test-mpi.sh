#!/usr/bin/env bash
# test-mpi.sh: the MPI component (libflashattn_mpi, ring attention) and its tests.
# Installs Open MPI from Debian's packages when missing (scripts/deps.sh), builds
# build-mpi/ (Release, -DFLASHATTN_MPI=ON) and runs the tests labelled "mpi":
# test_ring under `mpirun --oversubscribe -np N` for N = 1..4 and a smoke run of
# the flashattn-mpi bench tool. Prints ctest's summary; exits non-zero on failure.
#   scripts/test-mpi.sh          ~1-2 min on 2 busy cores (most of it the build)
# Open MPI refuses to run as root unless told; the tests' ctest environment says so
# too, this is for running test_ring or the bench by hand from the same shell.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh libopenmpi-dev openmpi-bin
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=${FA_JOBS:-2}
build=build-mpi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_MPI=ON >/dev/null
# the whole tree: mpi_install_consumer installs it into a scratch prefix
cmake --build "$build" -j "$jobs"
cd "$build"
ctest -L mpi --output-on-failure
