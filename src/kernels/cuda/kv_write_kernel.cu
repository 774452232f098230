// Latent row write: one warp per token, 72 chunks of 8 values (64 of c_kv, 8 of k_pe), 16-byte
// loads; bf16 rows stored as 16-byte vectors, fp8 rows as 8-byte vectors. Slots outside the
// cache are skipped (the device cannot report them; the backends validate out_cache_loc).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/kv_write_kernel.h"

namespace mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kLatentChunks = 576 / 8;
constexpr int kCkvChunks = 512 / 8;

__global__ void __launch_bounds__(kThreads) kv_write_kernel(const KvWriteParams p) {
  const int64_t token = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (token >= p.num_tokens) return;
  const int64_t slot = p.loc[token];
  if (slot < 0 || slot >= p.num_slots) return;
  for (int c = lane; c < kLatentChunks; c += 32) {
    const uint16_t* src = c < kCkvChunks
                              ? p.c_kv + token * p.c_kv_row_stride + c * 8
                              : p.k_pe + token * p.k_pe_row_stride + (c - kCkvChunks) * 8;
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    if (!p.fp8) {
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.cache) + slot * 576 + c * 8) = v;
      continue;
    }
    const auto* e = reinterpret_cast<const __nv_bfloat162*>(&v);
    uint16_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = __bfloat1622float2(e[i]);
      f.x = f.x / p.k_scale;  // as the reference: value / k_scale, then round
      f.y = f.y / p.k_scale;
      packed[i] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
    }
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.cache) + slot * 576 + c * 8) =
        *reinterpret_cast<const uint2*>(packed);
  }
}

}  // namespace

cudaError_t launch_kv_write(const KvWriteParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.num_tokens * 32 + kThreads - 1) / kThreads;
  if (blocks == 0) return cudaSuccess;
  kv_write_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mla::cuda
