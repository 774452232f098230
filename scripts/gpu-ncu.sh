#!/usr/bin/env bash
# Nsight Compute on the GPU machine, one decode shape, mla's absorbed kernel beside the anchors'
# kernels in one call: `ncu --set detailed` plus the L2 / DRAM sector counts, one launch of each,
# exported as CSV rows (kernel, section, metric, unit, value) with a label column into
# $OUT/ncu.csv, and the SASS lines with the most stall samples of each mla build
# (scripts/ncu_top.py) into $OUT/ncu_top.txt.
#   scripts/gpu-ncu.sh LABEL=DIR [LABEL=DIR ...]
# DIR holds an `mla` built by scripts/gpu-build.sh; its kernel is profiled on shapes of `mla bench
# --quick --pages 64` (GPU_NCU_CASES below; default the first, (128, 1, 128, 8192), bf16).
# GPU_ANCHORS_DIR=dir (built by scripts/gpu-anchors.sh build; waited for here) adds FlashMLA's
# and FA3's kernels on the same shape (bench/anchors/one_shape.py, run in that folder: the
# anchors' code stays out of the project).
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/mla-gpu-out}"
mkdir -p "$OUT"
metrics=lts__t_sectors.sum,lts__t_sectors_srcunit_tex.sum,lts__t_requests_srcunit_tex.sum
metrics+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
metrics+=,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
export_csv() {  # export_csv LABEL REPORT
  ncu -i "$2.ncu-rep" --page details --csv 2>/dev/null | sed "s/^/\"$1\",/" >> "$OUT/ncu.csv"
  # The raw page is one header row of metric names, one of units, one of values: transposed.
  ncu -i "$2.ncu-rep" --page raw --csv --metrics "$metrics" 2>/dev/null | python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if r]
if len(rows) >= 3:
    w = csv.writer(sys.stdout, quoting=csv.QUOTE_ALL)
    for name, unit, value in zip(rows[0], rows[1], rows[2]):
        if "__" in name: w.writerow([sys.argv[1], "raw", name, unit, value])' "$1" >> "$OUT/ncu.csv"
}
: > "$OUT/ncu.csv"
: > "$OUT/ncu_top.txt"
# GPU_NCU_CASES: the launches profiled per build, "dtype:index" (default "bf16:0"), index into
# `mla bench --quick --pages 64`'s decode grid (0: (128, 1, 128, 8192), 1: (128, 1, 16, 8192),
# 2: (128, 1, 32, 8192), 3: (128, 1, 8, 8192), 4: (128, 2, 64, 4096)); each shape runs 3
# warm-up and 3 timed launches, the third of them is profiled. Labels: LABEL_dtype_index.
for spec in "$@"; do
  for case in ${GPU_NCU_CASES:-bf16:0}; do
    dtype="${case%%:*}"
    index="${case#*:}"
    label="${spec%%=*}_${dtype}_${index}"
    dir="${spec#*=}"
    rep="/tmp/ncu_$label"
    timeout "${GPU_NCU_TIMEOUT:-150}" ncu --set detailed --import-source no --metrics "$metrics" \
      --kernel-name regex:absorbed_attention_sm90 --launch-skip $((6 * index + 2)) \
      --launch-count 1 -o "$rep" -f "$dir/mla" bench --device cuda --quick --pages 64 \
      --ops decode --iters 3 --cache-dtype "$dtype" > "$OUT/ncu_$label.log" 2>&1
    echo "$label: ncu rc=$?" >> "$OUT/ncu_top.txt"
    export_csv "$label" "$rep"
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.source.csv" 2>/dev/null
    python3 "$root/scripts/ncu_top.py" "$rep.source.csv" 25 >> "$OUT/ncu_top.txt" 2>&1
  done
done
if [ -n "${GPU_ANCHORS_DIR:-}" ]; then
  # A machine that has not built the anchors yet (a fresh one) builds them now.
  [ -f /tmp/mla-anchor-build.log ] || "$root/scripts/gpu-anchors.sh" build "$GPU_ANCHORS_DIR"
  timeout "${GPU_NCU_ANCHOR_WAIT:-300}" "$root/scripts/gpu-anchors.sh" wait > /dev/null 2>&1
  for impl in flashmla fa3; do
    rep="/tmp/ncu_$impl"
    (cd "$GPU_ANCHORS_DIR" && ANCHOR_BUILD=/tmp/mla-anchor-build FA3_BUILD=/tmp/mla-fa3-build \
      timeout "${GPU_NCU_TIMEOUT:-150}" ncu --set detailed --import-source no \
      --metrics "$metrics" --kernel-name regex:'splitkv_mla|FlashAttnFwd|device_kernel' --launch-skip 4 \
      --launch-count 1 -o "$rep" -f python3 "$root/bench/anchors/one_shape.py" "$impl") > "$OUT/ncu_$impl.log" 2>&1
    echo "$impl: ncu rc=$?" >> "$OUT/ncu_top.txt"
    export_csv "$impl" "$rep"
  done
fi
# The headline metrics per label (full rows are in ncu.csv).
grep -E 'Duration|L2 Cache Throughput|DRAM Throughput|L2 Hit Rate|Issue Slots Busy|Registers Per|lts__t_sectors|dram__bytes_read' \
  "$OUT/ncu.csv" | awk -F'","' '{print $1 "\t" $(NF-2) "\t" $(NF-1) "\t" $NF}' | tr -d '"' |
  sort -u | sort -t$'\t' -k1,1 -s
