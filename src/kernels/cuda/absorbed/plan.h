// Host planning of the absorbed kernel: a pure function of host data. Splits every
// (request, row tile) into key ranges so the fixed grid of num_ctas persistent blocks gets equal
// work, and lists the tiles whose partial results the combine kernel merges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

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
// row tile of a request with T row tiles sees are cut into
// p = clamp(ceil(n / (kInvariantSplitTiles x T)), 1, kInvariantMaxPieces) pieces of ceil(n / p)
// key tiles (the last one shorter), a split tile's partial slots are consecutive in key order
// and its combine merges them in that order. Which CTA runs a piece (the only thing the batch
// decides) does not change the arithmetic. The T: a request of T row tiles has T units per
// piece (on T groups of CTAs, plan_invariant.cc), so scaling the piece by T keeps the pieces
// per CTA and the partial bytes per key those of a one-tile request.
inline constexpr int kInvariantSplitTiles = 64;  // 4096 keys
inline constexpr int kInvariantMaxPieces = 4;
// The pieces (units) of a row tile that sees n key tiles, of a request with row_tiles row tiles,
// in a batch-invariant plan.
int invariant_pieces(int64_t key_tiles, int64_t row_tiles = 1);

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

// Rows per tile for a batch: smallest of 16 / 32 / 64 holding heads x longest q_len
// (batch-invariant plans: kMaxRows).
int rows_per_tile(int num_heads, int max_q_len);

// Writes the plan into host_plan (at least plan_layout(cap, num_ctas).bytes); returns bytes used.
StatusOr<std::size_t> build_plan(const AbsorbedProblem& problem, const AttnCapacity& cap,
                                 int num_ctas, std::span<std::byte> host_plan);

}  // namespace mla::cuda::absorbed
