// Ragged MHA forward for Hopper (sm_90a), FlashAttention-3 style without a producer warp:
// one CTA of 2 consumer warpgroups runs a 128-row query tile of one head (64 rows per
// warpgroup); K tiles (128 keys x 192) and V tiles (128 keys x 128) are double-buffered in
// 128-byte-swizzled smem by cp.async from all 256 threads; S = Q K^T by wgmma m64n128k16 SS
// (Q and K K-major), online softmax on the accumulator fragment (log2 domain), P stays in
// registers as the A operand of O += P V (wgmma RS, V read MN-major). Same plan, LSE and
// empty-row conventions as the FlashAttention-2 style v1 kernel it replaced
// (docs/history/cuda-notes.md).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/mha/params.h"
#include "kernels/cuda/mha/traits.h"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/tma.cuh"
#include "kernels/cuda/sm90/wgmma.cuh"

namespace mla::cuda::mha::sm90k {

using T9 = MhaTraits;

using sm90::cp_async_16;
using sm90::cp_async_commit;
using sm90::cp_async_wait;
using sm90::exp2_ftz;
using sm90::pack_bf16;

// Named barrier 0 is __syncthreads; 1 orders the two warpgroups' QK^T issue; 2 marks Q free in
// a unit's last step.
constexpr int kPingPongBarrier = 1;
constexpr int kQFreeBarrier = 2;
// Copies rows [0, rows_valid) of a [kRows, kChunks * 8] bf16 global tile into the 128B-swizzled
// layout: column block b (64 bf16) of row r at b * kRows * 128 + r * 128, 16-byte chunk c of the
// block at chunk c ^ (r % 8). Rows past rows_valid are zero-filled (nothing read).
template <int kRows, int kChunks>
__device__ __forceinline__ void load_tile_sw128(uint32_t smem, const uint16_t* g,
                                                int64_t row_stride, int rows_valid, int tid) {
  constexpr int kIters = kRows * kChunks / T9::kThreads;
  static_assert(kRows * kChunks % T9::kThreads == 0);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * T9::kThreads + tid;
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const bool valid = row < rows_valid;
    const uint16_t* src = valid ? g + row * row_stride + chunk * 8 : g;
    const uint32_t dst = smem + static_cast<uint32_t>((chunk >> 3) * kRows * 128 + row * 128 +
                                                      (((chunk & 7) ^ (row & 7)) << 4));
    cp_async_16(dst, src, valid);
  }
}

// Masks keys a row may not see (key >= kv_len, or key > diag + row) with -inf; the logits stay
// unscaled (the softmax folds the scale into its exp2 FMA). s[4 * j + e]: row row0 + 8 * (e / 2),
// key key_base + 8 * j + 2 * (lane % 4) + e % 2.
__device__ __forceinline__ void apply_mask(float (&s)[T9::kBlockN / 2], int key_base, int kv_len,
                                           int diag, int row0, int lane) {
  const int t = lane & 3;
#pragma unroll
  for (int j = 0; j < T9::kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_base + j * 8 + 2 * t + (e & 1);
      const int row = row0 + (e >> 1) * 8;
      if (!(key < kv_len && key <= diag + row)) s[4 * j + e] = -INFINITY;
    }
  }
}

// Online softmax over the step for the thread's two rows, in the log2 domain: running max m
// (scaled), sum l, rescale of the output accumulator, s turned into probabilities
// exp2(s * scale_log2 - m) with one FMA each.
__device__ __forceinline__ void online_softmax(float (&s)[T9::kBlockN / 2], float (&m)[2],
                                               float (&l)[2], float (&o)[T9::kHeadDimV / 2],
                                               float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < T9::kBlockN / 8; ++j)
      mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[r], mx * scale_log2);      // scale > 0: max commutes with it
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet stays at 0
    const float alpha = exp2_ftz(m[r] - m_use);
    m[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < T9::kBlockN / 8; ++j) {
      s[4 * j + 2 * r] = exp2_ftz(fmaf(s[4 * j + 2 * r], scale_log2, -m_use));
      s[4 * j + 2 * r + 1] = exp2_ftz(fmaf(s[4 * j + 2 * r + 1], scale_log2, -m_use));
      sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
    l[r] = l[r] * alpha + sum;
#pragma unroll
    for (int d = 0; d < T9::kHeadDimV / 8; ++d) {
      o[4 * d + 2 * r] *= alpha;
      o[4 * d + 2 * r + 1] *= alpha;
    }
  }
}

