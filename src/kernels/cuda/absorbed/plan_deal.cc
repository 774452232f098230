// Row tiles cut into pieces and dealt onto the CTAs longest first (cut_dealt, plan_internal.h),
// in two uses:
// - The batch-invariant cut (AttnCapacity::batch_invariant; plan.h): every row tile of every
//   request cut into invariant_pieces(n, T, rows) pieces of ceil(n / pieces) key tiles, a
//   function of the tile's own extent, the request's row tiles T and its rows per tile; a split
//   tile's partial slots are consecutive in key order, so its combine merges them in key order.
//   Only the placement of the pieces on CTAs depends on the batch, and it changes no arithmetic.
// - Whole requests (the default plan of grouped decode with more requests than CTAs per group,
//   plan.cc): every row tile one piece, no partials and no combines, kept only when the most
//   loaded CTA carries at most the caller's bound.
// The placement:
// - Groups, as in the default plan: when every request has at most G = 2..4 row tiles (128
//   heads, or heads x q_len > 64), the grid splits into G groups of num_ctas / G CTAs and row
//   tile r of a request runs in group r, on the CTA and at the position that piece k of its
//   row tile 0 has in group 0. So the row tiles of a request read the same keys at the same
//   time and the second read hits L2 (dealing the units out in batch order instead put both
//   row tiles of a request on one CTA, one after the other: every key read twice from DRAM).
// - Items: (request, piece k) with the members piece k of each row tile (G > 1), or one per
//   piece (G = 1); an item costs its longest member (+ kUnitCost). The items go to the CTAs of
//   a group longest first, each to the least loaded CTA (ties: the lower CTA), so the most
//   loaded CTA carries at most the ideal share + one item (and at most 4/3 of the optimum);
//   best fit under a few targets just above the ideal share replaces that when its most loaded
//   CTA is lighter (deal_items). Contiguous runs in batch order left up to a whole piece of
//   imbalance where a CTA holds few pieces (variable lengths).
#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cuda/absorbed/plan.h"
#include "kernels/cuda/absorbed/plan_internal.h"

