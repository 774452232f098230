// The CUDA absorbed op's host planner (src/kernels/cuda/absorbed/plan.cc): a pure host function,
// built and tested in every configuration, GPU or not. Coverage (every (row, key) the causal mask
// allows is planned exactly once), combines, partial bounds, balance over the persistent grid,
// capacity errors, deterministic re-planning (allocations per plan: bench/planning_bench.cc), and
// plans byte-identical to the planner before its rewrite (a copy kept here as the reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <new>
#include <vector>

#include "conformance/case_gen.h"
#include "conformance/conformance.h"
#include "fuzz/plan_checks.h"
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

// The planner as of commit 25ee00c (before the single-pass rewrite), kept as it was but for its
// name and a non-thread_local scratch: the reference the current planner must match byte for
// byte (header, CTA begins, units and combines).
namespace reference {
using namespace ::mla::cuda::absorbed;

constexpr int64_t kUnitCost = 1;
// Never cut a piece shorter than 2 key tiles (128 keys): a split costs a partial write and a
// combine read of 64 x 512 fp32, the traffic of about two key tiles.
constexpr int64_t kMinPieceTiles = 2;

struct Tile {
  int32_t request;
  int32_t q_row_begin;
  int32_t num_rows;
  int32_t row_in_req;
  int32_t kv_extent;  // keys the tile's last row sees
  int64_t tiles;      // key tiles
};

struct Piece {
  int64_t begin_tile, end_tile;
  int cta;
};

// Reusable vectors of one planning thread (clear() keeps their capacity).
struct PlanScratch {
  std::vector<Tile> tiles;
  std::vector<int32_t> first_tile;  // tiles of request b: [first_tile[b], first_tile[b + 1])
  std::vector<int64_t> item_tiles;
  std::vector<Piece> pieces;
  std::vector<int32_t> piece_begin;  // pieces of item i: [piece_begin[i], piece_begin[i + 1])
  std::vector<int32_t> cta_begin;    // [num_ctas + 1]
  std::vector<CombineUnit> combines;

