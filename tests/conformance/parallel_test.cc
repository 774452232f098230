// The cpu thread pool: every index exactly once, worker ids in range and exclusive, nesting and
// calls from several threads at once.
#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace mla {
namespace {

TEST(Parallel, EveryIndexExactlyOnce) {
  for (int64_t n : {0, 1, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    parallel_for(0, n, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
  }
}

TEST(Parallel, ChunksCoverRangeWithWorkerIdsInRange) {
  const int threads = parallel_num_threads();
  ASSERT_GE(threads, 1);
  std::vector<std::atomic<int>> hits(1003);
  std::vector<std::atomic<int>> busy(threads);
  std::atomic<bool> bad_worker{false}, overlap{false};
  parallel_for_chunks(3, 1003, 17, [&](int64_t b, int64_t e, int w) {
    if (w < 0 || w >= threads) {
      bad_worker = true;
      return;
    }
    if (busy[w].fetch_add(1) != 0) overlap = true;
    EXPECT_LE(e - b, 17);
    for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    busy[w].fetch_sub(1);
  });
  EXPECT_FALSE(bad_worker);
  EXPECT_FALSE(overlap);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(hits[i].load(), 0);
  for (int i = 3; i < 1003; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

TEST(Parallel, NestedAndConcurrentCallsComplete) {
  std::atomic<int64_t> sum{0};
  auto body = [&] {
    parallel_for(0, 8, [&](int64_t i) {
      parallel_for(0, 10, [&](int64_t j) { sum.fetch_add(i * 10 + j); });
    });
  };
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) callers.emplace_back(body);
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 3 * (79 * 80 / 2));
}

}  // namespace
}  // namespace mla
