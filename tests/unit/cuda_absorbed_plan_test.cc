// The CUDA absorbed op's host planner (src/kernels/cuda/absorbed/plan.cc): a pure host function,
// built and tested in every configuration, GPU or not. Coverage (every (row, key) the causal mask
// allows is planned exactly once), combines, partial bounds, balance over the persistent grid,
// capacity errors, deterministic re-planning (allocations per plan: bench/planning_bench.cc), and
// the balance bound the plans keep (the most loaded CTA against the ideal share of the problem).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <vector>

#include "conformance/case_gen.h"
#include "conformance/conformance.h"
#include "fuzz/plan_checks.h"
#include "kernels/cuda/absorbed/choose.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan.h"
#include "kernels/cuda/absorbed/traits.h"
#include "mla/kv_pool.h"
#include "mla/model.h"
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
        for (int k = 0; k < limit; ++k)
          ASSERT_EQ(it->second[k], 1) << "row " << row << " key " << k;
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

// Grouped decode plans (65-128 heads): the k-th CTA of each group (CTAs k and k + num_ctas / 2)
// loads the same key tiles in the same order, so the second read of each key hits L2 (plan.cc)
// and a cluster of the two CTAs can share the tiles outright (the paired kernel of merge
// 2a6abcf checks exactly this per CTA). The fraction of CTA pairs with the same unit list
// (page-table row and key range of each unit).
double paired_fraction(const std::vector<std::byte>& plan, int ctas) {
  PlanHeader h;
  std::memcpy(&h, plan.data(), sizeof(h));
  const auto begin = plan_array<int32_t>(plan, h.cta_begin_offset, ctas + 1);
  const auto units = plan_array<WorkUnit>(plan, h.units_offset, h.num_units);
  const int half = ctas / 2;
  int same = 0;
  for (int k = 0; k < half; ++k) {
    const int a = begin[k], n = begin[k + 1] - a, b = begin[half + k];
    bool eq = begin[half + k + 1] - b == n;
    for (int i = 0; eq && i < n; ++i) {
      eq = units[a + i].pool_row == units[b + i].pool_row &&
           units[a + i].kv_begin == units[b + i].kv_begin &&
           units[a + i].kv_end == units[b + i].kv_end;
    }
    same += eq ? 1 : 0;
  }
  return half > 0 ? static_cast<double>(same) / half : 0.0;
}

