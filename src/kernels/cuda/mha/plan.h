// Host planner of the ragged MHA attention: a pure function of host data that writes the device
// plan (MhaPlanHeader + MhaTile[]) into caller bytes. No CUDA calls; testable without a GPU.
#pragma once

#include <cstddef>
#include <span>

#include "mla/ops.h"
#include "mla/status.h"

namespace mla::cuda::mha {

// Tiles a capacity can produce: every request adds at most one partial tile.
int64_t max_tiles(const AttnCapacity& cap);
std::size_t plan_bytes(const AttnCapacity& cap);

// Splits every request into 128-row query tiles, longest key range first (the persistent grid
// takes units in order, so the heavy causal tiles start first). Returns the bytes written.
StatusOr<std::size_t> build_plan(const MhaProblem& problem, const AttnCapacity& cap,
                                 std::span<std::byte> host_plan);

}  // namespace mla::cuda::mha
