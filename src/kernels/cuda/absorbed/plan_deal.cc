// Row tiles dealt onto the CTAs longest first (plan_internal.h), in two uses:
// - The batch-invariant cut (AttnCapacity::batch_invariant; plan.h): every row tile of every
//   request cut into invariant_pieces(n, T, rows) pieces of ceil(n / pieces) key tiles, a
//   function of the tile's own extent, the request's row tiles T and its rows per tile; a split
//   tile's partial slots are consecutive in key order, so its combine merges them in key order.
//   Only the placement of the pieces on CTAs depends on the batch, and it changes no arithmetic.
// - Whole requests (deal_whole: the default plan of grouped batches, plan.cc): every row tile
//   one piece, no partials and no combines, kept only when the most loaded CTA carries at most
//   the caller's bound; dealt in rounds (equal lengths round robin, as the invariant cut places
//   them; others in a snake), without the invariant cut's per-tile bookkeeping.
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
#include <functional>
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
  std::vector<int32_t> order, by_cta, per_cta, at, cta, best_cta, count;
  std::vector<int64_t> load;
  std::vector<uint64_t> keys;                // sort keys of the items
  std::vector<uint64_t> heap;                // least loaded: (load << 20 | cta)
  std::vector<std::vector<int32_t>> bucket;  // best fit: CTAs by load
  std::vector<uint64_t> used;                // best fit: loads with a CTA
};

// The least loaded CTA: a 4-ary min-heap of (load << kCtaBits | cta), one key per CTA (num_ctas
// <= 2^20). The keys are distinct, so the top is the least loaded CTA and the lower CTA on ties,
// whatever the heap's shape. Children of node p: 4p + 1 .. 4p + 4 (3 levels for 66 CTAs, where a
// binary heap has 6 dependent loads); padded with keys above every load so each node has four
// children: the lesser child is found without a bounds check or a branch (conditional moves),
// and a sift ends when the key is not above it.
constexpr int kCtaBits = 20;
constexpr uint64_t kCtaMask = (uint64_t{1} << kCtaBits) - 1;

// Puts `key` at node `pos` and sifts it down.
inline void sift_down(uint64_t* h, std::size_t pos, uint64_t key) {
  while (true) {
    const std::size_t first = 4 * pos + 1;
    const uint64_t c0 = h[first], c1 = h[first + 1], c2 = h[first + 2], c3 = h[first + 3];
    const bool r01 = c1 < c0, r23 = c3 < c2;
    const uint64_t m01 = r01 ? c1 : c0, m23 = r23 ? c3 : c2;
    const bool hi = m23 < m01;
    const uint64_t m = hi ? m23 : m01;
    if (m >= key) break;
    h[pos] = m;
    pos = first + (hi ? 2 + static_cast<std::size_t>(r23) : static_cast<std::size_t>(r01));
  }
  h[pos] = key;
}

// The heap of `ctas` CTAs with the given loads (all 0 when null).
inline void build_heap(std::vector<uint64_t>& heap, int ctas, const int64_t* loads) {
  const std::size_t n = static_cast<std::size_t>(ctas);
  heap.assign(4 * n + 5, UINT64_MAX);
  for (std::size_t c = 0; c < n; ++c) {
    heap[c] = (loads ? static_cast<uint64_t>(loads[c]) << kCtaBits : 0) | c;
  }
  if (loads == nullptr || n < 2) return;  // equal loads: ordered by CTA, already a heap
  for (std::size_t p = (n - 2) / 4 + 1; p-- > 0;) sift_down(heap.data(), p, heap[p]);
}

