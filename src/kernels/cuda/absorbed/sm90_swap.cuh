// The swapped-operand absorbed kernel for an fp8 e4m3 cache and at most 32 heads (Hopper,
// sm_90a): the case where decode is memory-bound and the 64-row kernel (sm90_ws.cuh) wastes most
// of its tensor work on padding rows and converts every tile to bf16 in shared memory on the
// critical path (docs/kernels.md, "fp8 e4m3").
//
// Keys are the wgmma M dimension and the unit's query rows (heads x tokens, at most kSwapN =
// 32 per pass) its N: per tile of kSwapKeys = 128 keys
//   warpgroup 0: S^T = K Q^T (two m64n32k16 chains of 36 k-steps, one per 64-key half), its A
//     fragments converted from the raw fp8 rows straight into registers (16-byte loads; the dims
//     in the order of swap_layout.h, Q stored in the same order); the online softmax down the
//     columns (a row's 128 keys lie in 8 lanes x 4 warps: shuffles, then the warps' maxima
//     through shared memory); P^T (bf16, times 2^120) and the columns' rescale factors handed
//     to warpgroup 1.
//   warpgroup 1: O^T = O^T alpha + V^T P^T (8 m-tiles of 64 dims x 8 k-steps of 16 keys,
//     m64n32k16), its A fragments (V^T) converted from the raw rows into registers too (keys and
//     dims in the orders of swap_layout.h, one 16-byte load per key).
//   warpgroup 2: the loads of the raw tiles into a ring of kStages (TMA boxes of 64 rows x 64
//     bytes for pages of 64 and more, one thread; 16-byte cp.async of a row per thread below).
// No tile is converted in shared memory: shared-memory traffic per key is its 576 raw bytes
// written once and read twice (S^T and V^T fragments), against five passes of 1-2 KB in the
// 64-row kernel. A unit of more than 32 rows (at most 32 heads but several tokens) runs in
// passes of 32 rows over its keys.
//
// Values are the cache's times 2^-120 (fp8x8_to_bf16x8_scaled); the logits' scale carries
// 2^120 (and k_scale) back, P^T is stored times 2^120, o_scale = k_scale (op.cc).
//
// Barriers: full[s] (tile landed: TMA transaction bytes, or 128 cp.async arrivals), empty[s]
// (256: both consumer warpgroups read the tile), p_ready[b] (128, warpgroup 0 -> 1: P^T buffer
// b and its factors written), p_free[b] (128, warpgroup 1 -> 0: read; tiles alternate between
// the two buffers, so neither side can run two phases ahead of a barrier's waiter), sums_ready /
// sums_free
// (128 each, per pass: 1 / row sum handed over). Named barrier kWg0Sync (warpgroup 0 alone:
// column maxima, column sums, Q landed).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/slots.cuh"
#include "kernels/cuda/absorbed/swap_layout.h"
#include "kernels/cuda/absorbed/traits.h"
#include "kernels/cuda/sm90/pipeline.cuh"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/tma.cuh"
#include "kernels/cuda/sm90/wgmma.cuh"