// Normalises and stores the thread's two rows; a row that saw no key gets o = 0, lse = -inf.
__device__ __forceinline__ void write_o(const MhaParams& p, const MhaTile& tile, int head,
                                        float (&o)[T9::kHeadDimV / 2], const float (&m)[2],
                                        float (&l)[2], int row0, int lane) {
  const int t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = row0 + r * 8;
    if (row >= tile.q_rows) continue;
    const bool empty = l[r] == 0.f;
    const float inv = empty ? 0.f : 1.f / l[r];
    const int64_t q_row = tile.q_start + row;
    uint16_t* dst = p.o + q_row * p.o_row_stride + head * p.o_head_stride + 2 * t;
#pragma unroll
    for (int d = 0; d < T9::kHeadDimV / 8; ++d) {
      *reinterpret_cast<uint32_t*>(dst + d * 8) =
          pack_bf16(o[4 * d + 2 * r] * inv, o[4 * d + 2 * r + 1] * inv);
    }
    if (p.lse != nullptr && t == 0) {
      p.lse[q_row * p.lse_row_stride + head] =
          empty ? -INFINITY : (m[r] + log2f(l[r])) * 0.69314718055994531f;
    }
  }
}

// One (tile, head) unit of the schedule with its key range.
struct Unit {
  MhaTile tile;
  int head;
  int kv_end;     // keys the tile needs at all: the last row sees diag + q_rows of them
  int num_steps;  // 128-key steps
};

__device__ __forceinline__ Unit make_unit(const MhaTile* tiles, int unit, int num_tiles, int heads,
                                          int head_group) {
  const int group_units = num_tiles * head_group;
  const int group = unit / group_units;
  const int r = unit - group * group_units;
  const int group_heads = min(head_group, heads - group * head_group);
  Unit u;
  u.tile = tiles[r / group_heads];
  u.head = group * head_group + r % group_heads;
  u.kv_end = u.tile.kv_len;
  if (u.tile.diag != kNoDiag) u.kv_end = min(u.kv_end, max(u.tile.diag + u.tile.q_rows, 0));
  u.num_steps = (u.kv_end + T9::kBlockN - 1) / T9::kBlockN;
  return u;
}

__device__ __forceinline__ const uint16_t* k_rows(const MhaParams& p, const Unit& u) {
  return p.k + u.tile.kv_start * p.k_row_stride + u.head * p.k_head_stride;
}
__device__ __forceinline__ const uint16_t* v_rows(const MhaParams& p, const Unit& u) {
  return p.v + u.tile.kv_start * p.v_row_stride + u.head * p.v_head_stride;
}
__device__ __forceinline__ void load_q(const MhaParams& p, const Unit& u, uint32_t q_smem,
                                       int tid) {
  const uint16_t* q_g = p.q + u.tile.q_start * p.q_row_stride + u.head * p.q_head_stride;
  load_tile_sw128<T9::kBlockM, T9::kQkChunks>(q_smem, q_g, p.q_row_stride, u.tile.q_rows, tid);
}
// K/V rows [key0, key0 + 128) of the unit into one stage.
__device__ __forceinline__ void load_kv(const MhaParams& p, const Unit& u, int key0,
                                        uint32_t k_stage, uint32_t v_stage, int tid) {
  load_tile_sw128<T9::kBlockN, T9::kQkChunks>(k_stage, k_rows(p, u) + key0 * p.k_row_stride,
                                              p.k_row_stride, u.kv_end - key0, tid);
  load_tile_sw128<T9::kBlockN, T9::kVChunks>(v_stage, v_rows(p, u) + key0 * p.v_row_stride,
                                             p.v_row_stride, u.kv_end - key0, tid);
}

