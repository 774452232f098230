#include "kernels/cuda/absorbed/plan.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/absorbed/choose.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan_internal.h"
#include "kernels/cuda/absorbed/traits.h"
#include "mla/kv_pool.h"
#include "mla/model.h"

namespace mla::cuda::absorbed {
namespace {

using namespace plan_detail;

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Never cut a piece shorter than 2 key tiles (128 keys): a split costs a partial write and a
// combine read of 64 x 512 fp32, the traffic of about two key tiles.
constexpr int64_t kMinPieceTiles = 2;

// Piece of a grouped item (a request), kept for the groups after the first.
struct Piece {
  int32_t request;
  int32_t q_row;  // first flat row of the request
  int32_t begin_tile, end_tile;
  int32_t cta;          // within the group
  int32_t item_pieces;  // pieces of the item, on its first piece
};

// Reusable vectors of one planning thread (resize() keeps their capacity).
struct PlanScratch {
  std::vector<Piece> pieces;
};

// max(ceil(unassigned / CTAs left), kMinPieceTiles + kUnitCost): the share of CTA c of a group.
__attribute__((always_inline)) inline int64_t share_of(int64_t unassigned, int ctas_per_group,
                                                       int c) {
  const int64_t left_ctas = ctas_per_group - c;
  return std::max<int64_t>((unassigned + left_ctas - 1) / left_ctas, kMinPieceTiles + kUnitCost);
}

// Contiguous cutting of the flattened (item, key tile) list of one group into equal shares:
// CTA c of the group gets max(ceil(unassigned work / CTAs left), kMinPieceTiles + kUnitCost),
// re-derived from the work still unassigned, so pieces left unused by the no-tiny-piece rule
// spread over the remaining CTAs instead of piling up on the last one. An item that fits (with
// a slack of kMinPieceTiles: overfill a little rather than leave a tiny piece behind) ends in
// the CTA; else a piece is cut off (unless a piece under kMinPieceTiles would be left) and the
// cut moves to the next CTA. A tile cut into several pieces writes partial slots that one
// combine merges. Units are written as the pieces come, CTA-major.
//
// Items: one per request with rows (grouped: its first row tile, costed by its last row tile,
// which sees all kv_len keys) or one per row tile (ungrouped). pieces (grouped with several
// queries only): one per unit written, for the other groups.
//
// Combines need no bound check: each split item moves the cut past a CTA, so there are fewer
// than num_ctas = max_combines. Units are checked against max_units.
template <bool kDecode>
__attribute__((noinline)) void cut_group(const Batch& in_ref, bool grouped, int ctas_per_group,
                                         int64_t total_cost, Piece* pieces, PlanOut& out) {
  // The non-decode cut runs for grouped schedules only (cut_tiles takes the ungrouped ones).
  if constexpr (!kDecode) grouped = true;
  const Batch in = in_ref;  // a local copy: not reloaded after each store through std::byte*
  std::byte* const units_out = out.units;
  std::byte* const combines_out = out.combines;
  std::byte* const cta_begin_out = out.cta_begin;
  const int64_t max_units = out.max_units;
  const int last_cta = ctas_per_group - 1;
  int32_t num_units = 0, num_combines = 0, next_partial = 0;
  int cta = 0;
  int64_t unassigned = total_cost;
  int64_t room = share_of(unassigned, ctas_per_group, 0);
  store_i32(cta_begin_out, 0);
  const auto next_cta = [&]() __attribute__((always_inline)) {
    ++cta;
    store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(cta), num_units);
    room = share_of(unassigned, ctas_per_group, cta);
  };
  bool overflow = false;
  std::byte* unit_at = units_out;  // the next unit (decode)
  int64_t q_row = 0;
  for (int b = 0; b < in.bs && !overflow; ++b) {
    const int32_t ql = in.q_lens[b];
    const int64_t rows = int64_t{ql} * in.heads;
    if constexpr (kDecode) {
      // One item per request whose first row tile sees all kv_len keys: decode (every request
      // 0 or 1 query, grouped or not) or any batch whose requests have one row tile each
      // (heads x q_len <= rows_tile: the tile's last row is the request's last query).
      // bs + ctas_per_group - 1 units at most, under max_batch + num_ctas <= max_units: no
      // check. The first row tile has tile_rows = min(rows_tile, heads x q_len) rows: a piece
      // [b, e) of key tiles covers keys [64 b, min(64 e, kv_len)), and a piece cut off before
      // the last ends below kv_len.
      if (ql == 0) continue;
      const int32_t kl = in.kv_lens[b];
      const int64_t n = (static_cast<uint32_t>(kl) + kBlockN - 1) / kBlockN;
      const int32_t tile_rows = static_cast<int32_t>(std::min<int64_t>(in.rows_tile, rows));
      const I32x4 head =
          quad(pair(in.req_rows[b], static_cast<int32_t>(q_row)), pair(tile_rows, 0));
      const uint64_t lens = pair(ql, kl);
      q_row += rows;
      const auto put = [&](int64_t begin, int32_t end, int32_t partial)
          __attribute__((always_inline)) {
        store4(unit_at, head);
        store4(unit_at + 16, quad(lens, pair(static_cast<int32_t>(begin * kBlockN), end)));
        store4(unit_at + 32, quad(static_cast<uint32_t>(partial), 0));
        unit_at += sizeof(WorkUnit);
        ++num_units;
      };
      if (cta == last_cta || n + kUnitCost <= room + kMinPieceTiles) [[likely]] {
        put(0, kl, -1);  // the whole request in this CTA
        room -= n + kUnitCost;
        unassigned -= n + kUnitCost;
      } else {
        int64_t begin = 0;
        const int32_t first_partial = next_partial;
        while (true) {
          const int64_t left = n - begin;
          if (cta == last_cta || left + kUnitCost <= room + kMinPieceTiles) {
            const bool split = begin > 0;
            put(begin, kl, split ? next_partial : -1);
            if (split) {
              ++next_partial;
              store4(combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(num_combines++),
                     I32x4{head[1], tile_rows, first_partial, next_partial - first_partial});
            }
            room -= left + kUnitCost;
            unassigned -= left + kUnitCost;
            break;
          }
          const int64_t take = room - kUnitCost;
          if (take >= kMinPieceTiles && left - take >= kMinPieceTiles) {
            put(begin, static_cast<int32_t>((begin + take) * kBlockN), next_partial++);
            begin += take;
            unassigned -= take;  // the item's unit cost leaves with its last piece
          }
          next_cta();
        }
      }
      if (room <= 0 && cta < last_cta) next_cta();
    } else {
      for (int64_t r = 0; r < rows; r += in.rows_tile) {
        const TileRef t = tile_of(in, b, q_row, r);
        const int64_t n = grouped ? (static_cast<uint32_t>(in.kv_lens[b]) + kBlockN - 1) / kBlockN
                                  : int64_t{t.tiles};
        int64_t begin = 0;
        int32_t first_partial = 0;
        const int32_t first_piece = num_units;
        const auto put = [&](int64_t end, int32_t partial) __attribute__((always_inline)) {
          if (num_units >= max_units) [[unlikely]] {
            overflow = true;
            return;
          }
          store_unit(units_out + sizeof(WorkUnit) * static_cast<std::size_t>(num_units), t, begin,
                     end, partial);
          if (pieces != nullptr) {
            pieces[num_units] = Piece{b,
                                      static_cast<int32_t>(q_row),
                                      static_cast<int32_t>(begin),
                                      static_cast<int32_t>(end),
                                      cta,
                                      0};
          }
          ++num_units;
        };
        while (!overflow) {  // NOLINT(bugprone-infinite-loop): put() sets overflow
          const int64_t left = n - begin;
          if (cta == last_cta || left + kUnitCost <= room + kMinPieceTiles) {
            const bool split = begin > 0;
            put(n, split ? next_partial : -1);
            if (split) {
              ++next_partial;
              store4(combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(num_combines++),
                     I32x4{t.head[1], t.head[2], first_partial, next_partial - first_partial});
            }
            room -= left + kUnitCost;
            unassigned -= left + kUnitCost;
            break;
          }
          const int64_t take = room - kUnitCost;
          if (take >= kMinPieceTiles && left - take >= kMinPieceTiles) {
            if (begin == 0) first_partial = next_partial;
            put(begin + take, next_partial++);
            begin += take;
            unassigned -= take;  // the item's unit cost leaves with its last piece
          }
          next_cta();
        }
        if (overflow) break;
        if (pieces != nullptr) pieces[first_piece].item_pieces = num_units - first_piece;
        if (room <= 0 && cta < last_cta) next_cta();
        if (grouped) break;  // the other row tiles follow in the other groups
      }
      q_row += rows;
    }
  }
  out.num_units = num_units;
  out.num_combines = num_combines;
  out.next_partial = next_partial;
  out.next_cta = cta + 1;
  out.overflow = overflow;
}

// The ungrouped cut when requests have several row tiles (heads x q_len > rows_tile and no
// grouping: 64-128 heads with q_len > 4, or a small grid): the same cut as cut_group<false>
// with one item per row tile, the request's fields loaded once and the units built from
// 64-bit lane pairs. Row tile r of a request (its first row r) holds
// num_rows = min(rows_tile, rows - r) rows; its last query q = (r + num_rows - 1) / heads
// sees extent = max(kv_len - q_len + q + 1, 0) keys (causal, kv_len > 0) or kv_len (otherwise:
// tile_extent), so a
// piece [b, e) of its n = ceil(extent / 64) key tiles covers keys [64 b, min(64 e, extent)),
// and a piece cut off before the last ends below extent. Units are checked against max_units
// (an overflow fails the plan, so the cut stops there).
__attribute__((noinline)) void cut_tiles(const Batch& in_ref, int ctas_per_group,
                                         int64_t total_cost, PlanOut& out) {
  const Batch in = in_ref;  // a local copy: not reloaded after each store through std::byte*
  std::byte* const units_out = out.units;
  std::byte* const combines_out = out.combines;
  std::byte* const cta_begin_out = out.cta_begin;
  const int32_t max_units = static_cast<int32_t>(std::min<int64_t>(out.max_units, INT32_MAX));
  const int last_cta = ctas_per_group - 1;
  int32_t num_units = 0, num_combines = 0, next_partial = 0;
  int cta = 0;
  int64_t unassigned = total_cost;
  int64_t room = share_of(unassigned, ctas_per_group, 0);
  store_i32(cta_begin_out, 0);
  const auto next_cta = [&]() __attribute__((always_inline)) {
    ++cta;
    store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(cta), num_units);
    room = share_of(unassigned, ctas_per_group, cta);
  };
  std::byte* unit_at = units_out;  // the next unit
  int64_t q_row = 0;
  for (int b = 0; b < in.bs; ++b) {
    const int32_t ql = in.q_lens[b];
    if (ql == 0) continue;  // no rows, no tiles
    const int64_t rows = int64_t{ql} * in.heads;
    const int32_t kl = in.kv_lens[b];
    const uint64_t lens = pair(ql, kl);
    const int32_t req_row = in.req_rows[b];
    for (int64_t r = 0; r < rows; r += in.rows_tile) {
      const int32_t num_rows = static_cast<int32_t>(std::min<int64_t>(in.rows_tile, rows - r));
      const int32_t extent = tile_extent(in.causal, ql, kl, query_of(in, r + num_rows - 1));
      const int64_t n = (static_cast<uint32_t>(extent) + kBlockN - 1) / kBlockN;
      const I32x4 head = quad(pair(req_row, static_cast<int32_t>(q_row + r)),
                              pair(num_rows, static_cast<int32_t>(r)));
      // The whole tile's second 16 bytes, built here as a vector: a 32-bit extent kept for the
      // store below was spilled and reloaded as 64 bits (a failed store-to-load forward).
      const I32x4 lens_whole = quad(lens, pair(0, extent));
      if (num_units + 1 > max_units) [[unlikely]] {
        out.overflow = true;
        return;
      }
      const auto put = [&](int64_t begin, int32_t end, int32_t partial)
          __attribute__((always_inline)) {
        store4(unit_at, head);
        store4(unit_at + 16, quad(lens, pair(static_cast<int32_t>(begin * kBlockN), end)));
        store4(unit_at + 32, quad(static_cast<uint32_t>(partial), 0));
        unit_at += sizeof(WorkUnit);
        ++num_units;
      };
      if (cta == last_cta || n + kUnitCost <= room + kMinPieceTiles) [[likely]] {
        store4(unit_at, head);  // the whole tile in this CTA
        store4(unit_at + 16, lens_whole);
        store4(unit_at + 32, quad(static_cast<uint32_t>(-1), 0));
        unit_at += sizeof(WorkUnit);
        ++num_units;
        room -= n + kUnitCost;
        unassigned -= n + kUnitCost;
      } else {
        int64_t begin = 0;
        const int32_t first_partial = next_partial;
        while (true) {
          const int64_t left = n - begin;
          if (cta == last_cta || left + kUnitCost <= room + kMinPieceTiles) {
            if (num_units + 1 > max_units) [[unlikely]] {
              out.overflow = true;
              return;
            }
            const bool split = begin > 0;
            put(begin, extent, split ? next_partial : -1);
            if (split) {
              ++next_partial;
              store4(combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(num_combines++),
                     I32x4{head[1], num_rows, first_partial, next_partial - first_partial});
            }
            room -= left + kUnitCost;
            unassigned -= left + kUnitCost;
            break;
          }
          const int64_t take = room - kUnitCost;
          if (take >= kMinPieceTiles && left - take >= kMinPieceTiles) {
            if (num_units + 1 > max_units) [[unlikely]] {
              out.overflow = true;
              return;
            }
            put(begin, static_cast<int32_t>((begin + take) * kBlockN), next_partial++);
            begin += take;
            unassigned -= take;  // the item's unit cost leaves with its last piece
          }
          next_cta();
        }
      }
      if (room <= 0 && cta < last_cta) next_cta();
    }
    q_row += rows;
  }
  out.num_units = num_units;
  out.num_combines = num_combines;
  out.next_partial = next_partial;
  out.next_cta = cta + 1;
  out.overflow = false;
}

