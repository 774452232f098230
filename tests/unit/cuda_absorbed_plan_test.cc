// The CUDA absorbed op's host planner (src/kernels/cuda/absorbed/plan.cc): a pure host function,
// built and tested in every configuration, GPU or not. Coverage (every (row, key) the causal mask
// allows is planned exactly once), combines, partial bounds, balance over the persistent grid,
// capacity errors, and deterministic re-planning (allocations per plan: bench/planning_bench.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "common/case_gen.h"
#include "common/conformance.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan.h"
#include "kernels/cuda/absorbed/traits.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

using cuda::absorbed::CombineUnit;
using cuda::absorbed::PlanHeader;
using cuda::absorbed::WorkUnit;

struct Batch {
  std::vector<int32_t> rows, q_lens, kv_lens;
};

// An array of the plan, copied out (an empty one without touching a null pointer).
template <typename T>
std::vector<T> plan_array(const std::vector<std::byte>& plan, int32_t offset, int64_t count) {
  std::vector<T> out(static_cast<std::size_t>(count));
  if (count > 0) std::memcpy(out.data(), plan.data() + offset, out.size() * sizeof(T));
  return out;
}

Batch random_batch(Rng& rng, int bs, int max_q, int max_kv) {
  Batch b;
  for (int i = 0; i < bs; ++i) {
    const int q = static_cast<int>(rng.uniform_int(0, max_q));
    const int kv = q + static_cast<int>(rng.uniform_int(0, max_kv));
    b.rows.push_back(i + 1);
    b.q_lens.push_back(q);
    b.kv_lens.push_back(rng.uniform_int(0, 9) == 0 ? 0 : kv);
    if (b.kv_lens.back() == 0 && q > 0) b.q_lens.back() = 0;  // causal: kv_len >= q_len
  }
  return b;
}

// Every (row, key) the causal mask allows is covered by exactly one unit; splits are merged by
// exactly one combine; the partial count stays within its bound.
TEST(AbsorbedPlan, RandomBatchesCoverEveryRowAndKeyOnce) {
  Rng rng(mix_seed(base_seed(), 41));
  for (int iter = 0; iter < 200; ++iter) {
    const int heads = 16 << rng.uniform_int(0, 3);
    const int ctas = static_cast<int>(rng.uniform_int(1, 140));
    const Batch b = random_batch(rng, static_cast<int>(rng.uniform_int(1, 40)),
                                 static_cast<int>(rng.uniform_int(1, 9)),
                                 static_cast<int>(rng.uniform_int(0, 3000)));
    int64_t tokens = 0;
    for (int32_t q : b.q_lens) tokens += q;
    AttnCapacity cap{static_cast<int>(b.rows.size()) + 3, tokens + 5, 0, 9, heads};
    AbsorbedProblem p{heads, 16, true, b.rows, b.q_lens, b.kv_lens};
    const auto layout = cuda::absorbed::plan_layout(cap, ctas);
    std::vector<std::byte> plan(layout.bytes);
    auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
    ASSERT_TRUE(used.ok()) << used.status().to_string();
    PlanHeader h;
    std::memcpy(&h, plan.data(), sizeof(h));
    ASSERT_EQ(h.num_ctas, ctas);
    const auto begin = plan_array<int32_t>(plan, h.cta_begin_offset, ctas + 1);
    ASSERT_EQ(begin[0], 0);
    ASSERT_EQ(begin[ctas], h.num_units);
    for (int g = 0; g < ctas; ++g) ASSERT_LE(begin[g], begin[g + 1]);
    const auto units = plan_array<WorkUnit>(plan, h.units_offset, h.num_units);
    const auto combines = plan_array<CombineUnit>(plan, h.combines_offset, h.num_combines);
    ASSERT_LE(h.num_partials, cuda::absorbed::max_partials(ctas));

    // coverage[(flat row)] = keys covered, counted per key range
    std::map<int64_t, std::vector<int>> covered;
    std::map<int64_t, int> partial_rows;
    for (const WorkUnit& u : units) {
      ASSERT_GT(u.num_rows, 0);
      ASSERT_LE(u.num_rows, h.rows_per_tile);
      ASSERT_EQ(u.kv_begin % cuda::absorbed::kBlockN, 0);
      ASSERT_LE(u.kv_begin, std::max(u.kv_end, 0));
      for (int r = 0; r < u.num_rows; ++r) {
        auto& keys = covered[int64_t{u.q_row_begin} + r];
        if (keys.empty()) keys.assign(u.kv_len + 1, 0);
        for (int k = u.kv_begin; k < u.kv_end; ++k) keys[k]++;
        keys[u.kv_len]++;  // units touching the row
      }
      if (u.partial >= 0) partial_rows[u.partial]++;
    }
    int64_t row = 0;
    for (size_t i = 0; i < b.rows.size(); ++i) {
      for (int64_t r = 0; r < int64_t{b.q_lens[i]} * heads; ++r, ++row) {
        auto it = covered.find(row);
        ASSERT_NE(it, covered.end()) << "row " << row << " not planned";
        const int query = static_cast<int>(r / heads);
        const int limit = b.kv_lens[i] == 0 ? 0 : b.kv_lens[i] - b.q_lens[i] + query + 1;
        for (int k = 0; k < limit; ++k) ASSERT_EQ(it->second[k], 1) << "row " << row << " key " << k;
      }
    }
    ASSERT_EQ(static_cast<int64_t>(covered.size()), row);
    int partials_in_combines = 0;
    for (const CombineUnit& c : combines) {
      ASSERT_GE(c.num_partials, 2);
      partials_in_combines += c.num_partials;
    }
    ASSERT_EQ(partials_in_combines, h.num_partials);
    ASSERT_EQ(static_cast<int>(partial_rows.size()), h.num_partials);
  }
}

