#!/usr/bin/env bash
# Builds flashattn (Release) and runs the benchmark on the default shape,
# LLaMA-7B attention: B=1, H=32, S=2048, D=128, f32. Extra arguments go to
# `flashattn bench` (e.g. --seq 4096 --causal --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target flashattn_cli >/dev/null
./build/flashattn info
exec ./build/flashattn bench "$@"
