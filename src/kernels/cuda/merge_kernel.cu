// Merge of two attention states, in place: a group of lanes per (token, head) row, 16-byte
// vectors of 8 bf16, fp32 arithmetic. Every lane of a group reads lse_acc before the group's
// first lane overwrites it (__syncwarp between), so the in-place update is race-free.
#include <cuda_bf16.h>

#include "kernels/cuda/merge_kernel.h"

namespace mla::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) merge_kernel(const MergeParams p) {
  const int chunks = p.head_dim / 8;
  const int group = chunks < 32 ? chunks : 32;  // lanes per row; divides 32 (checked by the op)
  const int rows_per_warp = 32 / group;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t row = warp * rows_per_warp + lane / group;
  const int sub = lane % group;
  const bool valid = row < p.num_tokens * p.num_heads;
  const int64_t t = valid ? row / p.num_heads : 0;
  const int h = valid ? static_cast<int>(row % p.num_heads) : 0;

  float wa = 0.f, wb = 0.f, inv = 0.f, lse = -INFINITY;
  if (valid) {
    const float la = p.lse_acc[t * p.la_row_stride + h];
    const float lb = p.lse_b[t * p.lb_row_stride + h];
    const float m = fmaxf(la, lb);
    if (m != -INFINITY) {
      wa = __expf(la - m);
      wb = __expf(lb - m);
      inv = 1.f / (wa + wb);
      lse = m + __logf(wa + wb);
    }
  }
  __syncwarp();
  if (!valid) return;
  uint16_t* oa = p.o_acc + t * p.oa_row_stride + h * p.oa_head_stride;
  const uint16_t* ob = p.o_b + t * p.ob_row_stride + h * p.ob_head_stride;
  for (int c = sub; c < chunks; c += group) {
    uint4 va = *reinterpret_cast<const uint4*>(oa + c * 8);
    const uint4 vb = *reinterpret_cast<const uint4*>(ob + c * 8);
    auto* ea = reinterpret_cast<__nv_bfloat162*>(&va);
    const auto* eb = reinterpret_cast<const __nv_bfloat162*>(&vb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 fa = __bfloat1622float2(ea[i]);
      const float2 fb = __bfloat1622float2(eb[i]);
      ea[i] = __floats2bfloat162_rn((wa * fa.x + wb * fb.x) * inv, (wa * fa.y + wb * fb.y) * inv);
    }
    *reinterpret_cast<uint4*>(oa + c * 8) = va;
  }
  if (sub == 0) p.lse_acc[t * p.la_row_stride + h] = lse;
}

}  // namespace

cudaError_t launch_merge(const MergeParams& p, cudaStream_t stream) {
  const int chunks = p.head_dim / 8;
  const int group = chunks < 32 ? chunks : 32;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t warps = (rows * group + 31) / 32;
  const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
  if (blocks == 0) return cudaSuccess;
  merge_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mla::cuda
