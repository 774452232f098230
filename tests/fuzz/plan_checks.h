// Coverage checks of the planners, shared by the fuzz targets: for an accepted problem the plan
// covers every (query row, key) the mask allows exactly once. Each returns "" or the failure.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan.h"
#include "kernels/cuda/absorbed/traits.h"
#include "kernels/cuda/mha/params.h"
#include "kernels/cuda/mha/plan.h"
#include "kernels/cuda/mha/traits.h"
#include "mla/ops.h"
#include "planning/chunked_prefix.h"

namespace mla::fuzz {

template <typename T>
std::vector<T> read_array(std::span<const std::byte> plan, int64_t offset, int64_t count) {
  std::vector<T> out(static_cast<std::size_t>(std::max<int64_t>(count, 0)));
  if (!out.empty()) std::memcpy(out.data(), plan.data() + offset, out.size() * sizeof(T));
  return out;
}

// Absorbed plan of `used` bytes for problem p on num_ctas CTAs (cap: the capacity it was planned
// for, when it bounds the partial slots differently from the grid: batch-invariant plans).
inline std::string check_absorbed_plan(const AbsorbedProblem& p, int num_ctas,
                                       std::span<const std::byte> plan, std::size_t used,
                                       const AttnCapacity* cap = nullptr) {
  using namespace cuda::absorbed;
  FUZZ_CHECK(used >= sizeof(PlanHeader) && used <= plan.size(), "used {} of {}", used, plan.size());
  PlanHeader h;
  std::memcpy(&h, plan.data(), sizeof(h));
  FUZZ_CHECK(h.num_ctas == num_ctas, "header num_ctas {} vs {}", h.num_ctas, num_ctas);
  FUZZ_CHECK(h.num_units >= 0 && h.num_combines >= 0 && h.num_partials >= 0, "counts {} {} {}",
             h.num_units, h.num_combines, h.num_partials);
  const int64_t partial_bound = cap ? max_partials(*cap, num_ctas) : max_partials(num_ctas);
  FUZZ_CHECK(h.num_partials <= partial_bound, "partials {} > bound {}", h.num_partials,
             partial_bound);
  FUZZ_CHECK(h.cta_begin_offset + int64_t{num_ctas + 1} * 4 <= static_cast<int64_t>(used) &&
                 h.units_offset + int64_t{h.num_units} * int64_t{sizeof(WorkUnit)} <=
                     static_cast<int64_t>(plan.size()) &&
                 h.combines_offset + int64_t{h.num_combines} * int64_t{sizeof(CombineUnit)} <=
                     static_cast<int64_t>(used),
             "arrays beyond the {} bytes used", used);
  const auto begin = read_array<int32_t>(plan, h.cta_begin_offset, num_ctas + 1);
  FUZZ_CHECK(begin[0] == 0 && begin[num_ctas] == h.num_units, "cta begins {}..{} vs {} units",
             begin[0], begin[num_ctas], h.num_units);
  for (int g = 0; g < num_ctas; ++g) FUZZ_CHECK(begin[g] <= begin[g + 1], "cta {} begins", g);
  const auto units = read_array<WorkUnit>(plan, h.units_offset, h.num_units);
  const auto combines = read_array<CombineUnit>(plan, h.combines_offset, h.num_combines);

  // Flat rows of request b: [row0[b], row0[b] + q_len * H).
  const int bs = static_cast<int>(p.req_rows.size());
  std::vector<int64_t> row0(static_cast<std::size_t>(bs) + 1, 0);
  for (int b = 0; b < bs; ++b) row0[b + 1] = row0[b] + int64_t{p.q_lens[b]} * p.num_heads;
  // Units grouped by their row tile (q_row_begin, num_rows).
  std::map<std::pair<int64_t, int32_t>, std::vector<const WorkUnit*>> tiles;
  std::vector<int> partial_use(static_cast<std::size_t>(h.num_partials), 0);
  for (const WorkUnit& u : units) {
    FUZZ_CHECK(u.num_rows > 0 && u.num_rows <= h.rows_per_tile, "unit rows {} (tile {})",
               u.num_rows, h.rows_per_tile);
    FUZZ_CHECK(u.kv_begin % kBlockN == 0 && u.kv_begin >= 0 && u.kv_begin <= u.kv_end &&
                   u.kv_end <= u.kv_len,
               "unit keys [{}, {}) of kv_len {}", u.kv_begin, u.kv_end, u.kv_len);
    FUZZ_CHECK(u.partial >= -1 && u.partial < h.num_partials, "partial {} of {}", u.partial,
               h.num_partials);
    if (u.partial >= 0) partial_use[static_cast<std::size_t>(u.partial)]++;
    tiles[{u.q_row_begin, u.num_rows}].push_back(&u);
  }
  for (int i = 0; i < h.num_partials; ++i) {
    FUZZ_CHECK(partial_use[static_cast<std::size_t>(i)] == 1, "partial slot {} used {} times", i,
               partial_use[static_cast<std::size_t>(i)]);
  }
  std::map<int64_t, const CombineUnit*> combine_of;
  int64_t partials_combined = 0;
  for (const CombineUnit& c : combines) {
    FUZZ_CHECK(c.num_partials >= 2, "combine of {} partials", c.num_partials);
    FUZZ_CHECK(combine_of.emplace(c.q_row_begin, &c).second, "two combines at row {}",
               c.q_row_begin);
    partials_combined += c.num_partials;
  }
  FUZZ_CHECK(partials_combined == h.num_partials, "{} partials combined of {}", partials_combined,
             h.num_partials);
  // Tiles partition every request's rows; each tile's key ranges partition [0, extent).
  int64_t next_row = 0;
  for (const auto& [key, list] : tiles) {
    const auto [first_row, num_rows] = key;
    FUZZ_CHECK(first_row == next_row, "rows {}..{} not planned (next tile at {})", next_row,
               first_row - 1, first_row);
    next_row = first_row + num_rows;
    const int b =
        static_cast<int>(std::upper_bound(row0.begin(), row0.end(), first_row) - row0.begin()) - 1;
    FUZZ_CHECK(b >= 0 && b < bs && next_row <= row0[b + 1], "tile rows {}..{} cross requests",
               first_row, next_row - 1);
    const int32_t ql = p.q_lens[b], kl = p.kv_lens[b];
    const int64_t last_query = (next_row - 1 - row0[b]) / p.num_heads;
    // Bottom-right causal: with kv_len < q_len the first queries see no key (extent 0).
    const int64_t extent =
        p.causal && kl > 0 ? std::max<int64_t>(int64_t{kl} - ql + last_query + 1, 0) : kl;
    std::vector<std::pair<int32_t, int32_t>> ranges;
    for (const WorkUnit* u : list) {
      FUZZ_CHECK(u->pool_row == p.req_rows[b] && u->q_len == ql && u->kv_len == kl &&
                     u->row_in_req == first_row - row0[b],
                 "unit of request {}: pool_row {} q_len {} kv_len {} row_in_req {}", b, u->pool_row,
                 u->q_len, u->kv_len, u->row_in_req);
      ranges.emplace_back(u->kv_begin, u->kv_end);
      FUZZ_CHECK((list.size() == 1) == (u->partial < 0), "tile at row {}: {} units, partial {}",
                 first_row, list.size(), u->partial);
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t covered = 0;
    for (const auto& [lo, hi] : ranges) {
      FUZZ_CHECK(lo == covered || (lo == hi && lo <= covered),
                 "tile at row {}: keys [{}, {}) after {} covered", first_row, lo, hi, covered);
      covered = std::max<int64_t>(covered, hi);
    }
    FUZZ_CHECK(covered == extent, "tile at row {}: keys 0..{} covered, the mask allows {}",
               first_row, covered, extent);
    if (list.size() > 1) {
      auto it = combine_of.find(first_row);
      FUZZ_CHECK(it != combine_of.end(), "split tile at row {} has no combine", first_row);
      const CombineUnit& c = *it->second;
      FUZZ_CHECK(c.num_rows == num_rows && c.num_partials == static_cast<int>(list.size()),
                 "combine at row {}: {} rows, {} partials for {} rows, {} units", first_row,
                 c.num_rows, c.num_partials, num_rows, list.size());
      for (const WorkUnit* u : list) {
        FUZZ_CHECK(u->partial >= c.first_partial && u->partial < c.first_partial + c.num_partials,
                   "unit partial {} outside its combine's [{}, +{})", u->partial, c.first_partial,
                   c.num_partials);
      }
    }
  }
  FUZZ_CHECK(next_row == row0[bs], "rows {}..{} not planned", next_row, row0[bs] - 1);
  FUZZ_CHECK(combine_of.size() <= tiles.size(), "more combines than tiles");
  return "";
}

// MHA plan: tiles partition every request's query rows; each carries its request's key range
// and causal diagonal (the kernel masks keys per row from these).
inline std::string check_mha_plan(const MhaProblem& p, std::span<const std::byte> plan,
                                  std::size_t used) {
  using namespace cuda::mha;
  FUZZ_CHECK(used >= sizeof(MhaPlanHeader) && used <= plan.size(), "used {}", used);
  MhaPlanHeader h;
  std::memcpy(&h, plan.data(), sizeof(h));
  const int64_t bs = static_cast<int64_t>(p.qo_indptr.size()) - 1;
  FUZZ_CHECK(h.batch_size == bs && h.num_heads == p.num_heads && h.head_group >= 1,
             "header bs {} heads {} group {}", h.batch_size, h.num_heads, h.head_group);
  FUZZ_CHECK(
      used == sizeof(MhaPlanHeader) + static_cast<std::size_t>(h.num_tiles) * sizeof(MhaTile),
      "used {} for {} tiles", used, h.num_tiles);
  const auto tiles = read_array<MhaTile>(plan, sizeof(MhaPlanHeader), h.num_tiles);
  std::vector<std::tuple<int32_t, int32_t, const MhaTile*>> by_row;
  for (const MhaTile& t : tiles) {
    FUZZ_CHECK(t.q_rows >= 1 && t.q_rows <= MhaTraits::kBlockM, "tile rows {}", t.q_rows);
    by_row.emplace_back(t.q_start, t.q_rows, &t);
  }
  std::sort(by_row.begin(), by_row.end());
  std::size_t i = 0;
  for (int64_t b = 0; b < bs; ++b) {
    const int32_t q0 = p.qo_indptr[b], q1 = p.qo_indptr[b + 1];
    const int32_t kv0 = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - p.kv_indptr[b];
    int64_t row = q0;
    while (row < q1) {
      FUZZ_CHECK(i < by_row.size(), "request {}: rows {}..{} not planned", b, row, q1 - 1);
      const auto [start, rows, t] = by_row[i];
      FUZZ_CHECK(start == row, "request {}: next tile at row {}, expected {}", b, start, row);
      FUZZ_CHECK(start + rows <= q1, "tile rows {}..{} cross request {}", start, start + rows - 1,
                 b);
      FUZZ_CHECK(t->kv_start == kv0 && t->kv_len == kv_len, "tile keys {}+{} vs request {}+{}",
                 t->kv_start, t->kv_len, kv0, kv_len);
      const int32_t diag = p.causal ? kv_len - (q1 - q0) + (start - q0) : kNoDiag;
      FUZZ_CHECK(t->diag == diag, "tile diag {} vs {}", t->diag, diag);
      row += rows;
      ++i;
    }
  }
  FUZZ_CHECK(i == by_row.size(), "{} tiles beyond the requests' rows", by_row.size() - i);
  return "";
}

// Chunked-prefix plan: every prefix token of every request is in exactly one chunk, at the
// slot req_to_token gives it.
inline std::string check_chunked_plan(std::span<const int32_t> prefix, int64_t capacity,
                                      const planning::ChunkedPrefixPlan& plan,
                                      std::span<const int32_t> rows, std::span<const int32_t> table,
                                      int64_t stride, int page_size, bool indices) {
  const int bs = static_cast<int>(prefix.size());
  FUZZ_CHECK(plan.batch_size == bs && plan.capacity == capacity, "bs {} cap {}", plan.batch_size,
             plan.capacity);
  FUZZ_CHECK(plan.chunk_len == capacity / std::max(bs, 1) || bs == 0, "chunk_len {}",
             plan.chunk_len);
  const std::size_t C = static_cast<std::size_t>(plan.num_chunks);
  FUZZ_CHECK(plan.lens.size() == C * bs && plan.cu_len.size() == C * (bs + 1) &&
                 plan.max_len.size() == C && plan.num_tokens.size() == C &&
                 plan.has_zero_kv.size() == C && plan.kv_offsets.size() == C + 1,
             "array sizes for {} chunks", C);
  std::vector<int64_t> covered(static_cast<std::size_t>(bs), 0);
  for (int c = 0; c < plan.num_chunks; ++c) {
    int64_t sum = 0;
    int32_t mx = 0;
    bool zero = false;
    const auto cu = plan.chunk_cu_len(c);
    FUZZ_CHECK(cu[0] == 0, "cu_len[{}][0] = {}", c, cu[0]);
    for (int b = 0; b < bs; ++b) {
      const int32_t len = plan.len(c, b);
      FUZZ_CHECK(len >= 0 && len <= plan.chunk_len, "len[{}, {}] = {}", c, b, len);
      if (len > 0) {
        FUZZ_CHECK(plan.start(c) == covered[b], "chunk {} starts request {} at {}, {} covered", c,
                   b, plan.start(c), covered[b]);
      }
      covered[b] += len;
      sum += len;
      mx = std::max(mx, len);
      zero = zero || len == 0;
      FUZZ_CHECK(cu[b + 1] == sum, "cu_len[{}][{}] = {} vs {}", c, b + 1, cu[b + 1], sum);
    }
    FUZZ_CHECK(sum <= capacity, "chunk {} holds {} tokens > capacity {}", c, sum, capacity);
    FUZZ_CHECK(
        plan.num_tokens[c] == sum && plan.max_len[c] == mx && (plan.has_zero_kv[c] != 0) == zero,
        "chunk {} summary", c);
    FUZZ_CHECK(plan.kv_offsets[c + 1] - plan.kv_offsets[c] == sum, "kv_offsets of chunk {}", c);
  }
  for (int b = 0; b < bs; ++b) {
    FUZZ_CHECK(covered[b] == prefix[b], "request {}: {} of {} prefix tokens planned", b, covered[b],
               prefix[b]);
  }
  if (indices) {
    FUZZ_CHECK(static_cast<int64_t>(plan.kv_indices.size()) == plan.kv_offsets[C],
               "kv_indices has {} entries, offsets say {}", plan.kv_indices.size(),
               plan.kv_offsets[C]);
    for (int c = 0; c < plan.num_chunks; ++c) {
      int64_t k = plan.kv_offsets[c];
      for (int b = 0; b < bs; ++b) {
        for (int32_t i = 0; i < plan.len(c, b); ++i, ++k) {
          const int64_t want =
              slot_of_token(table.data(), stride, rows[b], plan.start(c) + i, page_size);
          FUZZ_CHECK(plan.kv_indices[static_cast<std::size_t>(k)] == want,
                     "chunk {} request {} token {}: slot {} vs {}", c, b, plan.start(c) + i,
                     plan.kv_indices[static_cast<std::size_t>(k)], want);
        }
      }
    }
  }
  return "";
}

}  // namespace mla::fuzz
