#!/usr/bin/env bash
# Lint as CI runs it (.ci/run step 2): formatting, then clang-tidy.
#   1. clang-format-14 --dry-run --Werror over every tracked C++/CUDA file (.clang-format);
#      the generated wgmma block is fenced off with clang-format off/on.
#   2. clang-tidy-14 with the checks in .clang-tidy over the host translation units of the ci
#      preset (build/ci/compile_commands.json; configured here if missing): the library (src/),
#      the CLI (tools/), the benchmark (bench/), the README example (examples/), lib/ (the
#      conformance reference, the serving simulation), and the project headers they include.
#      The gtest executables' own files are left out (their bodies are macro expansions; linting
#      them doubles the step's time). CUDA .cu files are not in the ci preset's database.
# Usage: scripts/lint.sh [--format-only | --tidy-only]. MLA_JOBS sets clang-tidy's -j.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${MLA_JOBS:-$(nproc)}"
what="${1:-all}"
rc=0

if [ "$what" != --tidy-only ]; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
  if ! clang-format-14 --dry-run --Werror "${files[@]}"; then
    echo "lint: formatting differs from .clang-format (fix: clang-format-14 -i FILE)" >&2
    rc=1
  else
    echo "lint: clang-format clean (${#files[@]} files)"
  fi
fi

if [ "$what" != --format-only ]; then
  if [ ! -f build/ci/compile_commands.json ]; then
    cmake --preset ci > /dev/null
  fi
  # The CLI's generated header (mla_version.h) exists once CMake has configured.
  if ! run-clang-tidy-14 -quiet -j "$jobs" -p build/ci \
      -header-filter="^$root/(include|src|lib|tests|tools|bench|examples)/" \
      "^$root/(src|lib|tools|bench|examples)/.*\.cc$" > build/ci/clang-tidy.log 2>&1; then
    grep -E 'error:|warning:' build/ci/clang-tidy.log | sort -u >&2 || true
    echo "lint: clang-tidy found problems (full log: build/ci/clang-tidy.log)" >&2
    rc=1
  else
    echo "lint: clang-tidy clean ($(grep -c '"file"' build/ci/compile_commands.json) TUs in the" \
      "database, those under src/ lib/ tools/ bench/ examples/ checked)"
  fi
fi
exit $rc
