#!/usr/bin/env bash
# ThreadSanitizer run (preset `tsan`): builds the unit, conformance and backend test executables
# with -fsanitize=thread and runs the tests that share state across threads: the KV pool and
# page allocator, the memory ledger, the workspace registry, backend creation, the cpu ops and
# their thread pool, and the concurrency test (backends created and destroyed while others run
# batches). Any data race fails the run (TSAN_OPTIONS halt_on_error=1).
# Not part of .ci/run (a third full build of the library and tests; see docs/reliability.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${MLA_JOBS:-$(nproc)}"
cmake --preset tsan >/dev/null
cmake --build --preset tsan --parallel "$jobs" \
  --target mla_unit_tests mla_conformance_tests mla_backends_tests
bin="$root/build/tsan/tests"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1}"
export MLA_NUM_THREADS="${MLA_NUM_THREADS:-4}"  # workers even on a 2-core machine
status=0
run() {
  echo "== $1 --gtest_filter=$2"
  "$bin/$1" --gtest_filter="$2" --gtest_brief=1 || status=1
}
run mla_unit_tests 'LatentKvPool.*:KvPoolProperty.*:PageAllocator.*:DeviceRuntime.*:MemoryLedger.*:FuzzCorpus.*'
run mla_backends_tests 'Workspace*:GrowableBufferTest.*:BackendResources.*:Concurrency.*:FaultInjectionHook.*'
run mla_conformance_tests 'Parallel.*:CpuAbsorbed.*:CpuKvWrite.*:CpuMerge.*:ConformanceRunner.*'
if [ $status -ne 0 ]; then echo "tsan: FAILED" >&2; exit 1; fi
echo "tsan: no data race reported"