// Groups 1.. of a grouped schedule with several queries per request: group g owns CTAs
// [g * ctas_per_group, ...) and replays the first group's pieces with row tile g of each
// request that has one (pieces: the first group's, one per unit). Combines: fewer than num_ctas
// (each split item of each group moved its group's cut past a CTA).
__attribute__((noinline)) void replay_groups(const Batch& in_ref, int groups, int ctas_per_group,
                                             const Piece* pieces, PlanOut& out) {
  const Batch in = in_ref;
  std::byte* const units_out = out.units;
  std::byte* const combines_out = out.combines;
  std::byte* const cta_begin_out = out.cta_begin;
  const int64_t max_units = out.max_units;
  const int32_t units0 = out.num_units;
  int32_t num_units = units0, num_combines = out.num_combines, next_partial = out.next_partial;
  int next_cta = out.next_cta;
  bool overflow = false;
  for (int g = 1; g < groups && !overflow; ++g) {
    const int cta0 = g * ctas_per_group;
    const int64_t r = int64_t{g} * in.rows_tile;
    for (int32_t k = 0; k < units0 && !overflow;) {
      const Piece first = pieces[k];
      const int32_t end = k + first.item_pieces;
      if (int64_t{in.q_lens[first.request]} * in.heads > r) {  // the request has row tile g
        const TileRef t = tile_of(in, first.request, first.q_row, r);
        const bool split = first.item_pieces > 1;
        if (split) {
          store4(combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(num_combines++),
                 I32x4{t.head[1], t.head[2], next_partial, first.item_pieces});
        }
        for (; k < end; ++k) {
          const Piece& pc = pieces[k];
          for (; next_cta <= cta0 + pc.cta; ++next_cta) {
            store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(next_cta),
                      num_units);
          }
          if (num_units >= max_units) [[unlikely]] {
            overflow = true;
            break;
          }
          store_unit(units_out + sizeof(WorkUnit) * static_cast<std::size_t>(num_units++), t,
                     pc.begin_tile, pc.end_tile, split ? next_partial++ : -1);
        }
      }
      k = end;
    }
  }
  out.num_units = num_units;
  out.num_combines = num_combines;
  out.next_partial = next_partial;
  out.next_cta = next_cta;
  out.overflow = overflow;
}

