#include "kernels/cuda/absorbed/plan.h"

#include <algorithm>
#include <bit>
#include <new>
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
  thread_local PlanScratch scratch;
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
    max_tiles_per_req = std::max(max_tiles_per_req,
                                 static_cast<int>(s.tiles.size()) - s.first_tile[b]);
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
          ? max_tiles_per_req : 1;
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
  std::memcpy(base, &h, sizeof(h));
  std::memcpy(base + layout.cta_begin_offset, cta_begin.data(),
              sizeof(int32_t) * cta_begin.size());
  if (!combines.empty()) {  // memcpy from an empty vector's null data() is undefined
    std::memcpy(base + layout.combines_offset, combines.data(),
                sizeof(CombineUnit) * combines.size());
  }
  // Bytes through the last combine written: the upload can stop there.
  return layout.combines_offset + sizeof(CombineUnit) * combines.size();
}

}  // namespace mla::cuda::absorbed
