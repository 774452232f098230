// The position of a consumer (or producer) in a ring of kStages shared-memory stages guarded by
// mbarriers, as CUTLASS's PipelineState: the stage index and the parity of the barrier phase to
// wait for, both read from one step counter, so no kernel computes a phase at each wait and the
// state costs one register. A barrier that completes once per step (a hand-off between
// warpgroups) is PipelineState<1>: its stage is always 0 and its phase flips at every advance().
#pragma once

#include <cstdint>

namespace mla::cuda::sm90 {

template <int kStages>
struct PipelineState {
  static_assert(kStages >= 1 && (kStages & (kStages - 1)) == 0, "a power of two: shifts, no div");
  int count = 0;  // steps taken

  __device__ __forceinline__ int stage() const { return count & (kStages - 1); }
  // Parity passed to mbar_wait for this step's stage: its barrier completes once per lap.
  __device__ __forceinline__ uint32_t phase() const {
    return (static_cast<uint32_t>(count) / kStages) & 1u;
  }
  __device__ __forceinline__ void advance() { ++count; }
  // The state `steps` steps later (steps >= 0), e.g. the stage a load two tiles ahead goes to.
  __device__ __forceinline__ PipelineState ahead(int steps) const { return {count + steps}; }
};

}  // namespace mla::cuda::sm90
