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

// Sizes depend only on the capacity and the grid.
PlanLayout plan_layout(const AttnCapacity& cap, int num_ctas);
int64_t max_partials(int num_ctas);
std::size_t partial_workspace_bytes(int num_ctas);

// Rows per tile for a batch: smallest of 16 / 32 / 64 holding heads x longest q_len.
int rows_per_tile(int num_heads, int max_q_len);

// Writes the plan into host_plan (at least plan_layout(cap, num_ctas).bytes); returns bytes used.
StatusOr<std::size_t> build_plan(const AbsorbedProblem& problem, const AttnCapacity& cap,
                                 int num_ctas, std::span<std::byte> host_plan);

}  // namespace mla::cuda::absorbed
