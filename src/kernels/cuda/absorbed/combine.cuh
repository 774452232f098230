// The combine kernel of the absorbed op: merges the partial results (o, lse) of tiles the plan
// split across CTAs into o / lse.
#pragma once

#include <cstdint>

#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/traits.h"
#include "kernels/cuda/sm90/ptx.cuh"

namespace mla::cuda::absorbed {

using sm90::pack_bf16;

// Merges the partial results of split tiles: one block per split tile, one warp per row.
__global__ void __launch_bounds__(256) absorbed_combine_kernel(AbsorbedParams p) {
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  const CombineUnit* combines = reinterpret_cast<const CombineUnit*>(p.plan + h.combines_offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int ci = blockIdx.x; ci < h.num_combines; ci += gridDim.x) {
    const CombineUnit c = combines[ci];
    for (int r = warp; r < c.num_rows; r += 8) {
      float mx = -INFINITY;
      for (int j = 0; j < c.num_partials; ++j) {
        mx = fmaxf(mx, p.partial_lse[static_cast<int64_t>(c.first_partial + j) * kMaxRows + r]);
      }
      float acc[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[i] = 0.f;
      float wsum = 0.f;
      if (mx != -INFINITY) {
        for (int j = 0; j < c.num_partials; ++j) {
          const int64_t prow = static_cast<int64_t>(c.first_partial + j) * kMaxRows + r;
          const float w = __expf(p.partial_lse[prow] - mx);
          wsum += w;
          const float4* src = reinterpret_cast<const float4*>(p.partial_o + prow * kDimV);
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // columns (i * 32 + lane) * 4 .. + 3
            const float4 v = src[i * 32 + lane];
            acc[i * 4 + 0] += w * v.x;
            acc[i * 4 + 1] += w * v.y;
            acc[i * 4 + 2] += w * v.z;
            acc[i * 4 + 3] += w * v.w;
          }
        }
      }
      const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
      const int64_t row = static_cast<int64_t>(c.q_row_begin) + r;
      uint16_t* dst = p.o + row * kDimV;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint2 v;
        v.x = pack_bf16(acc[i * 4 + 0] * inv, acc[i * 4 + 1] * inv);
        v.y = pack_bf16(acc[i * 4 + 2] * inv, acc[i * 4 + 3] * inv);
        *reinterpret_cast<uint2*>(dst + (i * 32 + lane) * 4) = v;
      }
      if (lane == 0) p.lse[row] = wsum > 0.f ? mx + logf(wsum) : -INFINITY;
    }
  }
}

}  // namespace mla::cuda::absorbed