// Runs unit `u` whose step 0 uses stage `stage0`. If `loaded`, its Q and first K/V stage were
// issued by the previous unit. If `prefetch`, the last step issues `next`'s first K/V stage
// (into the stage after the last one) and, once both warpgroups are done with Q, next's Q.
// Returns the stage of next's step 0.
__device__ __forceinline__ int run_unit(const MhaParams& p, const Unit& u, bool loaded, int stage0,
                                        const Unit& next, bool prefetch, uint32_t q_smem,
                                        uint32_t k_smem, uint32_t v_smem) {
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;
  const int lane = tid % 32;
  const int row0 = wg * 64 + ((tid % 128) / 32) * 16 + (lane >> 2);
  const MhaTile& tile = u.tile;
  const int num_steps = u.num_steps;

  float o[T9::kHeadDimV / 2];
#pragma unroll
  for (int i = 0; i < T9::kHeadDimV / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  if (num_steps > 0) {
    if (!loaded) {
      load_q(p, u, q_smem, tid);
      load_kv(p, u, 0, k_smem + stage0 * T9::kKBytes, v_smem + stage0 * T9::kVBytes, tid);
      cp_async_commit();
    }

    // Descriptors without the start address: Q/K K-major (SBO 1024, LBO unused), V MN-major
    // (LBO: the next 64-column block, SBO: the next 8 keys).
    const uint64_t q_desc = sm90::desc_k_sw128(q_smem + wg * 64 * 128);
    const uint64_t k_desc0 = sm90::desc_k_sw128(k_smem);
    const uint64_t v_desc0 = sm90::desc_mn_sw128(v_smem, T9::kVBlockBytes);
    const int diag_wg = tile.diag == kNoDiag ? kNoDiag : tile.diag + wg * 64;

    for (int step = 0; step < num_steps; ++step) {
      const int stage = (stage0 + step) & 1;
      const bool last = step + 1 == num_steps;
      // One barrier per step: after it the current stage is visible to the async proxy and
      // every thread has finished step - 1, so the other stage can be refilled.
      cp_async_wait<0>();
      sm90::fence_proxy_async();
      __syncthreads();

      // S[64 x 128] = Q[64 x 192] K^T: 12 k-steps of 16, 4 per 64-column swizzle block.
      // Ping-pong: warpgroup 1 issues after warpgroup 0, so the tensor cores run S0, S1, PV0,
      // PV1 in order and each warpgroup's softmax overlaps the other's matrix work.
      float s[T9::kBlockN / 2];
      const uint64_t k_desc = k_desc0 + ((stage * T9::kKBytes) >> 4);
      if (wg == 1) sm90::bar_sync(kPingPongBarrier, T9::kThreads);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < T9::kHeadDimQk / 16; ++kk) {
        const uint32_t off_q = (kk / 4) * T9::kQBlockBytes + (kk % 4) * 32;
        const uint32_t off_k = (kk / 4) * T9::kKBlockBytes + (kk % 4) * 32;
        sm90::wgmma_ss_bf16<T9::kBlockN, 0>(s, q_desc + (off_q >> 4), k_desc + (off_k >> 4),
                                            kk > 0);
      }
      sm90::wgmma_commit();
      if (wg == 0) sm90::bar_arrive(kPingPongBarrier, T9::kThreads);
      // Next K/V stage (this unit's next step, or the next unit's first) into the other stage
      // while the tensor cores run QK^T.
      if (!last) {
        load_kv(p, u, (step + 1) * T9::kBlockN, k_smem + (stage ^ 1) * T9::kKBytes,
                v_smem + (stage ^ 1) * T9::kVBytes, tid);
        cp_async_commit();
      } else if (prefetch) {
        load_kv(p, next, 0, k_smem + (stage ^ 1) * T9::kKBytes, v_smem + (stage ^ 1) * T9::kVBytes,
                tid);
        cp_async_commit();
      }
      sm90::wgmma_wait<0>();
      sm90::fence_regs(s);

      const int key_base = step * T9::kBlockN;
      const bool need_mask =
          key_base + T9::kBlockN > tile.kv_len || key_base + T9::kBlockN - 1 > diag_wg;
      if (need_mask) sm90k::apply_mask(s, key_base, tile.kv_len, tile.diag, row0, lane);
      sm90k::online_softmax(s, m, l, o, p.scale_log2);

      // O[64 x 128] += P[64 x 128] V[128 x 128]: 8 k-steps of 16 keys (2048 bytes each).
      const uint64_t v_desc = v_desc0 + ((stage * T9::kVBytes) >> 4);
      // P as bf16 A fragments (the mma.sync m16n8k16 A layout), all packed before the fence so
      // no register is written between the wgmmas.
      uint32_t pa[T9::kBlockN / 16][4];
#pragma unroll
      for (int kk = 0; kk < T9::kBlockN / 16; ++kk) {
        pa[kk][0] = pack_bf16(s[4 * (2 * kk) + 0], s[4 * (2 * kk) + 1]);
        pa[kk][1] = pack_bf16(s[4 * (2 * kk) + 2], s[4 * (2 * kk) + 3]);
        pa[kk][2] = pack_bf16(s[4 * (2 * kk + 1) + 0], s[4 * (2 * kk + 1) + 1]);
        pa[kk][3] = pack_bf16(s[4 * (2 * kk + 1) + 2], s[4 * (2 * kk + 1) + 3]);
      }
      sm90::fence_regs(o);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < T9::kBlockN / 16; ++kk) {
        sm90::wgmma_rs_bf16<T9::kHeadDimV, 1>(o, pa[kk], v_desc + ((kk * 16 * 128) >> 4), true);
      }
      sm90::wgmma_commit();
      if (last && prefetch) {
        // Both warpgroups' QK^T are complete past this barrier: Q can be refilled.
        sm90::bar_sync(kQFreeBarrier, T9::kThreads);
        load_q(p, next, q_smem, tid);
        cp_async_commit();
      }
      sm90::wgmma_wait<0>();
      sm90::fence_regs(o);
    }
    __syncthreads();  // smem (Q, both stages) is free for the next unit's loads
  }
  sm90k::write_o(p, tile, u.head, o, m, l, row0, lane);
  return (stage0 + num_steps) & 1;
}

