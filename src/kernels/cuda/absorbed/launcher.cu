#include <atomic>
#include <mutex>

#include "kernels/cuda/absorbed/launcher.h"
#include "kernels/cuda/absorbed/sm90_kernel.cuh"

namespace mla::cuda::absorbed {

namespace {

// The launch configuration of one kernel of kSmem dynamic shared-memory bytes, in clusters of
// two CTAs when `pairs`.
cudaLaunchConfig_t launch_config(int num_ctas, int smem, cudaStream_t stream, bool pairs,
                                 cudaLaunchAttribute& cluster) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(num_ctas));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
  cfg.stream = stream;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cfg.attrs = &cluster;
  cfg.numAttrs = pairs ? 1 : 0;
  return cfg;
}

// One kernel (a template argument, so each gets its own once-per-process attributes) of kSmem
// dynamic shared-memory bytes. params.cluster_pairs asks for clusters of two CTAs; they are
// used when the grid is even and the device runs every pair at once (all CTAs resident, as a
// persistent grid needs: checked once per process and grid size), else the kernel runs
// unclustered (params.cluster_pairs cleared: the kernel then pairs nothing).
template <auto kKernel, int kSmem>
LaunchResult launch_one(const char* name, AbsorbedParams params, int num_ctas,
                        cudaStream_t stream) {
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  });
  if (attr_err != cudaSuccess) return {attr_err, "cudaFuncSetAttribute(absorbed attention)"};
  if (params.cluster_pairs != 0) {
    // 2 * num_ctas + (pairs fit) for the last grid asked about; -1 before the first.
    static std::atomic<int> known{-1};
    int k = known.load(std::memory_order_relaxed);
    if (k < 0 || k / 2 != num_ctas) {
      cudaLaunchAttribute cluster{};
      const cudaLaunchConfig_t cfg = launch_config(num_ctas, kSmem, nullptr, true, cluster);
      int clusters = 0;
      const bool fits = num_ctas % 2 == 0 &&
                        cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg) == cudaSuccess &&
                        2 * clusters >= num_ctas;
      (void)cudaGetLastError();  // a refused query leaves no error behind
      k = 2 * num_ctas + (fits ? 1 : 0);
      known.store(k, std::memory_order_relaxed);
    }
    if ((k & 1) == 0) params.cluster_pairs = 0;
  }
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t cfg =
      launch_config(num_ctas, kSmem, stream, params.cluster_pairs != 0, cluster);
  if (cudaError_t e = cudaLaunchKernelEx(&cfg, kKernel, params); e != cudaSuccess) {
    return {e, name};
  }
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
