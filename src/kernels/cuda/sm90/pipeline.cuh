// The position of a consumer (or producer) in a ring of kStages shared-memory stages guarded by
// mbarriers, as CUTLASS's PipelineState: the stage index and the parity of the barrier phase to
// wait for, advanced together, so no kernel computes a phase from a tile counter at each wait.
// A ring of one stage (a barrier that completes once per step) is PipelineState<1>: its stage is
// always 0 and its phase flips at every advance().
#pragma once

#include <cstdint>

namespace mla::cuda::sm90 {

template <int kStages>
struct PipelineState {
  static_assert(kStages >= 1);
  int stage = 0;
  uint32_t phase = 0;  // parity passed to mbar_wait for the current stage

  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace mla::cuda::sm90
