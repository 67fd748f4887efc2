#!/usr/bin/env bash
# scripts/venv.sh: the project's one Python environment, for the Python tests and
# every benchmark that needs torch. Prints the venv's path on stdout.
#
# The venv lives OUTSIDE the repo, in ${FLASHATTN_VENV:-${FLASHATTN_BENCH_VENV:-$HOME/.cache/flashattn/bench-venv}},
# and holds torch (from PyPI), numpy, matplotlib, pytest, transformers, nanobind and
# scikit-build-core. torch and transformers are installed nowhere else. A stamp file
# records what was installed; a venv whose stamp matches costs one file read.
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

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${FLASHATTN_VENV:-${FLASHATTN_BENCH_VENV:-$HOME/.cache/flashattn/bench-venv}}
torch_req=${FLASHATTN_BENCH_TORCH:-torch}
others=(numpy matplotlib pytest transformers nanobind scikit-build-core)
stamp="$venv/.flashattn-venv-ready"
want="requirements: $torch_req ${others[*]}"

case "$venv" in
  "$repo"|"$repo"/*) echo "venv.sh: FLASHATTN_VENV must be outside the repo ($repo)" >&2; exit 2 ;;
esac

say() { echo "venv: $*" >&2; }

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && grep -qxF "$want" "$stamp"; then
  echo "$venv"
  exit 0
fi

# A compiler, CMake and python3 as the rest of the project installs them.
bash "$repo/scripts/deps.sh" >&2
# venv needs ensurepip, which Debian ships apart as python3-venv.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  bash "$repo/scripts/deps.sh" python3-venv >&2
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

if [ ! -x "$venv/bin/python" ]; then
  say "creating the venv in $venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
"${pip[@]}" "${others[@]}" >&2

if ! torch_works; then
  mode=
  if [ "${FLASHATTN_BENCH_TORCH_FULL:-0}" != 1 ]; then
    say "trying torch without its CUDA wheels ($torch_req --no-deps + its plain dependencies)"
    "${pip[@]}" --no-deps "$torch_req" >&2
    # torch's own requirements less the nvidia/cuda/triton ones; pip warns here
    # that those are missing, which is the point of this step
    "${pip[@]}" filelock typing-extensions sympy networkx jinja2 fsspec 'setuptools>=77' >&2
    if torch_works; then mode=light; else say "that torch does not import (it links CUDA libraries)"; fi
  fi
  if [ -z "$mode" ]; then
    say "installing the full $torch_req wheel with its CUDA dependencies (~4-5 GB, once)"
    "${pip[@]}" "$torch_req" >&2
    torch_works || { say "torch still does not run a CPU SDPA in $venv"; exit 1; }
  fi
fi
# What is really there decides the label: a venv that had the full wheel
# already passes the light step too.
mode=light
installed=$("$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null || true)
if grep -qi '^nvidia-' <<<"$installed"; then
  mode=full
fi
ver=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
# the stamp bench/peers has always written, kept for anything that reads it
printf 'torch %s\ninstall %s\n' "$ver" "$mode" > "$venv/.flashattn-bench-ready"
printf '%s\ntorch %s\ninstall %s\n' "$want" "$ver" "$mode" > "$stamp"
say "ready: torch $ver ($mode install) and ${others[*]}"
echo "$venv"