// Items in `order` (longest first) each onto the least loaded CTA; the top's load grows in place
// and sifts down (one pass instead of a pop and a push). cost(i) is item i's cost; writes cta[i];
// returns the makespan.
template <typename Cost>
int64_t deal_least_loaded(const std::vector<int32_t>& order, int ctas, Cost cost, int32_t* cta,
                          std::vector<uint64_t>& heap) {
  build_heap(heap, ctas, nullptr);
  uint64_t* const h = heap.data();
  uint64_t makespan = 0;
  for (const int32_t i : order) {
    const uint64_t top = h[0];
    cta[i] = static_cast<int32_t>(top & kCtaMask);
    const uint64_t key = top + (static_cast<uint64_t>(cost(i)) << kCtaBits);
    makespan = std::max(makespan, key >> kCtaBits);
    sift_down(h, 0, key);
  }
  return static_cast<int64_t>(makespan);
}

// order = the item indices, longest first, then in item order; skipped when every cost is the
// same. Costs within a short range (key tiles: a few hundred at most for 8192-key pieces): a
// counting sort, stable (the std::sort below was a third of a batch-invariant plan's time at batch
// 256); otherwise one 64-bit key per item (cost, then the complement of the index), sorted
// descending. Both give the same order.
template <typename Cost>
void longest_first(std::size_t n, Cost cost, bool uniform, std::vector<uint64_t>& keys,
                   std::vector<int32_t>& count, std::vector<int32_t>& order) {
  order.resize(n);
  if (uniform) {
    for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
    return;
  }
  uint32_t lo = UINT32_MAX, hi = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<uint32_t>(cost(static_cast<int32_t>(i)));
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  if (n > 0 && hi - lo <= std::max<std::size_t>(4096, 4 * n)) {
    count.assign(static_cast<std::size_t>(hi - lo) + 2, 0);
    int32_t* const k = count.data();
    for (std::size_t i = 0; i < n; ++i)
      ++k[hi - static_cast<uint32_t>(cost(static_cast<int32_t>(i))) + 1];
    for (std::size_t v = 1; v < count.size(); ++v) k[v] += k[v - 1];
    for (std::size_t i = 0; i < n; ++i) {
      order[static_cast<std::size_t>(
          k[hi - static_cast<uint32_t>(cost(static_cast<int32_t>(i)))]++)] =
          static_cast<int32_t>(i);
    }
    return;
  }
  keys.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = uint64_t{static_cast<uint32_t>(cost(static_cast<int32_t>(i)))} << 32 |
              (UINT32_MAX - static_cast<uint32_t>(i));
  }
  std::sort(keys.begin(), keys.end(), std::greater<>());
  for (std::size_t i = 0; i < n; ++i) {
    order[i] = static_cast<int32_t>(UINT32_MAX - static_cast<uint32_t>(keys[i]));
  }
}

