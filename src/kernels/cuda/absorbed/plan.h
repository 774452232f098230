// Host planning of the absorbed kernel: a pure function of host data. Splits every
// (request, row tile) into key ranges so the fixed grid of num_ctas persistent blocks gets equal
// work, and lists the tiles whose partial results the combine kernel merges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cuda/absorbed/traits.h"
#include "mla/ops.h"
#include "mla/status.h"

namespace mla::cuda::absorbed {

struct PlanLayout {
  int num_ctas = 0;
  int64_t max_units = 0;
  int64_t max_combines = 0;
  std::size_t cta_begin_offset = 0;
  std::size_t units_offset = 0;
  std::size_t combines_offset = 0;
  std::size_t bytes = 0;
};

// Batch-invariant plans (AttnCapacity::batch_invariant): a request's units depend on that
// request alone. Row tiles of kMaxRows rows (not the batch's longest q_len); the n key tiles a
// row tile sees are cut into p equal pieces of ceil(n / p) key tiles (the last one shorter),
//   p = clamp(max(min(2, ceil(n / L)), ceil(n / M)), 1, kInvariantMaxPieces),
// L = kInvariantSplitTiles x T (kInvariantSplitTilesFewRows x T for a request of at most 16 rows)
// and M = kInvariantPieceTiles x T, T the request's row tiles: a row tile of more than L key tiles
// is split in two, and in pieces of at most M key tiles. A split tile's partial slots are
// consecutive in key order and its combine merges them in that order. Which CTA runs a piece
// (the only thing the batch decides) does not change the arithmetic. The T: a request of T row
// tiles has T units per piece (on T groups of CTAs, plan_deal.cc), so scaling by T keeps the
// pieces per CTA and the partial bytes per key those of a one-tile request.
// Why these numbers (docs/design-decisions.md): a piece's partial costs a write and a combine
// read of rows x 512 fp32, so long requests take pieces of up to 8192 keys (the partial traffic
// of 64 rows of four 4096-key pieces cost 10 % at 16384 keys); two pieces above L keep batches of
// varied lengths balanced (whole requests of 2048..4096 keys left the most loaded CTA 1.3x the
// mean); 16-row tiles, whose partials are a quarter of 64 rows', split from 2048 keys.
inline constexpr int kInvariantSplitTiles = 64;         // 4096 keys
inline constexpr int kInvariantSplitTilesFewRows = 32;  // 2048 keys, tiles of <= 16 rows
inline constexpr int kInvariantPieceTiles = 128;        // 8192 keys
inline constexpr int kInvariantMaxPieces = 4;
// The pieces (units) of a row tile that sees n key tiles, of a request with row_tiles row tiles
// of (at most) `rows` rows each, in a batch-invariant plan.
int invariant_pieces(int64_t key_tiles, int64_t row_tiles = 1, int64_t rows = kMaxRows);

// Sizes depend only on the capacity and the grid.
PlanLayout plan_layout(const AttnCapacity& cap, int num_ctas);
// Partial slots a plan may use (batch-invariant plans: kInvariantMaxPieces per row tile of the
// capacity), and the workspace that holds them (partial o, then partial lse).
int64_t max_partials(int num_ctas);
int64_t max_partials(const AttnCapacity& cap, int num_ctas);
std::size_t partial_workspace_bytes(int num_ctas);
std::size_t partial_workspace_bytes(const AttnCapacity& cap, int num_ctas);
// Partial slots a workspace of `bytes` holds (the inverse of partial_workspace_bytes).
int64_t partials_in_workspace(std::size_t bytes);

// Writes the plan into host_plan (at least plan_layout(cap, num_ctas).bytes); returns bytes used.
// Asks the chooser (choose.h) once, for the tile rows and the key load path it writes into the
// header; the op's plan() is this call alone, so the chooser runs once per plan.
StatusOr<std::size_t> build_plan(const AbsorbedProblem& problem, const AttnCapacity& cap,
                                 int num_ctas, std::span<std::byte> host_plan);

}  // namespace mla::cuda::absorbed
