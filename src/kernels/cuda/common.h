// Shared CUDA helpers: CUDA errors as mla::Status (kCudaError, with file, line and the call),
// the debug switch MLA_CUDA_SYNC_CHECK=1 (synchronise and check after every launch), and a
// cached device-property lookup. Host code only; kernels include their own headers.
#pragma once

#include <cuda_runtime.h>

#include <string_view>

#include "mla/status.h"

namespace mla::cuda {

// "cudaMalloc(&p, bytes) failed at src/kernels/cuda/runtime.cc:42: out of memory (2)"
Status cuda_status(cudaError_t err, std::string_view call, const char* file, int line);

// True when MLA_CUDA_SYNC_CHECK=1 (read once).
bool sync_check_enabled();

// After a launch: the launch error; with MLA_CUDA_SYNC_CHECK=1 also synchronises the stream and
// reports any asynchronous error, naming the kernel. Never synchronises otherwise.
Status check_launch(std::string_view kernel, cudaStream_t stream, const char* file, int line);

// Multiprocessor count of the current device (cached per device; 0 when there is none).
int sm_count(int device);
// Current device index, or -1 when the call fails.
int current_device();

}  // namespace mla::cuda

// Returns kCudaError from the enclosing function when a CUDA runtime call fails.
#define MLA_CUDA_RETURN_IF_ERROR(call)                                           \
  do {                                                                           \
    const cudaError_t mla_cuda_err_ = (call);                                    \
    if (mla_cuda_err_ != cudaSuccess) {                                          \
      return ::mla::cuda::cuda_status(mla_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

// Checks the last launch (and, with MLA_CUDA_SYNC_CHECK=1, the finished kernel).
#define MLA_CUDA_CHECK_LAUNCH(name, stream) \
  MLA_RETURN_IF_ERROR(::mla::cuda::check_launch((name), (stream), __FILE__, __LINE__))