// Decode with no more requests than CTAs, each within kWholeSlack of the ideal share: request k
// whole on CTA k (the CTAs past the last request get nothing). Splitting such a batch to fill
// every CTA gains at most kWholeSlack of the time and costs a second unit (its query tile and
// pipeline start) on most CTAs, partial writes and the combine kernel. Grouped batches (2-4 row
// tiles per request) of more requests deal them whole, longest first (deal_whole), when the most
// loaded CTA stays within kWholeSlack of the share: measured through the batch-invariant plans,
// which are those plans where every request is one piece (H200, 2026-12-04, f942a01): 128 heads
// at 4096-8192 keys 0.89-0.95x the split plan's time, 64 heads x 2 queries 0.93-0.98x, 128 x 2
// 0.97-1.0x, (256, 1, 128, 2048) 0.97x.
inline constexpr int64_t kWholeSlackDiv = 16;  // within share + share / 16
__attribute__((noinline)) void place_whole(const Batch& in, PlanOut& out) {
  int32_t num_units = 0;
  int64_t q_row = 0;
  for (int b = 0; b < in.bs; ++b) {
    const int32_t ql = in.q_lens[b];
    if (ql == 0) continue;
    const int32_t kl = in.kv_lens[b];
    const int32_t tile_rows =
        static_cast<int32_t>(std::min<int64_t>(in.rows_tile, int64_t{ql} * in.heads));
    store_i32(out.cta_begin + sizeof(int32_t) * static_cast<std::size_t>(num_units), num_units);
    std::byte* u = out.units + sizeof(WorkUnit) * static_cast<std::size_t>(num_units++);
    store4(u, quad(pair(in.req_rows[b], static_cast<int32_t>(q_row)), pair(tile_rows, 0)));
    store4(u + 16, quad(pair(ql, kl), pair(0, kl)));
    store4(u + 32, quad(static_cast<uint32_t>(-1), 0));
    q_row += int64_t{ql} * in.heads;
  }
  out.num_units = num_units;
  out.num_combines = 0;
  out.next_partial = 0;
  out.next_cta = num_units;
  out.overflow = false;
}

