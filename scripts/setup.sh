#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs, only those that are missing. Idempotent: a
# second run installs nothing and does not touch apt. Uses sudo only when not root. Then the
# Python environment (scripts/setup-python.sh), unless the first argument is --no-python (the
# main job, scripts/run.sh, needs no Python packages).
set -euo pipefail
python_env=1
if [ "${1:-}" = "--no-python" ]; then python_env=0; fi
python_setup() {
  if [ "$python_env" = 1 ]; then exec "$(dirname "${BASH_SOURCE[0]}")/setup-python.sh"; fi
}

packages=(
  build-essential cmake ninja-build git python3 python3-venv
  libgtest-dev googletest libbenchmark-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  clang-14 libclang-rt-14-dev clang-format-14 clang-tidy-14
)

missing=()
for p in "${packages[@]}"; do
  # dpkg -s fails for unknown packages; also require the "installed" state (not config-files).
  state="$(dpkg -s "$p" 2>/dev/null | sed -n 's/^Status: //p' || true)"
  if [ "$state" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} build packages are installed"
  python_setup
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "setup: missing packages (${missing[*]}) and not root, and sudo is not installed" >&2
    exit 1
  fi
  sudo=(sudo)
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  "${missing[@]}"
echo "setup: done"
python_setup
