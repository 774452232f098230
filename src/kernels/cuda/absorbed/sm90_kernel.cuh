// The Hopper (sm_90a) entries of the absorbed op (bf16 caches; fp8 caches launch
// absorbed_attention_fp8_kernel of kernel.cuh).
//   absorbed_attention_sm90_ws_kernel (version 3, sm90_ws.cuh): 64-row tiles, the warpgroups in
//     different roles, TMA gathers for pages of 64 and more. Launched when num_heads >= 64, for
//     which every plan has 64-row tiles (heads x q_len >= 64), so a re-plan never changes the
//     tile shape under a captured graph. kDiag != 0: measurement-only instantiations.
//   absorbed_attention_sm90_kernel (version 2, sm90_v2.cuh, for 64-row tiles; 16 / 32-row tiles
//     on the mma.sync variants of kernel.cuh): launched for 16 and 32 heads, where the tile shape
//     depends on the batch's longest query; the kernel switches on the plan header's
//     rows_per_tile, so a captured CUDA graph stays correct when a re-plan changes it.
// Each entry is its own kernel, so neither constrains the other's register allocation, and no
// wgmma pipeline crosses a function call.
#pragma once

#include "kernels/cuda/absorbed/kernel.cuh"
#include "kernels/cuda/absorbed/sm90_v2.cuh"
#include "kernels/cuda/absorbed/sm90_ws.cuh"

namespace mla::cuda::absorbed {

inline constexpr int kSm90WsSmemBytes = wg::ws::kSmemBytes;
inline constexpr int kSm90SmemBytes = max_int(wg::v2::kSmemBytes, kSmemBytes);

__device__ __forceinline__ unsigned char* align_1024(unsigned char* smem) {
  const uint32_t a = sm90::smem_u32(smem);
  return smem + (((a + 1023u) & ~1023u) - a);
}

template <int kDiag>
__global__ void __launch_bounds__(kThreads, 1)
    absorbed_attention_sm90_ws_kernel(const __grid_constant__ AbsorbedParams p) {
  extern __shared__ __align__(1024) unsigned char sm90_ws_smem[];
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  if (static_cast<int>(blockIdx.x) >= h.num_ctas || h.rows_per_tile != kMaxRows) return;
  wg::tile64_ws<kDiag>(p, align_1024(sm90_ws_smem));
}

__global__ void __launch_bounds__(kThreads, 1)
    absorbed_attention_sm90_kernel(const __grid_constant__ AbsorbedParams p) {
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  if (static_cast<int>(blockIdx.x) >= h.num_ctas) return;
  if (h.rows_per_tile == kMaxRows) {
    wg::tile64_v2(p, h, align_1024(sm90_smem));
  } else if (h.rows_per_tile == 16) {
    // The same variants and shared memory layouts as absorbed_attention_kernel, from offset 0.
    attention_variant<1, false>(p, h, sm90_smem);
  } else {
    attention_variant<2, false>(p, h, sm90_smem);
  }
}

}  // namespace mla::cuda::absorbed
