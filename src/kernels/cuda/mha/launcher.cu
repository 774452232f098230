#include "kernels/cuda/mha/kernel.cuh"
#include "kernels/cuda/mha/launcher.h"
#include "kernels/cuda/mha/sm90_kernel.cuh"

namespace mla::cuda::mha {

cudaError_t launch_mha_forward(const MhaParams& params, int grid, cudaStream_t stream,
                               MhaKernel kernel) {
  if (kernel == MhaKernel::kSm90Wgmma) {
    const cudaError_t err = cudaFuncSetAttribute(sm90k::mha_fwd_sm90_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 MhaSm90Traits::kSmemBytes);
    if (err != cudaSuccess) return err;
    sm90k::
        mha_fwd_sm90_kernel<<<grid, MhaSm90Traits::kThreads, MhaSm90Traits::kSmemBytes, stream>>>(
            params);
    return cudaGetLastError();
  }
  const cudaError_t err = cudaFuncSetAttribute(
      mha_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MhaTraits::kSmemBytes);
  if (err != cudaSuccess) return err;
  mha_fwd_kernel<<<grid, MhaTraits::kThreads, MhaTraits::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace mla::cuda::mha