  void reset(int bs, int num_ctas) {
    tiles.clear();
    first_tile.assign(static_cast<std::size_t>(bs) + 1, 0);
    item_tiles.clear();
    pieces.clear();
    cta_begin.resize(static_cast<std::size_t>(num_ctas) + 1);
    combines.clear();
  }
};

StatusOr<std::size_t> reference_build_plan(const AbsorbedProblem& p, const AttnCapacity& cap,
                                           int num_ctas, std::span<std::byte> host_plan) {
  const int bs = static_cast<int>(p.req_rows.size());
  MLA_CHECK_ARG(num_ctas > 0, "num_ctas = {} must be positive", num_ctas);
  MLA_CHECK_ARG(is_supported_head_count(p.num_heads), "num_heads = {} (supported: 16, 32, 64, 128)",
                p.num_heads);
  MLA_CHECK_ARG(cap.num_heads == 0 || cap.num_heads == p.num_heads,
                "num_heads = {} differs from the capacity's num_heads = {}", p.num_heads,
                cap.num_heads);
  MLA_CHECK_ARG(is_supported_page_size(p.page_size),
                "page_size = {} (supported: 1, 16, 32, 64, 128)", p.page_size);
  MLA_CHECK_ARG(p.q_lens.size() == p.req_rows.size() && p.kv_lens.size() == p.req_rows.size(),
                "req_rows / q_lens / kv_lens sizes differ: {} / {} / {}", p.req_rows.size(),
                p.q_lens.size(), p.kv_lens.size());
  MLA_CHECK_ARG(bs <= cap.max_batch, "batch size {} exceeds capacity max_batch = {}", bs,
                cap.max_batch);
  const PlanLayout layout = plan_layout(cap, num_ctas);
  MLA_CHECK_ARG(host_plan.size() >= layout.bytes, "host_plan holds {} bytes, the plan needs {}",
                host_plan.size(), layout.bytes);

  int64_t q_tokens = 0;
  int max_q_len = 1;
  for (int b = 0; b < bs; ++b) {
    const int32_t ql = p.q_lens[b], kl = p.kv_lens[b];
    MLA_CHECK_ARG(ql >= 0 && kl >= 0, "q_lens[{}] = {}, kv_lens[{}] = {} must be >= 0", b, ql, b,
                  kl);
    MLA_CHECK_ARG(!p.causal || kl == 0 || kl >= ql,
                  "causal: kv_lens[{}] = {} is below q_lens[{}] = {}", b, kl, b, ql);
    MLA_CHECK_ARG(p.req_rows[b] >= 0, "req_rows[{}] = {} must be >= 0", b, p.req_rows[b]);
    q_tokens += ql;
    max_q_len = std::max(max_q_len, static_cast<int>(ql));
  }
  MLA_CHECK_ARG(q_tokens <= cap.max_q_tokens, "sum(q_lens) = {} exceeds capacity max_q_tokens = {}",
                q_tokens, cap.max_q_tokens);

  const int heads = p.num_heads;
  const int heads_log2 = std::countr_zero(static_cast<unsigned>(heads));  // a power of two
  const int rows_tile = rows_per_tile(heads, max_q_len);

  // Scratch reused across plans on this thread: after the first plans of the largest batch,
  // planning allocates nothing (a serving loop plans every step).
  PlanScratch scratch;
  PlanScratch& s = scratch;
  s.reset(bs, num_ctas);

  // Row tiles: consecutive flat rows (token * H + head) of one request.
  int64_t q_row = 0;
  int max_tiles_per_req = 0;
  for (int b = 0; b < bs; ++b) {
    s.first_tile[b] = static_cast<int32_t>(s.tiles.size());
    const int64_t rows = int64_t{p.q_lens[b]} * heads;
    for (int64_t r = 0; r < rows; r += rows_tile) {
      Tile t;
      t.request = b;
      t.q_row_begin = static_cast<int32_t>(q_row + r);
      t.num_rows = static_cast<int32_t>(std::min<int64_t>(rows_tile, rows - r));
      t.row_in_req = static_cast<int32_t>(r);
      const int32_t last_query = (t.row_in_req + t.num_rows - 1) >> heads_log2;
      const int32_t kl = p.kv_lens[b];
      t.kv_extent = p.causal && kl > 0 ? kl - p.q_lens[b] + last_query + 1 : kl;
      t.tiles = (t.kv_extent + kBlockN - 1) / kBlockN;
      s.tiles.push_back(t);
    }
    max_tiles_per_req =
        std::max(max_tiles_per_req, static_cast<int>(s.tiles.size()) - s.first_tile[b]);
    q_row += rows;
  }
  s.first_tile[bs] = static_cast<int32_t>(s.tiles.size());
  const std::vector<Tile>& tiles = s.tiles;
  const std::vector<int32_t>& first_tile = s.first_tile;

  // Grouped schedule when a request has 2-4 row tiles (128 heads, or heads x q_len > 64): the
  // grid splits into one group of CTAs per row tile, all groups following the same key schedule,
  // so the row tiles of a request read the same keys at the same time and share them in L2
  // (otherwise 128-head decode reads the cache twice from DRAM: 2 x 1152 B per key).
  const int groups =
      max_tiles_per_req >= 2 && max_tiles_per_req <= 4 && num_ctas >= 2 * max_tiles_per_req
          ? max_tiles_per_req
          : 1;
  const int ctas_per_group = num_ctas / groups;
  // Items cut across one group's CTAs: requests (grouped) or row tiles (ungrouped).
  std::vector<int64_t>& item_tiles = s.item_tiles;
  if (groups > 1) {
    for (int b = 0; b < bs; ++b) {
      int64_t n = 0;
      for (int i = first_tile[b]; i < first_tile[b + 1]; ++i) n = std::max(n, tiles[i].tiles);
      item_tiles.push_back(first_tile[b + 1] > first_tile[b] ? n : -1);  // -1: no rows
    }
  } else {
    for (const Tile& t : tiles) item_tiles.push_back(t.tiles);
  }
  int64_t total_cost = 0;
  for (int64_t n : item_tiles) total_cost += n >= 0 ? n + kUnitCost : 0;

  // 1. Contiguous cutting of the flattened (item, key tile) list into equal shares, once for
  // all groups. Each CTA's share is re-derived from the work still unassigned, so pieces left
  // unused by the no-tiny-piece rule spread over the remaining CTAs instead of piling up on the
  // last one. Pieces of item i: pieces[piece_begin[i] .. piece_begin[i + 1]), CTAs ascending.
  int64_t unassigned = total_cost;
  const auto share = [&](int c) {
    const int64_t left_ctas = ctas_per_group - c;
    return std::max<int64_t>((unassigned + left_ctas - 1) / left_ctas, kMinPieceTiles + kUnitCost);
  };
  int cta = 0;
  int64_t room = share(0);
  std::vector<Piece>& pieces = s.pieces;
  std::vector<int32_t>& piece_begin = s.piece_begin;
  const std::size_t num_items = item_tiles.size();
  piece_begin.resize(num_items + 1);
  for (std::size_t item = 0; item < num_items; ++item) {
    piece_begin[item] = static_cast<int32_t>(pieces.size());
    const int64_t n_tiles = item_tiles[item];
    if (n_tiles < 0) continue;
    int64_t begin = 0;
    while (true) {
      const int64_t left = n_tiles - begin;
      // Slack of kMinPieceTiles: overfill a little rather than leave a tiny piece behind.
      if (cta == ctas_per_group - 1 || left + kUnitCost <= room + kMinPieceTiles) {
        pieces.push_back({begin, n_tiles, cta});
        room -= left + kUnitCost;
        unassigned -= left + kUnitCost;
        break;
      }
      const int64_t take = room - kUnitCost;
      if (take >= kMinPieceTiles && left - take >= kMinPieceTiles) {
        pieces.push_back({begin, begin + take, cta});
        begin += take;
        unassigned -= take;  // the item's unit cost leaves with its last piece
      }
      ++cta;
      room = share(cta);
    }
    if (room <= 0 && cta < ctas_per_group - 1) {
      ++cta;
      room = share(cta);
    }
  }
  piece_begin[num_items] = static_cast<int32_t>(pieces.size());

  // 2. Units written in place, group by group: group g owns CTAs [g * ctas_per_group, ...) and
  // its pieces come in ascending CTA order, so the output is CTA-major with no sorting pass.
  // A tile cut into several pieces writes partial slots that one combine merges. Each unit is
  // bounds-checked as it is written (the layout's max_units bounds them; exceeding it is a bug).
  std::byte* base = host_plan.data();
  auto* units_out = reinterpret_cast<WorkUnit*>(base + layout.units_offset);
  std::vector<int32_t>& cta_begin = s.cta_begin;  // [num_ctas + 1]
  std::vector<CombineUnit>& combines = s.combines;
  int32_t num_units = 0;
  int32_t next_partial = 0;
  int next_cta = 0;  // CTAs before next_cta have their begin written
  for (int g = 0; g < groups; ++g) {
    const int cta0 = g * ctas_per_group;
    for (std::size_t item = 0; item < num_items; ++item) {
      const int tile_index = groups > 1 ? first_tile[item] + g : static_cast<int>(item);
      if (groups > 1 && tile_index >= first_tile[item + 1]) continue;
      const int32_t pb = piece_begin[item], pe = piece_begin[item + 1];
      if (pb == pe) continue;
      const Tile& t = tiles[static_cast<std::size_t>(tile_index)];
      const bool split = pe - pb > 1;
      if (split) combines.push_back({t.q_row_begin, t.num_rows, next_partial, pe - pb});
      for (int32_t k = pb; k < pe; ++k) {
        const Piece& pc = pieces[static_cast<std::size_t>(k)];
        const int owner = cta0 + pc.cta;
        while (next_cta <= owner) cta_begin[next_cta++] = num_units;
        if (num_units >= layout.max_units) [[unlikely]] {
          return internal_error("absorbed plan overflow: more than {} units", layout.max_units);
        }
        // Constructed in place, field by field: building a local and copying it out made every
        // unit wait on a store-to-load forwarding stall (a third of the planner's time).
        WorkUnit* u = ::new (static_cast<void*>(units_out + num_units++)) WorkUnit;
        u->pool_row = p.req_rows[t.request];
        u->q_row_begin = t.q_row_begin;
        u->num_rows = t.num_rows;
        u->row_in_req = t.row_in_req;
        u->q_len = p.q_lens[t.request];
        u->kv_len = p.kv_lens[t.request];
        const int32_t kv_begin =
            static_cast<int32_t>(std::min<int64_t>(pc.begin_tile, t.tiles) * kBlockN);
        const int32_t kv_end =
            static_cast<int32_t>(std::min<int64_t>(pc.end_tile * kBlockN, t.kv_extent));
        u->kv_begin = kv_begin;
        u->kv_end = std::max(kv_end, kv_begin);
        u->partial = split ? next_partial++ : -1;
        u->reserved[0] = u->reserved[1] = u->reserved[2] = 0;
      }
    }
  }
  while (next_cta <= num_ctas) cta_begin[next_cta++] = num_units;
  if (static_cast<int64_t>(combines.size()) > layout.max_combines ||
      next_partial > max_partials(num_ctas)) {
    return internal_error("absorbed plan overflow: {} combines (max {}), {} partials (max {})",
                          combines.size(), layout.max_combines, next_partial,
                          max_partials(num_ctas));
  }

  PlanHeader h{};
  h.num_ctas = num_ctas;
  h.rows_per_tile = rows_tile;
  h.num_units = static_cast<int32_t>(num_units);
  h.num_combines = static_cast<int32_t>(combines.size());
  h.num_heads = heads;
  h.page_size = p.page_size;
  h.causal = p.causal ? 1 : 0;
  h.num_partials = next_partial;
  h.cta_begin_offset = static_cast<int32_t>(layout.cta_begin_offset);
  h.units_offset = static_cast<int32_t>(layout.units_offset);
  h.combines_offset = static_cast<int32_t>(layout.combines_offset);
  h.tma_box_rows = p.page_size >= 64 ? 64 : 0;  // the chooser's load path (added later)
  std::memcpy(base, &h, sizeof(h));
  std::memcpy(base + layout.cta_begin_offset, cta_begin.data(), sizeof(int32_t) * cta_begin.size());
  if (!combines.empty()) {  // memcpy from an empty vector's null data() is undefined
    std::memcpy(base + layout.combines_offset, combines.data(),
                sizeof(CombineUnit) * combines.size());
  }
  // Bytes through the last combine written: the upload can stop there.
  return layout.combines_offset + sizeof(CombineUnit) * combines.size();
}

}  // namespace reference

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

