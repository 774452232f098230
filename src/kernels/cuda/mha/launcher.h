// Launch of the MHA forward kernel (sm90_kernel.cuh, wgmma; persistent grid, the caller picks
// the CTA count).
// Returns the raw CUDA error so the .cu file needs no mla/status.h (fmt does not build under
// nvcc in C++20 mode); mha_op.cc turns it into a Status.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/mha/params.h"

namespace mla::cuda::mha {

// Raises the kernel's dynamic smem limit, launches `grid` CTAs and returns cudaGetLastError().
cudaError_t launch_mha_forward(const MhaParams& params, int grid, cudaStream_t stream);

}  // namespace mla::cuda::mha
