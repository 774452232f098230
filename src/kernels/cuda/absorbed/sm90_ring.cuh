// Absorbed paged MLA attention, version 2.1 (Hopper, sm_90a): 64-row tiles on wgmma with a ring
// of 32-key half tiles, so three halves (108 KB) are in flight while one computes (version 2:
// one 72 KB tile, issued at the start of the step and awaited at its end).
//
// Two consumer warpgroups (256 threads), one CTA per SM, per half tile of 32 keys:
//   S_w = Q[:, dims of w] . K[:, dims of w]^T  (m64n32k16 SS x 18 k-steps; warpgroup w takes the
//   dims [288 w, +288)), then S = S_0 + S_1 through an 8 KB exchange buffer in two phases
//   (named barriers: warpgroup 1 publishes S_1, warpgroup 0 adds and publishes S, warpgroup 1
//   takes it), so both warpgroups hold the same S (bitwise) and run the same online softmax on
//   all 32 keys of the rows: no row-max exchange, no P tile in shared memory;
//   O_w += P . V[:, 256 w, +256)  (m64n256k16 RS x 2 k-steps: P as bf16 A fragments straight
//   from the S registers; V read MN-major from the half tile).
// Shared memory (1024-byte aligned): Q [9 blocks][64 rows][128 B] | 4 half slots, each
// [9 blocks][32 rows][128 B] | exchange float4 [4][128] | slot lists int32 [8][32].
// Per-thread cp.async groups, one per half, with a compile-time wait count: at the top of step
// h, half h must have landed (halves h + 1, h + 2 may be pending), then half h + 3 is issued
// into the slot that step h - 1 used. Slots of half h + 7 are looked up at the top of step h and
// stored into their list in step h + 3 (read at the top of step h + 4).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/traits.h"
#include "kernels/cuda/sm90/wgmma.cuh"

namespace mla::cuda::absorbed {
namespace ring {

using namespace mla::cuda::sm90;

inline constexpr int kHalfKeys = 32;
inline constexpr int kRing = 4;                              // half slots
inline constexpr int kLists = 8;                             // slot lists (>= kRing + 4)
inline constexpr int kLookAhead = 3;  // steps a slot lookup has before it is stored
inline constexpr int kQBlockBytes = 64 * 128;                // Q block: [64 rows][128 B]
inline constexpr int kHBlockBytes = kHalfKeys * 128;         // half block: [32 rows][128 B]
inline constexpr int kHalfBytes = (kDimQk / 64) * kHBlockBytes;  // 36864
inline constexpr int kQOff = 0;
inline constexpr int kRingOff = (kDimQk / 64) * kQBlockBytes;    // 73728
inline constexpr int kXOff = kRingOff + kRing * kHalfBytes;      // 221184
inline constexpr int kSlotsOff = kXOff + 4 * 128 * 16;           // 229376
inline constexpr int kSmemBytes = kSlotsOff + kLists * kHalfKeys * 4 + 1024;  // + align slack
static_assert(kSmemBytes <= 232448, "exceeds the 227 KiB shared memory of one Hopper SM");
static_assert(kMaxRows == 64 && kThreads == 256 && kBlockN % kHalfKeys == 0);

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_groups() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Named barriers 1 and 2 (0 is __syncthreads): one warpgroup arrives, the other waits.
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void bar_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
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
    cp16(q_s + (ch >> 3) * kQBlockBytes + sw128_offset(r, ch & 7), src, valid);
  }
}