// Group 1 of 65-128-head decode: every request has one query, so both row tiles of a request
// see the same keys, and group 1's units, combines and CTA begins are group 0's moved by one row
// tile (rows_tile rows; partial slots after group 0's), each of heads - rows_tile rows (group
// 0's tiles hold rows_tile: 126 heads are tiles of 64 and 62 rows).
__attribute__((noinline)) void copy_group(int rows_tile, int heads, int ctas_per_group,
                                          PlanOut& out) {
  std::byte* const units_out = out.units;
  std::byte* const combines_out = out.combines;
  std::byte* const cta_begin_out = out.cta_begin;
  const int32_t units0 = out.num_units, combines0 = out.num_combines, partials0 = out.next_partial;
  if (int64_t{units0} * 2 > out.max_units) [[unlikely]] {
    out.num_units = static_cast<int32_t>(out.max_units);
    out.overflow = true;
    return;
  }
  for (int c = out.next_cta; c < ctas_per_group; ++c) {
    store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(c), units0);
  }
  const I32x4 row_step{0, rows_tile, 0, rows_tile}, partial_step{partials0, 0, 0, 0};
  const int32_t rows_second = heads - rows_tile;
  for (int32_t i = 0; i < units0; ++i) {
    const std::byte* src = units_out + sizeof(WorkUnit) * static_cast<std::size_t>(i);
    std::byte* dst = units_out + sizeof(WorkUnit) * static_cast<std::size_t>(i + units0);
    I32x4 head, lens, tail;
    std::memcpy(&head, src, 16);
    std::memcpy(&lens, src + 16, 16);
    std::memcpy(&tail, src + 32, 16);
    tail += (tail >= 0) & partial_step;  // split units only (lanes 1-3 are 0)
    I32x4 moved = head + row_step;
    moved[2] = rows_second;
    store4(dst, moved);
    store4(dst + 16, lens);
    store4(dst + 32, tail);
  }
  const I32x4 combine_step{rows_tile, 0, partials0, 0};
  for (int32_t i = 0; i < combines0; ++i) {
    I32x4 c;
    std::memcpy(&c, combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(i), 16);
    I32x4 moved = c + combine_step;
    moved[1] = rows_second;
    store4(combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(i + combines0), moved);
  }
  for (int c = 0; c < ctas_per_group; ++c) {
    int32_t b0;
    std::memcpy(&b0, cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(c), 4);
    store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(ctas_per_group + c),
              b0 + units0);
  }
  out.next_cta = 2 * ctas_per_group;
  out.num_units = 2 * units0;
  out.num_combines = 2 * combines0;
  out.next_partial = 2 * partials0;
}