namespace mla::cuda::absorbed::swap {

using namespace mla::cuda::sm90;

inline constexpr int kThreads = 384;  // consumer warpgroups 0 and 1, producer warpgroup 2
inline constexpr int kStages = 2;
inline constexpr int kBlocks = kDimQk / 64;                     // 9 column blocks of 64 dims
inline constexpr int kRawBlockBytes = kSwapKeys * 64;           // [128 keys][64 B]
inline constexpr int kRawTileBytes = kBlocks * kRawBlockBytes;  // 73,728
inline constexpr int kQBlockBytes = kSwapN * 128;               // [32 rows][128 B] bf16
inline constexpr int kPBlockBytes = kSwapN * 128;               // 64 keys of P^T
// setmaxnreg budgets: their sum is the launch's 3 x 168 registers per thread slot (65,536 /
// 384, rounded down to 8), the pool the consumers' setmaxnreg.inc draws from.
inline constexpr int kProducerRegs = 64;
inline constexpr int kSRegs = 208;   // warpgroup 0: S^T accumulators and fragments, softmax
inline constexpr int kPvRegs = 232;  // warpgroup 1: 128 O^T accumulators, fragments
static_assert(kProducerRegs + kSRegs + kPvRegs == 3 * 168);
static_assert(kSwapKeys == 128 && kSwapN == 32, "the fragment maps below are for these");

using StageState = PipelineState<kStages>;
using Handoff = PipelineState<1>;

struct SharedStorage {
  alignas(1024) unsigned char raw[kStages][kRawTileBytes];  // raw fp8 tiles: [9][128 keys][64 B]
  alignas(1024) unsigned char q[kBlocks * kQBlockBytes];    // Q, dims in qk_slot order
  alignas(1024) unsigned char p[2][2 * kPBlockBytes];       // P^T x 2^120, keys in pv_slot order
  float colmax[2][4][kSwapN];          // warpgroup 0's warps' column maxima (two tiles alternate)
  float alpha[2][kSwapN];              // the columns' rescale factors, with P^T buffer b
  float colsum[4][kSwapN];             // warpgroup 0's warps' column sums at a pass's end
  float inv[kSwapN];                   // o_scale / row sum of a pass, for warpgroup 1
  int32_t entry[kSwapKeys / 16][128];  // the producer's page-table entries of the next tile
  uint64_t full[kStages], empty[kStages], p_ready[2], p_free[2], sums_ready, sums_free;
};
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
static_assert(kSmemBytes <= kSmemLimit, "exceeds the 227 KiB shared memory of one Hopper SM");

enum NamedBarrier : int { kWg0Sync = 1 };

__device__ __forceinline__ int swap_tiles(const WorkUnit& u) {
  return (u.kv_end - u.kv_begin + kSwapKeys - 1) / kSwapKeys;
}
__device__ __forceinline__ int swap_passes(const WorkUnit& u) {
  return u.num_rows > kSwapN ? (u.num_rows + kSwapN - 1) / kSwapN : 1;
}

// Shared addresses: one base plus SharedStorage offsets.
struct Smem {
  unsigned char* ptr;
  uint32_t base;
  __device__ __forceinline__ SharedStorage& ss() const {
    return *reinterpret_cast<SharedStorage*>(ptr);
  }
  __device__ __forceinline__ uint32_t raw(int s) const {
    return base + offsetof(SharedStorage, raw) + s * kRawTileBytes;
  }
  __device__ __forceinline__ const unsigned char* raw_ptr(int s) const {
    return ptr + offsetof(SharedStorage, raw) + s * kRawTileBytes;
  }
  __device__ __forceinline__ uint32_t q() const { return base + offsetof(SharedStorage, q); }
  __device__ __forceinline__ uint32_t p(int b) const {
    return base + offsetof(SharedStorage, p) + b * 2 * kPBlockBytes;
  }
  __device__ __forceinline__ unsigned char* p_ptr(int b) const {
    return ptr + offsetof(SharedStorage, p) + b * 2 * kPBlockBytes;
  }
  __device__ __forceinline__ uint32_t full(int s) const {
    return base + offsetof(SharedStorage, full) + 8 * s;
  }
  __device__ __forceinline__ uint32_t empty(int s) const {
    return base + offsetof(SharedStorage, empty) + 8 * s;
  }
  __device__ __forceinline__ uint32_t p_ready(int b) const {
    return base + offsetof(SharedStorage, p_ready) + 8 * b;
  }
  __device__ __forceinline__ uint32_t p_free(int b) const {
    return base + offsetof(SharedStorage, p_free) + 8 * b;
  }
  __device__ __forceinline__ uint32_t sums_ready() const {
    return base + offsetof(SharedStorage, sums_ready);
  }
  __device__ __forceinline__ uint32_t sums_free() const {
    return base + offsetof(SharedStorage, sums_free);
  }
};

// ---- producer (warpgroup 2) ------------------------------------------------------------------

// Every tile of every pass of the CTA's units into the ring, in the consumers' order. TMA: thread
// 0 issues the boxes (a box outside the cache reads zeros and still counts its bytes); cp.async:
// 8 threads per key row (zeros past kv_end or outside the cache).
__device__ __forceinline__ void produce(const AbsorbedParams& p, const PlanHeader& h,
                                        const Smem& sm, const WorkUnit* units, int u_begin,
                                        int u_end, int tw) {
  const int box_rows = p.kv_tmap_valid != 0 ? h.tma_box_rows : 0;
  if (box_rows > 0 && tw != 0) return;
  if (box_rows > 0) prefetch_tensormap(p.kv_tmap);
  const SlotTable st = make_slot_table(p, h.page_size);
  StageState ring;
  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = swap_tiles(u), passes = swap_passes(u);
    const int32_t* row = slot_row(st, u.pool_row);
    for (int pass = 0; pass < passes; ++pass) {
      for (int t = 0; t < n_tiles; ++t, ring.advance()) {
        const int s = ring.stage();
        const int key0 = u.kv_begin + t * kSwapKeys;
        // The tile's page-table entries (and, TMA, the next tile's, for its L2 prefetch) are
        // loaded before the wait for the stage, so their latency passes under it instead of
        // one load's latency per row or box one after another.
        // Kept in shared memory (this thread's own slots), not registers: the producer's budget
        // is small.
        int32_t(*ent)[128] = sm.ss().entry;
        if (box_rows > 0) {
          int32_t e[4];
#pragma unroll
          for (int x = 0; x < 4; ++x) {  // boxes 0, 1 of this tile, 2, 3: the next tile's
            e[x] = load_entry(st, row, u.kv_end, key0 + x * box_rows);
          }
#pragma unroll
          for (int x = 0; x < 4; ++x) ent[x][0] = e[x];
        } else {
          int32_t e[kSwapKeys / 16];
#pragma unroll
          for (int j = 0; j < kSwapKeys / 16; ++j) {
            e[j] = load_entry(st, row, u.kv_end, key0 + (tw >> 3) + 16 * j);
          }
#pragma unroll
          for (int j = 0; j < kSwapKeys / 16; ++j) ent[j][tw] = e[j];
        }
        if (ring.count >= kStages) mbar_wait(sm.empty(s), StageState{ring.count - kStages}.phase());
        if (box_rows > 0) {
          const int boxes = min(kSwapKeys / box_rows, (u.kv_end - key0 + box_rows - 1) / box_rows);
          mbar_arrive_expect_tx(sm.full(s), static_cast<uint32_t>(boxes * kBlocks * box_rows * 64));
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int key = key0 + x * box_rows;
            if (x < boxes) {
              const int32_t slot = resolve_slot(st, ent[x][0], u.kv_end, key);
#pragma unroll
              for (int b = 0; b < kBlocks; ++b) {
                tma_load_2d(sm.raw(s) + b * kRawBlockBytes + x * box_rows * 64, p.kv_tmap, 64 * b,
                            slot, sm.full(s));
              }
            }
          }
          // The unit's next tile into L2 now, before this thread waits for a stage to load it.
#pragma unroll
          for (int x = 2; x < 4; ++x) {
            const int key = key0 + x * box_rows;
            if (t + 1 < n_tiles && key < u.kv_end) {
              const int32_t slot = resolve_slot(st, ent[x][0], u.kv_end, key);
#pragma unroll
              for (int b = 0; b < kBlocks; ++b) tma_prefetch_2d(p.kv_tmap, 64 * b, slot);
            }
          }
        } else {
          // 8 threads per key row, each 16-byte chunks tw % 8 + 8 i of it: a warp's copy reads
          // 4 rows x 128 contiguous bytes (a row per thread read 32 rows x 16 bytes per copy:
          // 1.9x the time of the 64-row kernel at page 1 on an H100, 2026-12-07).
          const int chunk = tw & 7;
#pragma unroll 1
          for (int j = 0; j < kSwapKeys / 16; ++j) {
            const int r = (tw >> 3) + 16 * j, key = key0 + r;
            const int32_t slot = resolve_slot(st, ent[j][tw], u.kv_end, key);
            const bool valid = slot >= 0;
            const unsigned char* src =
                valid ? p.kv_cache_fp8 + static_cast<int64_t>(slot) * kDimQk : p.kv_cache_fp8;
#pragma unroll
            for (int i = 0; i < 5; ++i) {
              const int c = chunk + 8 * i;
              if (c < kDimQk / 16) {
                cp_async_16(sm.raw(s) + (c >> 2) * kRawBlockBytes + r * 64 + (c & 3) * 16,
                            src + (valid ? 16 * c : 0), valid);
              }
            }
          }
          mbar_arrive_cp_async(sm.full(s));
        }
      }
    }
  }
  if (box_rows == 0) cp_async_wait<0>();
}