// Variable lengths: no CTA gets much more than an equal share of the key tiles.
TEST(AbsorbedPlan, VariableLengthsStayBalanced) {
  Rng rng(mix_seed(base_seed(), 43));
  for (int heads : {16, 128}) {
    std::vector<int32_t> rows, q(128, 1), kv;
    for (int b = 0; b < 128; ++b) {
      rows.push_back(b + 1);
      kv.push_back(static_cast<int32_t>(rng.uniform_int(2048, 4096)));
    }
    const int ctas = 132;
    AttnCapacity cap{128, 128, 0, 1, heads};
    AbsorbedProblem p{heads, 64, true, rows, q, kv};
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
    ASSERT_TRUE(cuda::absorbed::build_plan(p, cap, ctas, plan).ok());
    PlanHeader h;
    std::memcpy(&h, plan.data(), sizeof(h));
    const auto begin = plan_array<int32_t>(plan, h.cta_begin_offset, ctas + 1);
    const auto units = plan_array<WorkUnit>(plan, h.units_offset, h.num_units);
    int64_t total = 0, worst = 0;
    for (int g = 0; g < ctas; ++g) {
      int64_t cost = 0;
      for (int i = begin[g]; i < begin[g + 1]; ++i) {
        cost += (units[i].kv_end - units[i].kv_begin + 63) / 64 + 1;
      }
      total += cost;
      worst = std::max(worst, cost);
    }
    const int64_t groups = heads == 128 ? 2 : 1;
    const double ideal = static_cast<double>(total) / (ctas / groups * groups);
    EXPECT_LE(worst, ideal * 1.1 + 4) << "heads " << heads << ": worst CTA " << worst
                                      << " key tiles vs equal share " << ideal;
  }
}

TEST(AbsorbedPlan, RowsPerTileFollowHeadsTimesQueryLength) {
  EXPECT_EQ(cuda::absorbed::rows_per_tile(16, 1), 16);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(16, 2), 32);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(16, 4), 64);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(32, 1), 32);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(128, 1), 64);
}

TEST(AbsorbedPlan, RejectsProblemsBeyondCapacity) {
  std::vector<int32_t> rows{1, 2}, q{1, 1}, kv{5, 0};
  AttnCapacity cap{1, 8, 0, 1, 16};
  AbsorbedProblem p{16, 1, true, rows, q, kv};
  std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, 8).bytes);
  auto r = cuda::absorbed::build_plan(p, cap, 8, plan);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_batch"), std::string::npos) << r.status().message();
}

// Grouped (128 heads) and ungrouped (16 heads) schedules write the same plan bytes when planned
// twice, and re-planning a smaller batch after a larger one leaves no trace of the larger one.
TEST(AbsorbedPlan, ReplanningIsDeterministicAndForgetsTheLastBatch) {
  Rng rng(mix_seed(base_seed(), 47));
  for (int heads : {16, 128}) {
    const int ctas = 132;
    const Batch big = random_batch(rng, 200, 2, 9000);
    const Batch small = random_batch(rng, 3, 2, 500);
    AttnCapacity cap{256, 512, 0, 2, heads};
    const auto layout = cuda::absorbed::plan_layout(cap, ctas);
    auto plan_of = [&](const Batch& b) {
      std::vector<std::byte> plan(layout.bytes, std::byte{0});
      AbsorbedProblem p{heads, 64, true, b.rows, b.q_lens, b.kv_lens};
      auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
      EXPECT_TRUE(used.ok()) << used.status().to_string();
      plan.resize(used.ok() ? *used : 0);
      return plan;
    };
    const auto small_first = plan_of(small);
    (void)plan_of(big);
    EXPECT_EQ(plan_of(small), small_first) << "heads " << heads;
  }
}

}  // namespace
}  // namespace mla::testing
