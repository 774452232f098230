// A small process-wide thread pool for the cpu kernels. parallel_for splits [begin, end) into
// chunks that the pool's workers and the calling thread execute; it returns when all are done.
// Safe to call from any thread, also from inside a parallel_for body (nested calls run inline).
// Threads: MLA_NUM_THREADS if set, else std::thread::hardware_concurrency(); created once.
#pragma once

#include <cstdint>
#include <functional>

namespace mla {

// Threads that execute parallel work (workers + the caller), >= 1. Fixed for the process.
int parallel_num_threads();

// fn(chunk_begin, chunk_end, worker) over chunks of at most `grain` indices; `worker` is in
// [0, parallel_num_threads()) and no two chunks run at once with the same worker id, so it can
// index per-thread scratch. Runs inline (worker 0) when the range is at most one chunk.
void parallel_for_chunks(int64_t begin, int64_t end, int64_t grain,
                         const std::function<void(int64_t, int64_t, int)>& fn);

// fn(i) for every i in [begin, end), one index per task (for coarse work items).
void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t)>& fn);

}  // namespace mla