// The reference splits every decode batch to fill all CTAs; the planner places a decode batch
// of no more requests than CTAs (per group), each within 1/16 of the ideal share, whole: one
// unit per request on CTAs 0, 1, ... of each group, nothing split (plan.cc, place_whole). Such a
// plan may differ from the reference's; its most loaded CTA is then within 1/16 of the
// reference's. Returns whether `got` is the same plan or such a placement (counted in *whole).
bool same_or_whole(const PlanContent& got, const PlanContent& want, int* whole) {
  if (got == want) return true;
  const PlanHeader& h = got.header;
  if (h.num_combines != 0 || h.num_partials != 0) return false;
  std::vector<WorkUnit> units(got.units.size() / sizeof(WorkUnit));
  if (!units.empty()) std::memcpy(units.data(), got.units.data(), got.units.size());
  for (int c = 0; c < h.num_ctas; ++c) {
    if (got.cta_begin[c + 1] - got.cta_begin[c] > 1) return false;
  }
  for (const WorkUnit& u : units) {
    if (u.kv_begin != 0 || u.kv_end != u.kv_len || u.partial != -1) return false;
  }
  if (max_cta_cost(got) * 16 > (max_cta_cost(want) + 1) * 17) return false;
  ++*whole;
  return true;
}

// The planner writes the same plan as the reference (the planner of 25ee00c) on thousands of
// random batches of every shape, grid and head count, so the schedule (and the max per-CTA cost
// the kernel's time follows) is unchanged; errors carry the same message.
TEST(AbsorbedPlan, MatchesTheReferencePlannerByteForByte) {
  Rng rng(mix_seed(base_seed(), 53));
  int compared = 0, errors = 0, whole = 0;
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
    // Mostly a capacity that fits; sometimes a tight one (unit overflow, a capacity error) or
    // one without num_heads.
    AttnCapacity cap{bs + static_cast<int>(rng.uniform_int(0, 4)), tokens + rng.uniform_int(0, 9),
                     0, 8, heads};
    if (rng.uniform_int(0, 40) == 0) cap.num_heads = 0;
    if (rng.uniform_int(0, 60) == 0) cap.max_q_tokens = std::max<int64_t>(tokens - 1, 0);
    AbsorbedProblem p{heads, 64, causal, b.rows, b.q_lens, b.kv_lens};
    const auto layout = cuda::absorbed::plan_layout(cap, ctas);
    std::vector<std::byte> got(layout.bytes, std::byte{0}), want(layout.bytes, std::byte{0});
    auto g = cuda::absorbed::build_plan(p, cap, ctas, got);
    auto w = reference::reference_build_plan(p, cap, ctas, want);
    ASSERT_EQ(g.ok(), w.ok()) << "iter " << iter << ": " << (g.ok() ? w : g).status().to_string();
    if (!w.ok()) {
      EXPECT_EQ(g.status().to_string(), w.status().to_string()) << "iter " << iter;
      ++errors;
      continue;
    }
    const PlanContent cg = content_of(got, *g), cw = content_of(want, *w);
    ASSERT_TRUE(same_or_whole(cg, cw, &whole))
        << "iter " << iter << ": heads " << heads << " ctas " << ctas << " bs " << bs << " causal "
        << causal << ": units " << cg.header.num_units << " vs " << cw.header.num_units
        << ", combines " << cg.header.num_combines << " vs " << cw.header.num_combines
        << ", max CTA cost " << max_cta_cost(cg) << " vs " << max_cta_cost(cw);
    ++compared;
  }
  EXPECT_GT(compared, 5000);
  EXPECT_LT(whole, compared / 10);  // mostly the reference's plans
  EXPECT_GT(errors, 0);             // the error paths were compared too
}