TEST(AbsorbedPlan, DecodeOfTwoRowTilesPairsEveryCtaWithItsGroupTwin) {
  Rng rng(mix_seed(base_seed(), 47));
  for (int heads : {128, 96, 65}) {
    for (int ctas : {132, 114, 8}) {
      for (int shape = 0; shape < 4; ++shape) {
        // equal lengths (whole placement), more requests than CTAs, variable lengths (the
        // dealt or cut plans), and a few long requests (split pieces and combines)
        const int bs = shape == 0 ? 64 : shape == 3 ? 3 : 200;
        std::vector<int32_t> rows, q(static_cast<std::size_t>(bs), 1), kv;
        for (int b = 0; b < bs; ++b) {
          rows.push_back(b + 1);
          kv.push_back(shape <= 1   ? 4096
                       : shape == 2 ? static_cast<int32_t>(rng.uniform_int(1, 9000))
                                    : 60000);
        }
        AttnCapacity cap{bs, bs, 0, 1, heads};
        AbsorbedProblem p{heads, 64, true, rows, q, kv};
        std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
        ASSERT_TRUE(cuda::absorbed::build_plan(p, cap, ctas, plan).ok());
        EXPECT_EQ(paired_fraction(plan, ctas), 1.0)
            << "heads " << heads << " ctas " << ctas << " shape " << shape;
      }
    }
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
    EXPECT_LE(worst, ideal * 1.1 + 4)
        << "heads " << heads << ": worst CTA " << worst << " key tiles vs equal share " << ideal;
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

// What a plan says, less the bytes it leaves unwritten (region padding, slots past its counts).
struct PlanContent {
  PlanHeader header{};
  std::vector<int32_t> cta_begin;
  std::vector<std::byte> units, combines;
  std::size_t used = 0;
  bool operator==(const PlanContent& o) const {
    return std::memcmp(&header, &o.header, sizeof(header)) == 0 && cta_begin == o.cta_begin &&
           units == o.units && combines == o.combines && used == o.used;
  }
};

PlanContent content_of(const std::vector<std::byte>& plan, std::size_t used) {
  PlanContent c;
  std::memcpy(&c.header, plan.data(), sizeof(c.header));
  const PlanHeader& h = c.header;
  c.cta_begin = plan_array<int32_t>(plan, h.cta_begin_offset, h.num_ctas + 1);
  const auto* u = plan.data() + h.units_offset;
  c.units.assign(u, u + sizeof(WorkUnit) * static_cast<std::size_t>(h.num_units));
  const auto* k = plan.data() + h.combines_offset;
  c.combines.assign(k, k + sizeof(CombineUnit) * static_cast<std::size_t>(h.num_combines));
  c.used = used;
  return c;
}

// The most loaded CTA in the planner's cost model (key tiles + kUnitCost per unit).
int64_t max_cta_cost(const PlanContent& c) {
  std::vector<WorkUnit> units(c.units.size() / sizeof(WorkUnit));
  if (!units.empty()) std::memcpy(units.data(), c.units.data(), c.units.size());
  int64_t worst = 0;
  for (int g = 0; g < c.header.num_ctas; ++g) {
    int64_t cost = 0;
    for (int i = c.cta_begin[g]; i < c.cta_begin[g + 1]; ++i) {
      cost += (units[i].kv_end - units[i].kv_begin + cuda::absorbed::kBlockN - 1) /
                  cuda::absorbed::kBlockN +
              1;
    }
    worst = std::max(worst, cost);
  }
  return worst;
}

// The plan of p on `ctas` CTAs, checked to cover every (row, key) once with its combines
// (check_absorbed_plan); a failure is added, and the content left empty, when it is not.
PlanContent covered_plan(const AbsorbedProblem& p, const AttnCapacity& cap, int ctas) {
  std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
  auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
  if (!used.ok()) {
    ADD_FAILURE() << used.status().to_string();
    return {};
  }
  const std::string error = fuzz::check_absorbed_plan(p, ctas, plan, *used, &cap);
  if (!error.empty()) {
    ADD_FAILURE() << error;
    return {};
  }
  return content_of(plan, *used);
}

// A random batch of one of several shapes: decode (q_len 1, some idle 0), speculative verify
// (one q_len for all), mixed q_len 0-8 (extends and draft extends), long prefixes; lengths from
// empty to long, some kv_len 0.
Batch random_shaped_batch(Rng& rng, int bs, bool causal) {
  const int shape = static_cast<int>(rng.uniform_int(0, 4));
  const int verify_q = static_cast<int>(rng.uniform_int(2, 8));
  const int max_kv = static_cast<int>(rng.uniform_int(0, 4)) == 0
                         ? static_cast<int>(rng.uniform_int(0, 300))
                         : static_cast<int>(rng.uniform_int(1, 40000));
  Batch b;
  for (int i = 0; i < bs; ++i) {
    int q = 1;
    if (shape == 0) q = rng.uniform_int(0, 30) == 0 ? 0 : 1;
    if (shape == 1) q = verify_q;
    if (shape >= 2) q = static_cast<int>(rng.uniform_int(0, 8));
    int kv = static_cast<int>(rng.uniform_int(0, max_kv));
    if (shape == 3) kv = static_cast<int>(rng.uniform_int(max_kv / 2, max_kv));
    if (rng.uniform_int(0, 15) == 0) kv = 0;
    if (causal && kv > 0 && kv < q) kv = q;
    if (causal && kv == 0) q = std::min(q, 0);
    b.rows.push_back(static_cast<int32_t>(rng.uniform_int(0, 1000)));
    b.q_lens.push_back(q);
    b.kv_lens.push_back(kv);
  }
  return b;
}

// The ideal share of the plan's cost model: items (a request's row tiles in step on groups of
// CTAs when the planner groups them, else each row tile) of key tiles + kUnitCost, spread evenly
// over one group's CTAs. Derived from the problem, as the planner must balance it.
double ideal_share(const AbsorbedProblem& p, int rows_tile, int ctas) {
  const int bs = static_cast<int>(p.q_lens.size());
  int64_t max_tiles = 0;
  for (int b = 0; b < bs; ++b) {
    max_tiles = std::max<int64_t>(max_tiles,
                                  (int64_t{p.q_lens[b]} * p.num_heads + rows_tile - 1) / rows_tile);
  }
  const int groups =
      max_tiles >= 2 && max_tiles <= 4 && ctas >= 2 * max_tiles ? static_cast<int>(max_tiles) : 1;
  int64_t total = 0;
  for (int b = 0; b < bs; ++b) {
    const int32_t ql = p.q_lens[b], kl = p.kv_lens[b];
    const int64_t rows = int64_t{ql} * p.num_heads;
    int64_t longest = 0;
    for (int64_t r = 0; r < rows; r += rows_tile) {
      const int64_t last_query = (std::min<int64_t>(r + rows_tile, rows) - 1) / p.num_heads;
      const int64_t extent =
          p.causal && kl > 0 ? std::max<int64_t>(int64_t{kl} - ql + last_query + 1, 0) : kl;
      const int64_t cost = (extent + cuda::absorbed::kBlockN - 1) / cuda::absorbed::kBlockN + 1;
      if (groups > 1) {
        longest = std::max(longest, cost);
      } else {
        total += cost;
      }
    }
    total += longest;
  }
  return static_cast<double>(total) / (ctas / groups);
}

// The stated balance bound of the default plans: the most loaded CTA within 10 % of the ideal
// share, plus 5 key tiles (a CTA's share is at least 3, a piece of at least 2 key tiles plus its
// unit cost, and a CTA may take 2 key tiles over its share rather than leave a shorter piece
// behind). Grouped batches dealt whole stay within share + share / 16 (plan.cc).
bool within_balance_bound(int64_t worst, double ideal) { return worst <= ideal * 1.1 + 5; }

// Thousands of random batches of every shape (decode, verify, mixed, long prefixes; some empty
// requests), grids of 1-300 CTAs, 16-128 heads, causal or not, tight capacities: every plan
// covers every (row, key) the mask allows exactly once with its combines (check_absorbed_plan),
// keeps the most loaded CTA within the balance bound, and a rejected problem names its field.
TEST(AbsorbedPlan, RandomBatchesAreCoveredOnceWithinTheBalanceBound) {
  Rng rng(mix_seed(base_seed(), 53));
  int planned = 0, errors = 0, whole = 0;
  double worst_excess = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    const int heads = 16 << rng.uniform_int(0, 3);
    const int pick = static_cast<int>(rng.uniform_int(0, 5));
    const int ctas = pick == 0   ? static_cast<int>(rng.uniform_int(1, 8))
                     : pick == 1 ? static_cast<int>(rng.uniform_int(9, 300))
                                 : 132;
    const int bs = rng.uniform_int(0, 3) == 0 ? static_cast<int>(rng.uniform_int(0, 8))
                                              : static_cast<int>(rng.uniform_int(1, 300));
    const bool causal = rng.uniform_int(0, 4) != 0;
    const Batch b = random_shaped_batch(rng, bs, causal);
    int64_t tokens = 0;
    for (int32_t q : b.q_lens) tokens += q;
    AttnCapacity cap{bs + static_cast<int>(rng.uniform_int(0, 4)), tokens + rng.uniform_int(0, 9),
                     0, 8, heads};
    if (rng.uniform_int(0, 40) == 0) cap.num_heads = 0;
    if (rng.uniform_int(0, 60) == 0) cap.max_q_tokens = std::max<int64_t>(tokens - 1, 0);
    AbsorbedProblem p{heads, 64, causal, b.rows, b.q_lens, b.kv_lens};
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes, std::byte{0});
    auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
    if (!used.ok()) {
      ASSERT_GT(tokens, cap.max_q_tokens) << used.status().to_string();
      EXPECT_NE(used.status().message().find("max_q_tokens"), std::string::npos)
          << used.status().to_string();
      ++errors;
      continue;
    }
    ASSERT_EQ(fuzz::check_absorbed_plan(p, ctas, plan, *used, &cap), "") << "iter " << iter;
    const PlanContent c = content_of(plan, *used);
    const double ideal = ideal_share(p, c.header.rows_per_tile, ctas);
    const int64_t worst = max_cta_cost(c);
    EXPECT_TRUE(within_balance_bound(worst, ideal))
        << "iter " << iter << ": heads " << heads << " ctas " << ctas << " bs " << bs
        << ": most loaded CTA " << worst << " key tiles, ideal share " << ideal;
    worst_excess = std::max(worst_excess, worst - ideal);
    whole += c.header.num_units > 0 && c.header.num_combines == 0 ? 1 : 0;
    ++planned;
  }
  EXPECT_GT(planned, 5000);
  EXPECT_GT(errors, 0);  // the capacity error path was taken too
  EXPECT_GT(whole, 0);
  std::printf(
      "%d plans (%d without splits), %d rejected; worst CTA at most %.1f key tiles over "
      "the ideal share\n",
      planned, whole, errors, worst_excess);
}