// ---- warpgroup 0: S^T and the softmax ----------------------------------------------------------

// The columns (query rows) of this thread's accumulator values: n = 8 j + 2 (lane % 4) + i for
// column slot c = 2 j + i (m64n32 layout, sm90/wgmma.cuh).
__device__ __forceinline__ int column_of(int c, int lane) {
  return 8 * (c >> 1) + 2 * (lane & 3) + (c & 1);
}

// Q rows [row0, row0 + 32) of unit u into the B operand of S^T: row n's dim d at k slot
// qk_slot(d) (K-major, 128-byte swizzle, [9 blocks][32 rows][128 B]); rows past num_rows zero.
__device__ __forceinline__ void load_q_swapped(const AbsorbedParams& p, const Smem& sm,
                                               const WorkUnit& u, int row0, int tw) {
  for (int e = tw; e < kSwapN * (kDimQk / 2); e += 128) {
    const int n = e / (kDimQk / 2), d = 2 * (e % (kDimQk / 2));
    const int slot = qk_slot(d);  // d even: d + 1 sits at slot + 1
    const bool valid = row0 + n < u.num_rows;
    const uint16_t* src =
        valid ? p.q + (static_cast<int64_t>(u.q_row_begin) + row0 + n) * kDimQk + d : p.q;
    cp_async_4(
        sm.q() + (slot >> 6) * kQBlockBytes + sw128_offset(n, (slot & 63) >> 3) + (slot & 7) * 2,
        src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  bar_sync(kWg0Sync, 128);
}

// S^T of the tile in stage s, one accumulator per 64-key half mh: 9 blocks of 4 k-steps per
// half, each block's A fragments converted from two 16-byte loads per thread (its key rows lo /
// hi) and issued as one commit group. The fragments of two consecutive groups are live at once
// (each group waits for the one before it, whose registers the next block then reuses); the
// buffer alternates over the 18 groups of the tile, across the halves too.
__device__ __forceinline__ void s_tile(float (&acc)[2][16], const Smem& sm, int s, int w,
                                       int lane) {
  const int q = lane & 3;
  const unsigned char* raw = sm.raw_ptr(s);
  uint32_t a[2][4][4];
#pragma unroll
  for (int mh = 0; mh < 2; ++mh) {
    const int r_lo = 64 * mh + 16 * w + (lane >> 2);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const unsigned char* blk = raw + b * kRawBlockBytes + 16 * q;
      const uint4 lo = *reinterpret_cast<const uint4*>(blk + r_lo * 64);
      const uint4 hi = *reinterpret_cast<const uint4*>(blk + (r_lo + 8) * 64);
      const uint4 l0 = fp8x8_to_bf16x8_scaled(make_uint2(lo.x, lo.y));
      const uint4 l1 = fp8x8_to_bf16x8_scaled(make_uint2(lo.z, lo.w));
      const uint4 h0 = fp8x8_to_bf16x8_scaled(make_uint2(hi.x, hi.y));
      const uint4 h1 = fp8x8_to_bf16x8_scaled(make_uint2(hi.z, hi.w));
      uint32_t(&f)[4][4] = a[(kBlocks * mh + b) & 1];
      // k-step 4 b + st: a[0] / a[2] = row lo, pairs (bytes 4 st, +1) / (4 st + 2, +3); a[1] /
      // a[3] the same of row hi (swap_layout.h: qk_dim).
      f[0][0] = l0.x, f[0][2] = l0.y, f[0][1] = h0.x, f[0][3] = h0.y;
      f[1][0] = l0.z, f[1][2] = l0.w, f[1][1] = h0.z, f[1][3] = h0.w;
      f[2][0] = l1.x, f[2][2] = l1.y, f[2][1] = h1.x, f[2][3] = h1.y;
      f[3][0] = l1.z, f[3][2] = l1.w, f[3][1] = h1.z, f[3][3] = h1.w;
      wgmma_fence();
#pragma unroll
      for (int st = 0; st < 4; ++st) {
        wgmma_rs_bf16<kSwapN, 0>(acc[mh], f[st], desc_k_sw128(sm.q() + b * kQBlockBytes + st * 32),
                                 b + st > 0);
      }
      wgmma_commit();
      wgmma_wait<1>();
    }
  }
}

// ---- warpgroup 1: O^T ----------------------------------------------------------------------

// O^T += V^T P^T over the tile in stage s: per 16-key step, the thread's four keys (pv_key: q,
// q + 4, q + 8, q + 12) as 16-byte loads of its 16 dims (pv_dim), zeroed at or past `valid`
// keys, paired into the A fragments of the 8 m-tiles; each half of the m-tiles (4 wgmmas) is a
// commit group, and the fragments of two groups are live at once (the group before is waited
// for).
__device__ __forceinline__ void pv_tile(float (&o)[kSwapMTiles][16], const Smem& sm, int s, int pb,
                                        int valid, int w, int lane) {
  const int q = lane & 3, dgrp = 8 * w + (lane >> 2);  // dims 16 dgrp .. + 16
  const unsigned char* raw =
      sm.raw_ptr(s) + (dgrp >> 2) * kRawBlockBytes + (dgrp & 3) * 16;  // key row 0 of them
  uint32_t a[2][kSwapMTiles / 2][4];
#pragma unroll
  for (int ks = 0; ks < kSwapKSteps; ++ks) {
    uint4 k[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = 16 * ks + 4 * j + q;
      k[j] = *reinterpret_cast<const uint4*>(raw + key * 64);
      if (key >= valid) k[j] = make_uint4(0, 0, 0, 0);  // rows past the keys: stale or NaN
    }
    const uint64_t desc_p = desc_k_sw128(sm.p(pb) + (ks >> 2) * kPBlockBytes + (ks & 3) * 32);
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // m-tiles 4 half .. 4 half + 3: words 2 half, + 1
      uint32_t(&f)[kSwapMTiles / 2][4] = a[half];
      // Pairs (k[0], k[1]) -> a[0] (row lo) / a[1] (row hi); (k[2], k[3]) -> a[2] / a[3]. Byte
      // 2 mt of a key's 16 is m-tile mt's row lo, byte 2 mt + 1 its row hi.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t x[4] = {k[2 * h].x, k[2 * h].y, k[2 * h].z, k[2 * h].w};
        const uint32_t y[4] = {k[2 * h + 1].x, k[2 * h + 1].y, k[2 * h + 1].z, k[2 * h + 1].w};
#pragma unroll
        for (int x2 = 0; x2 < 2; ++x2) {  // word wi = 2 half + x2: m-tiles 2 wi, 2 wi + 1
          const int wi = 2 * half + x2;
          const uint4 v = fp8x8_to_bf16x8_scaled(
              make_uint2(prmt2(x[wi], y[wi], 0x5140u), prmt2(x[wi], y[wi], 0x7362u)));
          f[2 * x2][2 * h + 0] = v.x;
          f[2 * x2][2 * h + 1] = v.y;
          f[2 * x2 + 1][2 * h + 0] = v.z;
          f[2 * x2 + 1][2 * h + 1] = v.w;
        }
      }
      wgmma_fence();
#pragma unroll
      for (int m4 = 0; m4 < kSwapMTiles / 2; ++m4) {
        wgmma_rs_bf16<kSwapN, 0>(o[4 * half + m4], f[m4], desc_p, true);
      }
      wgmma_commit();
      wgmma_wait<1>();
    }
  }
}

