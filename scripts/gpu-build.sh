#!/usr/bin/env bash
# Builds the CUDA configuration HERE (no GPU needed) and copies what the device machine runs into
# .carry/gpu/ (git-ignored): the `mla` CLI, the GPU test binary, the commit id, and, when the
# Python environment of scripts/setup-python.sh exists (.venv; MLA_GPU_WHEEL=0 skips it), the
# Python package built with MLA_CUDA=ON as a wheel (its torch op library links no libpython, so it
# serves the device's Python 3.12). Then, on the device: scripts/gpu-check.sh (device tool: run
# with carry [".carry/gpu"]).
#   scripts/gpu-build.sh [build_dir]      default build/gpu
# CARRY=dir puts the binaries elsewhere (default .carry/gpu; gpu-check.sh reads the same variable),
# so engineers working in parallel keep separate carries.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build/gpu}"
carry="${CARRY:-$root/.carry/gpu}"
launcher=()
wheel_launcher=()
if command -v ccache > /dev/null; then  # worktrees share objects when ccache's base_dir covers them
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  wheel_launcher=(-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
    -Ccmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLA_CUDA=ON "${launcher[@]}" \
  -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" -DMLA_BUILD_BENCH=OFF \
  -DMLA_PTXAS_VERBOSE=ON >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target mla_cli mla_gpu_tests
mkdir -p "$carry"
cp "$build/mla" "$build/tests/mla_gpu_tests" "$carry/"
venv="${MLA_VENV:-$root/.venv}"
if [ "${MLA_GPU_WHEEL:-1}" = 1 ] && [ -x "$venv/bin/pip" ]; then
  rm -f "$carry"/mla-*.whl
  CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" "$venv/bin/pip" wheel --disable-pip-version-check \
    --quiet --no-deps --no-build-isolation -Ccmake.define.MLA_CUDA=ON \
    -Ccmake.define.CMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" \
    "${wheel_launcher[@]}" -Cbuild-dir="$build/wheel" -w "$carry" "$root"
fi
git -C "$root" rev-parse --short HEAD > "$carry/COMMIT"
if ! git -C "$root" diff --quiet HEAD -- src include tests tools; then
  sed -i 's/$/-dirty/' "$carry/COMMIT"
fi
ls -la "$carry"