namespace mla::cuda::absorbed::plan_detail {
namespace {

struct InvItem {
  int32_t cost;
  int32_t cta;    // within the group, once dealt
  int32_t tile0;  // index of the request's row tile 0 in the tile table
  int16_t tiles;  // row tiles of the request in the item (1 when ungrouped)
  int16_t piece;  // k
};
struct InvTile {
  TileRef ref;
  int32_t len;  // key tiles per piece
  int32_t pieces;
  int32_t first_partial;  // -1: not split
};

// Reused across plans on this thread (resize() and clear() keep the capacity).
struct InvScratch {
  std::vector<InvTile> tiles;
  std::vector<InvItem> items;
  std::vector<int32_t> order, by_cta, per_cta, at, cta, best_cta;
  std::vector<int64_t> load;
  std::vector<std::pair<int64_t, int32_t>> heap;
  std::vector<std::vector<int32_t>> bucket;  // best fit: CTAs by load
  std::vector<uint64_t> used;                // best fit: loads with a CTA
};

// Longest item first onto the least loaded CTA (a binary heap of (load, cta): the top is the
// least loaded, the lower CTA on ties). Writes sc.cta; returns the makespan.
int64_t deal_least_loaded(const std::vector<InvItem>& items, const std::vector<int32_t>& order,
                          int ctas, InvScratch& sc) {
  std::vector<std::pair<int64_t, int32_t>>& heap = sc.heap;
  heap.clear();
  for (int c = 0; c < ctas; ++c) heap.emplace_back(0, c);
  const auto later = [](const std::pair<int64_t, int32_t>& a,
                        const std::pair<int64_t, int32_t>& b) { return a > b; };
  int64_t makespan = 0;
  for (const int32_t i : order) {
    std::pop_heap(heap.begin(), heap.end(), later);
    sc.cta[static_cast<std::size_t>(i)] = heap.back().second;
    heap.back().first += items[static_cast<std::size_t>(i)].cost;
    makespan = std::max(makespan, heap.back().first);
    std::push_heap(heap.begin(), heap.end(), later);
  }
  return makespan;
}

// Longest item first onto the fullest CTA it fits under `target` (best fit), else onto the
// least loaded one. CTAs sit in buckets by load (0 .. target) with a bit per non-empty bucket.
// Writes sc.cta; returns the makespan.
int64_t deal_best_fit(const std::vector<InvItem>& items, const std::vector<int32_t>& order,
                      int ctas, int64_t target, InvScratch& sc) {
  const std::size_t words = static_cast<std::size_t>(target / 64 + 1);
  sc.used.assign(words, 0);
  if (sc.bucket.size() < static_cast<std::size_t>(target + 1)) {
    sc.bucket.resize(static_cast<std::size_t>(target + 1));
  }
  for (int64_t v = 0; v <= target; ++v) sc.bucket[static_cast<std::size_t>(v)].clear();
  sc.load.assign(static_cast<std::size_t>(ctas), 0);
  for (int c = ctas - 1; c >= 0; --c) sc.bucket[0].push_back(c);  // CTA 0 on top
  sc.used[0] = 1;
  const auto take = [&](int64_t v) {
    std::vector<int32_t>& b = sc.bucket[static_cast<std::size_t>(v)];
    const int32_t c = b.back();
    b.pop_back();
    if (b.empty()) sc.used[static_cast<std::size_t>(v >> 6)] &= ~(uint64_t{1} << (v & 63));
    return c;
  };
  // The highest non-empty bucket at or below v, or -1.
  const auto highest_at_most = [&](int64_t v) -> int64_t {
    int64_t w = v >> 6;
    uint64_t bits = sc.used[static_cast<std::size_t>(w)] & (~uint64_t{0} >> (63 - (v & 63)));
    while (bits == 0) {
      if (--w < 0) return -1;
      bits = sc.used[static_cast<std::size_t>(w)];
    }
    return w * 64 + 63 - std::countl_zero(bits);
  };
  const auto lowest = [&]() -> int64_t {
    for (std::size_t w = 0; w < words; ++w) {
      if (sc.used[w] != 0) return static_cast<int64_t>(w * 64) + std::countr_zero(sc.used[w]);
    }
    return -1;
  };
  int64_t makespan = 0;
  for (const int32_t i : order) {
    const int64_t cost = items[static_cast<std::size_t>(i)].cost;
    int64_t v = cost <= target ? highest_at_most(target - cost) : -1;
    if (v < 0) v = lowest();
    int32_t c;
    if (v >= 0) {
      c = take(v);
    } else {  // every CTA is past the target: the least loaded
      c = 0;
      for (int k = 1; k < ctas; ++k) {
        if (sc.load[static_cast<std::size_t>(k)] < sc.load[static_cast<std::size_t>(c)]) c = k;
      }
    }
    int64_t& l = sc.load[static_cast<std::size_t>(c)];
    l += cost;
    makespan = std::max(makespan, l);
    if (l <= target) {
      sc.bucket[static_cast<std::size_t>(l)].push_back(c);
      sc.used[static_cast<std::size_t>(l >> 6)] |= uint64_t{1} << (l & 63);
    }
    sc.cta[static_cast<std::size_t>(i)] = c;
  }
  return makespan;
}

// The items (longest first in `order`) onto `ctas` CTAs of a group, the assignment with the
// smallest makespan of: least loaded, and best fit under a few targets from the ideal share up
// (a short Multifit; best fit can miss the ideal where least loaded does not, and the reverse).
// Targets past 2^16 key tiles are not tried (the buckets grow with the target).
// Returns the makespan (the most loaded CTA's cost).
int64_t deal_items(std::vector<InvItem>& items, const std::vector<int32_t>& order, int ctas,
                   InvScratch& sc) {
  int64_t total = 0, longest = 0, shortest = INT64_MAX;
  for (const InvItem& it : items) {
    total += it.cost;
    longest = std::max<int64_t>(longest, it.cost);
    shortest = std::min<int64_t>(shortest, it.cost);
  }
  sc.cta.resize(items.size());
  int64_t best = deal_least_loaded(items, order, ctas, sc);
  sc.best_cta = sc.cta;
  const int64_t ideal = std::max((total + ctas - 1) / ctas, longest);
  // Items of one cost: least loaded is optimal (ceil(items / CTAs) on the most loaded CTA).
  const bool uniform = shortest == longest;
  for (const int64_t pct : {0, 1, 2, 4, 8}) {
    const int64_t target = ideal + ideal * pct / 100;
    if (uniform || best <= ideal || target >= best || target > (int64_t{1} << 16)) break;
    const int64_t m = deal_best_fit(items, order, ctas, target, sc);
    if (m < best) {
      best = m;
      sc.best_cta = sc.cta;
    }
  }
  for (std::size_t i = 0; i < items.size(); ++i) items[i].cta = sc.best_cta[i];
  return best;
}

}  // namespace

bool cut_dealt(const Batch& in, int num_ctas, bool whole, int64_t max_load, PlanOut& out) {
  thread_local InvScratch sc;
  std::vector<InvTile>& tiles = sc.tiles;
  std::vector<InvItem>& items = sc.items;
  std::vector<int32_t>& order = sc.order;
  // 1. The tiles, their pieces and partial slots (batch order), and the groups.
  tiles.clear();
  int64_t units = 0, max_row_tiles = 0;
  int32_t next_partial = 0, num_combines = 0;
  int64_t q_row = 0;
  for (int b = 0; b < in.bs; ++b) {
    const int64_t rows = int64_t{in.q_lens[b]} * in.heads;
    const int64_t row_tiles = (rows + in.rows_tile - 1) / in.rows_tile;
    max_row_tiles = std::max(max_row_tiles, row_tiles);
    for (int64_t r = 0; r < rows; r += in.rows_tile) {
      InvTile t;
      t.ref = tile_of(in, b, q_row, r);
      t.pieces =
          whole ? 1
                : invariant_pieces(t.ref.tiles, row_tiles, std::min<int64_t>(rows, in.rows_tile));
      t.len = t.pieces > 1 ? (t.ref.tiles + t.pieces - 1) / t.pieces : t.ref.tiles;
      t.first_partial = t.pieces > 1 ? next_partial : -1;
      if (t.pieces > 1) {
        next_partial += t.pieces;
        ++num_combines;
      }
      units += t.pieces;
      tiles.push_back(t);
    }
    q_row += rows;
  }
  if (units > out.max_units) {
    out.overflow = true;
    return true;
  }
  const int groups = max_row_tiles >= 2 && max_row_tiles <= 4 && num_ctas >= 2 * max_row_tiles
                         ? static_cast<int>(max_row_tiles)
                         : 1;
  const int ctas_per_group = num_ctas / groups;
  const auto piece_cost = [](const InvTile& t, int k) -> int64_t {
    if (k >= t.pieces) return 0;
    const int64_t begin = int64_t{k} * t.len;
    const int64_t end = k + 1 == t.pieces ? t.ref.tiles : begin + t.len;
    return end - begin + kUnitCost;
  };

  // 2. The items: the pieces of row tile 0 and, grouped, the same pieces of the request's other
  // row tiles (tiles of one request are consecutive, row_in_req 0, 64, ...).
  items.clear();
  for (std::size_t i = 0; i < tiles.size();) {
    std::size_t end = i + 1;
    if (groups > 1) {
      while (end < tiles.size() && tiles[end].ref.head[3] != 0) ++end;
    }
    int max_pieces = 0;
    for (std::size_t j = i; j < end; ++j) max_pieces = std::max(max_pieces, tiles[j].pieces);
    for (int k = 0; k < max_pieces; ++k) {
      int64_t cost = 0;
      for (std::size_t j = i; j < end; ++j) cost = std::max(cost, piece_cost(tiles[j], k));
      items.push_back(InvItem{static_cast<int32_t>(std::min<int64_t>(cost, INT32_MAX)), 0,
                              static_cast<int32_t>(i), static_cast<int16_t>(end - i),
                              static_cast<int16_t>(k)});
    }
    i = end;
  }

  // 3. The items onto the CTAs of a group, longest first.
  order.resize(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int32_t ca = items[static_cast<std::size_t>(a)].cost;
    const int32_t cb = items[static_cast<std::size_t>(b)].cost;
    return ca != cb ? ca > cb : a < b;  // longest first, then in item order
  });
  if (deal_items(items, order, ctas_per_group, sc) > max_load) return false;  // nothing written
  std::vector<int32_t>& per_cta = sc.per_cta;
  per_cta.assign(static_cast<std::size_t>(ctas_per_group) + 1, 0);
  for (const InvItem& it : items) ++per_cta[static_cast<std::size_t>(it.cta) + 1];
  // Items CTA-major, each CTA's in the order dealt (longest first): a counting sort.
  for (int c = 0; c < ctas_per_group; ++c) per_cta[c + 1] += per_cta[c];
  std::vector<int32_t>& by_cta = sc.by_cta;
  std::vector<int32_t>& at = sc.at;
  by_cta.resize(items.size());
  at.assign(per_cta.begin(), per_cta.end() - 1);
  for (const int32_t i : order) by_cta[static_cast<std::size_t>(at[items[i].cta]++)] = i;

