// The kernel entries of the absorbed op (choose.h picks one; launcher.cu launches it):
//   absorbed_attention_sm90_kernel (sm90_ws.cuh, sm_90a): every tile as 64 wgmma rows (a tile of
//     16 / 32 rows, 16 or 32 heads, runs with its rows past num_rows zero), the warpgroups in
//     different roles, TMA key loads when the plan header says so (pages of 64 and more).
//   absorbed_attention_sm90_kernel<true>: the same over an fp8 e4m3 cache (each tile converted to
//     bf16 in shared memory after it lands).
//   absorbed_combine_kernel (combine.cuh): merges the partials of split tiles.
// Each entry is its own kernel, so neither constrains the other's register allocation, and no
// wgmma pipeline crosses a function call.
#pragma once

#include "kernels/cuda/absorbed/combine.cuh"
#include "kernels/cuda/absorbed/sm90_ws.cuh"

namespace mla::cuda::absorbed {

inline constexpr int kSm90SmemBytes = wg::ws::kSmemBytes;

__device__ __forceinline__ unsigned char* align_1024(unsigned char* smem) {
  const uint32_t a = sm90::smem_u32(smem);
  return smem + (((a + 1023u) & ~1023u) - a);
}

// kFp8: an fp8 e4m3 cache, converted to bf16 in shared memory tile by tile.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    absorbed_attention_sm90_kernel(const __grid_constant__ AbsorbedParams p) {
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  if (static_cast<int>(blockIdx.x) >= h.num_ctas) return;
  wg::tile64_ws<kFp8>(p, align_1024(sm90_smem));
}

}  // namespace mla::cuda::absorbed