// ---- the kernel body -----------------------------------------------------------------------

// The dynamic shared memory, aligned to 1024 bytes (the swizzle atom): derived where it is used
// rather than kept in a register across setmaxnreg.
__device__ __forceinline__ unsigned char* swap_smem() {
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  const uint32_t a = smem_u32(sm90_smem);
  return sm90_smem + (((a + 1023u) & ~1023u) - a);
}

// Warpgroup 0 over the CTA's units: S^T, the softmax, P^T and the row sums of each pass.
__device__ __forceinline__ void consume_s(const AbsorbedParams& p) {
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  const int tw = threadIdx.x & 127, w = tw >> 5, lane = threadIdx.x & 31;
  unsigned char* smem = swap_smem();
  const Smem sm{smem, smem_u32(smem)};
  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];
  SharedStorage& ss = sm.ss();
  StageState ring;  // tiles consumed (both consumer warpgroups count alike)
  Handoff sums;     // passes handed over
  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = swap_tiles(u), passes = swap_passes(u);
    for (int pass = 0; pass < passes; ++pass) {
      const int row0 = pass * kSwapN;
      const float ln2 = 0.69314718055994530942f;
      // ---- warpgroup 0: S^T, softmax, P^T --------------------------------------------------
      float m[8], l[8];
      int lim[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        m[c] = -INFINITY;
        l[c] = 0.f;
        const int r = row0 + column_of(c, lane);
        const int query = (u.row_in_req + r) / h.num_heads;
        const int causal_end = h.causal ? u.kv_len - u.q_len + query + 1 : u.kv_len;
        lim[c] = min(causal_end, u.kv_end);
      }
      if (n_tiles > 0) load_q_swapped(p, sm, u, row0, tw);
      for (int t = 0; t < n_tiles; ++t, ring.advance()) {
        const int s = ring.stage(), g = ring.count, pb = g & 1;
        const int key0 = u.kv_begin + t * kSwapKeys;
        mbar_wait(sm.full(s), ring.phase());
        float acc[2][16];
        s_tile(acc, sm, s, w, lane);
        wgmma_wait<0>();
        fence_regs(acc[0]);
        fence_regs(acc[1]);
        mbar_arrive(sm.empty(s));  // this warpgroup's reads of the tile are done

        // Scale, mask, column maxima: value acc[mh][4 j + i] is key 64 mh + 16 w + lane / 4 +
        // 8 (i / 2) of the tile, column slot c = 2 j + i % 2.
        float cmax[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) cmax[c] = -INFINITY;
#pragma unroll
        for (int mh = 0; mh < 2; ++mh)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int c = 2 * j + (i & 1);
              const int key = key0 + 64 * mh + 16 * w + (lane >> 2) + 8 * (i >> 1);
              float v = acc[mh][4 * j + i] * p.scale_log2;
              if (key >= lim[c]) v = -INFINITY;
              acc[mh][4 * j + i] = v;
              cmax[c] = fmaxf(cmax[c], v);
            }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          cmax[c] = fmaxf(cmax[c], __shfl_xor_sync(0xffffffffu, cmax[c], 4));
          cmax[c] = fmaxf(cmax[c], __shfl_xor_sync(0xffffffffu, cmax[c], 8));
          cmax[c] = fmaxf(cmax[c], __shfl_xor_sync(0xffffffffu, cmax[c], 16));
        }
        if ((lane >> 2) == 0) {
#pragma unroll
          for (int c = 0; c < 8; ++c) ss.colmax[pb][w][column_of(c, lane)] = cmax[c];
        }
        bar_sync(kWg0Sync, 128);
        float alpha[8], m_use[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const int n = column_of(c, lane);
          const float tmax = fmaxf(fmaxf(ss.colmax[pb][0][n], ss.colmax[pb][1][n]),
                                   fmaxf(ss.colmax[pb][2][n], ss.colmax[pb][3][n]));
          const float m_new = fmaxf(m[c], tmax);
          m_use[c] = m_new == -INFINITY ? 0.f : m_new;
          alpha[c] = exp2f(m[c] - m_use[c]);  // m = -inf -> 0
          m[c] = m_new;
          l[c] *= alpha[c];
        }
        // P^T buffer pb was read by warpgroup 1's O^T of tile g - 2.
        if (g >= 2) mbar_wait(sm.p_free(pb), PipelineState<2>{g - 2}.phase());
        unsigned char* pt = sm.p_ptr(pb);