// by_cta = the items CTA-major, each CTA's in `order` (dealt order): a counting sort of the
// items by cta[i]; per_cta[c] .. per_cta[c + 1] are CTA c's.
void cta_major(const std::vector<int32_t>& order, const int32_t* cta, int ctas,
               std::vector<int32_t>& per_cta, std::vector<int32_t>& at,
               std::vector<int32_t>& by_cta) {
  per_cta.assign(static_cast<std::size_t>(ctas) + 1, 0);
  for (const int32_t i : order) ++per_cta[static_cast<std::size_t>(cta[i]) + 1];
  for (int c = 0; c < ctas; ++c) per_cta[c + 1] += per_cta[c];
  at.assign(per_cta.begin(), per_cta.end() - 1);
  by_cta.resize(order.size());
  for (const int32_t i : order) by_cta[static_cast<std::size_t>(at[cta[i]]++)] = i;
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
  bool over = false;  // every CTA past the target (sc.heap holds their loads)
  for (const int32_t i : order) {
    const int64_t cost = items[static_cast<std::size_t>(i)].cost;
    int64_t v = cost <= target ? highest_at_most(target - cost) : -1;
    if (v < 0) v = lowest();
    int32_t c;
    if (v >= 0) {
      c = take(v);
    } else {
      // Every CTA is past the target (and stays there: loads only grow), so this item and every
      // later one go to the least loaded CTA, the lower on ties: from a heap of all the loads,
      // built once, instead of a scan over the CTAs per item.
      if (!over) {
        build_heap(sc.heap, ctas, sc.load.data());
        over = true;
      }
      c = static_cast<int32_t>(sc.heap[0] & kCtaMask);
    }
    int64_t& l = sc.load[static_cast<std::size_t>(c)];
    l += cost;
    if (over) sift_down(sc.heap.data(), 0, static_cast<uint64_t>(l) << kCtaBits | c);
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
  int64_t best = deal_least_loaded(
      order, ctas, [&](int32_t i) { return items[static_cast<std::size_t>(i)].cost; },
      sc.cta.data(), sc.heap);
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

void cut_invariant(const Batch& in, int num_ctas, PlanOut& out) {
  thread_local InvScratch sc;
  std::vector<InvTile>& tiles = sc.tiles;
  std::vector<InvItem>& items = sc.items;
  std::vector<int32_t>& order = sc.order;
  // 1. The tiles, their pieces and partial slots (batch order), and the groups.
  tiles.clear();
  int64_t units = 0, max_row_tiles = 0;
  int32_t next_partial = 0, num_combines = 0;
  int64_t q_row = 0;
  // Tiles of 16, 32 or 64 rows: a shift, not a division per request.
  const int rows_tile_log2 = std::countr_zero(static_cast<unsigned>(in.rows_tile));
  const bool pow2 = (in.rows_tile & (in.rows_tile - 1)) == 0;
  for (int b = 0; b < in.bs; ++b) {
    const int64_t rows = int64_t{in.q_lens[b]} * in.heads;
    const int64_t row_tiles = pow2 ? (rows + in.rows_tile - 1) >> rows_tile_log2
                                   : (rows + in.rows_tile - 1) / in.rows_tile;
    max_row_tiles = std::max(max_row_tiles, row_tiles);
    for (int64_t r = 0; r < rows; r += in.rows_tile) {
      InvTile t;
      t.ref = tile_of(in, b, q_row, r);
      t.pieces = invariant_pieces(t.ref.tiles, row_tiles, std::min<int64_t>(rows, in.rows_tile));
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
    return;
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
  longest_first(
      items.size(), [&](int32_t i) { return items[static_cast<std::size_t>(i)].cost; },
      /*uniform=*/false, sc.keys, sc.count, order);
  deal_items(items, order, ctas_per_group, sc);
  // Items CTA-major, each CTA's in the order dealt (longest first).
  cta_major(order, sc.best_cta.data(), ctas_per_group, sc.per_cta, sc.at, sc.by_cta);
  const std::vector<int32_t>& per_cta = sc.per_cta;
  const std::vector<int32_t>& by_cta = sc.by_cta;

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
}

bool deal_whole(const Batch& in, int write_groups, int ctas_per_group, int64_t max_load,
                PlanOut& out) {
  struct Scratch {  // reused across plans on this thread (only grown)
    std::vector<int32_t> req, cost, order, count;
    std::vector<int64_t> q_row, load;
    std::vector<uint64_t> keys;
  };
  thread_local Scratch w;
  // The loops below work through local pointers: stores through std::byte* (the plan) may
  // alias anything, so members of the thread_local scratch would be reloaded after every store.
  const std::size_t bs = static_cast<std::size_t>(in.bs);
  if (w.req.size() < bs) {
    w.req.resize(bs);
    w.cost.resize(bs);
    w.q_row.resize(bs);
  }
  int32_t* const req = w.req.data();
  int32_t* const cost = w.cost.data();
  int64_t* const req_q_row = w.q_row.data();
  const int32_t* const q_lens = in.q_lens;
  const int32_t* const kv_lens = in.kv_lens;
  const int64_t heads = in.heads;
  // 1. The items: the requests with rows, each costing its last row tile (all kv_len keys).
  std::size_t n = 0;
  int64_t q_row = 0, units = 0;
  int32_t lo = INT32_MAX, hi = 0;
  for (std::size_t b = 0; b < bs; ++b) {
    const int32_t ql = q_lens[b];
    const int64_t rows = int64_t{ql} * heads;
    if (ql > 0) {
      const int32_t c = static_cast<int32_t>(
          (static_cast<uint32_t>(kv_lens[b]) + kBlockN - 1) / kBlockN + kUnitCost);
      req[n] = static_cast<int32_t>(b);
      cost[n] = c;
      req_q_row[n] = q_row;
      ++n;
      lo = std::min(lo, c);
      hi = std::max(hi, c);
      units += (rows + in.rows_tile - 1) / in.rows_tile;
    }
    q_row += rows;
  }
  // Some CTA takes ceil(n / CTAs) requests of at least lo key tiles each: past max_load, no
  // dealing can keep the bound (checked before the sort, so a batch that splits pays little).
  const std::size_t per = static_cast<std::size_t>(ctas_per_group);
  if (n > 0 && static_cast<int64_t>((n + per - 1) / per) * lo > max_load) return false;
  // 2. Longest first (longest_first: a counting sort by cost when the costs span a short range),
  // dealt in rounds of one request per CTA: equal costs round robin (what least loaded does
  // with them, so these plans are byte for byte the invariant plans of such batches), others
  // in a snake (rounds alternately up and down the CTAs, so a CTA given a shorter request in
  // one round gets a longer one in the next). The snake's most loaded CTA was within 1 % of
  // least loaded's (longest first to the least loaded CTA) on random batches of requests of
  // 65-129 and 33-129 key tiles, 128-512 of them on 66 CTAs (a Python model, 2026-12-04), at
  // no heap walk per request (least loaded was 60 % of this function's time at batch 256).
  const bool uniform = lo == hi;
  longest_first(
      n, [cost](int32_t i) { return cost[i]; }, uniform, w.keys, w.count, w.order);
  const int32_t* const order = w.order.data();
  // Request k of the sorted order goes to CTA cta_of(k): position k mod per of round k / per,
  // counted up the CTAs in even rounds (and always when uniform), down them in odd ones.
  const auto cta_of = [uniform, per](std::size_t round, std::size_t at) {
    return uniform || round % 2 == 0 ? at : per - 1 - at;
  };
  w.load.assign(per, 0);
  int64_t* const load = w.load.data();
  for (std::size_t k = 0, round = 0, at = 0; k < n; ++k) {
    load[cta_of(round, at)] += cost[order[k]];
    if (++at == per) {
      at = 0;
      ++round;
    }
  }
  const int64_t makespan = n == 0 ? 0 : *std::max_element(load, load + per);
  if (makespan > max_load) return false;  // nothing written
  if (units > out.max_units) {
    out.overflow = true;
    return true;
  }
  // 3. The units, CTA-major: group g, CTA c runs row tile g of each request dealt to c (its
  // position in every round, in the order dealt), all its keys.
  std::byte* const units_out = out.units;
  std::byte* const cta_begin = out.cta_begin;
  const std::size_t rounds = (n + per - 1) / per;
  int32_t num_units = 0;
  for (int g = 0; g < write_groups; ++g) {
    const int64_t r = int64_t{g} * in.rows_tile;
    for (std::size_t c = 0; c < per; ++c) {
      store_i32(cta_begin + sizeof(int32_t) * (static_cast<std::size_t>(g) * per + c), num_units);
      for (std::size_t round = 0; round < rounds; ++round) {
        const std::size_t k = round * per + cta_of(round, c);
        if (k >= n) continue;  // the last round's positions past n
        const std::size_t i = static_cast<std::size_t>(order[k]);
        const int b = req[i];
        if (r >= int64_t{q_lens[b]} * heads) continue;  // fewer row tiles
        const TileRef t = tile_of(in, b, req_q_row[i], r);
        store_unit(units_out + sizeof(WorkUnit) * static_cast<std::size_t>(num_units++), t, 0,
                   t.tiles, -1);
      }
    }
  }
  out.num_units = num_units;
  out.num_combines = 0;
  out.next_partial = 0;
  out.next_cta = write_groups * ctas_per_group;
  return true;
}

}  // namespace mla::cuda::absorbed::plan_detail
