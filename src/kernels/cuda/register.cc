// The "cuda" OpSet: the absorbed op from this folder, the prefill-side ops (MHA, merge, KV
// write, up-projection, head GEMM) from cuda-prefill's factories, and the cuda DeviceRuntime
// (runtime.cc): both registered with core when the library is loaded (mla links it whole). The set
// is registered even without a device: its ops then fail with the runtime's error, and
// device_available(Device::cuda()) tells callers to skip. The set declares the GPUs its kernels
// are built for (kCudaKernelCapabilities: sm_90a, compute capability 9.0), so every run() first
// refuses any other GPU with kUnsupported (OpRegistry::add, check_op_set_device): nothing is
// launched on a device without code for it.
#include <iterator>

#include "kernels/cuda/absorbed/op.h"
#include "mla/gpu_support.h"
#include "mla/ops.h"

#if __has_include("kernels/cuda/ops_factory.h")
#include "kernels/cuda/ops_factory.h"
#define MLA_HAVE_CUDA_OPS_FACTORY 1
#endif

namespace mla {

namespace {

void register_cuda_ops(OpRegistry& registry) {
  OpSet set;
  set.name = "cuda";
  set.device = DeviceType::kCuda;
  set.compute_capabilities.assign(std::begin(kCudaKernelCapabilities),
                                  std::end(kCudaKernelCapabilities));
  set.absorbed = cuda::make_cuda_absorbed_op();
#ifdef MLA_HAVE_CUDA_OPS_FACTORY
  set.mha = cuda::make_cuda_mha_op();
  set.merge = cuda::make_cuda_merge_op();
  set.kv_write = cuda::make_cuda_kv_write_op();
  set.up_project = cuda::make_cuda_up_project_op();
  set.head_gemm = cuda::make_cuda_head_gemm_op();
#endif
  registry.add(std::move(set));
}

[[maybe_unused]] const bool kRegistered =
    register_op_set_provider(DeviceType::kCuda, &register_cuda_ops);

}  // namespace

}  // namespace mla