#pragma unroll
        for (int mh = 0; mh < 2; ++mh)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int c = 2 * j + (i & 1);
              const float pr = exp2f(acc[mh][4 * j + i] - m_use[c]);
              l[c] += pr;
              const int kp = 16 * w + (lane >> 2) + 8 * (i >> 1);  // key in the half
              const int byte = (kp >> 4) * 32 + 2 * pv_slot(kp & 15);
              *reinterpret_cast<__nv_bfloat16*>(pt + mh * kPBlockBytes +
                                                sw128_offset(column_of(c, lane), byte >> 4) +
                                                (byte & 15)) = __float2bfloat16_rn(pr * 0x1p120f);
            }
        if (w == 0 && (lane >> 2) == 0) {
#pragma unroll
          for (int c = 0; c < 8; ++c) ss.alpha[pb][column_of(c, lane)] = alpha[c];
        }
        fence_proxy_async();  // P^T stores -> warpgroup 1's wgmma
        mbar_arrive(sm.p_ready(pb));
      }
      // The pass's row sums: the thread's partials over its keys, then the lanes, then warps.
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        l[c] += __shfl_xor_sync(0xffffffffu, l[c], 4);
        l[c] += __shfl_xor_sync(0xffffffffu, l[c], 8);
        l[c] += __shfl_xor_sync(0xffffffffu, l[c], 16);
      }
      if ((lane >> 2) == 0) {
#pragma unroll
        for (int c = 0; c < 8; ++c) ss.colsum[w][column_of(c, lane)] = l[c];
      }
      bar_sync(kWg0Sync, 128);
      if (sums.count > 0) mbar_wait(sm.sums_free(), Handoff{sums.count - 1}.phase());
      if (w == 0 && (lane >> 2) == 0) {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const int n = column_of(c, lane), r = row0 + n;
          const float sum = ss.colsum[0][n] + ss.colsum[1][n] + ss.colsum[2][n] + ss.colsum[3][n];
          ss.inv[n] = sum > 0.f ? p.o_scale / sum : 0.f;  // o_scale: k_scale
          if (r < u.num_rows) {
            const float lse = sum > 0.f ? (m[c] + log2f(sum)) * ln2 : -INFINITY;
            if (u.partial < 0) {
              p.lse[static_cast<int64_t>(u.q_row_begin) + r] = lse;
            } else {
              p.partial_lse[static_cast<int64_t>(u.partial) * kMaxRows + r] = lse;
            }
          }
        }
      }
      mbar_arrive(sm.sums_ready());
      sums.advance();
      // colsum is read above by warp 0 before any warp writes the next pass's.
      bar_sync(kWg0Sync, 128);
    }
  }
}