// Gathers the 32 key rows of one half tile (slot -1: zero-filled) into a half slot.
__device__ __forceinline__ void load_half(const AbsorbedParams& p, const int32_t* slots,
                                          uint32_t dst) {
#pragma unroll
  for (int i = 0; i < kHalfKeys * 72 / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int k = c / 72, ch = c % 72;
    const int32_t slot = slots[k];
    const uint16_t* src =
        slot >= 0 ? p.kv_cache + static_cast<int64_t>(slot) * kDimQk + ch * 8 : p.kv_cache;
    cp16(dst + (ch >> 3) * kHBlockBytes + sw128_offset(k, ch & 7), src, slot >= 0);
  }
}
static_assert(kHalfKeys * 72 % kThreads == 0);

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// kLateIssue (A/B, MLA_ABSORBED_WGMMA=3): half hf + 3 is issued after the QK wgmmas of step hf
// instead of before them.
template <bool kLateIssue>
__device__ void tile64_ring(const AbsorbedParams& p, const PlanHeader& h, unsigned char* smem) {
  const int tid = threadIdx.x, wgi = tid >> 7, t128 = tid & 127;
  const int w = (tid >> 5) & 3, lane = tid & 31;
  const int r_lo = 16 * w + (lane >> 2), r_hi = r_lo + 8;  // this thread's rows
  const uint32_t base = smem_u32(smem);
  const uint32_t q_s = base + kQOff, ring_s = base + kRingOff;
  float4* xbuf = reinterpret_cast<float4*>(smem + kXOff) + t128;  // this thread's 4 float4
  int32_t* slots = reinterpret_cast<int32_t*>(smem + kSlotsOff);
  const uint64_t desc_k0 = desc_k_sw128(0), desc_mn0 = desc_mn_sw128(0, kHBlockBytes);

  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];

  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_halves = (u.kv_end - u.kv_begin + kHalfKeys - 1) / kHalfKeys;
    __syncthreads();  // the previous unit is done with every buffer
    if (tid < kRing * kHalfKeys) {  // slot lists of halves 0..3
      slots[tid] = slot_of(p, u, u.kv_begin + tid, h.page_size);
    }
    // Warp 0: slots of key tid of halves hf + 4 .. hf + 6, in flight or held in registers.
    int32_t pend[kLookAhead];
#pragma unroll
    for (int i = 0; i < kLookAhead; ++i) {
      pend[i] = tid < kHalfKeys
                    ? slot_of(p, u, u.kv_begin + (kRing + i) * kHalfKeys + tid, h.page_size) : -1;
    }
    load_q(p, u, q_s);
    __syncthreads();
    // Groups: {Q, half 0}, {half 1}, {half 2}; empty groups keep the wait counts fixed.
