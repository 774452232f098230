// Batch-invariant plans of the CUDA absorbed planner (AttnCapacity::batch_invariant; host code,
// run on the cpu): a request's units (row tiles, key ranges, which units are split and in which
// partial order their combine merges them) are a function of that request alone. The same
// request is planned alone and inside random batches of other sizes and companions, at random
// positions, on grids of different sizes; its units must be identical. Every plan also passes the
// coverage check of the fuzz targets (every (row, key) the mask allows exactly once). A control
// shows that the default planner's units do depend on the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "conformance/case_gen.h"
#include "fuzz/plan_checks.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan.h"
#include "kernels/cuda/absorbed/traits.h"

namespace mla::testing {
namespace {

using cuda::absorbed::PlanHeader;
using cuda::absorbed::WorkUnit;

struct Req {
  int32_t q_len = 1, kv_len = 1;
};

// The requests as the planner's input: request i at pool row i + 1; causal.
struct ReqBatch {
  explicit ReqBatch(const std::vector<Req>& reqs) {
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      rows.push_back(static_cast<int32_t>(i) + 1);
      q_lens.push_back(reqs[i].q_len);
      kv_lens.push_back(reqs[i].kv_len);
      tokens += reqs[i].q_len;
    }
  }
  // Views of this batch: it must outlive the problem.
  AbsorbedProblem problem(int heads, int page) const {
    AbsorbedProblem p;
    p.num_heads = heads;
    p.page_size = page;
    p.causal = true;
    p.req_rows = rows;
    p.q_lens = q_lens;
    p.kv_lens = kv_lens;
    return p;
  }
  std::vector<int32_t> rows, q_lens, kv_lens;
  int64_t tokens = 0;
};

// What the kernel computes for one request: per row tile (row_in_req, rows), its key ranges in
// the order the combine merges them (by partial slot; -1 when the tile is not split).
struct TileUnits {
  int32_t rows = 0;
  std::vector<std::pair<int32_t, int32_t>> ranges;
  bool split = false;
  bool operator==(const TileUnits&) const = default;
};
struct Signature {
  int rows_per_tile = 0;
  std::map<int32_t, TileUnits> tiles;  // by row_in_req
  bool operator==(const Signature&) const = default;
};

// Plans `reqs` (request i at pool row i + 1) and returns the signature of request `target`.
Signature plan_and_sign(const std::vector<Req>& reqs, int target, int heads, int page, int ctas,
                        bool invariant, std::string* error) {
  const ReqBatch batch(reqs);
  const AbsorbedProblem p = batch.problem(heads, page);
  AttnCapacity cap{64, 64 * 8, 0, 8, heads, invariant};
  std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
  auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
  Signature sig;
  if (!used.ok()) {
    *error = used.status().to_string();
    return sig;
  }
  *error = fuzz::check_absorbed_plan(p, ctas, plan, *used, &cap);
  PlanHeader h;
  std::memcpy(&h, plan.data(), sizeof(h));
  sig.rows_per_tile = h.rows_per_tile;
  // (the combines themselves are checked by check_absorbed_plan: one per split tile, over
  // exactly its units' partial slots)
  const std::vector<WorkUnit> units = fuzz::read_array<WorkUnit>(plan, h.units_offset, h.num_units);
  std::map<int32_t, std::vector<const WorkUnit*>> by_tile;
  for (const WorkUnit& u : units) {
    if (u.pool_row == target + 1) by_tile[u.row_in_req].push_back(&u);
  }
  for (auto& [row_in_req, list] : by_tile) {
    std::sort(list.begin(), list.end(),
              [](const WorkUnit* a, const WorkUnit* b) { return a->partial < b->partial; });
    TileUnits t;
    t.rows = list.front()->num_rows;
    t.split = list.front()->partial >= 0;
    for (const WorkUnit* u : list) t.ranges.emplace_back(u->kv_begin, u->kv_end);
    // The combine merges partial slots first .. first + n - 1 in order: key order, ascending.
    if (t.split && error->empty() && !std::is_sorted(t.ranges.begin(), t.ranges.end())) {
      *error = fmt::format("tile {}: partial slots not in key order", row_in_req);
    }
    sig.tiles[row_in_req] = t;
  }
  return sig;
}

Req random_req(Rng& rng) {
  Req r;
  r.q_len = static_cast<int32_t>(rng.uniform_int(1, 8));
  // Short, around the split length, and long (several pieces, capped).
  const int kind = static_cast<int>(rng.uniform_int(0, 2));
  const int64_t hi = kind == 0 ? 300 : kind == 1 ? 5000 : 40000;
  r.kv_len = static_cast<int32_t>(rng.uniform_int(r.q_len, hi));
  return r;
}

struct Counts {
  int compared = 0, differing = 0;
};

Counts place_in_batches(int heads, int page, bool invariant, uint64_t seed) {
  Counts c;
  Rng rng(seed);
  for (int target_trial = 0; target_trial < 12; ++target_trial) {
    const Req target = random_req(rng);
    std::string error;
    const Signature alone = plan_and_sign({target}, 0, heads, page, 132, invariant, &error);
    EXPECT_TRUE(error.empty()) << error;
    for (int trial = 0; trial < 16; ++trial) {
      const int size = static_cast<int>(rng.uniform_int(2, 64));
      std::vector<Req> reqs;
      for (int i = 0; i < size; ++i) reqs.push_back(random_req(rng));
      const int at = static_cast<int>(rng.uniform_int(0, size - 1));
      reqs[at] = target;
      // Grids of 132 CTAs (H200), 78 and 8: the invariant split does not depend on the grid.
      const int ctas = trial % 3 == 0 ? 132 : trial % 3 == 1 ? 78 : 8;
      const Signature in_batch = plan_and_sign(reqs, at, heads, page, ctas, invariant, &error);
      EXPECT_TRUE(error.empty()) << error;
      ++c.compared;
      if (!(in_batch == alone)) ++c.differing;
    }
  }
  return c;
}

class InvariantPlan : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(InvariantPlan, RequestUnitsDoNotDependOnTheBatch) {
  const auto [heads, page] = GetParam();
  const Counts c = place_in_batches(heads, page, true, 1000 + heads + page);
  EXPECT_EQ(c.compared, 12 * 16);
  EXPECT_EQ(c.differing, 0) << c.differing << " of " << c.compared
                            << " placements changed the request's units";
}

INSTANTIATE_TEST_SUITE_P(HeadsAndPages, InvariantPlan,
                         ::testing::Combine(::testing::Values(16, 32, 64, 128),
                                            ::testing::Values(1, 64)));

// The control: the default planner balances the batch over the grid, so a request's split
// depends on its companions (the invariance test above can fail).
TEST(InvariantPlanControl, DefaultPlansDependOnTheBatch) {
  const Counts c = place_in_batches(16, 1, false, 7);
  EXPECT_GT(c.differing, 0);
}

// The rule itself: tiles of kMaxRows rows, p pieces of ceil(n / p) key tiles with
// p = clamp(max(min(2, ceil(n / L)), ceil(n / M)), 1, kInvariantMaxPieces), L and M (plan.h) times
// T, the request's row tiles.
TEST(InvariantPlan, SplitsByTheRequestsOwnKeys) {
  using cuda::absorbed::invariant_pieces;
  using cuda::absorbed::kBlockN;
  using cuda::absorbed::kInvariantMaxPieces;
  using cuda::absorbed::kInvariantPieceTiles;
  using cuda::absorbed::kInvariantSplitTiles;
  using cuda::absorbed::kInvariantSplitTilesFewRows;
  EXPECT_EQ(invariant_pieces(0), 1);
  EXPECT_EQ(invariant_pieces(kInvariantSplitTiles), 1);
  EXPECT_EQ(invariant_pieces(kInvariantSplitTiles + 1), 2);  // two above L
  EXPECT_EQ(invariant_pieces(2 * kInvariantPieceTiles), 2);  // pieces of at most M
  EXPECT_EQ(invariant_pieces(2 * kInvariantPieceTiles + 1), 3);
  EXPECT_EQ(invariant_pieces(int64_t{1} << 30), kInvariantMaxPieces);
  // Tiles of at most 16 rows split from L = kInvariantSplitTilesFewRows.
  EXPECT_EQ(invariant_pieces(kInvariantSplitTilesFewRows, 1, 16), 1);
  EXPECT_EQ(invariant_pieces(kInvariantSplitTilesFewRows + 1, 1, 16), 2);
  EXPECT_EQ(invariant_pieces(kInvariantSplitTilesFewRows + 1, 1, 32), 1);
  // T row tiles: L and M times T.
  EXPECT_EQ(invariant_pieces(2 * kInvariantSplitTiles, 2), 1);
  EXPECT_EQ(invariant_pieces(2 * kInvariantSplitTiles + 1, 2), 2);
  EXPECT_EQ(invariant_pieces(4 * kInvariantPieceTiles + 1, 2), 3);
  // One decode request of 16 heads (one row tile) and 3 piece lengths + 1 keys: 4 pieces.
  std::string error;
  const int32_t kv = 3 * kInvariantPieceTiles * kBlockN + 1;
  const Signature s = plan_and_sign({{1, kv}}, 0, 16, 1, 132, true, &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_EQ(s.rows_per_tile, cuda::absorbed::kMaxRows);
  ASSERT_EQ(s.tiles.size(), 1u);
  const TileUnits& t = s.tiles.begin()->second;
  EXPECT_EQ(t.rows, 16);
  EXPECT_TRUE(t.split);
  const int32_t n = 3 * kInvariantPieceTiles + 1, len = (n + 3) / 4;  // key tiles, per piece
  const std::vector<std::pair<int32_t, int32_t>> want = {{0, len * kBlockN},
                                                         {len * kBlockN, 2 * len * kBlockN},
                                                         {2 * len * kBlockN, 3 * len * kBlockN},
                                                         {3 * len * kBlockN, kv}};
  EXPECT_EQ(t.ranges, want);
  // 128 heads (two row tiles): the same keys make 2 pieces per row tile, not 4.
  const Signature s128 = plan_and_sign({{1, kv}}, 0, 128, 1, 132, true, &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_EQ(s128.tiles.size(), 2u);
  for (const auto& [row, tile] : s128.tiles) EXPECT_EQ(tile.ranges.size(), 2u) << "row " << row;
}

// The placement (the batch-dependent part of an invariant plan): the tests below read a plan's
// units per CTA.
struct PlacedPlan {
  PlanHeader h{};
  std::vector<int32_t> cta_begin;
  std::vector<WorkUnit> units;
  std::string error;
};

PlacedPlan plan_batch(int heads, const std::vector<Req>& reqs, int ctas) {
  const ReqBatch batch(reqs);
  const AbsorbedProblem p = batch.problem(heads, 64);
  const AttnCapacity cap{static_cast<int>(reqs.size()), batch.tokens, 0, 8, heads, true};
  std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
  PlacedPlan out;
  auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
  if (!used.ok()) {
    out.error = used.status().to_string();
    return out;
  }
  out.error = fuzz::check_absorbed_plan(p, ctas, plan, *used, &cap);
  std::memcpy(&out.h, plan.data(), sizeof(out.h));
  out.cta_begin = fuzz::read_array<int32_t>(plan, out.h.cta_begin_offset, ctas + 1);
  out.units = fuzz::read_array<WorkUnit>(plan, out.h.units_offset, out.h.num_units);
  return out;
}

int64_t unit_cost(const WorkUnit& u) {  // key tiles + 1 (the planner's cost model)
  return (u.kv_end - u.kv_begin + cuda::absorbed::kBlockN - 1) / cuda::absorbed::kBlockN + 1;
}

// 128 heads: two row tiles per decode request, in two groups of CTAs. Row tile 1 of a request
// runs on CTA c + 66 at the position row tile 0 has on CTA c, over the same keys, so the two
// read each key at about the same time and the second read hits L2. (Dealing the units out in
// batch order put both on one CTA one after the other: every key came from DRAM twice, 29 % of
// the 128-head decode time on the H200.)
TEST(InvariantPlan, RowTilesOfADecodeRequestReadTheSameKeysInStep) {
  Rng rng(41);
  for (int trial = 0; trial < 20; ++trial) {
    const int size = static_cast<int>(rng.uniform_int(1, 160));
    std::vector<Req> reqs(static_cast<std::size_t>(size));
    for (Req& r : reqs) r.kv_len = static_cast<int32_t>(rng.uniform_int(1, 20000));
    const PlacedPlan pl = plan_batch(128, reqs, 132);
    ASSERT_TRUE(pl.error.empty()) << pl.error;
    for (int c = 0; c < 66; ++c) {
      const int32_t b0 = pl.cta_begin[c], n0 = pl.cta_begin[c + 1] - b0;
      const int32_t b1 = pl.cta_begin[c + 66], n1 = pl.cta_begin[c + 67] - b1;
      ASSERT_EQ(n0, n1) << "CTA " << c;
      for (int32_t i = 0; i < n0; ++i) {
        const WorkUnit& u0 = pl.units[static_cast<std::size_t>(b0 + i)];
        const WorkUnit& u1 = pl.units[static_cast<std::size_t>(b1 + i)];
        EXPECT_EQ(u0.row_in_req, 0);
        EXPECT_EQ(u1.row_in_req, 64);
        EXPECT_EQ(u1.pool_row, u0.pool_row);
        EXPECT_EQ(u1.kv_begin, u0.kv_begin);
        EXPECT_EQ(u1.kv_end, u0.kv_end);
      }
    }
    EXPECT_EQ(pl.cta_begin[132], pl.h.num_units);
  }
}

// Balance: in each group of CTAs, the most loaded CTA carries at most the ideal share (the
// group's cost / its CTAs) plus one piece; a batch of equal requests puts ceil(pieces / CTAs)
// pieces on the most loaded CTA.
TEST(InvariantPlan, MostLoadedCtaWithinOnePieceOfTheIdealShare) {
  Rng rng(43);
  for (int trial = 0; trial < 40; ++trial) {
    const int heads = trial % 2 == 0 ? 16 : 128;
    const int groups = heads == 128 ? 2 : 1, per_group = 132 / groups;
    const int size = static_cast<int>(rng.uniform_int(1, 256));
    const int64_t hi = trial % 4 < 2 ? 9000 : 40000;
    std::vector<Req> reqs(static_cast<std::size_t>(size));
    for (Req& r : reqs) r.kv_len = static_cast<int32_t>(rng.uniform_int(hi / 2, hi));
    const PlacedPlan pl = plan_batch(heads, reqs, 132);
    ASSERT_TRUE(pl.error.empty()) << pl.error;
    for (int g = 0; g < groups; ++g) {
      int64_t total = 0, longest = 0, most = 0;
      for (int c = g * per_group; c < (g + 1) * per_group; ++c) {
        int64_t load = 0;
        for (int32_t i = pl.cta_begin[c]; i < pl.cta_begin[c + 1]; ++i) {
          const int64_t cost = unit_cost(pl.units[static_cast<std::size_t>(i)]);
          load += cost;
          longest = std::max(longest, cost);
        }
        total += load;
        most = std::max(most, load);
      }
      EXPECT_LE(most, (total + per_group - 1) / per_group + longest)
          << "trial " << trial << ", group " << g;
    }
  }
  // 128 equal decode requests of 4 piece lengths, 16 heads: 4 pieces each, 512 pieces on 132
  // CTAs: at most 4 per CTA.
  const int32_t kv = 4 * cuda::absorbed::kInvariantPieceTiles * cuda::absorbed::kBlockN;
  const PlacedPlan pl = plan_batch(16, std::vector<Req>(128, Req{1, kv}), 132);
  ASSERT_TRUE(pl.error.empty()) << pl.error;
  int32_t most = 0;
  for (int c = 0; c < 132; ++c) most = std::max(most, pl.cta_begin[c + 1] - pl.cta_begin[c]);
  EXPECT_EQ(pl.h.num_units, 512);
  EXPECT_EQ(most, 4);
}

// A full capacity of long requests fits the layout and the partial slots it sizes.
TEST(InvariantPlan, FullCapacityOfLongRequestsFits) {
  for (int heads : {16, 128}) {
    const AttnCapacity cap{64, 64 * 8, 0, 8, heads, true};
    std::vector<int32_t> rows, q_lens(64, 8), kv_lens(64, 100000);
    for (int i = 0; i < 64; ++i) rows.push_back(i + 1);
    AbsorbedProblem p;
    p.num_heads = heads;
    p.page_size = 64;
    p.req_rows = rows;
    p.q_lens = q_lens;
    p.kv_lens = kv_lens;
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, 132).bytes);
    auto used = cuda::absorbed::build_plan(p, cap, 132, plan);
    ASSERT_TRUE(used.ok()) << used.status().to_string();
    EXPECT_EQ(fuzz::check_absorbed_plan(p, 132, plan, *used, &cap), "");
    PlanHeader h;
    std::memcpy(&h, plan.data(), sizeof(h));
    EXPECT_GT(h.num_partials, cuda::absorbed::max_partials(132));  // beyond the default slots
    EXPECT_LE(h.num_partials, cuda::absorbed::max_partials(cap, 132));
    EXPECT_GE(
        cuda::absorbed::partials_in_workspace(cuda::absorbed::partial_workspace_bytes(cap, 132)),
        cuda::absorbed::max_partials(cap, 132));
  }
}

}  // namespace
}  // namespace mla::testing
