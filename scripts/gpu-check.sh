#!/usr/bin/env bash
# ONE command for the GPU machine (the device tool), over binaries built by scripts/gpu-build.sh:
#   nvidia-smi; the GPU test suite (gtest JSON); compute-sanitizer memcheck + racecheck on a small
#   filter; SASS counts of the CUDA kernels (HMMA/HGMMA present, no LDL/STL); `mla bench --device
#   cuda --json`; the Python suite (tests/python, cpu + cuda) over the CUDA wheel that gpu-build.sh
#   put in the carry. Logs and JSON go under $OUT (at most 8 files come back), a summary table is
#   printed last.
# Environment: OUT (default /tmp/mla-gpu-out), GPU_CHECK_QUICK=1 (bench --quick),
#   GPU_TEST_FILTER (gtest filter for the suite), GPU_BENCH_OPS (default decode,prefill,extend),
#   GPU_BENCH_DTYPES (decode caches: bf16 (default), fp8 or bf16,fp8),
#   GPU_SKIP_TESTS=1 / GPU_SKIP_SANITIZER=1 / GPU_SKIP_BENCH=1 / GPU_SKIP_INTEGRATION=1 /
#   GPU_SKIP_PYTHON=1, GPU_PYTEST_ARGS (extra pytest arguments),
#   GPU_SANITIZER_FILTER, GPU_AB="label|dir;label2|dir2" (A/B builds: for each, the absorbed
#   tests and the quick decode grid with dir/mla_gpu_tests and dir/mla, rows tagged "variant").
#   GPU_SANITIZE_ALL=1 (the whole GPU suite under memcheck, racecheck, initcheck and synccheck,
#   each tool's run cut into GPU_SANITIZE_SHARDS gtest shards (default 3; racecheck
#   GPU_SANITIZE_RACECHECK_SHARDS, default 8), all tools' shards at once on the machine's cores
#   once the plain test run is done, alongside the SASS, integration and Python steps, each shard
#   bounded by GPU_SANITIZE_TIMEOUT seconds (default 300); tools in GPU_SANITIZE_TOOLS, filter
#   GPU_SANITIZE_FILTER (default every test but the 10,000-request soak, SoakDevice.*, which the
#   plain run covers)). A failed plain run reruns its first failed tests alone under memcheck.
#   GPU_AB_OPS (default decode): the ops of the variants' quick runs (e.g. decode,extend).
#   GPU_SKIP_ANCHORS=1: no cuDNN anchor rows (bench/python/cudnn_anchor.py, run after the
#   first round's prefill / extend rows; GPU_ANCHOR_TIMEOUT, default 180 s).
#   GPU_BENCH_REPEAT=N: N rounds (default 1): the first runs the benchmark as configured, later
#   ones the quick decode grid, each followed by every A/B variant's quick grid, so A/B rows of
#   one run interleave. GPU_BENCH_PAGES (e.g. 1,16,32,64,128) sets the quick decode grids' pages,
#   GPU_BENCH_INVARIANT=1 adds the decode grid with batch-invariant plans to the first round
#   (GPU_AB_INVARIANT=1: each A/B variant's too).
#   The benchmarks run first, alone on the GPU, after a smoke test: GPU_SMOKE_FILTER (default
#   AbsorbedDevice.*) runs first with a short limit (GPU_SMOKE_TIMEOUT, default 90 s); when it
#   fails or hangs, the benchmarks are skipped (they would time a broken or hung kernel) and the
#   rest of the script runs as asked. GPU_SMOKE_FILTER=none skips it.
#   GPU_ANCHORS_DIR=dir (a folder laid out by ../shared/anchors/assemble.sh, carried with the
#   call): FlashMLA and FlashAttention-3 are built in the background from the start
#   (scripts/gpu-anchors.sh) and, after the tests, timed on GPU_ANCHOR_OPS (default decode) into
#   $OUT/anchors.jsonl: the anchors of the same run.
#   GPU_ENGINE_WHEELS=dir (the wheels of scripts/gpu-engine-wheels.sh, carried with the call): after
#   the Python suite, the SGLang adapter's tests on CUDA tensors with the real sglang 0.5.23
#   (GPU_ENGINE_PYTEST_K, GPU_ENGINE_TESTS, GPU_ENGINE_TIMEOUT; log $OUT/sglang.log).
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
# The device tool kills a command at 600 s and then nothing of the summary comes back:
# GPU_CHECK_BUDGET (default 560) seconds for the whole script; each step's time limit is cut to
# what is left of it (left_s), so the summary always prints.
budget="${GPU_CHECK_BUDGET:-560}"
left_s() {  # left_s WANT RESERVE: min(WANT, budget - elapsed - RESERVE), at least 10
  local left=$((budget - SECONDS - $2))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 10 ] && left=10
  echo "$left"
}
carry="${CARRY:-$root/.carry/gpu}"
OUT="${OUT:-/tmp/mla-gpu-out}"
mkdir -p "$OUT"
export MLA_COMMIT="$(cat "$carry/COMMIT" 2>/dev/null || echo unknown)"
tests="$carry/mla_gpu_tests"
mla="$carry/mla"
summary=()

