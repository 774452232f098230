// Internals shared by the absorbed planner's files (plan.cc: the default cuts and the layout;
// plan_deal.cc: the batch-invariant cut and whole requests dealt onto the CTAs): the unit cost
// model, the vector stores of units, the batch as the cuts read it and the plan's output cursor.
// Host code only.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/traits.h"

namespace mla::cuda::absorbed::plan_detail {

// Cost model in key-tile units: a unit also loads its query tile and writes its output, about
// the traffic of one key tile (64 rows x 576 bf16 either way), hence kUnitCost = 1.
inline constexpr int64_t kUnitCost = 1;
// A WorkUnit is three of these (48 bytes), a CombineUnit one: units are stored as three 16-byte
// vectors built in registers instead of twelve 4-byte fields.
typedef int32_t I32x4 __attribute__((vector_size(16)));
static_assert(sizeof(WorkUnit) == 3 * sizeof(I32x4) && sizeof(CombineUnit) == sizeof(I32x4));

typedef uint64_t U64x2 __attribute__((vector_size(16)));
static_assert(std::endian::native == std::endian::little, "quad() puts lane 0 in the low half");

inline void store4(std::byte* dst, I32x4 v) { std::memcpy(dst, &v, sizeof(v)); }
// Lanes {a, b} as one 64-bit value (a in the low half, as in memory on a little-endian host).
inline uint64_t pair(int32_t a, int32_t b) {
  return static_cast<uint32_t>(a) | uint64_t{static_cast<uint32_t>(b)} << 32;
}
// {lo.a, lo.b, hi.a, hi.b}: two 64-bit moves and one unpack, cheaper than four lane inserts.
inline I32x4 quad(uint64_t lo, uint64_t hi) { return reinterpret_cast<I32x4>(U64x2{lo, hi}); }
inline void store_i32(std::byte* dst, int32_t v) { std::memcpy(dst, &v, sizeof(v)); }

// The batch as the cut reads it.
struct Batch {
  const int32_t* q_lens;
  const int32_t* kv_lens;
  const int32_t* req_rows;
  int bs;
  int heads;
  int heads_log2;  // log2(heads) when heads is a power of two, else -1 (query_of divides)
  int rows_tile;
  bool causal;
};

// The query (token of its request) of row `row` of a request: rows are token * heads + head.
inline int32_t query_of(const Batch& in, int64_t row) {
  return static_cast<int32_t>(in.heads_log2 >= 0 ? row >> in.heads_log2 : row / in.heads);
}

// Keys the last row of a tile ending in query `last_query` sees: bottom-right causal
// (kv_len - q_len + last_query + 1, none when that is <= 0: kv_len < q_len leaves the first
// q_len - kv_len queries without a key) or kv_len.
inline int32_t tile_extent(bool causal, int32_t ql, int32_t kl, int32_t last_query) {
  if (!causal || kl == 0) return kl;
  return static_cast<int32_t>(std::max<int64_t>(int64_t{kl} - ql + last_query + 1, 0));
}

// One row tile of a request, as its units need it.
struct TileRef {
  I32x4 head;      // pool_row, q_row_begin, num_rows, row_in_req (the unit's first 16 bytes)
  I32x4 lens;      // q_len, kv_len, -, - (the unit's second 16 bytes, less the key range)
  int32_t extent;  // keys the tile's last row sees
  int32_t tiles;   // key tiles: ceil(extent / kBlockN)
};

// The row tile of request b starting at row r of the request (q_row: the request's first row).
inline TileRef tile_of(const Batch& in, int b, int64_t q_row, int64_t r) {
  const int32_t ql = in.q_lens[b], kl = in.kv_lens[b];
  const int64_t rows = int64_t{ql} * in.heads;
  const int32_t num_rows = static_cast<int32_t>(std::min<int64_t>(in.rows_tile, rows - r));
  const int32_t last_query = query_of(in, r + num_rows - 1);
  TileRef t;
  t.head =
      I32x4{in.req_rows[b], static_cast<int32_t>(q_row + r), num_rows, static_cast<int32_t>(r)};
  t.lens = I32x4{ql, kl, 0, 0};
  t.extent = tile_extent(in.causal, ql, kl, last_query);
  t.tiles = static_cast<int32_t>((static_cast<uint32_t>(t.extent) + kBlockN - 1) / kBlockN);
  return t;
}

// One unit of tile t over key tiles [begin, end), written as three 16-byte stores.
inline void store_unit(std::byte* u, const TileRef& t, int64_t begin, int64_t end,
                       int32_t partial) {
  const int64_t kv_begin = std::min<int64_t>(begin, t.tiles) * kBlockN;
  const int64_t kv_end = std::max<int64_t>(std::min<int64_t>(end * kBlockN, t.extent), kv_begin);
  I32x4 lens = t.lens;
  lens[2] = static_cast<int32_t>(kv_begin);
  lens[3] = static_cast<int32_t>(kv_end);
  store4(u, t.head);
  store4(u + 16, lens);
  store4(u + 32, I32x4{partial, 0, 0, 0});
}

// The plan's output regions and where the writing stands. The cut and the replay below are
// functions of their own that copy these counters into locals: kept in registers, they are not
// reloaded after every unit store (stores through std::byte* may alias anything in memory).
struct PlanOut {
  std::byte* units;
  std::byte* combines;
  std::byte* cta_begin;
  int64_t max_units;
  int32_t num_units = 0, num_combines = 0, next_partial = 0;
  int next_cta = 0;  // CTAs before next_cta have their begin written
  bool overflow = false;
};

// The batch-invariant cut (plan_deal.cc): every row tile in invariant_pieces (plan.h) pieces,
// dealt onto the CTAs longest first, a request's row tiles in step across the groups.
void cut_invariant(const Batch& in, int num_ctas, PlanOut& out);
// Grouped requests (groups of ctas_per_group CTAs, one per row tile) dealt whole onto the CTAs
// of a group, longest first, in rounds (plan_deal.cc); writes the units of the first
// `write_groups` groups (1 for decode, whose other group copies them: copy_group). Equal
// lengths give the units of the batch-invariant plan where every request is one piece. Returns
// false, writing nothing, when the most loaded CTA would carry more than max_load (the cost
// model above); true once the plan is written (or out.overflow set).
bool deal_whole(const Batch& in, int write_groups, int ctas_per_group, int64_t max_load,
                PlanOut& out);

}  // namespace mla::cuda::absorbed::plan_detail
