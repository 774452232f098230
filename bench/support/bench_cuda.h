// CUDA runtime errors as mla::Status for benchmark code (the library's own helper is private to
// src/kernels/cuda), and the event timing every GPU benchmark shares.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <vector>

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

namespace mla::cli {

// Median and minimum of `iters` runs of fn on `stream` (after `warmup` untimed ones), in
// microseconds, each timed by a pair of CUDA events (PERF.md's method).
template <typename Fn>
StatusOr<std::pair<double, double>> time_runs(cudaStream_t stream, int warmup, int iters, Fn fn) {
  for (int i = 0; i < warmup; ++i) MLA_RETURN_IF_ERROR(fn());
  std::vector<cudaEvent_t> ev(2 * static_cast<std::size_t>(iters));
  for (auto& e : ev) MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2 * i], stream));
    MLA_RETURN_IF_ERROR(fn());
    MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2 * i + 1], stream));
  }
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<float> ms(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return std::make_pair(1e3 * ms[ms.size() / 2], 1e3 * ms.front());
}

}  // namespace mla::cli