summary+=("gpu        $(nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1)")

# The anchors' builds (CPU only) start now, so they are ready when the GPU is free for them.
if [ -n "${GPU_ANCHORS_DIR:-}" ]; then "$root/scripts/gpu-anchors.sh" build "$GPU_ANCHORS_DIR"; fi

# The smoke test: a kernel that fails or hangs here is not benchmarked.
smoke_ok=1
if [ "${GPU_SMOKE_FILTER:-AbsorbedDevice.*}" != none ] && [ "${GPU_SKIP_BENCH:-0}" != 1 ]; then
  timeout "${GPU_SMOKE_TIMEOUT:-90}" "$tests" --gtest_filter="${GPU_SMOKE_FILTER:-AbsorbedDevice.*}" \
    > "$OUT/smoke.log" 2>&1
  smoke_rc=$?
  [ "$smoke_rc" -ne 0 ] && smoke_ok=0
  summary+=("smoke      rc=$smoke_rc ($(grep -c '^\[       OK \]' "$OUT/smoke.log") ok, $(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$OUT/smoke.log") failed; ${GPU_SMOKE_FILTER:-AbsorbedDevice.*})$([ "$smoke_ok" = 0 ] && echo ': benchmarks skipped')")
fi

# The benchmarks first, alone on the GPU: the commit's `mla bench`, then each A/B variant's
# (GPU_AB="label|dir;label2|dir2", each dir holding an mla and mla_gpu_tests built by
# scripts/gpu-build.sh (CARRY=dir) from another commit or with an experiments build option: the
# quick decode grid, rows tagged "variant": label), GPU_BENCH_REPEAT times in turn.
variants=()
[ -n "${GPU_AB:-}" ] && IFS=';' read -ra variants <<< "$GPU_AB"
if [ "${GPU_SKIP_BENCH:-0}" != 1 ] && [ "$smoke_ok" = 1 ]; then
  quick=()
  [ "${GPU_CHECK_QUICK:-0}" = 1 ] && quick=(--quick)
  pages=()
  [ -n "${GPU_BENCH_PAGES:-}" ] && pages=(--pages "$GPU_BENCH_PAGES")
  bench_rc=0
  for ((rep = 1; rep <= ${GPU_BENCH_REPEAT:-1}; ++rep)); do
    echo "== bench, round $rep" >> "$OUT/bench.log"
    if [ "$rep" = 1 ]; then
      first_pages=()
      [ "${GPU_CHECK_QUICK:-0}" = 1 ] && first_pages=("${pages[@]}")
      timeout "${GPU_BENCH_TIMEOUT:-300}" "$mla" bench --device cuda "${quick[@]}" \
        "${first_pages[@]}" --ops "${GPU_BENCH_OPS:-decode,prefill,extend}" --cache-dtype "${GPU_BENCH_DTYPES:-bf16}" \
        --out "$OUT/h200.jsonl" >> "$OUT/bench.log" 2>&1 || bench_rc=$?
      # The same run's cuDNN anchors of the MHA rows (bench/python/cudnn_anchor.py: cuDNN
      # through PyTorch SDPA, as PERF.md measured it; issue 11). GPU_SKIP_ANCHORS=1 leaves
      # them out; the script ignores decode.
      if [ "${GPU_SKIP_ANCHORS:-0}" != 1 ] && \
         [[ ",${GPU_BENCH_OPS:-decode,prefill,extend}," =~ ,(prefill|extend), ]]; then
        PYTHONUNBUFFERED=1 timeout "${GPU_ANCHOR_TIMEOUT:-180}" python3 \
          "$root/bench/python/cudnn_anchor.py" --device cuda "${quick[@]}" \
          --ops "${GPU_BENCH_OPS:-decode,prefill,extend}" --out "$OUT/h200.jsonl" \
          >> "$OUT/bench.log" 2>&1 || anchor_rc=$?
        python3 "$root/bench/python/cudnn_anchor.py" --compare "$OUT/h200.jsonl" \
          > /tmp/anchor_lines 2>&1
        summary+=("anchors    cuDNN rc=${anchor_rc:-0} (mla speed / cuDNN's, same run)")
        while IFS= read -r l; do summary+=("           $l"); done < /tmp/anchor_lines
      fi
      # GPU_BENCH_INVARIANT=1: the decode grid again with batch-invariant plans (issue 13 item 6).
      if [ "${GPU_BENCH_INVARIANT:-0}" = 1 ]; then
        timeout "${GPU_BENCH_TIMEOUT:-300}" "$mla" bench --device cuda "${quick[@]}" \
          --batch-invariant --ops decode --cache-dtype bf16 --out "$OUT/h200.jsonl" \
          >> "$OUT/bench.log" 2>&1 || bench_rc=$?
      fi
    else  # later rounds: the quick decode grid, to interleave with the variants' rows
      timeout "${GPU_BENCH_TIMEOUT:-300}" "$mla" bench --device cuda --quick "${pages[@]}" \
        --ops decode --cache-dtype "${GPU_BENCH_DTYPES:-bf16}" --out "$OUT/h200.jsonl" \
        >> "$OUT/bench.log" 2>&1 || bench_rc=$?
    fi
    for v in "${variants[@]}"; do
      label="${v%%|*}"
      dir="${v#*|}"
      {
        echo "== variant $label ($dir, $(cat "$dir/COMMIT" 2>/dev/null)), round $rep"
        MLA_BENCH_VARIANT="$label" MLA_COMMIT="$(cat "$dir/COMMIT" 2>/dev/null || echo unknown)" \
          timeout "${GPU_AB_BENCH_TIMEOUT:-150}" "$dir/mla" bench --device cuda --quick \
          "${pages[@]}" --ops "${GPU_AB_OPS:-decode}" --cache-dtype "${GPU_BENCH_DTYPES:-bf16}" \
          --out "$OUT/h200.jsonl"
        # GPU_AB_INVARIANT=1 (with GPU_BENCH_INVARIANT=1): round 1 also runs the variant's full
        # decode grid with batch-invariant plans (planner A/B).
        if [ "$rep" = 1 ] && [ "${GPU_BENCH_INVARIANT:-0}" = 1 ] && [ "${GPU_AB_INVARIANT:-0}" = 1 ]; then
          MLA_BENCH_VARIANT="$label" MLA_COMMIT="$(cat "$dir/COMMIT" 2>/dev/null || echo unknown)" \
            timeout "${GPU_AB_BENCH_TIMEOUT:-150}" "$dir/mla" bench --device cuda --batch-invariant \
            --ops decode --cache-dtype bf16 --out "$OUT/h200.jsonl"
        fi
      } >> "$OUT/bench_ab.log" 2>&1
    done
  done
  summary+=("bench      rc=$bench_rc rows=$(grep -c . "$OUT/h200.jsonl" 2>/dev/null) rounds=${GPU_BENCH_REPEAT:-1}")
