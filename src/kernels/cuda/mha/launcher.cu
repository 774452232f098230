#include "kernels/cuda/mha/kernel.cuh"
#include "kernels/cuda/mha/launcher.h"

namespace mla::cuda::mha {

cudaError_t launch_mha_forward(const MhaParams& params, int grid, cudaStream_t stream) {
  const cudaError_t err = cudaFuncSetAttribute(
      mha_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MhaTraits::kSmemBytes);
  if (err != cudaSuccess) return err;
  mha_fwd_kernel<<<grid, MhaTraits::kThreads, MhaTraits::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace mla::cuda::mha