// Warpgroup 1 over the CTA's units: O^T and the output of each pass.
__device__ __forceinline__ void consume_pv(const AbsorbedParams& p) {
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  const int tw = threadIdx.x & 127, w = tw >> 5, lane = threadIdx.x & 31;
  unsigned char* smem = swap_smem();
  const Smem sm{smem, smem_u32(smem)};
  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];
  SharedStorage& ss = sm.ss();
  StageState ring;  // tiles consumed (both consumer warpgroups count alike)
  Handoff sums;     // passes handed over
  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = swap_tiles(u), passes = swap_passes(u);
    for (int pass = 0; pass < passes; ++pass) {
      const int row0 = pass * kSwapN;
      // ---- warpgroup 1: O^T ------------------------------------------------------------------
      float o[kSwapMTiles][16];
#pragma unroll
      for (int mt = 0; mt < kSwapMTiles; ++mt)
#pragma unroll
        for (int i = 0; i < 16; ++i) o[mt][i] = 0.f;
      for (int t = 0; t < n_tiles; ++t, ring.advance()) {
        const int s = ring.stage(), g = ring.count, pb = g & 1;
        mbar_wait(sm.p_ready(pb), PipelineState<2>{g}.phase());
        mbar_wait(sm.full(s), ring.phase());
        fence_proxy_async();
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const float f = ss.alpha[pb][column_of(c, lane)];
#pragma unroll
          for (int mt = 0; mt < kSwapMTiles; ++mt) {
            o[mt][4 * (c >> 1) + (c & 1)] *= f;
            o[mt][4 * (c >> 1) + 2 + (c & 1)] *= f;
          }
        }
        pv_tile(o, sm, s, pb, u.kv_end - (u.kv_begin + t * kSwapKeys), w, lane);
        mbar_arrive(sm.empty(s));  // this warpgroup's reads of the tile are done
        wgmma_wait<0>();
#pragma unroll
        for (int mt = 0; mt < kSwapMTiles; ++mt) fence_regs(o[mt]);
        mbar_arrive(sm.p_free(pb));
      }
      mbar_wait(sm.sums_ready(), sums.phase());
      float inv[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) inv[c] = ss.inv[column_of(c, lane)];
      mbar_arrive(sm.sums_free());
      sums.advance();
      // Row n = row0 + column_of(c): its 16 dims 16 dgrp .. + 16 (pv_dim: byte 2 mt + hi).
      const int dgrp = 8 * w + (lane >> 2);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int r = row0 + column_of(c, lane);
        if (r >= u.num_rows) continue;
        float v[16];
