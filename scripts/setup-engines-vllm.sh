#!/usr/bin/env bash
# Installs vLLM 0.34.0 beside mla for tests/python/test_backend_vllm.py (CPU tensors, no GPU).
#
#   scripts/setup-engines-vllm.sh [VENV]      (default: $MLA_VENV, else .venv)
#
# vllm's wheel pins torch 2.14.0 and about 80 packages (CUDA kernels, serving stack); the test
# needs none of that. So: the wheel with --no-deps, then only the packages its attention modules
# import (vllm.plugins, the backend registry, mla_attention, the FlashMLA backend), each resolved
# under a constraint that keeps the venv's own torch (pip would otherwise replace it, and mla's
# native library is built against that torch), and the two packages that depend on torch
# (xgrammar, llguidance) with --no-deps. pip warns that vllm's pins are unmet; that is expected.
# Idempotent: a venv where the check import already works is left as it is.
# Cost, measured on the 2-core dev machine with a cold pip cache: ~20 s for the vllm wheel
# (239 MB download, 546 MB installed), ~40 s for the rest (~300 MB installed), 1 min in all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${MLA_VENV:-$root/.venv}}"
py="$venv/bin/python"
pip=("$py" -m pip install --disable-pip-version-check --quiet)

VLLM_VERSION=0.34.0
# What vLLM 0.34.0's attention modules import (found by importing them in a bare venv). Where
# scripts/setup-engines.sh (SGLang's test environment) pins the same package, this pins the same
# version, so both fit one venv: transformers 5.19.0 is inside vLLM's range; tokenizers 0.23.2
# is below its >=0.23.3, which these imports and tests do not notice.
DEPS=(regex==2026.12.2 psutil==7.2.2 pyzmq==27.3.0 pydantic==2.14.4 transformers==5.19.0
      tokenizers==0.23.2 aiohttp==3.14.5 requests==2.34.2 pillow==13.0.0 pybase64==1.5.1
      cachetools==8.0.3 cbor2==6.3.0 msgspec==0.23.0 cloudpickle==3.1.3 uvloop==0.23.0
      py-cpuinfo==9.0.0 prometheus_client==0.26.0 apache-tvm-ffi==0.1.11 einops==0.8.2)
TORCH_DEPENDENT=(xgrammar==0.2.8 llguidance==1.7.6)  # installed with --no-deps
CHECK="import vllm, vllm.plugins, vllm.v1.attention.backends.registry, \
vllm.model_executor.layers.attention.mla_attention, vllm.v1.attention.backends.mla.flashmla; \
assert vllm.__version__ == '$VLLM_VERSION', vllm.__version__"

export VLLM_TARGET_DEVICE="${VLLM_TARGET_DEVICE:-cpu}"
if "$py" -c "$CHECK" >/dev/null 2>&1; then
  echo "setup-engines-vllm: vllm $VLLM_VERSION already importable in $venv"
  exit 0
fi
start=$SECONDS
torch_version="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" > "$constraints"
"${pip[@]}" --no-deps "vllm==$VLLM_VERSION"
"${pip[@]}" -c "$constraints" "${DEPS[@]}"
"${pip[@]}" --no-deps "${TORCH_DEPENDENT[@]}"
if ! "$py" -c "$CHECK"; then
  echo "setup-engines-vllm: vllm $VLLM_VERSION is installed but its modules do not import" >&2
  exit 1
fi
now_torch="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
if [ "$now_torch" != "$torch_version" ]; then
  echo "setup-engines-vllm: torch changed from $torch_version to $now_torch" >&2
  exit 1
fi
echo "setup-engines-vllm: vllm $VLLM_VERSION installed in $venv in $((SECONDS - start))s" \
  "(torch $torch_version kept)"
