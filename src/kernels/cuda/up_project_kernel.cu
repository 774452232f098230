// One warp per gathered row: 64 chunks of 8 c_kv values to the scratch, then the 8 k_pe chunks
// to each head of k (16-byte stores). A slot outside the cache yields a zero row (the device
// cannot report it; the backends validate slot lists on the host).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/up_project_kernel.h"

namespace mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kCkvChunks = 512 / 8;
constexpr int kPeChunks = 64 / 8;

__device__ __forceinline__ uint4 load_chunk(const GatherParams& p, int64_t slot, int chunk) {
  if (slot < 0 || slot >= p.num_slots) return make_uint4(0, 0, 0, 0);
  if (!p.fp8) {
    return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.cache) + slot * 576 +
                                           chunk * 8);
  }
  const auto* row = static_cast<const uint8_t*>(p.cache) + slot * 576;
  const uint2 raw = *reinterpret_cast<const uint2*>(row + chunk * 8);
  const auto* pairs = reinterpret_cast<const __nv_fp8x2_e4m3*>(&raw);
  uint4 out;
  auto* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = static_cast<float2>(pairs[i]);
    o[i] = __floats2bfloat162_rn(f.x * p.k_scale, f.y * p.k_scale);
  }
  return out;
}

__global__ void __launch_bounds__(kThreads) gather_latent_kernel(const GatherParams p) {
  const int64_t n = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (n >= p.num_tokens) return;
  const int64_t slot = p.slots[n];
  for (int c = lane; c < kCkvChunks; c += 32) {
    *reinterpret_cast<uint4*>(p.c_kv + n * 512 + c * 8) = load_chunk(p, slot, c);
  }
  const int pe = lane % kPeChunks;
  const uint4 v = load_chunk(p, slot, kCkvChunks + pe);
  uint16_t* k_row = p.k + n * p.k_row_stride + 128 + pe * 8;
  for (int h = lane / kPeChunks; h < p.num_heads; h += 32 / kPeChunks) {
    *reinterpret_cast<uint4*>(k_row + h * p.k_head_stride) = v;
  }
}

}  // namespace

cudaError_t launch_gather_latent(const GatherParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.num_tokens * 32 + kThreads - 1) / kThreads;
  if (blocks == 0) return cudaSuccess;
  gather_latent_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mla::cuda