#pragma unroll
        for (int mt = 0; mt < kSwapMTiles; ++mt) {
          v[2 * mt + 0] = o[mt][4 * (c >> 1) + (c & 1)] * inv[c];
          v[2 * mt + 1] = o[mt][4 * (c >> 1) + 2 + (c & 1)] * inv[c];
        }
        if (u.partial < 0) {
          uint4* dst = reinterpret_cast<uint4*>(
              p.o + (static_cast<int64_t>(u.q_row_begin) + r) * kDimV + 16 * dgrp);
          dst[0] = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                              pack_bf16(v[6], v[7]));
          dst[1] = make_uint4(pack_bf16(v[8], v[9]), pack_bf16(v[10], v[11]),
                              pack_bf16(v[12], v[13]), pack_bf16(v[14], v[15]));
        } else {
          float4* dst = reinterpret_cast<float4*>(
              p.partial_o + (static_cast<int64_t>(u.partial) * kMaxRows + r) * kDimV + 16 * dgrp);
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            dst[x] = make_float4(v[4 * x], v[4 * x + 1], v[4 * x + 2], v[4 * x + 3]);
          }
        }
      }
    }
  }
}

__device__ __forceinline__ void swap_fp8(const AbsorbedParams& p) {
  {  // barriers; nothing computed here stays live across setmaxnreg (it would be spilled)
    unsigned char* smem = swap_smem();
    const Smem sm{smem, smem_u32(smem)};
    if (threadIdx.x == 0) {
      const PlanHeader& h = *reinterpret_cast<const PlanHeader*>(p.plan);
      const bool tma = p.kv_tmap_valid != 0 && h.tma_box_rows > 0;
      for (int s = 0; s < kStages; ++s) {
        mbar_init(sm.full(s), tma ? 1 : 128);
        mbar_init(sm.empty(s), 256);
      }
      for (int b = 0; b < 2; ++b) {
        mbar_init(sm.p_ready(b), 128);
        mbar_init(sm.p_free(b), 128);
      }
      mbar_init(sm.sums_ready(), 128);
      mbar_init(sm.sums_free(), 128);
      fence_mbarrier_init();
    }
  }
  __syncthreads();
  // Each role sets its register budget first and derives what it needs after it: a value live
  // across setmaxnreg is spilled, and code after a join of the two budgets gets the smaller one.
  const int wgi = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) >> 7, 0);
  if (wgi == 2) {
    setmaxnreg_dec<kProducerRegs>();
    const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
    const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
    unsigned char* smem = swap_smem();
    produce(p, h, Smem{smem, smem_u32(smem)},
            reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset), cta_begin[blockIdx.x],
            cta_begin[blockIdx.x + 1], threadIdx.x & 127);
    return;
  }
  // The consumers' budgets sum with the producer's to the launch allocation (3 x 168 per
  // thread slot): setmaxnreg.inc waits until the registers are free, forever if they never are.
  if (wgi == 0) {
    setmaxnreg_inc<kSRegs>();
    consume_s(p);
  } else {
    setmaxnreg_inc<kPvRegs>();
    consume_pv(p);
  }
}

}  // namespace mla::cuda::absorbed::swap
