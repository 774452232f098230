#include "kernels/cuda/absorbed/plan.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/traits.h"
#include "mla/kv_pool.h"
#include "mla/model.h"

namespace mla::cuda::absorbed {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Cost model in key-tile units: a unit also loads its query tile and writes its output, about
// the traffic of one key tile (64 rows x 576 bf16 either way), hence kUnitCost = 1.
constexpr int64_t kUnitCost = 1;
// Never cut a piece shorter than 2 key tiles (128 keys): a split costs a partial write and a
// combine read of 64 x 512 fp32, the traffic of about two key tiles.
constexpr int64_t kMinPieceTiles = 2;

// A WorkUnit is three of these (48 bytes), a CombineUnit one: units are stored as three 16-byte
// vectors built in registers instead of twelve 4-byte fields.
typedef int32_t I32x4 __attribute__((vector_size(16)));
static_assert(sizeof(WorkUnit) == 3 * sizeof(I32x4) && sizeof(CombineUnit) == sizeof(I32x4));

inline void store4(std::byte* dst, I32x4 v) { std::memcpy(dst, &v, sizeof(v)); }
inline void store_i32(std::byte* dst, int32_t v) { std::memcpy(dst, &v, sizeof(v)); }

// ceil(a / d) for 0 <= a and 1 <= d <= kRecipMax without a hardware divide: a divide per CTA
// of the cut sits on the cut's dependency chain (tens of cycles each). floor(a / d) ==
// mulhi64(ceil(2^64 / d), a) exactly for a, d < 2^32 (Lemire, Kaser, Kurz 2019).
constexpr int kRecipMax = 1024;
__extension__ typedef unsigned __int128 U128;
struct Reciprocals {
  uint64_t m[kRecipMax + 1];
  constexpr Reciprocals() : m{} {
    for (int d = 2; d <= kRecipMax; ++d) m[d] = ~uint64_t{0} / static_cast<uint64_t>(d) + 1;
  }
};
constexpr Reciprocals kRecip{};

inline int64_t ceil_div(int64_t a, int64_t d) {
  const uint64_t n = static_cast<uint64_t>(a) + static_cast<uint64_t>(d) - 1;
  if (d >= 2 && d <= kRecipMax && n <= 0xffffffffu) [[likely]] {
    return static_cast<int64_t>(
        static_cast<uint64_t>((static_cast<U128>(kRecip.m[d]) * n) >> 64));
  }
  return (a + d - 1) / d;
}

// One row tile of a request, as its units need it.
struct TileRef {
  I32x4 head;      // pool_row, q_row_begin, num_rows, row_in_req (the unit's first 16 bytes)
  I32x4 lens;      // q_len, kv_len, -, - (the unit's second 16 bytes, less the key range)
  int32_t extent;  // keys the tile's last row sees
  int32_t tiles;   // key tiles: ceil(extent / kBlockN)
};

// Piece of a grouped item (a request), kept for the groups after the first.
struct Piece {
  int32_t request;
  int32_t q_row;        // first flat row of the request
  int32_t begin_tile, end_tile;
  int32_t cta;          // within the group
  int32_t item_pieces;  // pieces of the item on its first piece, else 0
};

// Reusable vectors of one planning thread (clear() keeps their capacity).
struct PlanScratch {
  std::vector<Piece> pieces;
};

// max(ceil(unassigned / CTAs left), kMinPieceTiles + kUnitCost): the share of CTA c of a group.
inline int64_t share_of(int64_t unassigned, int ctas_per_group, int c) {
  return std::max<int64_t>(ceil_div(unassigned, ctas_per_group - c), kMinPieceTiles + kUnitCost);
}

// Where the cut stands: the CTA being filled, its room, the work not yet assigned, and what has
// been written.
struct CutState {
  int cta = 0;
  int64_t room = 0;
  int64_t unassigned = 0;
  int32_t num_units = 0, num_combines = 0, next_partial = 0;
};

// The plan's output regions.
struct PlanOut {
  std::byte* units;
  std::byte* combines;
  std::byte* cta_begin;
};

// The cut for decode (every request 0 or 1 query, one item per request with a query: its first
// row tile of tile_rows rows, which sees all kv_len keys), the general cut in build_plan
// specialised: a piece [b, e) of key tiles covers keys [64 b, min(64 e, kv_len)), and a piece
// cut off before the last ends below kv_len. A function of its own so that the state lives in
// registers: the unit stores go through std::byte*, which may alias anything in memory.
// No bound checks: the cut writes at most one unit per item plus one per CTA it moves past
// (bs + ctas_per_group - 1 < max_batch + num_ctas <= max_units) and at most one combine per CTA
// moved past (< num_ctas = max_combines).
void cut_decode(const int32_t* q_lens, const int32_t* kv_lens, const int32_t* req_rows, int bs,
                int heads, int32_t tile_rows, int ctas_per_group, const PlanOut& out,
                CutState& state) {
  std::byte* const units_out = out.units;
  std::byte* const combines_out = out.combines;
  std::byte* const cta_begin_out = out.cta_begin;
  const int last_cta = ctas_per_group - 1;
  int cta = state.cta;
  int64_t room = state.room, unassigned = state.unassigned;
  int32_t num_units = state.num_units, num_combines = state.num_combines;
  int32_t next_partial = state.next_partial;
  const auto next_cta = [&]() __attribute__((always_inline)) {
    ++cta;
    store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(cta), num_units);
    room = share_of(unassigned, ctas_per_group, cta);
  };
  const auto store_unit = [&](I32x4 head, int32_t kl, int64_t kv_begin, int32_t kv_end,
                              int32_t partial) __attribute__((always_inline)) {
    std::byte* u = units_out + sizeof(WorkUnit) * static_cast<std::size_t>(num_units++);
    store4(u, head);
    store4(u + 16, I32x4{1, kl, static_cast<int32_t>(kv_begin), kv_end});
    store4(u + 32, I32x4{partial, 0, 0, 0});
  };
  int64_t q_row = 0;
  for (int b = 0; b < bs; ++b) {
    const int32_t ql = q_lens[b];
    if (ql == 0) continue;
    const int32_t kl = kv_lens[b];
    const int64_t n = (static_cast<uint32_t>(kl) + kBlockN - 1) / kBlockN;
    const I32x4 head{req_rows[b], static_cast<int32_t>(q_row), tile_rows, 0};
    q_row += heads;
    if (cta == last_cta || n + kUnitCost <= room + kMinPieceTiles) [[likely]] {
      store_unit(head, kl, 0, kl, -1);  // the whole request in this CTA
      room -= n + kUnitCost;
      unassigned -= n + kUnitCost;
    } else {
      int64_t begin = 0;
      const int32_t first_partial = next_partial;
      while (true) {
        const int64_t left = n - begin;
        if (cta == last_cta || left + kUnitCost <= room + kMinPieceTiles) {
          const bool split = begin > 0;
          store_unit(head, kl, begin * kBlockN, kl, split ? next_partial : -1);
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
          store_unit(head, kl, begin * kBlockN, static_cast<int32_t>((begin + take) * kBlockN),
                     next_partial++);
          begin += take;
          unassigned -= take;  // the item's unit cost leaves with its last piece
        }
        next_cta();
      }
    }
    if (room <= 0 && cta < last_cta) next_cta();
  }
  state.cta = cta;
  state.room = room;
  state.unassigned = unassigned;
  state.num_units = num_units;
  state.num_combines = num_combines;
  state.next_partial = next_partial;
}

}  // namespace

