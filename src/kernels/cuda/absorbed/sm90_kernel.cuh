// Absorbed paged MLA attention, version 2 (Hopper, sm_90a): 64-row tiles (heads x q_len of one
// request) on wgmma. Same plan, work units, partial slots and combine kernel as version 1
// (kernel.cuh); only the tile compute differs. Tiles of 16 / 32 rows and fp8 caches stay on the
// mma.sync kernel: absorbed_attention_sm90_kernel switches on the plan header, so a captured
// CUDA graph stays correct when a re-plan changes rows_per_tile.
//
// Two consumer warpgroups (256 threads), one CTA per SM, per key tile of 64 keys:
//   S_w = Q . K_w^T  (m64n32k16 SS x 36 k-steps; warpgroup w takes keys [32 w, 32 w + 32))
//   row maxima exchanged through shared memory; each warpgroup writes its 32 columns of
//   P = exp2(S - m) (bf16) to shared memory;
//   O_w += P . V[:, 256 w, +256)  (m64n256k16 SS x 4 k-steps, V = first 512 columns of the
//   key tile read MN-major; 64 x 256 fp32 accumulators = 128 registers per thread).
// Shared memory (1024-byte aligned): Q [9 blocks][64 rows][128 B], 2 key stages of the same
// shape, P [64 rows][128 B], all in the 128-byte swizzle (chunk c of row r at c ^ (r % 8)), so
// one key tile serves as K-major B for Q K^T and as MN-major B for P V. Keys are gathered by
// slot with 16-byte cp.async (any page size), double buffered; slots are looked up 2 tiles ahead.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/absorbed/kernel.cuh"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/traits.h"
#include "kernels/cuda/sm90/wgmma.cuh"

namespace mla::cuda::absorbed {
namespace wg {

using namespace mla::cuda::sm90;

inline constexpr int kBlocks = kDimQk / 64;             // 9 column blocks of 64 elements
inline constexpr int kBlockBytes = 64 * 128;            // [64 rows][128 B]
inline constexpr int kTileBytes = kBlocks * kBlockBytes;  // 73728: Q or one key tile
inline constexpr int kQOff = 0;
inline constexpr int kKvOff = kTileBytes;
inline constexpr int kPOff = kKvOff + 2 * kTileBytes;
inline constexpr int kRedOff = kPOff + kBlockBytes;     // float [2][64]
inline constexpr int kSlotsOff = kRedOff + 2 * 64 * 4;  // int32 [2][64]
inline constexpr int kSmemBytes = kSlotsOff + 2 * 64 * 4 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 232448, "exceeds the 227 KiB shared memory of one Hopper SM");
static_assert(kBlockN == 64 && kMaxRows == 64 && kThreads == 256);

// Byte offset of 16-byte chunk ch (0..71) of row r of a [64 x 576] tile.
__device__ __forceinline__ uint32_t tile_offset(int r, int ch) {
  return static_cast<uint32_t>((ch >> 3) * kBlockBytes) + sw128_offset(r, ch & 7);
}

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

// Bulk prefetch of [ptr, ptr + bytes) into L2 (16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void prefetch_l2(const void* ptr, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(ptr), "r"(bytes) : "memory");
}

__device__ __forceinline__ int32_t slot_of(const AbsorbedParams& p, const WorkUnit& u, int key,
                                           int page_size) {
  if (key >= u.kv_end) return -1;
  const int32_t* row = p.req_to_token + static_cast<int64_t>(u.pool_row) * p.req_to_token_stride;
  if (page_size == 1) return row[key];
  return row[(key / page_size) * page_size] + key % page_size;
}

__device__ __forceinline__ void load_q(const AbsorbedParams& p, const WorkUnit& u, uint32_t q_s) {
  for (int c = threadIdx.x; c < 64 * 72; c += kThreads) {
    const int r = c / 72, ch = c % 72;
    const bool valid = r < u.num_rows;
    const uint16_t* src =
        valid ? p.q + (static_cast<int64_t>(u.q_row_begin) + r) * kDimQk + ch * 8 : p.q;
    cp16(q_s + tile_offset(r, ch), src, valid);
  }
}