// Row tiles the capacity allows at most (tiles of at least min_rows rows, one partial tile per
// request).
int64_t capacity_tiles(const AttnCapacity& cap, int64_t min_rows) {
  const int64_t heads = cap.num_heads > 0 ? cap.num_heads : 128;
  return (std::max<int64_t>(cap.max_q_tokens, 0) * heads + min_rows - 1) / min_rows +
         std::max(cap.max_batch, 0);
}

}  // namespace

int invariant_pieces(int64_t key_tiles, int64_t row_tiles, int64_t rows) {
  const int64_t t = std::clamp<int64_t>(row_tiles, 1, int64_t{1} << 24);
  const int64_t split = (rows <= 16 ? kInvariantSplitTilesFewRows : kInvariantSplitTiles) * t;
  const int64_t piece = kInvariantPieceTiles * t;
  const int64_t n = std::max<int64_t>(key_tiles, 0);
  const int64_t p =
      std::max(std::min<int64_t>(2, (n + split - 1) / split), (n + piece - 1) / piece);
  return static_cast<int>(std::clamp<int64_t>(p, 1, kInvariantMaxPieces));
}

PlanLayout plan_layout(const AttnCapacity& cap, int num_ctas) {
  PlanLayout l;
  l.num_ctas = num_ctas;
  // num_heads 0 in a capacity means any supported head count: size for the most (128). Sizing
  // for 1 head let a 16..128-head problem overflow the units and fail with kInternal (found by
  // the absorbed_plan fuzz target).
  const int64_t heads = cap.num_heads > 0 ? cap.num_heads : 128;
  const int64_t min_rows = std::min<int64_t>(kMaxRows, std::max<int64_t>(16, heads));
  const int64_t max_tiles = capacity_tiles(cap, min_rows);
  l.max_units = max_tiles + num_ctas;
  l.max_combines = num_ctas;
  if (cap.batch_invariant) {  // tiles of kMaxRows rows, each in up to kInvariantMaxPieces units
    const int64_t tiles = capacity_tiles(cap, kMaxRows);
    l.max_units = tiles * kInvariantMaxPieces;
    l.max_combines = tiles;
  }
  l.cta_begin_offset = align_up(sizeof(PlanHeader));
  l.units_offset = l.cta_begin_offset + align_up(sizeof(int32_t) * (int64_t{num_ctas} + 1));
  l.combines_offset = l.units_offset + align_up(sizeof(WorkUnit) * l.max_units);
  l.bytes = l.combines_offset + align_up(sizeof(CombineUnit) * l.max_combines);
  return l;
}

