// cuBLAS for the prefill-side ops: one handle per device, created on first non-captured use and
// cached for the process, with an explicit workspace from the memory ledger so that GEMMs can be
// captured in CUDA graphs (cublasSetStream resets the workspace, so every lease sets both).
// The workspace is one buffer for every stream: the lease's lock orders the issue of the GEMMs,
// not their execution, so once a second stream uses the handle, each lease fences its GEMMs with
// an event and a lease on another stream first makes its stream wait for it (the first switch
// waits for the device once: the work before it had no fence). Leases on a capturing stream
// neither wait nor fence: ordering a captured graph's replays is the caller's.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string_view>
#include <utility>

#include "mla/status.h"
#include "mla/types.h"

namespace mla::cuda {

// Exclusive use of the device's handle, bound to `stream`, until destroyed. With a fence, the
// destructor records it on the stream (after the GEMMs enqueued under the lease) and sets
// *fenced.
class CublasLease {
 public:
  CublasLease(std::unique_lock<std::mutex> lock, cublasHandle_t handle, cudaStream_t stream,
              cudaEvent_t fence, bool* fenced)
      : lock_(std::move(lock)), handle_(handle), stream_(stream), fence_(fence), fenced_(fenced) {}
  CublasLease(CublasLease&& o) noexcept
      : lock_(std::move(o.lock_)),
        handle_(o.handle_),
        stream_(o.stream_),
        fence_(std::exchange(o.fence_, nullptr)),
        fenced_(o.fenced_) {}
  CublasLease& operator=(CublasLease&&) = delete;
  CublasLease(const CublasLease&) = delete;
  CublasLease& operator=(const CublasLease&) = delete;
  ~CublasLease() {
    if (fence_ == nullptr) return;
    // Before the lock is released (members go after this body). A failed record leaves no
    // fence; its error is cleared so that it is not reported as a later launch's.
    if (cudaEventRecord(fence_, stream_) == cudaSuccess) {
      *fenced_ = true;
    } else {
      *fenced_ = false;
      cudaGetLastError();
    }
  }
  cublasHandle_t handle() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  cublasHandle_t handle_;
  cudaStream_t stream_;
  cudaEvent_t fence_;
  bool* fenced_;
};

// The handle of `device` set to `stream` with the 32 MiB workspace. Creating the handle (first
// call per device) is refused during stream capture: run the op once eagerly first.
StatusOr<CublasLease> cublas_lease(Device device, cudaStream_t stream);

// "cublasGemmStridedBatchedEx(...) failed at file:line: CUBLAS_STATUS_... (n)"
Status cublas_status(cublasStatus_t st, std::string_view call, const char* file, int line);

}  // namespace mla::cuda

#define MLA_CUBLAS_RETURN_IF_ERROR(call)                                            \
  do {                                                                              \
    const cublasStatus_t mla_cublas_st_ = (call);                                   \
    if (mla_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                  \
      return ::mla::cuda::cublas_status(mla_cublas_st_, #call, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)
