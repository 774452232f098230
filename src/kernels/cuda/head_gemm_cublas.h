// cuBLAS for the prefill-side ops: one handle per device, created on first non-captured use and
// cached for the process, with an explicit workspace from the memory ledger so that GEMMs can be
// captured in CUDA graphs (cublasSetStream resets the workspace, so every lease sets both).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string_view>

#include "mla/status.h"
#include "mla/types.h"

namespace mla::cuda {

// Exclusive use of the device's handle, bound to `stream`, until destroyed.
class CublasLease {
 public:
  CublasLease(std::unique_lock<std::mutex> lock, cublasHandle_t handle)
      : lock_(std::move(lock)), handle_(handle) {}
  cublasHandle_t handle() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  cublasHandle_t handle_;
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