int64_t max_partials(int num_ctas) { return int64_t{kPartialsPerCta} * num_ctas; }

int64_t max_partials(const AttnCapacity& cap, int num_ctas) {
  if (!cap.batch_invariant) return max_partials(num_ctas);
  return std::max(max_partials(num_ctas), capacity_tiles(cap, kMaxRows) * kInvariantMaxPieces);
}

namespace {
std::size_t workspace_for(int64_t partials) {
  const std::size_t n = static_cast<std::size_t>(partials);
  return align_up(n * kMaxRows * kDimV * sizeof(float)) + align_up(n * kMaxRows * sizeof(float));
}
}  // namespace

std::size_t partial_workspace_bytes(int num_ctas) { return workspace_for(max_partials(num_ctas)); }

std::size_t partial_workspace_bytes(const AttnCapacity& cap, int num_ctas) {
  return workspace_for(max_partials(cap, num_ctas));
}

int64_t partials_in_workspace(std::size_t bytes) {
  // Each slot takes kMaxRows * (kDimV + 1) floats; the two alignments cost below 2 * kAlign.
  const std::size_t per = kMaxRows * (kDimV + 1) * sizeof(float);
  int64_t n = static_cast<int64_t>(bytes / per);
  while (n > 0 && workspace_for(n) > bytes) --n;
  return n;
}

