// Ragged MHA forward for Hopper (sm_90a), FlashAttention-3 style: one CTA of a producer warpgroup
// and 2 consumer warpgroups runs 128-row query tiles of one head (64 rows per warpgroup),
// persistent over the plan's (tile, head) units. One producer thread loads Q (128 x
// 192) and, per 128-key step, K (128 x 192) and V (128 x 128) by TMA (3-D tensor maps {dim,
// head, token}, 128-byte swizzle applied by the copy engine) into a Q buffer and two-slot K and
// V rings, each slot guarded by a full mbarrier (transaction bytes) and an empty mbarrier (one
// arrival per consumer warp). The consumers compute S = Q K^T by wgmma m64n128k16 SS (Q and K
// K-major), the online softmax on the accumulator fragment (log2 domain), and O += P V by wgmma
// RS with P in registers (V read MN-major). Per warpgroup the steps are software-pipelined:
// step j issues S_j and O += P_{j-1} V_{j-1} together, then runs the softmax of S_j while the
// tensor cores do the P V (O is rescaled after it lands). Between the warpgroups a ping-pong of
// named barriers orders the issues (0, 1, 0, 1, ...) so one warpgroup's softmax runs under the
// other's matrix work. Rows of a box past the request's keys are other requests' rows (or zeros
// past the tensor): S masks them to -inf, so their P is 0 (k / v rows inside the views must be
// finite). Same plan, LSE and empty-row conventions as the cp.async kernel it replaced
// (docs/kernels.md).
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

using sm90::exp2_ftz;
using sm90::pack_bf16;
using sm90::unpack_bf16;

// Named barriers (0 is __syncthreads): kTurn + w: warpgroup w may issue its wgmmas (the other
// warpgroup arrives after issuing its own).
constexpr int kTurn = 1;

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

// Online softmax of one step for the thread's two rows, in the log2 domain: running max m
// (scaled) and sum l updated, s turned into probabilities exp2(s * scale_log2 - m) with one FMA
// each; alpha: the factor the output accumulator must be rescaled by (applied by the caller once
// the previous P V has landed).
__device__ __forceinline__ void softmax_step(float (&s)[T9::kBlockN / 2], float (&m)[2],
                                             float (&l)[2], float (&alpha)[2], float scale_log2) {
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
    alpha[r] = exp2_ftz(m[r] - m_use);
    m[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < T9::kBlockN / 8; ++j) {
      s[4 * j + 2 * r] = exp2_ftz(fmaf(s[4 * j + 2 * r], scale_log2, -m_use));
      s[4 * j + 2 * r + 1] = exp2_ftz(fmaf(s[4 * j + 2 * r + 1], scale_log2, -m_use));
      sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
    l[r] = l[r] * alpha[r] + sum;
  }
}

__device__ __forceinline__ void rescale_o(float (&o)[T9::kHeadDimV / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int d = 0; d < T9::kHeadDimV / 8; ++d) {
    o[4 * d + 0] *= alpha[0];
    o[4 * d + 1] *= alpha[0];
    o[4 * d + 2] *= alpha[1];
    o[4 * d + 3] *= alpha[1];
  }
}

// P as bf16 A fragments of the RS wgmma (the mma.sync m16n8k16 A layout).
__device__ __forceinline__ void pack_p(const float (&s)[T9::kBlockN / 2],
                                       uint32_t (&pa)[T9::kBlockN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < T9::kBlockN / 16; ++kk) {
    pa[kk][0] = pack_bf16(s[4 * (2 * kk) + 0], s[4 * (2 * kk) + 1]);
    pa[kk][1] = pack_bf16(s[4 * (2 * kk) + 2], s[4 * (2 * kk) + 3]);
    pa[kk][2] = pack_bf16(s[4 * (2 * kk + 1) + 0], s[4 * (2 * kk + 1) + 1]);
    pa[kk][3] = pack_bf16(s[4 * (2 * kk + 1) + 2], s[4 * (2 * kk + 1) + 3]);
  }
}

// S[64 x 128] = Q[64 x 192] K^T: 12 k-steps of 16, 4 per 64-column swizzle block. Not
// committed.
__device__ __forceinline__ void issue_qk(float (&s)[T9::kBlockN / 2], uint64_t q_desc,
                                         uint64_t k_desc) {
#pragma unroll
  for (int kk = 0; kk < T9::kHeadDimQk / 16; ++kk) {
    const uint32_t off_q = (kk / 4) * T9::kQBlockBytes + (kk % 4) * 32;
    const uint32_t off_k = (kk / 4) * T9::kKBlockBytes + (kk % 4) * 32;
    sm90::wgmma_ss_bf16<T9::kBlockN, 0>(s, q_desc + (off_q >> 4), k_desc + (off_k >> 4), kk > 0);
  }
}

