#!/usr/bin/env bash
# Builds the libFuzzer targets (preset `fuzz`: clang 14, -fsanitize=fuzzer,address,undefined)
# and runs each for a bounded time: scripts/fuzz.sh [seconds per target, default 60] [targets...]
# Each run starts from the seed corpus tests/fuzz/corpus/<target>/ (read-only) plus a scratch
# corpus in build/fuzz/work/<target>/ that grows across runs. A crash or broken invariant leaves
# its input in build/fuzz/artifacts/ and fails the script; once fixed, copy that input into
# tests/fuzz/corpus/<target>/ so the unit tests replay it (tests/unit/fuzz_corpus_test.cc).
# MLA_JOBS targets run at once (default: all cores), each for the full time on one core (a
# libFuzzer run without -jobs uses one), so 2 cores halve the step's wall time, not its budget.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(trace batch chunked_prefix absorbed_plan mha_plan kv_pool)
fi
jobs="${MLA_JOBS:-$(nproc)}"

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target mla_fuzz_all --parallel "$jobs"

bin="$root/build/fuzz/tests/fuzz"
art="$root/build/fuzz/artifacts"
mkdir -p "$art"
# fuzz_one TARGET: one bounded run; its exit status is the fuzzer's.
fuzz_one() {
  local t="$1" work="$root/build/fuzz/work/$1" log="$root/build/fuzz/$1.log" dict=()
  mkdir -p "$work"
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$bin/fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=4096 \
      -print_final_stats=1 "${dict[@]}" -artifact_prefix="$art/$t-" "$work" "tests/fuzz/corpus/$t" \
      >"$log" 2>&1
}
# Targets in waves of $jobs, the summary in the targets' order.
declare -A rcs=()
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  pids=()
  for t in "${targets[@]:i:jobs}"; do
    echo "fuzz: $t for ${seconds}s"
    fuzz_one "$t" &
    pids+=("$t:$!")
  done
  for entry in "${pids[@]}"; do
    set +e
    wait "${entry#*:}"
    rcs[${entry%%:*}]=$?
    set -e
  done
done
failed=()
summary=()
for t in "${targets[@]}"; do
  work="$root/build/fuzz/work/$t"
  log="$root/build/fuzz/$t.log"
  rc=${rcs[$t]}
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)"
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    summary+=("$t: FAILED (rc $rc), ${execs:-?} runs; log $log")
    grep -E 'invariant broken|ERROR: |SUMMARY: |runtime error|Test unit written' "$log" | head -n 8 || true
  else
    summary+=("$t: ok, ${execs:-?} runs, coverage ${cov:-?} edges, corpus $(ls "$work" | wc -l) inputs")
  fi
done
printf '\nfuzz summary (%ss per target):\n' "$seconds"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failed: ${failed[*]} (inputs in $art)" >&2
  exit 1
fi