StatusOr<std::size_t> build_plan(const AbsorbedProblem& p, const AttnCapacity& cap, int num_ctas,
                                 std::span<std::byte> host_plan) {
  const int bs = static_cast<int>(p.req_rows.size());
  // A grid of more than 2^20 CTAs is no GPU's; the bound keeps the layout arithmetic in range
  // (num_ctas = INT32_MAX overflowed it: found by the absorbed_plan fuzz target).
  MLA_CHECK_ARG(num_ctas > 0 && num_ctas <= (1 << 20), "num_ctas = {} must be in 1..{}", num_ctas,
                1 << 20);
  // The shared rule (ops.h: sizes, batch, heads vs capacity, page size), then the op's heads.
  MLA_RETURN_IF_ERROR(check_absorbed_shape(p, cap));
  MLA_CHECK_ARG(supported_head_count(p.num_heads), "num_heads = {} (supported: 1 to {})",
                p.num_heads, kMaxHeads);
  const PlanLayout layout = plan_layout(cap, num_ctas);
  MLA_CHECK_ARG(host_plan.size() >= layout.bytes, "host_plan holds {} bytes, the plan needs {}",
                host_plan.size(), layout.bytes);

  const int32_t* const q_lens = p.q_lens.data();
  const int32_t* const kv_lens = p.kv_lens.data();
  const int32_t* const req_rows = p.req_rows.data();
  const bool causal = p.causal;

  // 1. Branch-free passes the compiler vectorizes: the request checks, the longest q_len, the
  // query tokens, and the cost of every request as one item (its key tiles + kUnitCost), what
  // the cut uses unless a request splits into row tiles cut separately. Sums in unsigned
  // arithmetic are exact once the checks pass (every length >= 0); a malformed request sends us
  // to the shared per-request checks (check_absorbed_requests, ops.h), in their order, for the
  // message.
  uint32_t sign_bits = 0;
  int32_t max_q = 0;
  for (int b = 0; b < bs; ++b) {
    const int32_t ql = q_lens[b], kl = kv_lens[b];
    sign_bits |= static_cast<uint32_t>(ql | kl | req_rows[b]);
    max_q = std::max(max_q, ql);
  }
  // (also the requests with rows and the most costly one, for the whole placement of decode)
  uint64_t q_sum = 0, cost_sum = 0;
  uint32_t longest = 0, with_rows = 0;
  for (int b = 0; b < bs; ++b) {
    const uint32_t ql = static_cast<uint32_t>(q_lens[b]), kl = static_cast<uint32_t>(kv_lens[b]);
    q_sum += ql;
    const uint32_t cost =
        (((kl + kBlockN - 1) / kBlockN) + kUnitCost) & (0u - static_cast<uint32_t>(ql != 0));
    cost_sum += cost;
    longest = std::max(longest, cost);
    with_rows += static_cast<uint32_t>(ql != 0);
  }
  // Causal kv_len < q_len is allowed: its first q_len - kv_len queries see no key (tile_extent).
  const int64_t q_tokens = static_cast<int64_t>(q_sum);
  const int64_t request_cost = static_cast<int64_t>(cost_sum);
  const bool bad = (sign_bits >> 31) != 0 || max_q > cap.max_q_len || q_tokens > cap.max_q_tokens;
  if (bad) [[unlikely]] {
    MLA_RETURN_IF_ERROR(check_absorbed_requests(p, cap));
    return internal_error("absorbed plan: the fast pass refused a batch the request checks pass");
  }

  const int heads = p.num_heads;
  const int heads_log2 = std::has_single_bit(static_cast<unsigned>(heads))
                             ? std::countr_zero(static_cast<unsigned>(heads))
                             : -1;
  // The chooser's tile rows and key load path (the same for both cache dtypes).
  MLA_ASSIGN_OR_RETURN(const KernelChoice choice, choose_kernel(heads, std::max<int32_t>(max_q, 1),
                                                                p.page_size, DType::kBF16));
  // Batch-invariant plans: tiles of kMaxRows rows whatever the batch's longest q_len.
  const int rows_tile = cap.batch_invariant ? kMaxRows : choice.tile_rows;
  // Row tiles of a request: consecutive flat rows (token * H + head); the most any request has.
  const int max_tiles_per_req =
      static_cast<int>((int64_t{max_q} * heads + rows_tile - 1) / rows_tile);

  // Grouped schedule when a request has 2-4 row tiles (128 heads, or heads x q_len > 64): the
  // grid splits into one group of CTAs per row tile, all groups following the same key schedule,
  // so the row tiles of a request read the same keys at the same time and share them in L2
  // (otherwise 128-head decode reads the cache twice from DRAM: 2 x 1152 B per key).
  // Items cut across one group's CTAs: requests (grouped; a request's cost is that of its
  // longest row tile, the last one, which sees all kv_len keys) or row tiles (ungrouped).
  const int groups =
      max_tiles_per_req >= 2 && max_tiles_per_req <= 4 && num_ctas >= 2 * max_tiles_per_req
          ? max_tiles_per_req
          : 1;
  const int ctas_per_group = num_ctas / groups;
  const Batch in{q_lens, kv_lens, req_rows, bs, heads, heads_log2, rows_tile, causal};

  // Cost of all items: request_cost when every request is one item (grouped, or one row tile
  // each: that tile sees all kv_len keys), else the sum over row tiles.
  int64_t total_cost = request_cost;
  if (groups == 1 && max_tiles_per_req > 1 && heads % rows_tile == 0) {
    // Every row tile holds rows of one query (heads / rows_tile tiles per query), so a request
    // costs (heads / rows_tile) x sum over its queries q of (ceil(extent_q / 64) + kUnitCost),
    // extent_q = kv_len - q_len + q + 1 (causal, kv_len > 0; the sum over extents
    // kv_len - q_len + 1 .. kv_len is key_tile_sum(kv_len) - key_tile_sum(kv_len - q_len)) or
    // kv_len (otherwise). Same value as the loop below, without a step per row tile.
    const auto key_tile_sum = [](uint64_t m) {  // sum of ceil(x / 64) over x = 1 .. m
      const uint64_t k = m / kBlockN, rem = m % kBlockN;
      return kBlockN * k * (k + 1) / 2 + rem * (k + 1);
    };
    uint64_t sum = 0;
    for (int b = 0; b < bs; ++b) {
      const uint64_t ql = static_cast<uint32_t>(q_lens[b]), kl = static_cast<uint32_t>(kv_lens[b]);
      if (ql == 0) continue;
      const uint64_t keys = causal && kl > 0
                                ? key_tile_sum(kl) - key_tile_sum(kl > ql ? kl - ql : 0)
                                : ql * ((kl + kBlockN - 1) / kBlockN);
      sum += keys + ql * kUnitCost;
    }
    total_cost = static_cast<int64_t>(sum) * (heads / rows_tile);
  } else if (groups == 1 && max_tiles_per_req > 1) {
    // Row tile r's key tiles as in cut_tiles (the extent of the tile ending in query q).
    total_cost = 0;
    for (int b = 0; b < bs; ++b) {
      const int32_t ql = q_lens[b], kl = kv_lens[b];
      // No rows, no tiles; and kl - ql + 1 would overflow for kl = INT32_MAX (found by the
      // absorbed_plan fuzz target).
      if (ql == 0) continue;
      const int64_t rows = int64_t{ql} * heads;
      for (int64_t r = 0; r < rows; r += rows_tile) {
        const int64_t last_row = std::min<int64_t>(r + rows_tile, rows) - 1;
        const int32_t extent = tile_extent(causal, ql, kl, query_of(in, last_row));
        total_cost += (static_cast<uint32_t>(extent) + kBlockN - 1) / kBlockN + kUnitCost;
      }
    }
  }

  std::byte* const base = host_plan.data();
  PlanOut out{base + layout.units_offset, base + layout.combines_offset,
              base + layout.cta_begin_offset, layout.max_units};
  // 2. The cut, once for all groups, writing the first group's units. 3. The other groups.
  const bool decode = (max_q == 1 && groups > 1) || max_tiles_per_req <= 1;
  // Decode, or grouped: every request is one item whose cost is request_cost's term.
  const int64_t share = (total_cost + ctas_per_group - 1) / ctas_per_group;
  const bool longest_fits = int64_t{longest} * kWholeSlackDiv <= share * (kWholeSlackDiv + 1);
  const bool few = with_rows <= static_cast<uint32_t>(ctas_per_group);
  if (cap.batch_invariant) {
    cut_invariant(in, num_ctas, out);
  } else if (decode && few && longest_fits) {
    place_whole(in, out);
    if (groups > 1) copy_group(rows_tile, heads, ctas_per_group, out);  // groups == 2 (128 heads)
  } else if (groups > 1 && longest_fits &&
             deal_whole(in, decode ? 1 : groups, ctas_per_group, share + share / kWholeSlackDiv,
                        out)) {
    // Grouped requests dealt whole (the most loaded CTA within kWholeSlack of the share); for
    // decode group 0's units, then group 1's as their copy.
    if (decode && !out.overflow) copy_group(rows_tile, heads, ctas_per_group, out);
  } else if (decode) {
    cut_group<true>(in, groups > 1, ctas_per_group, total_cost, nullptr, out);
    if (groups > 1) copy_group(rows_tile, heads, ctas_per_group, out);  // groups == 2 (128 heads)
  } else if (groups > 1) {
    // Scratch reused across plans on this thread: after the first plans of the largest batch,
    // planning allocates nothing (a serving loop plans every step).
    thread_local PlanScratch scratch;
    std::vector<Piece>& pieces = scratch.pieces;
    if (pieces.size() < static_cast<std::size_t>(layout.max_units)) {
      pieces.resize(static_cast<std::size_t>(layout.max_units));
    }
    cut_group<false>(in, true, ctas_per_group, total_cost, pieces.data(), out);
    if (!out.overflow) replay_groups(in, groups, ctas_per_group, pieces.data(), out);
  } else {
    cut_tiles(in, ctas_per_group, total_cost, out);  // several row tiles per request
  }
  if (out.overflow) {
    return internal_error("absorbed plan overflow: more than {} units", layout.max_units);
  }
  if (out.next_partial > max_partials(cap, num_ctas)) {
    return internal_error("absorbed plan overflow: {} combines (max {}), {} partials (max {})",
                          out.num_combines, layout.max_combines, out.next_partial,
                          max_partials(cap, num_ctas));
  }
  for (int c = out.next_cta; c <= num_ctas; ++c) {
    store_i32(out.cta_begin + sizeof(int32_t) * static_cast<std::size_t>(c), out.num_units);
  }

  PlanHeader h{};
  h.num_ctas = num_ctas;
  h.rows_per_tile = rows_tile;
  h.num_units = out.num_units;
  h.num_combines = out.num_combines;
  h.num_heads = heads;
  h.page_size = p.page_size;
  h.causal = causal ? 1 : 0;
  h.num_partials = out.next_partial;
  h.cta_begin_offset = static_cast<int32_t>(layout.cta_begin_offset);
  h.units_offset = static_cast<int32_t>(layout.units_offset);
  h.combines_offset = static_cast<int32_t>(layout.combines_offset);
  h.tma_box_rows = choice.tma_box_rows;
  std::memcpy(base, &h, sizeof(h));
  // Bytes through the last combine written: the upload can stop there.
  return layout.combines_offset + sizeof(CombineUnit) * static_cast<std::size_t>(out.num_combines);
}

}  // namespace mla::cuda::absorbed
