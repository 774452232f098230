#!/usr/bin/env bash
# Checks the ptxas resource report (-Xptxas -v, on with MLA_PTXAS_VERBOSE=ON, as in the cuda
# preset) of a CUDA build log: no CUDA kernel may spill, and no wgmma kernel may be serialised.
#   scripts/check-ptxas.sh build.log
# Fails on:
#   - C7510 (a wgmma pipeline crosses a function call), C7518 (wgmma waits in divergent code) or
#     C7514 (an accumulator read by other instructions while its wgmma is in flight, e.g. a wgmma
#     group left in flight across a loop's back edge): ptxas serialises every wgmma of the
#     function (the first v3 builds ran 1.7x slower so);
#   - C7517 (a warpgroup.wait injected so registers a wgmma defines can be read) beyond the
#     counts listed below, each of which was looked at (docs/kernels.md, "ptxas report");
#   - spill stores or loads, or a stack frame, in any kernel;
#   - a log without the report of the absorbed sm90 kernels (the check must not pass on a build
#     that compiled nothing: .ci/run deletes the CUDA objects first, ccache replays the report).
set -euo pipefail
log="${1:?usage: check-ptxas.sh build.log}"
# function-name substring : C7517 lines allowed (per function)
allow_c7517=(
  "absorbed_attention_sm90_kernel:2"
)
awk -v allow="$(IFS=,; echo "${allow_c7517[*]}")" '
  BEGIN {
    n = split(allow, a, ",")
    for (i = 1; i <= n; ++i) { split(a[i], kv, ":"); allowed[kv[1]] = kv[2] }
    bad = 0; kernels = 0; absorbed = 0
  }
  /\(C75(10|14|18)\)/ {
    print "ptxas serialises wgmma: " $0; bad = 1
  }
  /\(C7517\)/ {
    match($0, /function .[A-Za-z0-9_]+/); fn = substr($0, RSTART + 10, RLENGTH - 10)
    c7517[fn]++
  }
  /Compiling entry function/ {
    match($0, /function .[A-Za-z0-9_]+/); cur = substr($0, RSTART + 10, RLENGTH - 10)
    kernels++
    if (cur ~ /absorbed_attention_sm90_kernel/) absorbed++
  }
  /bytes stack frame/ {
    frame = $1; stores = $5; loads = $9
    if (frame + stores + loads > 0) {
      printf "spills in %s: %s\n", cur, $0; bad = 1
    }
  }
  END {
    for (fn in c7517) {
      limit = 0
      for (k in allowed) if (index(fn, k) > 0) limit = allowed[k]
      if (c7517[fn] > limit) {
        printf "C7517 x%d in %s (allowed: %d)\n", c7517[fn], fn, limit; bad = 1
      }
    }
    if (absorbed == 0) {
      print "no ptxas report of absorbed_attention_sm90_kernel in the log (nothing compiled?)"
      bad = 1
    }
    printf "ptxas check: %d kernels, %s\n", kernels, bad ? "FAILED" : "ok"
    exit bad
  }' "$log"