__device__ __forceinline__ void load_kv(const AbsorbedParams& p, const int32_t* slots,
                                        uint32_t kv_s) {
#pragma unroll 3
  for (int c = threadIdx.x; c < 64 * 72; c += kThreads) {
    const int k = c / 72, ch = c % 72;
    const int32_t slot = slots[k];
    const uint16_t* src =
        slot >= 0 ? p.kv_cache + static_cast<int64_t>(slot) * kDimQk + ch * 8 : p.kv_cache;
    cp16(kv_s + tile_offset(k, ch), src, slot >= 0);
  }
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// kPrefetchTiles > 0: key rows kPrefetchTiles tiles ahead (continuing into the CTA's next unit)
// and the next unit's query rows are prefetched into L2 with bulk prefetches, so the cp.async
// gather, which has one tile of compute to land, mostly hits L2. A/B switch:
// MLA_ABSORBED_WGMMA=1: 0 (none), 2: 3 tiles ahead, 3: 5 tiles ahead.
template <int kPrefetchTiles>
__device__ void tile64(const AbsorbedParams& p, const PlanHeader& h, unsigned char* smem) {
  const int wgi = threadIdx.x >> 7;                   // warpgroup: key half (S), column half (O)
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int r_lo = 16 * w + (lane >> 2), r_hi = r_lo + 8;  // this thread's rows
  const uint32_t base = smem_u32(smem);
  const uint32_t q_s = base + kQOff, kv_s = base + kKvOff, p_s = base + kPOff;
  float* red = reinterpret_cast<float*>(smem + kRedOff);
  int32_t* slots = reinterpret_cast<int32_t*>(smem + kSlotsOff);
  // Descriptors without the address: the address field is added per k-step.
  const uint64_t desc_k0 = desc_k_sw128(0), desc_mn0 = desc_mn_sw128(0, kBlockBytes);

  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];
  constexpr bool kPrefetch = kPrefetchTiles > 0;

  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = (u.kv_end - u.kv_begin + kBlockN - 1) / kBlockN;
    const bool has_next = kPrefetch && ui + 1 < u_end;
    WorkUnit nu{};
    if (has_next) nu = units[ui + 1];
    const int next_tiles = has_next ? (nu.kv_end - nu.kv_begin + kBlockN - 1) / kBlockN : 0;
    __syncthreads();  // the previous unit is done with every buffer
    if (threadIdx.x < 2 * kBlockN) {
      const int key = u.kv_begin + threadIdx.x;  // tiles 0 and 1: slots[0..63], [64..127]
      slots[threadIdx.x] = threadIdx.x < kBlockN || n_tiles > 1
                               ? slot_of(p, u, key, h.page_size) : -1;
    }
    load_q(p, u, q_s);
    __syncthreads();
    if (n_tiles > 0) load_kv(p, slots, kv_s);
    asm volatile("cp.async.commit_group;\n");
    if (has_next && threadIdx.x == 2 * kBlockN && nu.num_rows > 0) {
      prefetch_l2(p.q + static_cast<int64_t>(nu.q_row_begin) * kDimQk,
                  static_cast<uint32_t>(nu.num_rows) * kDimQk * 2);
    }

    int lim[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int query = (u.row_in_req + (i == 0 ? r_lo : r_hi)) / h.num_heads;
      const int causal_end = h.causal ? u.kv_len - u.q_len + query + 1 : u.kv_len;
      lim[i] = min(causal_end, u.kv_end);
    }
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t & 1;
      const int tile_start = u.kv_begin + t * kBlockN;
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      fence_proxy_async();  // cp.async data -> visible to wgmma
      __syncthreads();      // tile t (and Q) landed for all; every warpgroup is done with t - 1
      const uint32_t k_tile = kv_s + stage * kTileBytes;
      // Slot of key threadIdx.x of tile t + 2: loaded now, stored after P V, so the global
      // latency never sits between the QK wgmmas and the softmax.
      int32_t next_slot = -1;
      const bool lookup = t + 2 < n_tiles && threadIdx.x < kBlockN;
      if (lookup) next_slot = slot_of(p, u, tile_start + 2 * kBlockN + threadIdx.x, h.page_size);
      // Key threadIdx.x - 64 of the tile kPrefetchTiles ahead (or of the next unit's first
      // tiles): looked up now, prefetched once the P V wgmmas are issued.
      int32_t pf_slot = -1;
      if (kPrefetch && threadIdx.x >= kBlockN && threadIdx.x < 2 * kBlockN) {
        const int tp = t + kPrefetchTiles, k = threadIdx.x - kBlockN;
        if (tp < n_tiles) {
          pf_slot = slot_of(p, u, u.kv_begin + tp * kBlockN + k, h.page_size);
        } else if (tp - n_tiles < next_tiles) {
          pf_slot = slot_of(p, nu, nu.kv_begin + (tp - n_tiles) * kBlockN + k, h.page_size);
        }
      }

      // compute_qk: S[64 rows x 32 keys] of this warpgroup, over 576 dims.
      float s[16];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kDimQk / 16; ++kk) {
        const uint32_t koff = (kk >> 2) * kBlockBytes + (kk & 3) * 32;
        const uint64_t da = desc_k0 + ((q_s + koff) >> 4);
        const uint64_t db = desc_k0 + ((k_tile + wgi * 32 * 128 + koff) >> 4);
        wgmma_ss_bf16<32, 0>(s, da, db, kk > 0);
      }
      wgmma_commit();
      // While the tensor cores work: gather tile t + 1.
      if (t + 1 < n_tiles) {
        load_kv(p, slots + (stage ^ 1) * kBlockN, kv_s + (stage ^ 1) * kTileBytes);
      }
      asm volatile("cp.async.commit_group;\n");
      wgmma_wait<0>();
      fence_regs(s);

      // online_softmax: scale, causal / range mask, row maxima over both warpgroups.
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = tile_start + wgi * 32 + 8 * j + 2 * (lane & 3) + (i & 1);
          float v = s[4 * j + i] * p.scale_log2;
          if (key >= lim[i >> 1]) v = -INFINITY;
          s[4 * j + i] = v;
          tmax[i >> 1] = fmaxf(tmax[i >> 1], v);
        }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
      }
      if ((lane & 3) == 0) {
        red[wgi * 64 + r_lo] = tmax[0];
        red[wgi * 64 + r_hi] = tmax[1];
      }
      __syncthreads();
      tmax[0] = fmaxf(tmax[0], red[(wgi ^ 1) * 64 + r_lo]);
      tmax[1] = fmaxf(tmax[1], red[(wgi ^ 1) * 64 + r_hi]);
      float alpha[2], m_use[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float m_new = fmaxf(m[i], tmax[i]);
        m_use[i] = m_new == -INFINITY ? 0.f : m_new;
        alpha[i] = exp2f(m[i] - m_use[i]);  // m = -inf -> 0
        m[i] = m_new;
        l[i] *= alpha[i];
      }
      // P (bf16) columns [32 w, +32) of the shared tile.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p0 = exp2f(s[4 * j + 0] - m_use[0]), p1 = exp2f(s[4 * j + 1] - m_use[0]);
        const float p2 = exp2f(s[4 * j + 2] - m_use[1]), p3 = exp2f(s[4 * j + 3] - m_use[1]);
        l[0] += p0 + p1;
        l[1] += p2 + p3;
        const int key = wgi * 32 + 8 * j + 2 * (lane & 3);
        const uint32_t byte = (key & 7) * 2;
        *reinterpret_cast<uint32_t*>(smem + kPOff + sw128_offset(r_lo, key >> 3) + byte) =
            pack2(p0, p1);
        *reinterpret_cast<uint32_t*>(smem + kPOff + sw128_offset(r_hi, key >> 3) + byte) =
            pack2(p2, p3);
      }
      fence_proxy_async();  // P stores -> visible to wgmma
      // Rescale O unless no row of the warp changed its maximum (o * 1 == o: bitwise the same).
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          o[4 * j + 0] *= alpha[0];
          o[4 * j + 1] *= alpha[0];
          o[4 * j + 2] *= alpha[1];
          o[4 * j + 3] *= alpha[1];
        }
      }
      __syncthreads();  // P complete (both halves)

      // compute_pv: O[64 x 256 columns of this warpgroup] += P[64 x 64] . V[64 x 256].
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        const uint64_t da = desc_k0 + ((p_s + ks * 32) >> 4);
        const uint64_t db = desc_mn0 + ((k_tile + wgi * 4 * kBlockBytes + ks * 2048) >> 4);
        wgmma_ss_bf16<256, 1>(o, da, db, true);
      }
      wgmma_commit();
      // slots[stage] (tile t) was last read when tile t was gathered, before this iteration's
      // first barrier; it is next read after the next iteration's first barrier.
      if (lookup) slots[stage * kBlockN + threadIdx.x] = next_slot;
      if (kPrefetch && pf_slot >= 0) {
        prefetch_l2(p.kv_cache + static_cast<int64_t>(pf_slot) * kDimQk, kDimQk * 2);
      }
      wgmma_wait<0>();
      fence_regs(o);
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");

    // write_o: row sums over the quad and both warpgroups, then normalise.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    __syncthreads();  // every warpgroup is past its last read of red
    if ((lane & 3) == 0) {
      red[wgi * 64 + r_lo] = l[0];
      red[wgi * 64 + r_hi] = l[1];
    }
    __syncthreads();
    l[0] += red[(wgi ^ 1) * 64 + r_lo];
    l[1] += red[(wgi ^ 1) * 64 + r_hi];
    const float ln2 = 0.69314718055994530942f;
    const int col0 = wgi * 256 + 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = i == 0 ? r_lo : r_hi;
      if (r >= u.num_rows) continue;
      const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
      const float lse = l[i] > 0.f ? (m[i] + log2f(l[i])) * ln2 : -INFINITY;
      const int64_t row = static_cast<int64_t>(u.q_row_begin) + r;
      if (u.partial < 0) {
        uint16_t* dst = p.o + row * kDimV + col0;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<uint32_t*>(dst + 8 * j) =
              pack2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        }
        if (wgi == 0 && (lane & 3) == 0) p.lse[row] = lse;
      } else {
        const int64_t prow = static_cast<int64_t>(u.partial) * kMaxRows + r;
        float* dst = p.partial_o + prow * kDimV + col0;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        }
        if (wgi == 0 && (lane & 3) == 0) p.partial_lse[prow] = lse;
      }
    }
  }
}

}  // namespace wg

inline constexpr int kSm90SmemBytes = wg::kSmemBytes > kSmemBytes ? wg::kSmemBytes : kSmemBytes;

// 64-row tiles on wgmma; 16 / 32-row tiles on the mma.sync variants of kernel.cuh.
__global__ void __launch_bounds__(kThreads, 1) absorbed_attention_sm90_kernel(AbsorbedParams p) {
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  if (static_cast<int>(blockIdx.x) >= h.num_ctas) return;
  if (h.rows_per_tile == kMaxRows) {
    const uint32_t a = sm90::smem_u32(sm90_smem);
    unsigned char* aligned = sm90_smem + (((a + 1023u) & ~1023u) - a);
    if (p.wgmma_tiles == 2) {
      wg::tile64<3>(p, h, aligned);
    } else if (p.wgmma_tiles == 3) {
      wg::tile64<5>(p, h, aligned);
    } else {
      wg::tile64<0>(p, h, aligned);
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