// O[64 x 128] += P[64 x 128] V[128 x 128]: 8 k-steps of 16 keys (2048 bytes each). Not
// committed.
__device__ __forceinline__ void issue_pv(float (&o)[T9::kHeadDimV / 2],
                                         const uint32_t (&pa)[T9::kBlockN / 16][4],
                                         uint64_t v_desc) {
#pragma unroll
  for (int kk = 0; kk < T9::kBlockN / 16; ++kk) {
    sm90::wgmma_rs_bf16<T9::kHeadDimV, 1>(o, pa[kk], v_desc + ((kk * 16 * 128) >> 4), true);
  }
}

// Normalises and stores the thread's two rows; a row that saw no key gets o = 0, lse = -inf.
// With p.merge_into_output the rows' state already in (o, lse) is merged with the unit's
// (SYSTEM.md 1, in the log2 domain): weights wa = 2^(lse_old - M) and wb = 2^(lse_new - M) of
// M = max; a row this unit saw no key of keeps its state; both empty: o = 0, lse = -inf.
__device__ __forceinline__ void write_o(const MhaParams& p, const MhaTile& tile, int head,
                                        float (&o)[T9::kHeadDimV / 2], const float (&m)[2],
                                        float (&l)[2], int row0, int lane) {
  constexpr float kLn2 = 0.69314718055994531f, kLog2e = 1.4426950408889634f;
  const int t = lane & 3;
  // The previous state's lse, read by all four threads of a row before its first thread
  // overwrites it (the __syncwarp orders the reads before any write of the warp).
  float lse_old[2] = {-INFINITY, -INFINITY};
  if (p.merge_into_output) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + r * 8;
      if (row < tile.q_rows) {
        lse_old[r] = p.lse[(tile.q_start + row) * p.lse_row_stride + head] * kLog2e;
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = row0 + r * 8;
    if (row >= tile.q_rows) continue;
    const bool empty = l[r] == 0.f;
    const int64_t q_row = tile.q_start + row;
    uint16_t* dst = p.o + q_row * p.o_row_stride + head * p.o_head_stride + 2 * t;
    float* lse_dst = p.lse != nullptr ? p.lse + q_row * p.lse_row_stride + head : nullptr;
    if (p.merge_into_output) {
      if (empty && lse_old[r] != -INFINITY) continue;  // an empty state changes nothing
      if (empty) {                                     // neither state saw a key: o = 0, lse = -inf
#pragma unroll
        for (int d = 0; d < T9::kHeadDimV / 8; ++d) *reinterpret_cast<uint32_t*>(dst + d * 8) = 0u;
        if (t == 0) *lse_dst = -INFINITY;
        continue;
      }
      const float lse_new = m[r] + log2f(l[r]);
      const float mx = fmaxf(lse_old[r], lse_new);
      const float wa = exp2f(lse_old[r] - mx), wb = exp2f(lse_new - mx);  // wa = 0 when old empty
      const float inv = 1.f / (wa + wb);
      const float ca = wa * inv, cb = wb * inv / l[r];
#pragma unroll
      for (int d = 0; d < T9::kHeadDimV / 8; ++d) {
        auto* pair = reinterpret_cast<uint32_t*>(dst + d * 8);
        const float2 old = unpack_bf16(*pair);
        *pair =
            pack_bf16(ca * old.x + cb * o[4 * d + 2 * r], ca * old.y + cb * o[4 * d + 2 * r + 1]);
      }
      if (t == 0) *lse_dst = (mx + log2f(wa + wb)) * kLn2;
      continue;
    }
    const float inv = empty ? 0.f : 1.f / l[r];
#pragma unroll
    for (int d = 0; d < T9::kHeadDimV / 8; ++d) {
      *reinterpret_cast<uint32_t*>(dst + d * 8) =
          pack_bf16(o[4 * d + 2 * r] * inv, o[4 * d + 2 * r + 1] * inv);
    }
    if (lse_dst != nullptr && t == 0) {
      *lse_dst = empty ? -INFINITY : (m[r] + log2f(l[r])) * kLn2;
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

// Tile index and head of schedule position `unit`.
__device__ __forceinline__ void unit_tile_head(int unit, int num_tiles, int heads, int head_group,
                                               int& tile, int& head) {
  const int group_units = num_tiles * head_group;
  const int group = unit / group_units;
  const int r = unit - group * group_units;
  const int group_heads = min(head_group, heads - group * head_group);
  tile = r / group_heads;
  head = group * head_group + r % group_heads;
}

__device__ __forceinline__ Unit make_unit(const MhaTile* tiles, int unit, int num_tiles, int heads,
                                          int head_group) {
  int t = 0;
  Unit u;
  unit_tile_head(unit, num_tiles, heads, head_group, t, u.head);
  u.tile = tiles[t];
  u.kv_end = u.tile.kv_len;
  if (u.tile.diag != kNoDiag) u.kv_end = min(u.kv_end, max(u.tile.diag + u.tile.q_rows, 0));
  u.num_steps = (u.kv_end + T9::kBlockN - 1) / T9::kBlockN;
  return u;
}

// Shared-memory addresses of the rings and barriers.
struct Smem {
  uint32_t q, k, v;  // Q; K slot s at k + s * kKBytes; V slot s at v + s * kVBytes
  uint32_t q_full, q_empty;
  uint32_t k_full, k_empty, v_full, v_empty;  // slot s at + 8 * s
};

// The producer: one thread loads, for each unit of the CTA with keys, K_0, Q, V_0, K_1, V_1, ...
// A slot is refilled once every consumer warp has arrived on its empty barrier (the first use of
// a slot passes at once: parity 1 of a fresh barrier reads as complete).
__device__ __forceinline__ void produce(const MhaParams& p, const MhaTile* tiles, int num_tiles,
                                        int head_group, const Smem& sm) {
  const int heads = p.num_heads;
  const int num_units = num_tiles * heads;
  uint32_t q_iter = 0, kv_iter = 0;
  for (int unit = static_cast<int>(blockIdx.x); unit < num_units;
       unit += static_cast<int>(gridDim.x)) {
    const Unit u = make_unit(tiles, unit, num_tiles, heads, head_group);
    if (u.num_steps <= 0) continue;
    for (int step = 0; step < u.num_steps; ++step, ++kv_iter) {
      const uint32_t s = kv_iter & 1u, ph = (kv_iter >> 1) & 1u;
      const int key = u.tile.kv_start + step * T9::kBlockN;
      sm90::mbar_wait(sm.k_empty + 8 * s, ph ^ 1u);
      sm90::mbar_arrive_expect_tx(sm.k_full + 8 * s, T9::kKBytes);
#pragma unroll
      for (int b = 0; b < T9::kHeadDimQk / 64; ++b) {
        sm90::tma_load_3d(sm.k + s * T9::kKBytes + b * T9::kKBlockBytes, p.k_tmap, 64 * b, u.head,
                          key, sm.k_full + 8 * s);
      }
      if (step == 0) {
        sm90::mbar_wait(sm.q_empty, (q_iter & 1u) ^ 1u);
        sm90::mbar_arrive_expect_tx(sm.q_full, T9::kQBytes);
#pragma unroll
        for (int b = 0; b < T9::kHeadDimQk / 64; ++b) {
          sm90::tma_load_3d(sm.q + b * T9::kQBlockBytes, p.q_tmap, 64 * b, u.head, u.tile.q_start,
                            sm.q_full);
        }
        ++q_iter;
        // The next unit's Q (read by that unit alone, so not in L2 yet) into L2: its load
        // waits until this unit's last Q K^T, and then hits L2 instead of HBM.
        const int next_unit = unit + static_cast<int>(gridDim.x);
        if (next_unit < num_units) {
          const Unit nu = make_unit(tiles, next_unit, num_tiles, heads, head_group);
          if (nu.num_steps > 0) {
#pragma unroll
            for (int b = 0; b < T9::kHeadDimQk / 64; ++b) {
              sm90::tma_prefetch_3d(p.q_tmap, 64 * b, nu.head, nu.tile.q_start);
            }
          }
        }
      }
      sm90::mbar_wait(sm.v_empty + 8 * s, ph ^ 1u);
      sm90::mbar_arrive_expect_tx(sm.v_full + 8 * s, T9::kVBytes);
#pragma unroll
      for (int b = 0; b < T9::kHeadDimV / 64; ++b) {
        sm90::tma_load_3d(sm.v + s * T9::kVBytes + b * T9::kVBlockBytes, p.v_tmap, 64 * b, u.head,
                          key, sm.v_full + 8 * s);
      }
    }
  }
}

// One consumer warpgroup's turn at the tensor cores (see kTurn).
__device__ __forceinline__ void turn_wait(int wg) {
  sm90::bar_sync(kTurn + wg, T9::kConsumerThreads);
}
__device__ __forceinline__ void turn_pass(int wg) {
  sm90::bar_arrive(kTurn + (wg ^ 1), T9::kConsumerThreads);
}
// One arrival per consumer warp (the empty barriers count kConsumerThreads / 32).
__device__ __forceinline__ void release(uint32_t bar, int lane) {
  __syncwarp();
  if (lane == 0) sm90::mbar_arrive(bar);
}

// Units: (tile, head) pairs in groups of the plan header's head_group heads, tile-major inside
// a group, so the CTAs running at the same time share the K/V of a few heads in L2.
__global__ void __launch_bounds__(T9::kThreads, 1)
    mha_fwd_sm90_kernel(const __grid_constant__ MhaParams p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (sm90::smem_u32(smem_raw) + 1023u) & ~1023u;  // 1024-aligned atoms
  Smem sm;
  sm.q = base;
  sm.k = base + T9::kKOff;
  sm.v = base + T9::kVOff;
  sm.q_full = base + T9::kBarOff;
  sm.q_empty = sm.q_full + 8;
  sm.k_full = sm.q_full + 16;
  sm.k_empty = sm.k_full + 8 * T9::kStages;
  sm.v_full = sm.k_empty + 8 * T9::kStages;
  sm.v_empty = sm.v_full + 8 * T9::kStages;
  const int tid = static_cast<int>(threadIdx.x);
  constexpr uint32_t kConsumerWarps = T9::kConsumerThreads / 32;
  if (tid == 0) {
    sm90::mbar_init(sm.q_full, 1);
    sm90::mbar_init(sm.q_empty, kConsumerWarps);
    for (int s = 0; s < T9::kStages; ++s) {
      sm90::mbar_init(sm.k_full + 8 * s, 1);
      sm90::mbar_init(sm.k_empty + 8 * s, kConsumerWarps);
      sm90::mbar_init(sm.v_full + 8 * s, 1);
      sm90::mbar_init(sm.v_empty + 8 * s, kConsumerWarps);
    }
    sm90::fence_mbarrier_init();
  }
  __syncthreads();

  const auto* header = static_cast<const MhaPlanHeader*>(p.plan);
  const auto* tiles = reinterpret_cast<const MhaTile*>(header + 1);
  const int num_tiles = header->num_tiles;
  const int heads = p.num_heads;
  const int num_units = num_tiles * heads;
  const int head_group = max(header->head_group, 1);

  if (tid >= T9::kConsumerThreads) {
    sm90::setmaxnreg_dec<T9::kProducerRegs>();
    if (tid == T9::kConsumerThreads) {
      sm90::prefetch_tensormap(p.q_tmap);  // k / v maps are not encoded when no request has keys
      produce(p, tiles, num_tiles, head_group, sm);
    }
    return;
  }

  sm90::setmaxnreg_inc<T9::kConsumerRegs>();
  const int wg = tid / 128;
  const int lane = tid % 32;
  const int row0 = wg * 64 + ((tid % 128) / 32) * 16 + (lane >> 2);
  // Descriptors without the start address: Q/K K-major (SBO 1024, LBO unused), V MN-major
  // (LBO: the next 64-column block, SBO: the next 8 keys).
  const uint64_t q_desc = sm90::desc_k_sw128(sm.q + wg * 64 * 128);
  const uint64_t k_desc0 = sm90::desc_k_sw128(sm.k);
  const uint64_t v_desc0 = sm90::desc_mn_sw128(sm.v, T9::kVBlockBytes);
  if (wg == 1) sm90::bar_arrive(kTurn + 0, T9::kConsumerThreads);  // warpgroup 0 goes first

  uint32_t q_iter = 0, kv_iter = 0;
  for (int unit = static_cast<int>(blockIdx.x); unit < num_units;
       unit += static_cast<int>(gridDim.x)) {
    const Unit u = make_unit(tiles, unit, num_tiles, heads, head_group);
    const MhaTile& tile = u.tile;
    const int n = u.num_steps;
    // The next unit's tile into L1 now, so reading it after this unit's epilogue does not wait.
    if (unit + static_cast<int>(gridDim.x) < num_units) {
      int nt = 0, nh = 0;
      unit_tile_head(unit + static_cast<int>(gridDim.x), num_tiles, heads, head_group, nt, nh);
      sm90::prefetch_l1(tiles + nt);
    }
    float o[T9::kHeadDimV / 2];
#pragma unroll
    for (int i = 0; i < T9::kHeadDimV / 2; ++i) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.f, 0.f};
    if (n > 0) {
      const int diag_wg = tile.diag == kNoDiag ? kNoDiag : tile.diag + wg * 64;
      float s[T9::kBlockN / 2];
      float alpha[2];
      uint32_t pa[T9::kBlockN / 16][4];

      // Step 0: S_0 alone.
      {
        const uint32_t ks = kv_iter & 1u, kph = (kv_iter >> 1) & 1u;
        sm90::mbar_wait(sm.q_full, q_iter & 1u);
        sm90::mbar_wait(sm.k_full + 8 * ks, kph);
        turn_wait(wg);
        sm90::wgmma_fence();
        issue_qk(s, q_desc, k_desc0 + ((ks * T9::kKBytes) >> 4));
        sm90::wgmma_commit();
        turn_pass(wg);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(s);
        release(sm.k_empty + 8 * ks, lane);
        if (n == 1) release(sm.q_empty, lane);
        const bool need_mask = T9::kBlockN > tile.kv_len || T9::kBlockN - 1 > diag_wg;
        if (need_mask) apply_mask(s, 0, tile.kv_len, tile.diag, row0, lane);
        softmax_step(s, m, l, alpha, p.scale_log2);
        pack_p(s, pa);
      }
      // Step j: S_j and O += P_{j-1} V_{j-1} issued together; the softmax of S_j runs while
      // the P V is in flight.
      for (int j = 1; j < n; ++j) {
        const uint32_t it = kv_iter + static_cast<uint32_t>(j);
        const uint32_t ks = it & 1u, kph = (it >> 1) & 1u;
        const uint32_t vs = (it - 1) & 1u, vph = ((it - 1) >> 1) & 1u;
        sm90::mbar_wait(sm.k_full + 8 * ks, kph);
        sm90::mbar_wait(sm.v_full + 8 * vs, vph);
        turn_wait(wg);
        sm90::fence_regs(o);
        sm90::wgmma_fence();
        issue_qk(s, q_desc, k_desc0 + ((ks * T9::kKBytes) >> 4));
        sm90::wgmma_commit();
        issue_pv(o, pa, v_desc0 + ((vs * T9::kVBytes) >> 4));
        sm90::wgmma_commit();
        turn_pass(wg);
        sm90::wgmma_wait<1>();
        sm90::fence_regs(s);
        release(sm.k_empty + 8 * ks, lane);
        if (j == n - 1) release(sm.q_empty, lane);
        const int key_base = j * T9::kBlockN;
        const bool need_mask =
            key_base + T9::kBlockN > tile.kv_len || key_base + T9::kBlockN - 1 > diag_wg;
        if (need_mask) apply_mask(s, key_base, tile.kv_len, tile.diag, row0, lane);
        softmax_step(s, m, l, alpha, p.scale_log2);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o);
        release(sm.v_empty + 8 * vs, lane);
        rescale_o(o, alpha);
        pack_p(s, pa);
      }
      // Last: O += P_{n-1} V_{n-1}.
      {
        const uint32_t it = kv_iter + static_cast<uint32_t>(n - 1);
        const uint32_t vs = it & 1u, vph = (it >> 1) & 1u;
        sm90::mbar_wait(sm.v_full + 8 * vs, vph);
        turn_wait(wg);
        sm90::fence_regs(o);
        sm90::wgmma_fence();
        issue_pv(o, pa, v_desc0 + ((vs * T9::kVBytes) >> 4));
        sm90::wgmma_commit();
        turn_pass(wg);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o);
        release(sm.v_empty + 8 * vs, lane);
      }
      kv_iter += static_cast<uint32_t>(n);
      ++q_iter;
    }
    write_o(p, tile, u.head, o, m, l, row0, lane);
  }
  // Warpgroup 1 passed the turn once more than warpgroup 0 took it: take it, so no named
  // barrier is left half-arrived at exit.
  if (wg == 0) turn_wait(0);
}

}  // namespace mla::cuda::mha::sm90k
