#!/usr/bin/env bash
# Python suite as CI runs it: builds and installs the package (`pip install .`, cpu build) into
# .venv, then runs pytest on tests/python (the ops and entry points against a float64 oracle,
# opcheck, torch.compile, bad inputs, the README quick start, the SGLang and vLLM plugins against
# the real sglang 0.5.23 and vllm 0.34.0, which scripts/setup-engines.sh and
# setup-engines-vllm.sh install into the venv first). pytest's exit 5 (no tests collected) is a
# failure. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${MLA_VENV:-$root/.venv}"
export CMAKE_BUILD_PARALLEL_LEVEL="${MLA_JOBS:-$(nproc)}"
MLA_VENV="$venv" "$root/scripts/setup-engines.sh"
MLA_VENV="$venv" "$root/scripts/setup-engines-vllm.sh" "$venv"
start=$SECONDS
"$venv/bin/pip" install --disable-pip-version-check --quiet --no-build-isolation --no-deps \
  -Ccmake.define.MLA_CUDA=OFF -Cbuild-dir=build/wheel-cpu .
echo "test-python: package built and installed in $((SECONDS - start))s"
set +e
(cd tests/python && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@")
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test-python: pytest collected no tests (exit 5): failing" >&2
  exit 1
fi
exit "$rc"
