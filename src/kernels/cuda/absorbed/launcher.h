// Launches of the absorbed attention and combine kernels (grid from the plan's capacity only).
// No mla/status.h here: nvcc (C++20) cannot compile fmt's consteval format strings, so the
// launcher reports a cudaError_t and the host op turns it into a Status.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/absorbed/params.h"

namespace mla::cuda::absorbed {

struct LaunchResult {
  cudaError_t error = cudaSuccess;
  const char* what = "";  // the call that failed
};

LaunchResult launch_absorbed(const AbsorbedParams& params, int num_ctas, cudaStream_t stream);

}  // namespace mla::cuda::absorbed
