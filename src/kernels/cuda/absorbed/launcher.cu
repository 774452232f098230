#include "kernels/cuda/absorbed/launcher.h"

#include <mutex>

#include "kernels/cuda/absorbed/sm90_kernel.cuh"

namespace mla::cuda::absorbed {

namespace {

// One kernel (a template argument, so each gets its own once-per-process shared-memory
// attribute) of kSmem dynamic shared-memory bytes.
template <auto kKernel, int kSmem>
LaunchResult launch_one(const char* name, const AbsorbedParams& params, int num_ctas,
                        cudaStream_t stream) {
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  });
  if (attr_err != cudaSuccess) return {attr_err, "cudaFuncSetAttribute(absorbed attention)"};
  kKernel<<<num_ctas, kThreads, kSmem, stream>>>(params);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return {e, name};
  return {};
}

LaunchResult launch_attention(const AbsorbedParams& params, int num_ctas, cudaStream_t stream) {
  if (params.kv_cache_fp8 != nullptr) {
    return launch_one<absorbed_attention_fp8_kernel, kSmemBytes>(
        "launch of absorbed_attention_fp8_kernel", params, num_ctas, stream);
  }
  switch (params.wgmma_tiles) {
    case 3:
      if (params.num_heads >= kMaxRows) {  // every plan has 64-row tiles
        if (params.diag == 1) {
          return launch_one<absorbed_attention_sm90_ws_kernel<1>, kSm90WsSmemBytes>(
              "launch of absorbed_attention_sm90_ws_kernel<1>", params, num_ctas, stream);
        }
        if (params.diag == 2) {
          return launch_one<absorbed_attention_sm90_ws_kernel<2>, kSm90WsSmemBytes>(
              "launch of absorbed_attention_sm90_ws_kernel<2>", params, num_ctas, stream);
        }
        return launch_one<absorbed_attention_sm90_ws_kernel<0>, kSm90WsSmemBytes>(
            "launch of absorbed_attention_sm90_ws_kernel<0>", params, num_ctas, stream);
      }
      [[fallthrough]];
    case 2:
      return launch_one<absorbed_attention_sm90_kernel, kSm90SmemBytes>(
          "launch of absorbed_attention_sm90_kernel", params, num_ctas, stream);
    default:
      return launch_one<absorbed_attention_kernel, kSmemBytes>(
          "launch of absorbed_attention_kernel", params, num_ctas, stream);
  }
}

}  // namespace

LaunchResult launch_absorbed(const AbsorbedParams& params, int num_ctas, cudaStream_t stream) {
  if (LaunchResult r = launch_attention(params, num_ctas, stream); r.error != cudaSuccess) {
    return r;
  }
  absorbed_combine_kernel<<<num_ctas, 256, 0, stream>>>(params);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return {e, "launch of absorbed_combine_kernel"};
  }
  return {};
}

}  // namespace mla::cuda::absorbed
