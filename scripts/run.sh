#!/usr/bin/env bash
# Builds the `release` preset (with CUDA when nvcc is found) and runs `mla run` with the given
# arguments, e.g.  scripts/run.sh --help
# --cpu (first argument) or MLA_CPU_ONLY=1: build without CUDA even when nvcc is present (a
# machine with nvcc and no GPU need not compile the kernels to run on the CPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${MLA_JOBS:-$(nproc)}"

"$root/scripts/setup.sh" --no-python >&2

cpu_only="${MLA_CPU_ONLY:-0}"
if [ "${1:-}" = "--cpu" ]; then
  cpu_only=1
  shift
fi

configure=(cmake --preset release)
nvcc=""
if [ "$cpu_only" != "1" ]; then
  nvcc="$(command -v nvcc || true)"
  if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
fi
if [ -n "$nvcc" ]; then
  configure+=(-DMLA_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
else
  configure+=(-DMLA_CUDA=OFF)
fi
"${configure[@]}" >&2
cmake --build --preset release --parallel "$jobs" --target mla_cli >&2

exec "$root/build/release/mla" run "$@"