// Decode batches of the benchmark's shape (s_q 1, s_k in [s/2, s]) at batch 1-256, 16-128 heads,
// 132 CTAs: the same plans as the reference, whose balance the GPU kernel was tuned on.
TEST(AbsorbedPlan, DecodeBatchesMatchTheReference) {
  Rng rng(mix_seed(base_seed(), 59));
  int whole = 0;
  for (int heads : {16, 32, 64, 128}) {
    for (int bs : {1, 2, 7, 64, 131, 132, 133, 256}) {
      for (int max_kv : {64, 1024, 8192, 65536}) {
        std::vector<int32_t> rows, q(static_cast<std::size_t>(bs), 1), kv;
        for (int i = 0; i < bs; ++i) {
          rows.push_back(i + 1);
          kv.push_back(static_cast<int32_t>(rng.uniform_int(max_kv / 2, max_kv)));
        }
        AttnCapacity cap{256, 512, 0, 2, heads};
        AbsorbedProblem p{heads, 64, true, rows, q, kv};
        const auto layout = cuda::absorbed::plan_layout(cap, 132);
        std::vector<std::byte> got(layout.bytes), want(layout.bytes);
        auto g = cuda::absorbed::build_plan(p, cap, 132, got);
        auto w = reference::reference_build_plan(p, cap, 132, want);
        ASSERT_TRUE(g.ok() && w.ok());
        EXPECT_TRUE(same_or_whole(content_of(got, *g), content_of(want, *w), &whole))
            << "heads " << heads << " bs " << bs << " max_kv " << max_kv;
      }
    }
  }
  EXPECT_LT(whole, 4 * 8 * 4 / 4);
}

