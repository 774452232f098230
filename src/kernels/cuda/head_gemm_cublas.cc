#include "kernels/cuda/head_gemm_cublas.h"

#include <array>
#include <cstdlib>
#include <memory>

#include "kernels/cuda/common.h"
#include "mla/memory.h"

namespace mla::cuda {
namespace {

// 4 MiB by default, MLA_CUBLAS_WORKSPACE_BYTES overrides (plain bytes). cuBLAS recommends 32 MiB
// on Hopper, but the device budget outside the KV pool is 64 MiB in all (issue 4) and the
// split-KV partials alone take 34.7 MB on 132 SMs; the GEMMs here ([N, 512] x [512, H*128],
// per-head projections) are large enough that split-K workspace buys little.
constexpr std::size_t kDefaultCublasWorkspaceBytes = std::size_t{4} << 20;

std::size_t cublas_workspace_bytes() {
  if (const char* env = std::getenv("MLA_CUBLAS_WORKSPACE_BYTES")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end != env && *end == '\0') return static_cast<std::size_t>(v);
  }
  return kDefaultCublasWorkspaceBytes;
}
constexpr int kMaxDevices = 16;

struct HandleSlot {
  std::mutex mu;
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  // Streams (head_gemm_cublas.h): the last lease's stream; multi once a second stream came;
  // then the fence event, and whether it holds a record.
  cudaStream_t last_stream = nullptr;
  bool used = false, multi = false, fenced = false;
  cudaEvent_t fence = nullptr;
};

std::array<HandleSlot, kMaxDevices>& slots() {
  // Leaked on purpose: handles must outlive every static that might still run a GEMM at exit.
  static auto* s = new std::array<HandleSlot, kMaxDevices>();
  return *s;
}

}  // namespace

Status cublas_status(cublasStatus_t st, std::string_view call, const char* file, int line) {
  return make_status(StatusCode::kCudaError, "{} failed at {}:{}: {} ({})", call, file, line,
                     cublasGetStatusString(st), static_cast<int>(st));
}

StatusOr<CublasLease> cublas_lease(Device device, cudaStream_t stream) {
  MLA_CHECK_ARG(device.is_cuda() && device.index >= 0 && device.index < kMaxDevices,
                "cublas: device {} is not a cuda device below index {}", device.to_string(),
                kMaxDevices);
  HandleSlot& slot = slots()[device.index];
  std::unique_lock<std::mutex> lock(slot.mu);
  if (slot.handle == nullptr) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MLA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    MLA_CHECK_CODE(StatusCode::kCudaError, capture == cudaStreamCaptureStatusNone,
                   "cublas: the handle of {} would be created during graph capture; run the op "
                   "once before capturing",
                   device.to_string());
    MLA_ASSIGN_OR_RETURN(slot.workspace,
                         DeviceBuffer::allocate(device, cublas_workspace_bytes(),
                                                "cuda.cublas_workspace", "cuda_ops", false));
    cublasHandle_t handle = nullptr;
    MLA_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
    slot.handle = handle;
  }
  // One workspace for every stream: order the streams that use it.
  cudaEvent_t fence = nullptr;
  if (slot.used && (slot.multi || stream != slot.last_stream)) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MLA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) {
      if (!slot.multi) {
        // The first second stream: the GEMMs so far have no fence (their stream may even be
        // gone), so wait for the device once; from now on every lease fences.
        MLA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        MLA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.fence, cudaEventDisableTiming));
        slot.multi = true;
        slot.fenced = false;
      } else if (slot.fenced && stream != slot.last_stream) {
        MLA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, slot.fence, 0));
      }
      fence = slot.fence;
    }
  }
  slot.used = true;
  slot.last_stream = stream;
  MLA_CUBLAS_RETURN_IF_ERROR(cublasSetStream(slot.handle, stream));
  MLA_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(slot.handle, slot.workspace.data(), slot.workspace.bytes()));
  return CublasLease(std::move(lock), slot.handle, stream, fence, &slot.fenced);
}

}  // namespace mla::cuda
