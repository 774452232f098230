#include "kernels/cuda/absorbed/launcher.h"

#include <mutex>

#include "kernels/cuda/absorbed/sm90_kernel.cuh"

namespace mla::cuda::absorbed {

namespace {

// Version 2: 64-row tiles on wgmma (sm90_kernel.cuh); the other tiles run the mma.sync variants.
LaunchResult launch_sm90(const AbsorbedParams& params, int num_ctas, cudaStream_t stream) {
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(absorbed_attention_sm90_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSm90SmemBytes);
  });
  if (attr_err != cudaSuccess) {
    return {attr_err, "cudaFuncSetAttribute(absorbed_attention_sm90_kernel)"};
  }
  absorbed_attention_sm90_kernel<<<num_ctas, kThreads, kSm90SmemBytes, stream>>>(params);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return {e, "launch of absorbed_attention_sm90_kernel"};
  }
  return {};
}

}  // namespace

LaunchResult launch_absorbed(const AbsorbedParams& params, int num_ctas, cudaStream_t stream) {
  if (params.wgmma_tiles != 0) {
    if (LaunchResult r = launch_sm90(params, num_ctas, stream); r.error != cudaSuccess) return r;
    absorbed_combine_kernel<<<num_ctas, 256, 0, stream>>>(params);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
      return {e, "launch of absorbed_combine_kernel"};
    }
    return {};
  }
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(absorbed_attention_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (attr_err == cudaSuccess) {
      attr_err = cudaFuncSetAttribute(absorbed_attention_fp8_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    }
  });
  if (attr_err != cudaSuccess) return {attr_err, "cudaFuncSetAttribute(absorbed_attention_kernel)"};
  if (params.kv_cache_fp8 != nullptr) {
    absorbed_attention_fp8_kernel<<<num_ctas, kThreads, kSmemBytes, stream>>>(params);
  } else {
    absorbed_attention_kernel<<<num_ctas, kThreads, kSmemBytes, stream>>>(params);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return {e, "launch of absorbed_attention_kernel"};
  }
  absorbed_combine_kernel<<<num_ctas, 256, 0, stream>>>(params);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return {e, "launch of absorbed_combine_kernel"};
  }
  return {};
}

}  // namespace mla::cuda::absorbed
