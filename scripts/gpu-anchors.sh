#!/usr/bin/env bash
# The same-run anchors on the GPU machine: FlashMLA's dense decode and FlashAttention-3, built and
# timed by the recipe in ../shared/anchors from a git-ignored folder laid out by its assemble.sh
# (their code never enters the project; carry the folder, e.g. .anchors, with the device call).
#   scripts/gpu-anchors.sh build DIR             both extensions at once (CPU only: start it in the
#                                                background while the GPU runs mla's suite)
#   scripts/gpu-anchors.sh wait                  until that build is done
#   scripts/gpu-anchors.sh run DIR OPS OUT.jsonl FlashMLA (bench_anchors.py) then FA3
#                                                (bench_fa3.py) on OPS (decode, prefill), rows
#                                                appended to OUT.jsonl with card and date
# Build folders: /tmp/mla-anchor-build (FlashMLA), /tmp/mla-fa3-build (FA3); logs beside them.
set -u
cmd="${1:-}"
fm_build=/tmp/mla-anchor-build
fa_build=/tmp/mla-fa3-build
case "$cmd" in
  build)
    dir="$(cd "$2" && pwd)"
    mkdir -p "$fm_build" "$fa_build"
    (cd "$dir" && ANCHOR_BUILD="$fm_build" python3 -c 'import build_flashmla' \
      > "$fm_build.log" 2>&1; echo "rc=$?" >> "$fm_build.log") &
    (cd "$dir" && FA3_BUILD="$fa_build" MAX_JOBS="${MAX_JOBS:-12}" python3 -c 'import build_fa3' \
      > "$fa_build.log" 2>&1; echo "rc=$?" >> "$fa_build.log") &
    echo $! > /tmp/mla-anchors.pid
    ;;
  wait)
    while ! grep -q '^rc=' "$fm_build.log" 2>/dev/null || ! grep -q '^rc=' "$fa_build.log" 2>/dev/null; do
      sleep 2
    done
    tail -n 2 "$fm_build.log" "$fa_build.log"
    ;;
  run)
    dir="$(cd "$2" && pwd)"
    ops="$3"
    out="$4"
    gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    date="$(date -u +%Y-%m-%d)"
    tag() { python3 -c 'import json,sys
for l in sys.stdin:
    l = l.strip()
    if l.startswith("{"):
        r = json.loads(l); r.update(gpu=sys.argv[1], date=sys.argv[2]); print(json.dumps(r), flush=True)' \
      "$gpu" "$date"; }
    (cd "$dir" && ANCHOR_BUILD="$fm_build" python3 bench_anchors.py "$ops") | tag >> "$out"
    (cd "$dir" && FA3_BUILD="$fa_build" python3 bench_fa3.py "$ops") | tag >> "$out"
    ;;
  *)
    echo "usage: gpu-anchors.sh build DIR | wait | run DIR OPS OUT.jsonl" >&2
    exit 2
    ;;
esac