PlanLayout plan_layout(const AttnCapacity& cap, int num_ctas) {
  PlanLayout l;
  l.num_ctas = num_ctas;
  const int64_t heads = std::max(cap.num_heads, 1);
  const int64_t min_rows = std::min<int64_t>(kMaxRows, std::max<int64_t>(16, heads));
  const int64_t max_tiles = (std::max<int64_t>(cap.max_q_tokens, 0) * heads + min_rows - 1) /
                                min_rows + std::max(cap.max_batch, 0);
  l.max_units = max_tiles + num_ctas;
  l.max_combines = num_ctas;
  l.cta_begin_offset = align_up(sizeof(PlanHeader));
  l.units_offset = l.cta_begin_offset + align_up(sizeof(int32_t) * (num_ctas + 1));
  l.combines_offset = l.units_offset + align_up(sizeof(WorkUnit) * l.max_units);
  l.bytes = l.combines_offset + align_up(sizeof(CombineUnit) * l.max_combines);
  return l;
}

int64_t max_partials(int num_ctas) { return int64_t{kPartialsPerCta} * num_ctas; }

std::size_t partial_workspace_bytes(int num_ctas) {
  const std::size_t n = static_cast<std::size_t>(max_partials(num_ctas));
  return align_up(n * kMaxRows * kDimV * sizeof(float)) + align_up(n * kMaxRows * sizeof(float));
}

