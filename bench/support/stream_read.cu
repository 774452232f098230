// The streaming-read kernel of the same-run ceilings (ceilings.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "fill.h"

namespace mla::cuda {
namespace {

// Sums the buffer as 64-bit integers (16-byte loads, grid-stride), one partial per thread block:
// every byte is read once and nothing but the partials is written.
__global__ void stream_read_kernel(const int4* __restrict__ src, int64_t n, long long* partial) {
  long long acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int4 v = __ldg(src + i);
    acc += static_cast<long long>(v.x) + v.y + v.z + v.w;
  }
  __shared__ long long warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long s = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s += warp_sums[w];
    partial[blockIdx.x] = s;
  }
}

}  // namespace

cudaError_t launch_stream_read(const void* src, int64_t bytes, long long* partial, int blocks,
                               cudaStream_t stream) {
  stream_read_kernel<<<blocks, 256, 0, stream>>>(static_cast<const int4*>(src), bytes / 16,
                                                 partial);
  return cudaGetLastError();
}

}  // namespace mla::cuda