// Units: (tile, head) pairs in groups of the plan header's head_group heads,
// tile-major inside a group, so the CTAs running at the same time share the K/V of a few heads
// in L2. Each unit's last step prefetches the next unit's Q and first K/V stage.
__global__ void __launch_bounds__(T9::kThreads, 1) mha_fwd_sm90_kernel(const MhaParams p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (sm90::smem_u32(smem_raw) + 1023u) & ~1023u;  // 1024-aligned atoms
  const uint32_t q_smem = base;
  const uint32_t k_smem = q_smem + T9::kQBytes;
  const uint32_t v_smem = k_smem + T9::kStages * T9::kKBytes;
  const auto* header = static_cast<const MhaPlanHeader*>(p.plan);
  const auto* tiles = reinterpret_cast<const MhaTile*>(header + 1);
  const int num_tiles = header->num_tiles;
  const int heads = p.num_heads;
  const int num_units = num_tiles * heads;
  const int head_group = max(header->head_group, 1);
  int unit = static_cast<int>(blockIdx.x);
  if (unit >= num_units) return;
  Unit cur = make_unit(tiles, unit, num_tiles, heads, head_group);
  bool loaded = false;
  int stage0 = 0;
  while (true) {
    const int next_unit = unit + static_cast<int>(gridDim.x);
    const bool has_next = next_unit < num_units;
    Unit next = cur;
    if (has_next) next = make_unit(tiles, next_unit, num_tiles, heads, head_group);
    const bool prefetch = has_next && next.num_steps > 0 && cur.num_steps > 0;
    stage0 = sm90k::run_unit(p, cur, loaded, stage0, next, prefetch, q_smem, k_smem, v_smem);
    if (!has_next) break;
    loaded = prefetch;
    unit = next_unit;
    cur = next;
  }
}

}  // namespace mla::cuda::mha::sm90k
