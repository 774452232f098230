// The named parts of the absorbed sm90 kernel (sm90_ws.cuh): its stage ring, its shared-memory
// map as one struct, its barriers, and the per-thread view (Cta) that the role functions take.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/absorbed/sm90_common.cuh"
#include "kernels/cuda/sm90/pipeline.cuh"

namespace mla::cuda::absorbed::wg::ws {

inline constexpr int kStages = 2;                 // key tiles in the ring
using StageState = sm90::PipelineState<kStages>;  // a tile's stage and its full / conv parity
using Handoff = sm90::PipelineState<1>;           // a barrier completing once per tile or unit

// The shared-memory map (base aligned to 1024 bytes by the kernel entry: the 128-byte swizzle
// atom). Tiles are [9 column blocks][64 rows][128 B] (sm90_common.cuh).
struct SharedStorage {
  alignas(1024) unsigned char q[kTileBytes];            // the unit's query rows
  alignas(1024) unsigned char kv[kStages][kTileBytes];  // the key ring (fp8: raw rows land in
                                                        // the upper half of each block first)
  alignas(1024) unsigned char p[kBlockBytes];           // bf16 P [64 rows][64 keys] of a tile
  float alpha[64];                                      // the rescale factors of that tile, by row
  float inv[2][64];  // 1 / row sum of a unit (two units alternate)
  // mbarriers (Barriers table in docs/kernels.md)
  uint64_t full[kStages];  // tile landed
  uint64_t p_ready;        // warpgroup 0 -> 1: P and alpha written
  uint64_t sums_ready;     // warpgroup 0 -> 1: a unit's inv written
  uint64_t sums_free;      // warpgroup 1 -> 0: inv read
  uint64_t conv[kStages];  // fp8: tile converted to bf16 (warpgroup 0 waits on it, not full)
  uint64_t p_free;         // warpgroup 1 -> 0: P and alpha read
};
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + alignment
static_assert(kSmemBytes <= kSmemLimit, "exceeds the 227 KiB shared memory of one Hopper SM");

// Named barriers (0 is __syncthreads). kStageFree + s (256 threads; warpgroup 0 arrives, 1
// syncs): warpgroup 0 is done with stage s. kWg0 / kWg1 (128): one warpgroup only.
enum NamedBarrier : int { kStageFree = 3, kWg0 = kStageFree + kStages, kWg1 = kWg0 + 1 };

// What every role function of one thread reads. Shared addresses are one base plus the
// SharedStorage offsets (constants), so they cost no registers of their own.
struct Cta {
  unsigned char* smem;  // the SharedStorage
  uint32_t base;        // its shared address
  int wgi, tw, lane;    // warpgroup, thread in it, lane
  int r_lo, r_hi;       // this thread's accumulator rows
  int box_rows;         // key rows per TMA box (plan header), 0: cp.async gathers
  bool tma;

  __device__ __forceinline__ SharedStorage& ss() const {
    return *reinterpret_cast<SharedStorage*>(smem);
  }
  template <std::size_t kOffset>
  __device__ __forceinline__ uint32_t at() const {
    return base + static_cast<uint32_t>(kOffset);
  }
  __device__ __forceinline__ uint32_t q() const { return at<offsetof(SharedStorage, q)>(); }
  __device__ __forceinline__ uint32_t kv(int s) const {
    return at<offsetof(SharedStorage, kv)>() + s * kTileBytes;
  }
  __device__ __forceinline__ unsigned char* kv_ptr(int s) const {
    return smem + offsetof(SharedStorage, kv) + s * kTileBytes;
  }
  __device__ __forceinline__ uint32_t p() const { return at<offsetof(SharedStorage, p)>(); }
  __device__ __forceinline__ uint32_t full(int s) const {
    return at<offsetof(SharedStorage, full)>() + 8 * s;
  }
  __device__ __forceinline__ uint32_t conv(int s) const {
    return at<offsetof(SharedStorage, conv)>() + 8 * s;
  }
  __device__ __forceinline__ uint32_t p_ready() const {
    return at<offsetof(SharedStorage, p_ready)>();
  }
  __device__ __forceinline__ uint32_t p_free() const {
    return at<offsetof(SharedStorage, p_free)>();
  }
  __device__ __forceinline__ uint32_t sums_ready() const {
    return at<offsetof(SharedStorage, sums_ready)>();
  }
  __device__ __forceinline__ uint32_t sums_free() const {
    return at<offsetof(SharedStorage, sums_free)>();
  }
};

}  // namespace mla::cuda::absorbed::wg::ws
