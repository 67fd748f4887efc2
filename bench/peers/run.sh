#!/usr/bin/env bash
# bench/peers/run.sh: sets up what the peer benchmark needs and runs it.
#
# Owns the benchmark's Python environment: a venv OUTSIDE the repo, in
# ${FLASHATTN_BENCH_VENV:-$HOME/.cache/flashattn/bench-venv}, with torch from PyPI,
# numpy and matplotlib. torch is installed nowhere else. Builds the library
# (Release) if build/libflashattn.so is missing, then runs torch_sdpa.py with
# the arguments given here.
#
# Why the full torch wheel: PyPI's Linux torch is the CUDA build. Installing it
# with --no-deps plus only its non-nvidia dependencies gives a torch that fails
# to import (libtorch links libcufile, libcusparseLt and libnvshmem from the
# nvidia-* wheels), so the plain `pip install torch` (~4-5 GB with the CUDA
# wheels) is the one that works. The light way is still tried first, and kept
# when it imports and runs a CPU SDPA (a later torch may allow it), unless
# FLASHATTN_BENCH_TORCH_FULL=1. FLASHATTN_BENCH_TORCH pins the requirement
# (default "torch").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${FLASHATTN_BENCH_VENV:-$HOME/.cache/flashattn/bench-venv}
torch_req=${FLASHATTN_BENCH_TORCH:-torch}
stamp="$venv/.flashattn-bench-ready"

case "$venv" in
  "$repo"|"$repo"/*) echo "run.sh: FLASHATTN_BENCH_VENV must be outside the repo ($repo)" >&2; exit 2 ;;
esac

say() { echo "peers: $*" >&2; }

# A compiler, CMake and python3 as the rest of the project installs them.
bash "$repo/scripts/deps.sh"
# venv needs ensurepip, which Debian ships apart as python3-venv.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  bash "$repo/scripts/deps.sh" python3-venv
fi

# Imports torch and runs one CPU SDPA forward and backward: the proof that an
# install is usable.
torch_works() {
  "$venv/bin/python" - <<'EOF' >/dev/null 2>&1
import torch, torch.nn.functional as F
q = torch.randn(1, 2, 16, 8, requires_grad=True)
F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
F.scaled_dot_product_attention(q.detach().bfloat16(), q.detach().bfloat16(), q.detach().bfloat16())
EOF
}

if [ ! -f "$stamp" ] || ! torch_works; then
  if [ ! -x "$venv/bin/python" ]; then
    say "creating the venv in $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
  fi
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" numpy matplotlib
  mode=
  if [ "${FLASHATTN_BENCH_TORCH_FULL:-0}" != 1 ]; then
    say "trying torch without its CUDA wheels ($torch_req --no-deps + its plain dependencies)"
    "${pip[@]}" --no-deps "$torch_req"
    # torch's own requirements less the nvidia/cuda/triton ones; pip warns here
    # that those are missing, which is the point of this step
    "${pip[@]}" filelock typing-extensions sympy networkx jinja2 fsspec 'setuptools>=77'
    if torch_works; then mode=light; else say "that torch does not import (it links CUDA libraries)"; fi
  fi
  if [ -z "$mode" ]; then
    say "installing the full $torch_req wheel with its CUDA dependencies (~4-5 GB, once)"
    "${pip[@]}" "$torch_req"
    torch_works || { say "torch still does not run a CPU SDPA in $venv"; exit 1; }
    mode=full
  fi
  # What is really there decides the label: a venv that had the full wheel
  # already passes the light step too.
  installed=$("$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null || true)
  if grep -qi '^nvidia-' <<<"$installed"; then
    mode=full
  fi
  ver=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
  printf 'torch %s\ninstall %s\n' "$ver" "$mode" > "$stamp"
  say "torch $ver ready ($mode install)"
fi

if [ ! -f "$repo/build/libflashattn.so" ]; then
  say "building libflashattn (Release)"
  cmake -S "$repo" -B "$repo/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$repo/build" -j2 --target flashattn >/dev/null
fi

exec "$venv/bin/python" "$here/torch_sdpa.py" --lib "$repo/build/libflashattn.so" "$@"
