#!/usr/bin/env bash
# Installs the engine test environment into the test venv (MLA_VENV, default .venv): SGLang
# 0.5.23 with --no-deps plus the small pinned packages its imports need
# (python/requirements-engines.txt), and the torch-dependent ones with --no-deps
# (python/requirements-engines-nodeps.txt, plus the torchvision that matches the venv's torch).
# The venv's torch is never replaced: every install runs under the constraint torch==<installed>.
# Idempotent: a venv whose stamp matches (requirement files + torch version) is left as it is.
# Needs only PyPI; about a minute on a fresh machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MLA_VENV:-$root/.venv}"
py="$venv/bin/python"
req="$root/python/requirements-engines.txt"
nodeps="$root/python/requirements-engines-nodeps.txt"
torch_version="$("$py" -c 'import torch; print(torch.__version__)')"
stamp="$venv/.mla-engines.sha256"
want="$(cat "$req" "$nodeps" <(echo "$torch_version") | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup-engines: sglang test environment in $venv is up to date"
  exit 0
fi
start=$SECONDS
# torchvision 0.N pairs with torch 2.(N-15): 2.11 -> 0.26, 2.14 -> 0.29.
minor="$(echo "$torch_version" | sed -E 's/^2\.([0-9]+)\..*/\1/')"
case "$minor" in
  ''|*[!0-9]*) echo "setup-engines: cannot read torch's version ($torch_version)" >&2; exit 1 ;;
esac
torchvision="torchvision==0.$((minor + 15)).*"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==${torch_version%%+*}" > "$constraints"
pip=("$venv/bin/pip" install --disable-pip-version-check --quiet -c "$constraints")
"${pip[@]}" -r "$req"
"${pip[@]}" --no-deps -r "$nodeps" "$torchvision"
"$py" - <<'PY'
import torch, sglang
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend  # noqa: F401
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: F401
from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS  # noqa: F401
print(f"setup-engines: sglang {sglang.__version__} imports with torch {torch.__version__}")
PY
echo "$want" > "$stamp"
echo "setup-engines: ready in $((SECONDS - start))s"
