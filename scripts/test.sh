#!/usr/bin/env bash
# CPU test suite as CI runs it: installs what is missing, builds the `ci` preset (Release, no
# CUDA, warnings as errors), checks the layering (scripts/check-layers.py) and runs
# `ctest --preset ci`, then the Python package's pytest suite
# (scripts/test-python.sh). Exits non-zero on any failure.
# MLA_JOBS sets build and test parallelism (default: all cores).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${MLA_JOBS:-$(nproc)}"

"$root/scripts/setup.sh"
cmake --preset ci --graphviz=build/ci/layers/mla.dot
# Layering (docs/design-decisions.md, "Layers"): includes and target links only point down.
python3 "$root/scripts/check-layers.py" --graphviz build/ci/layers/mla.dot
cmake --build --preset ci --parallel "$jobs"
ctest --preset ci --parallel "$jobs"
MLA_JOBS="$jobs" "$root/scripts/test-python.sh"
