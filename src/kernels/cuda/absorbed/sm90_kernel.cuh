// The Hopper (sm_90a) entry of the absorbed op: 64-row tiles (heads x q_len of one request) on
// wgmma, 16 / 32-row tiles on the mma.sync variants of kernel.cuh. The kernel switches on the
// plan header's rows_per_tile, so a captured CUDA graph stays correct when a re-plan changes it.
//   kVersion 3 (default): sm90_ws.cuh, warpgroups in different roles, TMA gathers for pages of
//     16 and more.
//   kVersion 2: sm90_v2.cuh, both warpgroups in the same role, cp.async gathers (A/B reference,
//     MLA_ABSORBED_WGMMA=v2).
// Each version is its own kernel, so neither constrains the other's register allocation.
// fp8 caches launch absorbed_attention_fp8_kernel (kernel.cuh).
#pragma once

#include "kernels/cuda/absorbed/kernel.cuh"
#include "kernels/cuda/absorbed/sm90_v2.cuh"
#include "kernels/cuda/absorbed/sm90_ws.cuh"

namespace mla::cuda::absorbed {

template <int kVersion>
inline constexpr int kSm90SmemBytes =
    max_int(kVersion == 3 ? wg::ws::kSmemBytes : wg::v2::kSmemBytes, kSmemBytes);

template <int kVersion>
__global__ void __launch_bounds__(kThreads, 1)
    absorbed_attention_sm90_kernel(const __grid_constant__ AbsorbedParams p) {
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  if (static_cast<int>(blockIdx.x) >= h.num_ctas) return;
  if (h.rows_per_tile == kMaxRows) {
    const uint32_t a = sm90::smem_u32(sm90_smem);
    unsigned char* aligned = sm90_smem + (((a + 1023u) & ~1023u) - a);
    if constexpr (kVersion == 3) {
      if (p.diag == 1) {
        wg::tile64_ws<1>(p, aligned);
      } else if (p.diag == 2) {
        wg::tile64_ws<2>(p, aligned);
      } else {
        wg::tile64_ws<0>(p, aligned);
      }
    } else {
      wg::tile64_v2(p, h, aligned);
    }
    return;
  }
  // bf16 only (fp8 caches launch absorbed_attention_fp8_kernel); the same variants and shared
  // memory layouts as absorbed_attention_kernel, from offset 0 of this block's shared memory.
  if (h.rows_per_tile == 16) {
    attention_variant<1, false>(p, h, sm90_smem);
  } else {
    attention_variant<2, false>(p, h, sm90_smem);
  }
}

}  // namespace mla::cuda::absorbed