// Head counts that are no power of two and fill no tile (FlashMLA's 1, 3, 9, 63, 126; 8 at TP16),
// and causal requests with fewer keys than queries (their first q_len - kv_len queries see no
// key): every plan covers each (row, key) the mask allows once, rows of one request only (126
// heads: decode tiles of 64 and 62 rows in the two groups), within the balance bound.
TEST(AbsorbedPlan, AnyHeadCountAndShortCausalRequestsAreCoveredOnce) {
  Rng rng(mix_seed(base_seed(), 59));
  const int heads_list[] = {1, 3, 8, 9, 24, 63, 65, 100, 126, 127, 128};
  int planned = 0, short_causal = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    const int heads = heads_list[rng.uniform_int(0, std::size(heads_list) - 1)];
    const int ctas = rng.uniform_int(0, 2) == 0 ? static_cast<int>(rng.uniform_int(1, 40)) : 132;
    const int bs = static_cast<int>(rng.uniform_int(1, rng.uniform_int(0, 3) == 0 ? 200 : 8));
    const bool causal = rng.uniform_int(0, 3) != 0;
    const int max_q = rng.uniform_int(0, 2) == 0 ? 1 : static_cast<int>(rng.uniform_int(2, 8));
    Batch b;
    int64_t tokens = 0;
    for (int i = 0; i < bs; ++i) {
      const int q = static_cast<int>(rng.uniform_int(max_q == 1 ? 1 : 0, max_q));
      const int kv = rng.uniform_int(0, 3) == 0 ? static_cast<int>(rng.uniform_int(0, q))
                                                : static_cast<int>(rng.uniform_int(q, 5000));
      short_causal += causal && kv < q ? 1 : 0;
      b.rows.push_back(i);
      b.q_lens.push_back(q);
      b.kv_lens.push_back(kv);
      tokens += q;
    }
    AttnCapacity cap{bs, tokens, 0, 8, heads};
    cap.batch_invariant = rng.uniform_int(0, 5) == 0;
    AbsorbedProblem p{heads, 64, causal, b.rows, b.q_lens, b.kv_lens};
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes, std::byte{0});
    auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
    ASSERT_TRUE(used.ok()) << "iter " << iter << ": " << used.status().to_string();
    ASSERT_EQ(fuzz::check_absorbed_plan(p, ctas, plan, *used, &cap), "")
        << "iter " << iter << ": heads " << heads << " ctas " << ctas << " bs " << bs;
    if (!cap.batch_invariant) {
      const PlanContent c = content_of(plan, *used);
      EXPECT_TRUE(
          within_balance_bound(max_cta_cost(c), ideal_share(p, c.header.rows_per_tile, ctas)))
          << "iter " << iter << ": heads " << heads << " ctas " << ctas << " bs " << bs;
    }
    ++planned;
  }
  EXPECT_EQ(planned, 1500);
  EXPECT_GT(short_causal, 100);
}

