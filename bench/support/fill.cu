#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fill.h"

namespace mla::cuda {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Two normals per hash (Box-Muller).
__global__ void fill_normal_bf16_kernel(__nv_bfloat16* dst, int64_t n, uint64_t seed,
                                        float stddev) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 2;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 2; i < n;
       i += stride) {
    const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
    const float u2 = static_cast<float>((h >> 16) & 0xffffffull) * (1.0f / 16777216.0f);
    const float r = sqrtf(-2.0f * logf(u1)) * stddev;
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    dst[i] = __float2bfloat16(r * c);
    if (i + 1 < n) dst[i + 1] = __float2bfloat16(r * s);
  }
}

// The same normals rounded to fp8 e4m3 (saturating), as stored value = x / scale.
__global__ void fill_normal_fp8_kernel(__nv_fp8_storage_t* dst, int64_t n, uint64_t seed,
                                       float stddev) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 2;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 2; i < n;
       i += stride) {
    const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
    const float u2 = static_cast<float>((h >> 16) & 0xffffffull) * (1.0f / 16777216.0f);
    const float r = sqrtf(-2.0f * logf(u1)) * stddev;
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    dst[i] = __nv_cvt_float_to_fp8(r * c, __NV_SATFINITE, __NV_E4M3);
    if (i + 1 < n) dst[i + 1] = __nv_cvt_float_to_fp8(r * s, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

cudaError_t fill_random_bf16(void* dst, int64_t n, uint64_t seed, float stddev,
                             cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t pairs = (n + 1) / 2;
  const int blocks = static_cast<int>(pairs / 256 + 1 < 4096 ? pairs / 256 + 1 : 4096);
  fill_normal_bf16_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), n, seed,
                                                      stddev);
  return cudaGetLastError();
}

cudaError_t fill_random_fp8(void* dst, int64_t n, uint64_t seed, float stddev,
                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t pairs = (n + 1) / 2;
  const int blocks = static_cast<int>(pairs / 256 + 1 < 4096 ? pairs / 256 + 1 : 4096);
  fill_normal_fp8_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_fp8_storage_t*>(dst), n, seed,
                                                     stddev);
  return cudaGetLastError();
}

}  // namespace mla::cuda