// Speculative verify (one q_len 2-8 for all) and mixed batches (q_len 0..max, max 2-8) at
// 16-128 heads, batch 1-256, grids of 132 and of 1-12 CTAs (ungrouped with several row tiles),
// causal or not: the same plans as the reference. Covers each path of the planner past decode:
// one row tile per request (16 heads q_len <= 4, 32 heads q_len 2), grouped (2-4 row tiles),
// and ungrouped with several row tiles (64-128 heads with long q_len, or a small grid).
TEST(AbsorbedPlan, VerifyAndMixedBatchesMatchTheReference) {
  Rng rng(mix_seed(base_seed(), 61));
  int compared = 0, whole = 0;
  for (int heads : {16, 32, 64, 128}) {
    for (int q_len = 2; q_len <= 8; ++q_len) {
      for (int bs : {1, 3, 64, 133, 256}) {
        for (int variant = 0; variant < 4; ++variant) {
          const bool causal = variant != 3;
          const bool mixed = variant == 1;
          const int ctas = variant == 2 ? static_cast<int>(rng.uniform_int(1, 12)) : 132;
          const int max_kv = static_cast<int>(rng.uniform_int(0, 3)) == 0
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
          AttnCapacity cap{bs, tokens, 0, 8, heads};
          AbsorbedProblem p{heads, 64, causal, rows, q, kv};
          const auto layout = cuda::absorbed::plan_layout(cap, ctas);
          std::vector<std::byte> got(layout.bytes), want(layout.bytes);
          auto g = cuda::absorbed::build_plan(p, cap, ctas, got);
          auto w = reference::reference_build_plan(p, cap, ctas, want);
          ASSERT_EQ(g.ok(), w.ok()) << (g.ok() ? w : g).status().to_string();
          if (!w.ok()) {
            EXPECT_EQ(g.status().to_string(), w.status().to_string());
            continue;
          }
          EXPECT_TRUE(same_or_whole(content_of(got, *g), content_of(want, *w), &whole))
              << "heads " << heads << " q_len " << q_len << " bs " << bs << " variant " << variant
              << " ctas " << ctas;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 500);
  EXPECT_LT(whole, compared / 10);
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
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, 132).bytes);
    auto used = cuda::absorbed::build_plan(p, cap, 132, plan);
    ASSERT_TRUE(used.ok()) << used.status().to_string();
    EXPECT_EQ(fuzz::check_absorbed_plan(p, 132, plan, *used, &cap), "");
    const PlanContent c = content_of(plan, *used);
    EXPECT_EQ(c.header.num_combines, 0);
    EXPECT_EQ(c.header.num_partials, 0);
    EXPECT_EQ(c.header.num_units, 132);
    for (int cta = 0; cta < 132; ++cta) {
      EXPECT_EQ(c.cta_begin[cta + 1] - c.cta_begin[cta], 1) << "heads " << heads << " CTA " << cta;
    }
    // One request twice the others' length: past share + share / 16, so the batch is split.
    kv[0] = 16384;
    AbsorbedProblem p2{heads, 64, true, rows, q, kv};
    used = cuda::absorbed::build_plan(p2, cap, 132, plan);
    ASSERT_TRUE(used.ok()) << used.status().to_string();
    EXPECT_EQ(fuzz::check_absorbed_plan(p2, 132, plan, *used, &cap), "");
    EXPECT_GT(content_of(plan, *used).header.num_combines, 0) << "heads " << heads;
  }
}

}  // namespace
}  // namespace mla::testing