// Decode batches of the benchmark's shape (s_q 1, s_k in [s/2, s]) at batch 1-256, 16-128 heads,
// 132 CTAs, and speculative verify / mixed batches (q_len 2-8) on 132 or 1-12 CTAs: covered
// once, within the balance bound. Each path of the planner: whole placement, the contiguous cut
// of requests or of row tiles, grouped requests cut or dealt whole.
TEST(AbsorbedPlan, ServingShapesAreCoveredOnceWithinTheBalanceBound) {
  Rng rng(mix_seed(base_seed(), 59));
  int planned = 0;
  const auto check = [&](const AbsorbedProblem& p, const AttnCapacity& cap, int ctas) {
    const PlanContent c = covered_plan(p, cap, ctas);
    const double ideal = ideal_share(p, c.header.rows_per_tile, ctas);
    EXPECT_TRUE(within_balance_bound(max_cta_cost(c), ideal))
        << "heads " << p.num_heads << " bs " << p.q_lens.size() << " ctas " << ctas
        << ": most loaded CTA " << max_cta_cost(c) << ", ideal share " << ideal;
    ++planned;
  };
  for (int heads : {16, 32, 64, 128}) {
    for (int bs : {1, 2, 7, 64, 131, 132, 133, 256}) {
      for (int max_kv : {64, 1024, 8192, 65536}) {
        std::vector<int32_t> rows, q(static_cast<std::size_t>(bs), 1), kv;
        for (int i = 0; i < bs; ++i) {
          rows.push_back(i + 1);
          kv.push_back(static_cast<int32_t>(rng.uniform_int(max_kv / 2, max_kv)));
        }
        check(AbsorbedProblem{heads, 64, true, rows, q, kv}, AttnCapacity{256, 512, 0, 2, heads},
              132);
      }
    }
    for (int q_len = 2; q_len <= 8; ++q_len) {
      for (int bs : {1, 3, 64, 133, 256}) {
        for (int variant = 0; variant < 4; ++variant) {
          const bool causal = variant != 3;
          const bool mixed = variant == 1;
          const int ctas = variant == 2 ? static_cast<int>(rng.uniform_int(1, 12)) : 132;
          const int max_kv = rng.uniform_int(0, 3) == 0
                                 ? static_cast<int>(rng.uniform_int(1, 200))
                                 : static_cast<int>(rng.uniform_int(200, 20000));
          std::vector<int32_t> rows, q, kv;
          int64_t tokens = 0;
          for (int i = 0; i < bs; ++i) {
            int qi = mixed ? static_cast<int>(rng.uniform_int(0, q_len)) : q_len;
            int kvi = static_cast<int>(rng.uniform_int(max_kv / 2, max_kv));
            if (rng.uniform_int(0, 20) == 0) kvi = 0;
            if (causal && kvi > 0 && kvi < qi) kvi = qi;
            if (causal && kvi == 0) qi = 0;
            rows.push_back(static_cast<int32_t>(rng.uniform_int(0, 1000)));
            q.push_back(qi);
            kv.push_back(kvi);
            tokens += qi;
          }
          check(AbsorbedProblem{heads, 64, causal, rows, q, kv},
                AttnCapacity{bs, tokens, 0, 8, heads}, ctas);
        }
      }
    }
  }
  EXPECT_EQ(planned, 4 * (8 * 4 + 7 * 5 * 4));
}

