#include "kernels/cuda/mha/launcher.h"
#include "kernels/cuda/mha/sm90_kernel.cuh"

namespace mla::cuda::mha {

cudaError_t launch_mha_forward(const MhaParams& params, int grid, cudaStream_t stream) {
  const cudaError_t err =
      cudaFuncSetAttribute(sm90k::mha_fwd_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           MhaTraits::kSmemBytes);
  if (err != cudaSuccess) return err;
  sm90k::mha_fwd_sm90_kernel<<<grid, MhaTraits::kThreads, MhaTraits::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace mla::cuda::mha
