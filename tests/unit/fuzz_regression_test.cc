// Regression tests of what the fuzz targets (tests/fuzz) found, one readable test per finding
// (the inputs themselves are replayed from tests/fuzz/corpus/ by fuzz_corpus_test.cc).
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <vector>

#include "kernels/cuda/absorbed/plan.h"
#include "mla/ops.h"
#include "planning/chunked_prefix.h"

namespace mla {
namespace {

// chunked_prefix: fill_chunk_kv_indices resized kv_indices (and filled the chunks before the
// bad one) before it reported a request row or a chunk end out of range.
TEST(FuzzRegression, FillChunkKvIndicesWritesNothingOnRejection) {
  planning::ChunkedPrefixPlan plan;
  const std::vector<int32_t> prefix{8, 8};
  ASSERT_TRUE(planning::plan_chunked_prefix(prefix, 8, &plan).ok());
  const std::vector<int32_t> table(3 * 16, 0);
  plan.kv_indices = {7, 7, 7};
  const std::vector<int32_t> bad_row{1, 3};  // 3 rows: 0..2
  Status s = planning::fill_chunk_kv_indices(bad_row, table, 16, 1, &plan);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("req_pool_indices[1]"), std::string::npos) << s.message();
  EXPECT_EQ(plan.kv_indices, (std::vector<int32_t>{7, 7, 7}));
  const std::vector<int32_t> rows{1, 2};
  s = planning::fill_chunk_kv_indices(rows, table, 6, 1, &plan);  // prefixes end beyond 6
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_context_len"), std::string::npos) << s.message();
  EXPECT_EQ(plan.kv_indices, (std::vector<int32_t>{7, 7, 7}));
}

// chunked_prefix: a capacity of 1 against a 2^31-token prefix planned 2^31 chunks (gigabytes,
// then std::bad_alloc); chunk offsets could overflow int32 for huge capacities.
TEST(FuzzRegression, ChunkedPrefixPlanSizeIsBounded) {
  planning::ChunkedPrefixPlan plan;
  plan.num_chunks = 5;
  const std::vector<int32_t> huge{INT32_MAX};
  Status s = planning::plan_chunked_prefix(huge, 1, &plan);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunked_prefix_capacity"), std::string::npos) << s.message();
  EXPECT_EQ(plan.num_chunks, 5) << "a rejected plan was written";
  const std::vector<int32_t> two{INT32_MAX, INT32_MAX};
  s = planning::plan_chunked_prefix(two, int64_t{1} << 40, &plan);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("extend_prefix_lens"), std::string::npos) << s.message();
  const std::vector<int32_t> fine{100000, 5};
  EXPECT_TRUE(planning::plan_chunked_prefix(fine, 2, &plan).ok());  // 100000 chunks: allowed
}

// absorbed_plan: a capacity with num_heads 0 (accepted: "any head count") sized the plan for one
// head, so a 128-head problem overflowed the units and failed with kInternal.
TEST(FuzzRegression, AbsorbedPlanWithHeadlessCapacityFits) {
  std::vector<int32_t> rows{1, 2, 3}, q{4, 4, 4}, kv{900, 4000, 64};
  AttnCapacity cap{3, 12, 0, 4, 0};
  AbsorbedProblem p{128, 64, true, rows, q, kv};
  for (int ctas : {1, 7, 132}) {
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
    auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
    EXPECT_TRUE(used.ok()) << ctas << " CTAs: " << used.status().to_string();
  }
}

// absorbed_plan: num_ctas = INT32_MAX overflowed the layout arithmetic (signed overflow).
TEST(FuzzRegression, AbsorbedPlanRejectsAbsurdGrids) {
  std::vector<int32_t> rows{1}, q{1}, kv{10};
  AttnCapacity cap{1, 1, 0, 1, 16};
  AbsorbedProblem p{16, 16, true, rows, q, kv};
  std::vector<std::byte> plan(4096);
  auto used = cuda::absorbed::build_plan(p, cap, INT32_MAX, plan);
  EXPECT_EQ(used.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(used.status().message().find("num_ctas"), std::string::npos);
}

// absorbed_plan: a request with q_len 0 and kv_len INT32_MAX overflowed kv_len - q_len + 1 in
// the cost of a multi-tile batch (signed overflow).
TEST(FuzzRegression, AbsorbedPlanEmptyRequestWithHugeKvLen) {
  std::vector<int32_t> rows{1, 2}, q{0, 8}, kv{INT32_MAX, 100};
  AttnCapacity cap{2, 8, 0, 8, 16};
  AbsorbedProblem p{16, 16, true, rows, q, kv};
  std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, 5).bytes);
  auto used = cuda::absorbed::build_plan(p, cap, 5, plan);
  EXPECT_TRUE(used.ok()) << used.status().to_string();
}

}  // namespace
}  // namespace mla