// Grouped batches of more requests than CTAs per group whose whole requests can be dealt within
// 1/16 of the share (128-head decode at batch 128 and 256, 64 heads x 2 queries at batch 128):
// every request whole (no partial, no combine), the most loaded CTA within share + share / 16;
// at equal lengths the same units on the same CTAs as the batch-invariant plan of the batch,
// whose requests are one piece each at these lengths: the plans measured on the H200
// (2026-12-04, f942a01) at 0.91-0.98x the time of the split plans (variable lengths: dealt in a
// snake, not as the invariant plan's least-loaded placement). A batch that cannot be dealt that
// evenly (100 requests on 66 CTAs) is still split.
TEST(AbsorbedPlan, GroupedBatchesOfManyRequestsAreDealtWhole) {
  struct Shape {
    int heads, bs, q_len, min_kv, max_kv;
  };
  for (const Shape s : {Shape{128, 128, 1, 8192, 8192}, Shape{128, 128, 1, 4096, 8192},
                        Shape{128, 256, 1, 2048, 2048}, Shape{64, 128, 2, 8192, 8192},
                        Shape{64, 128, 2, 2048, 4096}}) {
    SCOPED_TRACE(fmt::format("heads {} bs {} q_len {} kv {}..{}", s.heads, s.bs, s.q_len, s.min_kv,
                             s.max_kv));
    Rng rng(71);
    std::vector<int32_t> rows, q(static_cast<std::size_t>(s.bs), s.q_len), kv;
    for (int i = 0; i < s.bs; ++i) {
      rows.push_back(i + 1);
      kv.push_back(static_cast<int32_t>(rng.uniform_int(s.min_kv, s.max_kv)));
    }
    AbsorbedProblem p{s.heads, 64, true, rows, q, kv};
    AttnCapacity cap{256, 1024, 0, 2, s.heads};
    const PlanContent c = covered_plan(p, cap, 132);
    EXPECT_EQ(c.header.num_combines, 0);
    EXPECT_EQ(c.header.num_partials, 0);
    EXPECT_EQ(c.header.num_units, 2 * s.bs);  // two row tiles per request
    int64_t total = 0;
    for (int i = 0; i < s.bs; ++i) total += (kv[i] + 63) / 64 + 1;
    const int64_t share = (total + 65) / 66;
    EXPECT_LE(max_cta_cost(c), share + share / 16);
    // The batch-invariant plan of the same batch.
    AttnCapacity inv_cap = cap;
    inv_cap.batch_invariant = true;
    const PlanContent ci = covered_plan(p, inv_cap, 132);
    EXPECT_EQ(ci.header.num_combines, 0);
    if (s.min_kv == s.max_kv) {
      EXPECT_EQ(c.cta_begin, ci.cta_begin);
      EXPECT_EQ(c.units, ci.units);
    }
  }
  // 100 requests on 66 CTAs per group: dealt whole, the most loaded CTA would carry 2 of them
  // against a share of 1.5: split instead.
  std::vector<int32_t> rows, q(100, 1), kv(100, 8192);
  for (int i = 0; i < 100; ++i) rows.push_back(i + 1);
  AbsorbedProblem p{128, 64, true, rows, q, kv};
  EXPECT_GT(covered_plan(p, AttnCapacity{256, 1024, 0, 2, 128}, 132).header.num_combines, 0);
}