fi

failed=0
if [ "${GPU_SKIP_TESTS:-0}" != 1 ]; then
  timeout "$(left_s "${GPU_TEST_TIMEOUT:-300}" 60)" "$tests" --gtest_filter="${GPU_TEST_FILTER:-*}" \
    > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  passed=$(grep -c '^\[       OK \]' "$OUT/gpu_tests.log")
  # Each failed test once (gtest prints a parameterised test's FAILED line twice: after its run
  # and in the final list, both with a "(").
  failed=$(grep '^\[  FAILED  \] [A-Za-z].*(' "$OUT/gpu_tests.log" | sed 's/^\[  FAILED  \] \([^ ,]*\).*/\1/' | sort -u | grep -c .)
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].*(' "$OUT/gpu_tests.log")
  summary+=("tests      rc=$rc passed=$passed failed=$failed skipped=$skipped")
  grep '^\[  FAILED  \] [A-Za-z].*(' "$OUT/gpu_tests.log" | head -8 | sed 's/^/           /' > /tmp/fails
  while IFS= read -r l; do summary+=("$l"); done < /tmp/fails
  grep -E '^soak ' "$OUT/gpu_tests.log" | sed 's/^/           /' > /tmp/soaks
  while IFS= read -r l; do summary+=("$l"); done < /tmp/soaks
fi

# A failed plain run: its failed tests once more, alone, under memcheck (which names the kernel
# and the address of a bad access), appended to the test log.
if [ "${GPU_SKIP_TESTS:-0}" != 1 ] && [ "$failed" -gt 0 ] && \
   grep '^\[  FAILED  \] [A-Za-z].*(' "$OUT/gpu_tests.log" | grep -qv SoakDevice; then
  # (not the 10,000-request soaks: under memcheck they never finish in the 45 s)
  ffilt="$(grep '^\[  FAILED  \] [A-Za-z].*(' "$OUT/gpu_tests.log" | sed 's/^\[  FAILED  \] \([^ ,]*\).*/\1/' | grep -v SoakDevice | sort -u | head -3 | tr '\n' ':')"
  {
    echo; echo "==== the first failed tests again, alone, under memcheck: $ffilt"
    timeout 45 compute-sanitizer --tool memcheck --print-limit 20 "$tests" --gtest_filter="$ffilt"
    echo "memcheck rerun rc=$?"
  } >> "$OUT/gpu_tests.log" 2>&1
  summary+=("rerun      $(grep -E '^memcheck rerun rc=' "$OUT/gpu_tests.log") $(grep -m1 -E 'ERROR SUMMARY' <(sed -n '/==== the first failed tests again/,$p' "$OUT/gpu_tests.log"))")
  summary+=("           $(grep -cE '^\[       OK \]' <(sed -n '/==== the first failed tests again/,$p' "$OUT/gpu_tests.log")) of them passed alone")
fi

# The whole GPU suite under each compute-sanitizer tool (issue 13), started in the background
# once the plain run is done (so nothing else shares the GPU with it), alongside the steps after
# it: each tool's run cut into gtest shards (racecheck, the slowest, into more), every shard of
# every tool at once (the suite's host references use the cores, the sanitized kernels the GPU),
# each shard bounded in time. Summarised per tool at the end.
san_pids=()
if [ "${GPU_SANITIZE_ALL:-0}" = 1 ]; then
  sfilt="${GPU_SANITIZE_FILTER:-*:-*SoakDevice.*}"
  san_timeout="$(left_s "${GPU_SANITIZE_TIMEOUT:-300}" 40)"
  for tool in ${GPU_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    extra=()
    shards="${GPU_SANITIZE_SHARDS:-3}"
    if [ "$tool" = racecheck ]; then
      extra=(--racecheck-report hazard)
      shards="${GPU_SANITIZE_RACECHECK_SHARDS:-8}"
    fi
    echo "$shards" > "/tmp/mla_sanitize_${tool}.shards"
    rm -f "/tmp/mla_sanitize_${tool}.failed"
    # (initcheck takes no "--track-unused-memory no": compute-sanitizer read "no" as the program.)
    for ((i = 0; i < shards; ++i)); do
      log="/tmp/mla_sanitize_${tool}_$i.log"  # appended to $OUT/sanitize_all.log (8 files at most)
      (
        start=$SECONDS
        GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i MLA_NUM_THREADS=2 \
          timeout -s INT -k 15 "$san_timeout" compute-sanitizer --tool "$tool" \
          "${extra[@]}" --print-limit 100 --error-exitcode 9 "$tests" --gtest_filter="$sfilt" \
          --gtest_brief=0 > "$log" 2>&1
        echo "$? $((SECONDS - start))" > "$log.rc"
      ) &
      san_pids+=($!)
    done
  done
fi

# Each A/B variant's absorbed tests (its bench rows are above).
for v in "${variants[@]}"; do
  label="${v%%|*}"
  dir="${v#*|}"
  {
    echo "== variant $label tests ($dir, $(cat "$dir/COMMIT" 2>/dev/null))"
    timeout 120 "$dir/mla_gpu_tests" --gtest_filter="${GPU_AB_TEST_FILTER:-AbsorbedDevice.*:*absorbed*}" \
      2>&1 | grep -E '^\[  (PASSED|FAILED) |tests ran'
  } >> "$OUT/bench_ab.log" 2>&1
  summary+=("variant    $label: $(grep -A3 "== variant $label tests" "$OUT/bench_ab.log" | grep -E 'PASSED|FAILED' | tr '\n' ' ')")
done

if [ "${GPU_SKIP_SANITIZER:-0}" != 1 ] && [ "${GPU_SANITIZE_ALL:-0}" != 1 ]; then
  filt="${GPU_SANITIZER_FILTER:-AbsorbedDevice.*:*absorbed_decode_h16_p16_bs6*:*absorbed_verify_h128_p64*:*absorbed_draft_h16*}"
  {
    echo "== memcheck ($filt)"
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$tests" --gtest_filter="$filt"
    echo "memcheck rc=$?"
    echo "== racecheck ($filt)"
    timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 9 \
      "$tests" --gtest_filter="$filt"
    echo "racecheck rc=$?"
  } > "$OUT/sanitizer.log" 2>&1
  summary+=("sanitizer  $(grep -E '^(memcheck|racecheck) rc=' "$OUT/sanitizer.log" | tr '\n' ' ')$(grep -m1 -E 'ERROR SUMMARY' "$OUT/sanitizer.log")")
fi

if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass "$mla" 2>/dev/null | awk '
    /Function :/ { fn = $3 }
    /HGMMA/ { hg[fn]++ } /HMMA/ { hm[fn]++ } /LDL|STL/ { ll[fn]++ } /LDGSTS/ { cp[fn]++ }
    /Function :/ { seen[fn] = 1 }
    END { for (f in seen) printf "%-90s HGMMA %4d HMMA %5d LDGSTS %4d LDL/STL %4d\n", substr(f, 1, 90), hg[f], hm[f], cp[f], ll[f] }' \
    | sort > "$OUT/sass.txt"
  summary+=("sass       $(grep -c . "$OUT/sass.txt") kernels; absorbed: $(grep absorbed_attention "$OUT/sass.txt" | sed 's/  */ /g' | cut -c1-160)")
fi

if [ "${GPU_SKIP_INTEGRATION:-0}" != 1 ]; then
  # The backends end to end on the GPU: the memory report, the main job with --check for every
  # backend (and the fallback / graph paths), and the conformance table through the CLI.
  {
    echo "== mla info --device cuda"; timeout 60 "$mla" info --device cuda; echo "info rc=$?"
    for b in paged_mla chunked_mla ondemand_mla; do
      echo "== mla run --device cuda --backend $b --check --json"
      timeout 90 "$mla" run --device cuda --backend "$b" --check --json --model deepseek-v3 \
        --layers 2 --requests 48; echo "run $b rc=$?"
    done
    echo "== mla run --device cuda --backend chunked_mla --disable-chunked-prefix-cache --cuda-graph --speculative 3 --check"
    timeout 90 "$mla" run --device cuda --backend chunked_mla --disable-chunked-prefix-cache \
      --cuda-graph --speculative 3 --check --no-progress; echo "run fallback rc=$?"
    echo "== mla check --device cuda"; timeout 120 "$mla" check --device cuda; echo "check rc=$?"
  } > "$OUT/integration.log" 2>&1
  summary+=("integration $(grep -E ' rc=' "$OUT/integration.log" | tr '\n' ' ')")
fi

# The Python package on the GPU (issue 9): the wheel gpu-build.sh built here with MLA_CUDA=ON,
# unpacked into a scratch site (no index there; torch 2.11 and pytest are on the machine), then
# tests/python: every op and backend against the float64 oracle on cpu and cuda tensors, CUDA
# graph capture and replay after re-plans, bad inputs, the README quick start.
if [ "${GPU_SKIP_PYTHON:-0}" != 1 ]; then
  wheel="$(ls "$carry"/mla-*.whl 2>/dev/null | head -n 1)"
  if [ -z "$wheel" ]; then
    summary+=("python     no wheel in $carry (gpu-build.sh builds one when .venv exists)")
  else
    site=/tmp/mla-site
    rm -rf "$site"
    {
      python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheel"
      echo "pip rc=$?"
      (cd "$root/tests/python" && PYTHONPATH="$site" PYTHONUNBUFFERED=1 timeout "$(left_s "${GPU_PYTEST_TIMEOUT:-240}" 40)" \
        python3 -m pytest -q -p no:cacheprovider -rs ${GPU_PYTEST_ARGS:-})
      echo "pytest rc=$?"
      # Host time of planning a batch-256 decode from Python (issue 9 item 8; a benchmark).
      PYTHONPATH="$site" timeout 120 python3 "$root/bench/python/plan_bench.py" --device cuda \
        --commit "$(cat "$carry/COMMIT" 2>/dev/null || echo unknown)" > /tmp/python_plan.jsonl
      echo "plan_bench rc=$?"; cat /tmp/python_plan.jsonl
      # Host cost per call of the FlashMLA form on small problems (issue 33 part 5; a benchmark).
      PYTHONPATH="$site" timeout 120 python3 "$root/bench/python/flashmla_call.py" --device cuda \
        --commit "$(cat "$carry/COMMIT" 2>/dev/null || echo unknown)" > /tmp/flashmla_call.jsonl
      echo "flashmla_call rc=$?"; cat /tmp/flashmla_call.jsonl
      # SGLang's flashinfer fp8 path (the layer's pool converted to bf16 per call) beside mla's
      # fp8 decode from the same pool (issue 32): rows into $OUT/h200.jsonl with the bench's.
      PYTHONPATH="$site" timeout 120 python3 "$root/bench/python/sglang_fp8_path.py" --device cuda \
        --commit "$(cat "$carry/COMMIT" 2>/dev/null || echo unknown)" | tee -a "$OUT/h200.jsonl"
      echo "sglang_fp8_path rc=${PIPESTATUS[0]}"
    } > "$OUT/python.log" 2>&1
    summary+=("python     $(grep -E '^(pip|pytest) rc=' "$OUT/python.log" | tr '\n' ' ')$(grep -E '(passed|failed|error)' "$OUT/python.log" | tail -n 1)")
  fi
fi

# GPU_ENGINE_WHEELS=dir (scripts/gpu-engine-wheels.sh's wheels, carried with the call; issue 33
# part 6): the SGLang adapter on CUDA tensors inside the real sglang 0.5.23. The wheels and the
# carry's mla wheel go into the scratch site /tmp/site (no index there), sgl_kernel is the
# import stub of tests/python/gpu_stubs, then the cuda cases of the adapter tests
# (GPU_ENGINE_PYTEST_K, default: those of device cuda; GPU_ENGINE_TESTS, default
# test_backend_sglang.py and test_sglang_server_paths.py): decode, target-verify and draft-extend
# through RadixAttention, extends with a prefix (absorbed, chunked-prefix MHA), a CUDA-graph
# capture and replay through the graph hooks, the EAGLE / MTP draft worker's decode and extend
# from SGLang's DraftBackendFactory, each against the float64 oracle. Log: $OUT/sglang.log.
if [ -n "${GPU_ENGINE_WHEELS:-}" ]; then
  wheel="$(ls "$carry"/mla-*.whl 2>/dev/null | head -n 1)"
  {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site $wheel "$GPU_ENGINE_WHEELS"/*.whl
    echo "pip rc=$?"
    (cd "$root/tests/python" && PYTHONPATH="/tmp/site:$root/tests/python/gpu_stubs" \
      PYTHONUNBUFFERED=1 timeout "$(left_s "${GPU_ENGINE_TIMEOUT:-300}" 30)" \
      python3 -m pytest -q -p no:cacheprovider -rs -k "${GPU_ENGINE_PYTEST_K:-cuda and not cpu}" \
      ${GPU_ENGINE_TESTS:-test_backend_sglang.py test_sglang_server_paths.py})
    echo "pytest rc=$?"
  } > "$OUT/sglang.log" 2>&1
  summary+=("sglang     $([ -z "$wheel" ] && echo "no mla wheel in $carry; ")$(grep -E '^(pip|pytest) rc=' "$OUT/sglang.log" | tr '\n' ' ')$(grep -E '(passed|failed|error|deselected)' "$OUT/sglang.log" | tail -n 1)")
fi

# The sanitizer shards (started after the plain run): per tool, the errors of all its shards
# (each shard's ERROR SUMMARY when it got that far, else its error reports so far), the tests
# that finished, and whether a shard's time limit cut it short.
if [ ${#san_pids[@]} -gt 0 ]; then
  wait "${san_pids[@]}"
  for tool in ${GPU_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    errors=0; partial=""; ran=0; ok=0; bad=0; state="finished"; secs=0; rcs=""; hazards=""
    shards="$(cat "/tmp/mla_sanitize_${tool}.shards")"
    for ((i = 0; i < shards; ++i)); do
      log="/tmp/mla_sanitize_${tool}_$i.log"
      read -r rc s < "$log.rc"
      rcs="$rcs$rc,"
      [ "$s" -gt "$secs" ] && secs=$s
      e="$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -n 1)"
      if [ -z "$e" ]; then
        e="$(grep -cE '^========= (Invalid|Uninitialized|Error|Warning|Barrier|Program hit|Race|Cuda API|Host API|Unused|Misaligned|Out of)' "$log")"
        partial=" (some so far)"
      fi
      errors=$((errors + e))
      h="$(grep -m1 -E 'RACECHECK SUMMARY' "$log" | sed 's/^========= RACECHECK SUMMARY: //')"
      [ -n "$h" ] && hazards="$hazards [$h]"
      ran=$((ran + $(grep -c '^\[ RUN      \]' "$log")))
      ok=$((ok + $(grep -c '^\[       OK \]' "$log")))
      bad=$((bad + $(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$log")))
      grep '^\[  FAILED  \] [A-Za-z].*(' "$log" | sed 's/^\[  FAILED  \] \([^ ,]*\).*/\1/' \
        >> "/tmp/mla_sanitize_${tool}.failed"
      # gtest's last line: "[==========] N tests from M test suites ran. (T ms total)".
      { [ "$rc" -eq 124 ] || [ "$rc" -eq 130 ] || [ "$rc" -eq 137 ] || \
        ! grep -qE '^\[==========\] [0-9]+ tests? from .* ran\.' "$log"; } && \
        state="TIME LIMIT ($san_timeout s)"
      { echo "==== compute-sanitizer --tool $tool, shard $i of $shards: rc=$rc, ${s}s"
        cat "$log"; } >> "$OUT/sanitize_all.log"
    done
    summary+=("$(printf 'sanitize   %-9s errors=%s%s rc=%s %ss tests run=%s ok=%s failed=%s %s%s' \
      "$tool" "$errors" "$partial" "${rcs%,}" "$secs" "$ran" "$ok" "$bad" "$state" "$hazards")")
    if [ -s "/tmp/mla_sanitize_${tool}.failed" ]; then
      summary+=("           failed: $(sort -u "/tmp/mla_sanitize_${tool}.failed" | head -6 | tr '\n' ' ')")
    fi
  done
fi

# The anchors of the same run (GPU_ANCHORS_DIR), once mla's GPU work is done.
if [ -n "${GPU_ANCHORS_DIR:-}" ]; then
  timeout "$(left_s 120 30)" "$root/scripts/gpu-anchors.sh" wait > "$OUT/anchors_build.log" 2>&1
  timeout "$(left_s "${GPU_ANCHOR_RUN_TIMEOUT:-200}" 15)" "$root/scripts/gpu-anchors.sh" run \
    "$GPU_ANCHORS_DIR" "${GPU_ANCHOR_OPS:-decode}" "$OUT/anchors.jsonl" >> "$OUT/anchors_build.log" 2>&1
  summary+=("anchors    rc=$? rows=$(grep -c . "$OUT/anchors.jsonl" 2>/dev/null) ($(grep -h '^built\|rc=' /tmp/mla-anchor-build.log /tmp/mla-fa3-build.log 2>/dev/null | tr '\n' ' '))")
fi

echo
echo "==== bench (us, TFLOP/s, GB/s, fraction of the ceiling) ===="
grep -vE '^== bench' "$OUT/bench.log" 2>/dev/null | tail -80
[ -f "$OUT/bench_ab.log" ] && grep -E '^(== variant|decode )' "$OUT/bench_ab.log"
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
