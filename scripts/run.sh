#!/usr/bin/env bash
# Builds the `release` preset (with CUDA when nvcc is found) and runs `mla run` with the given
# arguments, e.g.  scripts/run.sh --help
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${MLA_JOBS:-$(nproc)}"

"$root/scripts/setup.sh" >&2

configure=(cmake --preset release)
nvcc="$(command -v nvcc || true)"
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ -n "$nvcc" ]; then
  configure+=(-DMLA_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
else
  configure+=(-DMLA_CUDA=OFF)
fi
"${configure[@]}" >&2
cmake --build --preset release --parallel "$jobs" --target mla_cli >&2

exec "$root/build/release/mla" run "$@"
