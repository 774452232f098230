#!/usr/bin/env bash
# The SGLang wheels for the GPU machine, which has no package index: sglang 0.5.23 and the small
# packages its imports need there, for the SGLang adapter tests on CUDA tensors
# (tests/python/test_backend_sglang.py; scripts/gpu-check.sh with GPU_ENGINE_WHEELS=dir installs
# them into a scratch site). The same versions as python/requirements-engines*.txt (CI's CPU
# environment). Not included: what the GPU machine already has (../.library/device/KINDS.md:
# torch 2.11, numpy, pytest, transformers, tokenizers, aiohttp, einops, pillow, psutil, requests,
# sentencepiece, tqdm, uvloop, torchvision, triton, ...), and sgl_kernel (hundreds of MB; the
# tests use the import stub in tests/python/gpu_stubs instead).
# SGLang's wheel (37 MiB) is repacked without the parts no import of the adapter tests loads, with
# or without a GPU: the compiled Rust extensions (sglang/srt/rust_extensions/*.so: 17 MiB;
# sglang/srt/mem_cache/rust_tree_core/*.so: 1 MiB; their Python loaders stay) and the diffusion
# runtime sglang/multimodal_gen (5 MiB); its RECORD lists what is left. The set then fits one
# device call (64 MiB) beside mla's CUDA wheel and binaries.
#   scripts/gpu-engine-wheels.sh [dir]      default .whl/sglang (git-ignored: /.whl/)
# PY_VERSION (default 3.12, the GPU machine's Python) selects the wheels' Python; 3.11 gives the
# set for a local check on this machine's Python. Prints each wheel's size and the total.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/.whl/sglang}"
py_version="${PY_VERSION:-3.12}"
req="$root/python/requirements-engines.txt"
nodeps="$root/python/requirements-engines-nodeps.txt"

pin() {  # pin NAME: NAME==VERSION as the requirement files pin it
  local line
  line="$(grep -hiE "^$1==" "$req" "$nodeps" | head -n 1)"
  [ -n "$line" ] || { echo "gpu-engine-wheels: $1 is not pinned in $req or $nodeps" >&2; exit 1; }
  echo "$line"
}

# Pinned by the requirement files, missing on the GPU machine.
wheels=()
for name in sglang apache-tvm-ffi compressed-tensors dill fastapi gguf ipython loguru msgspec \
            openai orjson partial-json-parser pybase64 pydantic pyzmq starlette uvicorn; do
  wheels+=("$(pin "$name")")
done
# Their own needs that the GPU machine lacks, at the versions pip resolves for the requirement
# files (pydantic 2.14.4 pins pydantic-core 2.50.5 and needs typing-extensions >= 4.16, newer
# than the machine's may be; fastapi, which ModelRunner's imports reach, imports
# opentelemetry-api).
wheels+=(pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
         typing-extensions==4.16.0 distro==1.9.0 sniffio==1.3.1 traitlets==5.16.1
         opentelemetry-api==1.45.3)

mkdir -p "$dest"
rm -f "$dest"/*.whl
abi="cp${py_version/./}"
platforms=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
  --python-version "$py_version" --implementation cp --abi "$abi" --abi abi3 --abi none \
  "${platforms[@]}" -d "$dest" "${wheels[@]}"

# Repack sglang without the parts listed above (same file name; RECORD rewritten).
python3 - "$dest"/sglang-*.whl <<'PY'
import os
import re
import sys
import zipfile

path = sys.argv[1]
drop = re.compile(r"^sglang/(multimodal_gen/|srt/rust_extensions/[^/]+\.so$|"
                  r"srt/mem_cache/rust_tree_core/[^/]+\.so$)")
tmp = path + ".tmp"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    kept = set()
    record = None
    for info in src.infolist():
        if drop.match(info.filename):
            continue
        if info.filename.endswith(".dist-info/RECORD"):
            record = info
            continue
        dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        kept.add(info.filename)
    lines = [line for line in src.read(record).decode().splitlines()
             if line.split(",", 1)[0] in kept or line.startswith(record.filename + ",")]
    dst.writestr(record, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
os.replace(tmp, path)
PY

total=0
for w in "$dest"/*.whl; do
  size=$(stat -c %s "$w")
  total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$w")"
done
printf '%10d  total in %s (%d wheels, %.1f MiB)\n' "$total" "$dest" \
  "$(ls "$dest"/*.whl | wc -l)" "$(echo "$total / 1048576" | bc -l)"