// Decode of no more requests than CTAs, of about equal length: request k whole on CTA k (per
// group), no partial, no combine; one request much longer than the share is split.
TEST(AbsorbedPlan, DecodeOfFewEqualRequestsRunsWhole) {
  for (int heads : {16, 128}) {
    const int per_group = heads == 128 ? 66 : 132;
    std::vector<int32_t> rows, q(static_cast<std::size_t>(per_group), 1), kv;
    Rng rng(67);
    for (int i = 0; i < per_group; ++i) {
      rows.push_back(i + 1);
      kv.push_back(static_cast<int32_t>(rng.uniform_int(8000, 8192)));
    }
    AttnCapacity cap{256, 512, 0, 2, heads};
    AbsorbedProblem p{heads, 64, true, rows, q, kv};
    const PlanContent c = covered_plan(p, cap, 132);
    ASSERT_EQ(c.header.num_ctas, 132);
    EXPECT_EQ(c.header.num_combines, 0);
    EXPECT_EQ(c.header.num_partials, 0);
    EXPECT_EQ(c.header.num_units, 132);
    for (int cta = 0; cta < 132; ++cta) {
      EXPECT_EQ(c.cta_begin[cta + 1] - c.cta_begin[cta], 1) << "heads " << heads << " CTA " << cta;
    }
    // One request twice the others' length: past share + share / 16, so the batch is split.
    kv[0] = 16384;
    AbsorbedProblem p2{heads, 64, true, rows, q, kv};
    EXPECT_GT(covered_plan(p2, cap, 132).header.num_combines, 0) << "heads " << heads;
  }
}

}  // namespace
}  // namespace mla::testing
