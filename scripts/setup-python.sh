#!/usr/bin/env bash
# Creates the virtual environment .venv (git-ignored; MLA_VENV overrides the path) with the pinned
# packages of python/requirements-dev.txt: torch 2.11.0 from PyPI (the default wheel is the CUDA
# build; it runs on the cpu), scikit-build-core, pytest, numpy. Idempotent: a venv whose
# requirements stamp matches is left as it is. Wheels in /tmp/torchdl, when present, are used as
# a local cache.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MLA_VENV:-$root/.venv}"
req="$root/python/requirements-dev.txt"
stamp="$venv/.mla-requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: python environment $venv is up to date"
  exit 0
fi
start=$SECONDS
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
links=()
if [ -d /tmp/torchdl ]; then links=(--find-links /tmp/torchdl); fi
"$venv/bin/pip" install --disable-pip-version-check --quiet "${links[@]}" -r "$req"
echo "$want" > "$stamp"
echo "setup: python environment $venv ready in $((SECONDS - start))s"
