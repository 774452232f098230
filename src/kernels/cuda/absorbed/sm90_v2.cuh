// Absorbed paged MLA attention, version 2 (Hopper, sm_90a): 64-row tiles on wgmma with both
// warpgroups in the same role. Kept as the A/B reference of version 3 (sm90_ws.cuh;
// MLA_ABSORBED_WGMMA=v2 selects it).
//
// Two consumer warpgroups (256 threads), one CTA per SM, per key tile of 64 keys:
//   S_w = Q . K_w^T  (m64n32k16 SS x 36 k-steps; warpgroup w takes keys [32 w, 32 w + 32))
//   row maxima exchanged through shared memory; each warpgroup writes its 32 columns of
//   P = exp2(S - m) (bf16) to shared memory;
//   O_w += P . V[:, 256 w, +256)  (m64n256k16 SS x 4 k-steps, V = first 512 columns of the
//   key tile read MN-major; 64 x 256 fp32 accumulators = 128 registers per thread).
// Shared memory (1024-byte aligned): Q, 2 key stages (sm90_common.cuh layout), P [64][128 B].
// Keys are gathered by slot with 16-byte cp.async by all threads (any page size), double
// buffered; slots are looked up 2 tiles ahead.
#pragma once

#include "kernels/cuda/absorbed/sm90_common.cuh"

namespace mla::cuda::absorbed::wg {

namespace v2 {
inline constexpr int kQOff = 0;
inline constexpr int kKvOff = kTileBytes;
inline constexpr int kPOff = kKvOff + 2 * kTileBytes;
inline constexpr int kRedOff = kPOff + kBlockBytes;     // float [2][64]
inline constexpr int kSlotsOff = kRedOff + 2 * 64 * 4;  // int32 [2][64]
inline constexpr int kSmemBytes = kSlotsOff + 2 * 64 * 4 + 1024;  // + alignment slack
static_assert(kSmemBytes <= kSmemLimit, "exceeds the 227 KiB shared memory of one Hopper SM");
}  // namespace v2

__device__ __forceinline__ void load_kv_all(const AbsorbedParams& p, const int32_t* slots,
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

__device__ void tile64_v2(const AbsorbedParams& p, const PlanHeader& h, unsigned char* smem) {
  using namespace v2;
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

  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = key_tiles(u);
    __syncthreads();  // the previous unit is done with every buffer
    if (threadIdx.x < 2 * kBlockN) {
      const int key = u.kv_begin + threadIdx.x;  // tiles 0 and 1: slots[0..63], [64..127]
      slots[threadIdx.x] = threadIdx.x < kBlockN || n_tiles > 1
                               ? slot_of(p, u.pool_row, u.kv_end, key, h.page_size) : -1;
    }
    load_q<kThreads>(p, u, q_s, threadIdx.x);
    __syncthreads();
    if (n_tiles > 0) load_kv_all(p, slots, kv_s);
    asm volatile("cp.async.commit_group;\n");

    const int lim[2] = {row_limit(u, h, r_lo), row_limit(u, h, r_hi)};
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
      if (lookup) {
        next_slot = slot_of(p, u.pool_row, u.kv_end, tile_start + 2 * kBlockN + threadIdx.x,
                            h.page_size);
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
        load_kv_all(p, slots + (stage ^ 1) * kBlockN, kv_s + (stage ^ 1) * kTileBytes);
      }
      asm volatile("cp.async.commit_group;\n");
      wgmma_wait<0>();
      fence_regs(s);

      // online_softmax: scale, causal / range mask, row maxima over both warpgroups.
      float tmax[2];
      scale_mask_max<4>(s, tile_start + wgi * 32, lane, lim, p.scale_log2, tmax);
      if ((lane & 3) == 0) {
        red[wgi * 64 + r_lo] = tmax[0];
        red[wgi * 64 + r_hi] = tmax[1];
      }
      __syncthreads();
      tmax[0] = fmaxf(tmax[0], red[(wgi ^ 1) * 64 + r_lo]);
      tmax[1] = fmaxf(tmax[1], red[(wgi ^ 1) * 64 + r_hi]);
      float alpha[2], m_use[2];
      softmax_rescale(m, l, tmax, alpha, m_use);
      // P (bf16) columns [32 w, +32) of the shared tile.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 pr =
            softmax_probs(s[4 * j + 0], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3], m_use, l);
        const int key = wgi * 32 + 8 * j + 2 * (lane & 3);
        const uint32_t byte = (key & 7) * 2;
        *reinterpret_cast<uint32_t*>(smem + kPOff + sw128_offset(r_lo, key >> 3) + byte) =
            pack2(pr.x, pr.y);
        *reinterpret_cast<uint32_t*>(smem + kPOff + sw128_offset(r_hi, key >> 3) + byte) =
            pack2(pr.z, pr.w);
      }
      fence_proxy_async();  // P stores -> visible to wgmma
      rescale_o(o, alpha[0], alpha[1]);
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
    float inv[2], lse[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      inv[i] = l[i] > 0.f ? 1.f / l[i] : 0.f;
      lse[i] = l[i] > 0.f ? (m[i] + log2f(l[i])) * ln2 : -INFINITY;
    }
    write_o(p, u, o, inv, lse, r_lo, wgi * 256 + 2 * (lane & 3), wgi == 0 && (lane & 3) == 0);
  }
}

}  // namespace mla::cuda::absorbed::wg