#pragma unroll
    for (int hh = 0; hh < kRing - 1; ++hh) {
      if (hh < n_halves) load_half(p, slots + hh * kHalfKeys, ring_s + hh * kHalfBytes);
      commit();
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

    for (int hf = 0; hf < n_halves; ++hf) {
      const int key0 = u.kv_begin + hf * kHalfKeys;
      wait_groups<kRing - 2>();  // half hf (and Q) of this thread landed
      fence_proxy_async();       // cp.async data -> visible to wgmma
      __syncthreads();           // ... of every thread; every warpgroup is done with hf - 1
      // Slot of key tid of half hf + 7, looked up before this step's gather is queued and
      // stored into its list three steps later: a lookup queued behind the gathers in flight
      // returns only when they do, so it must not be awaited in the step that issued it.
      int32_t fresh = -1;
      if (tid < kHalfKeys) {
        fresh = slot_of(p, u, key0 + (kRing + kLookAhead) * kHalfKeys + tid, h.page_size);
      }
      const auto issue = [&] {
        if (hf + kRing - 1 < n_halves) {
          const int hn = hf + kRing - 1;
          load_half(p, slots + (hn % kLists) * kHalfKeys, ring_s + (hn % kRing) * kHalfBytes);
        }
        commit();
      };
      if (!kLateIssue) issue();
      const uint32_t k_s = ring_s + (hf % kRing) * kHalfBytes;

      // S partial over this warpgroup's 18 k-steps (dims [288 wgi, +288)).
      float s[16];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kDimQk / 32; ++kk) {
        const int kg = wgi * (kDimQk / 32) + kk;
        const uint32_t col = (kg & 3) * 32;
        const uint64_t da = desc_k0 + ((q_s + (kg >> 2) * kQBlockBytes + col) >> 4);
        const uint64_t db = desc_k0 + ((k_s + (kg >> 2) * kHBlockBytes + col) >> 4);
        wgmma_ss_bf16<32, 0>(s, da, db, kk > 0);
      }
      wgmma_commit();
      if (kLateIssue) issue();
      wgmma_wait<0>();
      fence_regs(s);

      // S = S_0 + S_1 (thread t of one warpgroup holds the same elements as thread t of the
      // other). Warpgroup 0 computes the sum; warpgroup 1 takes it, so both are bitwise equal.
      if (wgi == 1) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          xbuf[j * 128] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
        }
        bar_arrive(1);
        bar_sync(2);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 v = xbuf[j * 128];
          s[4 * j] = v.x, s[4 * j + 1] = v.y, s[4 * j + 2] = v.z, s[4 * j + 3] = v.w;
        }
      } else {
        bar_sync(1);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 v = xbuf[j * 128];
          s[4 * j] += v.x, s[4 * j + 1] += v.y, s[4 * j + 2] += v.z, s[4 * j + 3] += v.w;
          xbuf[j * 128] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
        }
        bar_arrive(2);
      }

      // online_softmax over the 32 keys of this thread's two rows (quad reductions only).
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = key0 + 8 * j + 2 * (lane & 3) + (i & 1);
          float v = s[4 * j + i] * p.scale_log2;
          if (key >= lim[i >> 1]) v = -INFINITY;
          s[4 * j + i] = v;
          tmax[i >> 1] = fmaxf(tmax[i >> 1], v);
        }
      float alpha[2], m_use[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
        const float m_new = fmaxf(m[i], tmax[i]);
        m_use[i] = m_new == -INFINITY ? 0.f : m_new;
        alpha[i] = exp2f(m[i] - m_use[i]);  // m = -inf -> 0
        m[i] = m_new;
        l[i] *= alpha[i];
      }
      // P as the A fragments of the two k16 steps: a[0] row lo keys 2q.., a[1] row hi, a[2] row
      // lo keys 8 + 2q.., a[3] row hi (S columns 8 j + 2q: j = 2 ks, 2 ks + 1).
      uint32_t pa[2][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p0 = exp2f(s[4 * j + 0] - m_use[0]), p1 = exp2f(s[4 * j + 1] - m_use[0]);
        const float p2 = exp2f(s[4 * j + 2] - m_use[1]), p3 = exp2f(s[4 * j + 3] - m_use[1]);
        l[0] += p0 + p1;
        l[1] += p2 + p3;
        pa[j >> 1][(j & 1) * 2 + 0] = pack2(p0, p1);
        pa[j >> 1][(j & 1) * 2 + 1] = pack2(p2, p3);
      }
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

      // O[64 x 256 columns of this warpgroup] += P[64 x 32] . V[32 x 256].
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kHalfKeys / 16; ++ks) {
        const uint64_t db =
            desc_mn0 + ((k_s + wgi * 4 * kHBlockBytes + ks * 16 * 128) >> 4);
        wgmma_rs_bf16<256, 1>(o, pa[ks], db, true);
      }
      wgmma_commit();
      // List (hf + 4) % 8 last held half hf - 4, read at the top of step hf - 7; it is next
      // read at the top of step hf + 1.
      if (tid < kHalfKeys) slots[((hf + kRing) % kLists) * kHalfKeys + tid] = pend[0];
#pragma unroll
      for (int i = 0; i + 1 < kLookAhead; ++i) pend[i] = pend[i + 1];
      pend[kLookAhead - 1] = fresh;
      wgmma_wait<0>();
      fence_regs(o);
    }
    wait_groups<0>();

    // write_o: both warpgroups hold the same m and l; row sums over the quad.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
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

}  // namespace ring
}  // namespace mla::cuda::absorbed