int rows_per_tile(int num_heads, int max_q_len) {
  const int64_t rows = int64_t{num_heads} * std::max(max_q_len, 1);
  if (rows <= 16) return 16;
  if (rows <= 32) return 32;
  return kMaxRows;
}

StatusOr<std::size_t> build_plan(const AbsorbedProblem& p, const AttnCapacity& cap, int num_ctas,
                                 std::span<std::byte> host_plan) {
  const int bs = static_cast<int>(p.req_rows.size());
  MLA_CHECK_ARG(num_ctas > 0, "num_ctas = {} must be positive", num_ctas);
  MLA_CHECK_ARG(is_supported_head_count(p.num_heads), "num_heads = {} (supported: 16, 32, 64, 128)",
                p.num_heads);
  MLA_CHECK_ARG(cap.num_heads == 0 || cap.num_heads == p.num_heads,
                "num_heads = {} differs from the capacity's num_heads = {}", p.num_heads,
                cap.num_heads);
  MLA_CHECK_ARG(is_supported_page_size(p.page_size), "page_size = {} (supported: 1, 16, 32, 64, 128)",
                p.page_size);
  MLA_CHECK_ARG(p.q_lens.size() == p.req_rows.size() && p.kv_lens.size() == p.req_rows.size(),
                "req_rows / q_lens / kv_lens sizes differ: {} / {} / {}", p.req_rows.size(),
                p.q_lens.size(), p.kv_lens.size());
  MLA_CHECK_ARG(bs <= cap.max_batch, "batch size {} exceeds capacity max_batch = {}", bs,
                cap.max_batch);
  const PlanLayout layout = plan_layout(cap, num_ctas);
  MLA_CHECK_ARG(host_plan.size() >= layout.bytes, "host_plan holds {} bytes, the plan needs {}",
                host_plan.size(), layout.bytes);

  const int32_t* const q_lens = p.q_lens.data();
  const int32_t* const kv_lens = p.kv_lens.data();
  const int32_t* const req_rows = p.req_rows.data();
  const bool causal = p.causal;

  // 1. Branch-free passes the compiler vectorizes: the checks, the longest q_len, the query
  // tokens, and the cost of every request as one item (its key tiles + kUnitCost), what the cut
  // uses unless a request splits into row tiles cut separately. Sums in unsigned arithmetic
  // are exact once the checks pass (every length >= 0); a malformed request sends us to the
  // per-request checks, in their order, for the message.
  uint32_t sign_bits = 0, below_q = 0;
  int32_t max_q = 0;
  for (int b = 0; b < bs; ++b) {
    const int32_t ql = q_lens[b], kl = kv_lens[b];
    sign_bits |= static_cast<uint32_t>(ql | kl | req_rows[b]);
    below_q |= static_cast<uint32_t>((kl < ql) & (kl != 0));
    max_q = std::max(max_q, ql);
  }
  uint64_t q_sum = 0, cost_sum = 0;
  for (int b = 0; b < bs; ++b) {
    const uint32_t ql = static_cast<uint32_t>(q_lens[b]), kl = static_cast<uint32_t>(kv_lens[b]);
    q_sum += ql;
    cost_sum += (((kl + kBlockN - 1) / kBlockN) + kUnitCost) & (0u - static_cast<uint32_t>(ql != 0));
  }
  const bool bad = (sign_bits >> 31) != 0 || (causal && below_q != 0);
  const int64_t q_tokens = static_cast<int64_t>(q_sum);
  const int64_t request_cost = static_cast<int64_t>(cost_sum);
  if (bad) [[unlikely]] {
    for (int b = 0; b < bs; ++b) {
      const int32_t ql = q_lens[b], kl = kv_lens[b];
      MLA_CHECK_ARG(ql >= 0 && kl >= 0, "q_lens[{}] = {}, kv_lens[{}] = {} must be >= 0", b, ql, b,
                    kl);
      MLA_CHECK_ARG(!causal || kl == 0 || kl >= ql,
                    "causal: kv_lens[{}] = {} is below q_lens[{}] = {}", b, kl, b, ql);
      MLA_CHECK_ARG(req_rows[b] >= 0, "req_rows[{}] = {} must be >= 0", b, req_rows[b]);
    }
  }
  MLA_CHECK_ARG(q_tokens <= cap.max_q_tokens, "sum(q_lens) = {} exceeds capacity max_q_tokens = {}",
                q_tokens, cap.max_q_tokens);

  const int heads = p.num_heads;
  const int heads_log2 = std::countr_zero(static_cast<unsigned>(heads));  // a power of two
  const int rows_tile = rows_per_tile(heads, std::max<int32_t>(max_q, 1));
  // Row tiles of a request: consecutive flat rows (token * H + head); the most any request has.
  const int max_tiles_per_req =
      static_cast<int>((int64_t{max_q} * heads + rows_tile - 1) / rows_tile);

  // Grouped schedule when a request has 2-4 row tiles (128 heads, or heads x q_len > 64): the
  // grid splits into one group of CTAs per row tile, all groups following the same key schedule,
  // so the row tiles of a request read the same keys at the same time and share them in L2
  // (otherwise 128-head decode reads the cache twice from DRAM: 2 x 1152 B per key).
  // Items cut across one group's CTAs: requests (grouped; a request's cost is that of its
  // longest row tile, the last one) or row tiles (ungrouped).
  const int groups =
      max_tiles_per_req >= 2 && max_tiles_per_req <= 4 && num_ctas >= 2 * max_tiles_per_req
          ? max_tiles_per_req : 1;
  const int ctas_per_group = num_ctas / groups;

  // The row tile of request b starting at row r of the request.
  const auto tile_of = [&](int b, int64_t q_row, int64_t r) {
    const int32_t ql = q_lens[b], kl = kv_lens[b];
    const int64_t rows = int64_t{ql} * heads;
    const int32_t num_rows = static_cast<int32_t>(std::min<int64_t>(rows_tile, rows - r));
    const int32_t last_query = static_cast<int32_t>((r + num_rows - 1) >> heads_log2);
    TileRef t;
    t.head = I32x4{req_rows[b], static_cast<int32_t>(q_row + r), num_rows, static_cast<int32_t>(r)};
    t.lens = I32x4{ql, kl, 0, 0};
    t.extent = causal && kl > 0 ? kl - ql + last_query + 1 : kl;
    t.tiles = static_cast<int32_t>((static_cast<uint32_t>(t.extent) + kBlockN - 1) / kBlockN);
    return t;
  };

  // Cost of all items. Requests of one row tile: that tile sees all kv_len keys (its last row is
  // the last query), so request_cost is exact; ungrouped requests of several row tiles are cut
  // tile by tile.
  int64_t total_cost = request_cost;
  if (groups == 1 && max_tiles_per_req > 1) {
    total_cost = 0;
    int64_t q_row = 0;
    for (int b = 0; b < bs; ++b) {
      const int64_t rows = int64_t{q_lens[b]} * heads;
      for (int64_t r = 0; r < rows; r += rows_tile) total_cost += tile_of(b, q_row, r).tiles + kUnitCost;
      q_row += rows;
    }
  }

  std::byte* const base = host_plan.data();
  std::byte* const units_out = base + layout.units_offset;
  std::byte* const combines_out = base + layout.combines_offset;
  std::byte* const cta_begin_out = base + layout.cta_begin_offset;
  const int64_t max_units = layout.max_units;
  const int64_t max_combines = layout.max_combines;
  int32_t num_units = 0, num_combines = 0, next_partial = 0;

  // One unit of tile t over key tiles [begin, end), written in place as three 16-byte stores.
  // Bounds-checked as it is written (the layout's max_units bounds them; exceeding it is a bug).
  bool overflow = false;
  const auto emit = [&](const TileRef& t, int64_t begin, int64_t end, int32_t partial) {
    if (num_units >= max_units) [[unlikely]] {
      overflow = true;
      return;
    }
    const int64_t kv_begin = std::min<int64_t>(begin, t.tiles) * kBlockN;
    const int64_t kv_end = std::max<int64_t>(std::min<int64_t>(end * kBlockN, t.extent), kv_begin);
    I32x4 lens = t.lens;
    lens[2] = static_cast<int32_t>(kv_begin);
    lens[3] = static_cast<int32_t>(kv_end);
    std::byte* u = units_out + sizeof(WorkUnit) * static_cast<std::size_t>(num_units++);
    store4(u, t.head);
    store4(u + 16, lens);
    store4(u + 32, I32x4{partial, 0, 0, 0});
  };
  // A combine of tile t over partial slots [first, first + count).
  const auto emit_combine = [&](const TileRef& t, int32_t first, int32_t count) {
    if (num_combines >= max_combines) [[unlikely]] {
      overflow = true;
      return;
    }
    store4(combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(num_combines++),
           I32x4{t.head[1], t.head[2], first, count});
  };

  // 2. Contiguous cutting of the flattened (item, key tile) list into equal shares, once for
  // all groups, writing the first group's units as the pieces come (CTA-major, no sort). Each
  // CTA's share is re-derived from the work still unassigned, so pieces left unused by the
  // no-tiny-piece rule spread over the remaining CTAs instead of piling up on the last one.
  // A tile cut into several pieces writes partial slots that one combine merges.
  int64_t unassigned = total_cost;
  const auto share = [&](int c) {
    return std::max<int64_t>(ceil_div(unassigned, ctas_per_group - c), kMinPieceTiles + kUnitCost);
  };
  int cta = 0;
  int64_t room = share(0);
  store_i32(cta_begin_out, 0);
  const int last_cta = ctas_per_group - 1;
  const auto next_cta_of_cut = [&] {
    ++cta;
    store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(cta), num_units);
    room = share(cta);
  };
  // Groups after the first replay the first group's pieces with their own row tiles: directly
  // from its units when every request has one query (all row tiles alike), else from a list.
  const bool replay_units = groups > 1 && max_q == 1;
  const bool keep_pieces = groups > 1 && !replay_units;
  thread_local PlanScratch scratch;
  std::vector<Piece>& pieces = scratch.pieces;
  pieces.clear();

  // Cuts item (tile t, n key tiles): its pieces, in CTA order.
  const auto cut = [&](const TileRef& t, int64_t n, int b, int64_t q_row) {
    int64_t begin = 0;
    int32_t first_partial = 0;
    const std::size_t first_piece = pieces.size();
    const auto piece = [&](int64_t end, int32_t partial) {
      emit(t, begin, end, partial);
      if (keep_pieces) {
        pieces.push_back({b, static_cast<int32_t>(q_row), static_cast<int32_t>(begin),
                          static_cast<int32_t>(end), cta, 0});
      }
    };
    while (true) {
      const int64_t left = n - begin;
      // Slack of kMinPieceTiles: overfill a little rather than leave a tiny piece behind.
      if (cta == last_cta || left + kUnitCost <= room + kMinPieceTiles) {
        const bool split = begin > 0;
        piece(n, split ? next_partial++ : -1);
        if (split) emit_combine(t, first_partial, next_partial - first_partial);
        room -= left + kUnitCost;
        unassigned -= left + kUnitCost;
        break;
      }
      const int64_t take = room - kUnitCost;
      if (take >= kMinPieceTiles && left - take >= kMinPieceTiles) {
        if (begin == 0) first_partial = next_partial;
        piece(begin + take, next_partial++);
        begin += take;
        unassigned -= take;  // the item's unit cost leaves with its last piece
      }
      next_cta_of_cut();
    }
    if (keep_pieces) pieces[first_piece].item_pieces = static_cast<int32_t>(pieces.size() - first_piece);
    if (room <= 0 && cta < last_cta) next_cta_of_cut();
  };

  if (max_q == 1 && (groups > 1 || max_tiles_per_req <= 1)) {
    // Decode: every request 0 or 1 query, one item per request with a query (grouped at 128
    // heads: its first row tile; group 1 follows in step 3).
    CutState st;
    st.cta = cta;
    st.room = room;
    st.unassigned = unassigned;
    cut_decode(q_lens, kv_lens, req_rows, bs, heads, std::min(rows_tile, heads), ctas_per_group,
               PlanOut{units_out, combines_out, cta_begin_out}, st);
    cta = st.cta;
    room = st.room;
    unassigned = st.unassigned;
    num_units = st.num_units;
    num_combines = st.num_combines;
    next_partial = st.next_partial;
  } else if (groups > 1 || max_tiles_per_req <= 1) {
    // One item per request with rows: its first row tile (grouped: the others follow in step 3)
    // costs the key tiles of its last one, which sees all kv_len keys. Most items fit whole in
    // the CTA being filled: that case is written here, the rest are cut piece by piece.
    int64_t q_row = 0;
    for (int b = 0; b < bs; ++b) {
      const int32_t ql = q_lens[b], kl = kv_lens[b];
      const int64_t rows = int64_t{ql} * heads;
      if (rows > 0) {
        const int64_t n = (static_cast<uint32_t>(kl) + kBlockN - 1) / kBlockN;
        const TileRef t = tile_of(b, q_row, 0);
        if (cta == last_cta || n + kUnitCost <= room + kMinPieceTiles) [[likely]] {
          if (num_units >= max_units) [[unlikely]] {
            overflow = true;
            break;
          }
          std::byte* u = units_out + sizeof(WorkUnit) * static_cast<std::size_t>(num_units++);
          store4(u, t.head);
          store4(u + 16, I32x4{ql, kl, 0, t.extent});  // keys [0, extent): the whole tile
          store4(u + 32, I32x4{-1, 0, 0, 0});
          if (keep_pieces) {
            pieces.push_back({b, static_cast<int32_t>(q_row), 0, static_cast<int32_t>(n), cta, 1});
          }
          room -= n + kUnitCost;
          unassigned -= n + kUnitCost;
          if (room <= 0 && cta < last_cta) next_cta_of_cut();
        } else {
          cut(t, n, b, q_row);
        }
      }
      q_row += rows;
    }
  } else {
    int64_t q_row = 0;
    for (int b = 0; b < bs; ++b) {
      const int64_t rows = int64_t{q_lens[b]} * heads;
      for (int64_t r = 0; r < rows; r += rows_tile) {
        const TileRef t = tile_of(b, q_row, r);
        cut(t, t.tiles, b, q_row);
      }
      q_row += rows;
    }
  }
  // CTAs of the first group after the last one cut begin at the end of its units.
  int next_cta = cta + 1;  // CTAs before next_cta have their begin written
  const auto begin_ctas_through = [&](int owner) {
    for (; next_cta <= owner; ++next_cta) {
      store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(next_cta), num_units);
    }
  };

  // 3. The other groups: group g owns CTAs [g * ctas_per_group, ...).
  if (replay_units) {
    // Every request has one query, so max_tiles_per_req == groups == 2 (128 heads), and both row
    // tiles of a request see the same keys: group 1's units, combines and CTA begins are group
    // 0's moved by one row tile (rows_tile rows; partial slots after group 0's).
    const int32_t units0 = num_units, combines0 = num_combines, partials0 = next_partial;
    begin_ctas_through(ctas_per_group - 1);
    if (int64_t{units0} * groups > max_units) [[unlikely]] {
      num_units = static_cast<int32_t>(max_units);
      overflow = true;
    } else if (int64_t{combines0} * groups > max_combines) [[unlikely]] {
      overflow = true;
    } else {
      const I32x4 row_step{0, rows_tile, 0, rows_tile};
      for (int32_t i = 0; i < units0; ++i) {
        const std::byte* src = units_out + sizeof(WorkUnit) * static_cast<std::size_t>(i);
        std::byte* dst = units_out + sizeof(WorkUnit) * static_cast<std::size_t>(i + units0);
        I32x4 head, lens, tail;
        std::memcpy(&head, src, 16);
        std::memcpy(&lens, src + 16, 16);
        std::memcpy(&tail, src + 32, 16);
        tail[0] += tail[0] >= 0 ? partials0 : 0;
        store4(dst, head + row_step);
        store4(dst + 16, lens);
        store4(dst + 32, tail);
      }
      const I32x4 combine_step{rows_tile, 0, partials0, 0};
      for (int32_t i = 0; i < combines0; ++i) {
        const std::byte* src = combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(i);
        I32x4 c;
        std::memcpy(&c, src, 16);
        store4(combines_out + sizeof(CombineUnit) * static_cast<std::size_t>(i + combines0),
               c + combine_step);
      }
      for (int c = 0; c < ctas_per_group; ++c) {
        int32_t begin;
        std::memcpy(&begin, cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(c), 4);
        store_i32(cta_begin_out + sizeof(int32_t) * static_cast<std::size_t>(ctas_per_group + c),
                  begin + units0);
      }
      next_cta = 2 * ctas_per_group;
      num_units = 2 * units0;
      num_combines = 2 * combines0;
      next_partial = 2 * partials0;
    }
  } else if (keep_pieces) {
    const std::size_t num_pieces = pieces.size();
    for (int g = 1; g < groups && !overflow; ++g) {
      const int cta0 = g * ctas_per_group;
      const int64_t r = int64_t{g} * rows_tile;
      for (std::size_t k = 0; k < num_pieces;) {
        const Piece first = pieces[k];
        const std::size_t end = k + static_cast<std::size_t>(first.item_pieces);
        if (int64_t{q_lens[first.request]} * heads > r) {  // the request has row tile g
          const TileRef t = tile_of(first.request, first.q_row, r);
          const bool split = first.item_pieces > 1;
          if (split) emit_combine(t, next_partial, first.item_pieces);
          for (; k < end; ++k) {
            const Piece& pc = pieces[k];
            begin_ctas_through(cta0 + pc.cta);
            emit(t, pc.begin_tile, pc.end_tile, split ? next_partial++ : -1);
          }
        }
        k = end;
      }
    }
  }
  if (overflow && num_units >= max_units) {
    return internal_error("absorbed plan overflow: more than {} units", layout.max_units);
  }
  if (overflow || next_partial > max_partials(num_ctas)) {
    return internal_error("absorbed plan overflow: {} combines (max {}), {} partials (max {})",
                          num_combines, layout.max_combines, next_partial,
                          max_partials(num_ctas));
  }
  begin_ctas_through(num_ctas);

  PlanHeader h{};
  h.num_ctas = num_ctas;
  h.rows_per_tile = rows_tile;
  h.num_units = num_units;
  h.num_combines = num_combines;
  h.num_heads = heads;
  h.page_size = p.page_size;
  h.causal = causal ? 1 : 0;
  h.num_partials = next_partial;
  h.cta_begin_offset = static_cast<int32_t>(layout.cta_begin_offset);
  h.units_offset = static_cast<int32_t>(layout.units_offset);
  h.combines_offset = static_cast<int32_t>(layout.combines_offset);
  std::memcpy(base, &h, sizeof(h));
  // Bytes through the last combine written: the upload can stop there.
  return layout.combines_offset + sizeof(CombineUnit) * static_cast<std::size_t>(num_combines);
}

}  // namespace mla::cuda::absorbed
