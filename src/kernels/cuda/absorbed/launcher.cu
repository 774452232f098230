#include <mutex>

#include "kernels/cuda/absorbed/launcher.h"
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
  switch (static_cast<AbsorbedKernel>(params.kernel)) {
    case AbsorbedKernel::kSm90:
      return launch_one<absorbed_attention_sm90_kernel<false>, kSm90SmemBytes>(
          "launch of absorbed_attention_sm90_kernel<false>", params, num_ctas, stream);
    case AbsorbedKernel::kSm90Fp8:
      return launch_one<absorbed_attention_sm90_kernel<true>, kSm90SmemBytes>(
          "launch of absorbed_attention_sm90_kernel<true>", params, num_ctas, stream);
  }
  return {cudaErrorInvalidValue, "absorbed attention: unknown kernel"};
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