  // 4. The units, CTA-major: group g, CTA c holds member g of each of group 0's items on c.
  int32_t num_units = 0;
  for (int g = 0; g < groups; ++g) {
    for (int c = 0; c < ctas_per_group; ++c) {
      store_i32(out.cta_begin + sizeof(int32_t) * static_cast<std::size_t>(g * ctas_per_group + c),
                num_units);
      for (int32_t j = per_cta[c]; j < per_cta[c + 1]; ++j) {
        const InvItem& it = items[static_cast<std::size_t>(by_cta[static_cast<std::size_t>(j)])];
        // Member g: row tile g of the item's request, if it has that tile and that piece.
        if (g >= it.tiles) continue;
        const InvTile& t = tiles[static_cast<std::size_t>(it.tile0) + static_cast<std::size_t>(g)];
        if (it.piece >= t.pieces) continue;
        const int64_t begin = int64_t{it.piece} * t.len;
        const int64_t end = it.piece + 1 == t.pieces ? t.ref.tiles : begin + t.len;
        store_unit(out.units + sizeof(WorkUnit) * static_cast<std::size_t>(num_units++), t.ref,
                   begin, end, t.first_partial >= 0 ? t.first_partial + it.piece : -1);
      }
    }
  }
  // The combines, in tile order.
  int32_t combine = 0;
  for (const InvTile& t : tiles) {
    if (t.first_partial < 0) continue;
    store4(out.combines + sizeof(CombineUnit) * static_cast<std::size_t>(combine++),
           I32x4{t.ref.head[1], t.ref.head[2], t.first_partial, t.pieces});
  }
  out.num_units = num_units;
  out.num_combines = num_combines;
  out.next_partial = next_partial;
  out.next_cta = groups * ctas_per_group;
  return true;
}

}  // namespace mla::cuda::absorbed::plan_detail
