// CUDA runtime errors as mla::Status for benchmark code (the library's own helper is private to
// src/kernels/cuda).
#pragma once

#include <cuda_runtime.h>

#include "mla/status.h"

// Returns kCudaError from the enclosing function when a CUDA runtime call fails.
#define MLA_BENCH_CUDA_RETURN_IF_ERROR(call)                                                    \
  do {                                                                                          \
    const cudaError_t mla_bench_err_ = (call);                                                  \
    if (mla_bench_err_ != cudaSuccess) {                                                        \
      return ::mla::make_status(::mla::StatusCode::kCudaError, "{} failed at {}:{}: {}", #call, \
                                __FILE__, __LINE__, cudaGetErrorString(mla_bench_err_));        \
    }                                                                                           \
  } while (0)
