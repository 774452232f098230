// Device kernels of the benchmarks. The random fill of benchmark inputs (gigabytes of latent
// cache would take minutes to draw on the host): normal(0, stddev) values from a counter-based
// hash, rounded to bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

cudaError_t fill_random_bf16(void* dst, int64_t n, uint64_t seed, float stddev,
                             cudaStream_t stream);
// The same, rounded to fp8 e4m3 (saturating): an fp8 latent cache.
cudaError_t fill_random_fp8(void* dst, int64_t n, uint64_t seed, float stddev, cudaStream_t stream);

// Sums `bytes` (a multiple of 16) as 64-bit integers with 16-byte loads over `blocks` blocks of
// 256 threads, one partial per block: the streaming-read ceiling (ceilings.h, stream_read.cu).
cudaError_t launch_stream_read(const void* src, int64_t bytes, long long* partial, int blocks,
                               cudaStream_t stream);

}  // namespace mla::cuda
