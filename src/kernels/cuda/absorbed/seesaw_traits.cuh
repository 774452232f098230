// Traits of the seesaw decode kernel (seesaw.cuh): its parts of a key tile, its shared-memory map
// as one struct, its hand-offs between the two warpgroups, and the per-CTA view of both that the
// role functions take.
//
// A key tile [64 keys][576] lives as 9 column blocks of [64 rows][128 B] (sm90_common.cuh):
// blocks 0-3 are c_kv[0:256] (the V columns of warpgroup 0's output half O_L), 4-7 c_kv[256:512]
// (those of O_R), block 8 k_pe, which only S reads. Once S of a tile is done, its block 8 holds
// the tile's P (bf16 [64][64]) for the other warpgroup's P V, so the P tiles need no shared
// memory of their own and Q stays whole. Each tile is loaded in two parts, each completing on its
// own mbarrier and reloaded by the warpgroup that reads it last:
//   tile A (S by warpgroup 0): part L = blocks 0-3 (wg0's P V is its last reader), part R =
//     blocks 4-8 (wg1's P V reads blocks 4-7 and P_A in block 8);
//   tile B (S by warpgroup 1): part L = blocks 0-3 and 8 (wg0's P V reads blocks 0-3 and P_B in
//     block 8), part R = blocks 4-7 (wg1's P V).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/absorbed/sm90_common.cuh"

namespace mla::cuda::absorbed::seesaw {

using wg::kBlockBytes;
using wg::kBlocks;
using wg::kTileBytes;

// The two key tiles of a pair: A (the unit's even tiles, S by warpgroup 0) and B (odd tiles, S by
// warpgroup 1).
enum TileBuf : int { kBufA = 0, kBufB = 1 };
enum TilePart : int { kPartL = 0, kPartR = 1 };
// Column blocks of part `part` of a tile in buffer `buf`: a range [first, first + count), plus
// block 8 for part L of tile B.
__host__ __device__ constexpr int part_first_block(int part) { return part == kPartL ? 0 : 4; }
__host__ __device__ constexpr int part_range_blocks(int buf, int part) {
  return part == kPartL ? 4 : (buf == kBufA ? 5 : 4);
}
__host__ __device__ constexpr bool part_adds_block8(int buf, int part) {
  return buf == kBufB && part == kPartL;
}
__host__ __device__ constexpr int part_blocks(int buf, int part) {
  return part_range_blocks(buf, part) + (part_adds_block8(buf, part) ? 1 : 0);
}
static_assert(part_blocks(kBufA, kPartL) + part_blocks(kBufA, kPartR) == kBlocks);
static_assert(part_blocks(kBufB, kPartL) + part_blocks(kBufB, kPartR) == kBlocks);
// Blocks of V (c_kv) per output half: P V of warpgroup w reads blocks 4 w .. 4 w + 3.
inline constexpr int kVBlocksPerHalf = 4;
inline constexpr int kPOffset = 8 * kBlockBytes;  // a tile's P, in its block 8, once S is done

// The hand-offs between the warpgroups, one mbarrier each (128 arrivals), each completing once per
// pair in one direction:
//   kMax0Ready  wg0 -> wg1  the rows' maxima after tile A and the factor that rescaled O_L
//   kMax1Ready  wg1 -> wg0  the rows' maxima after tile B and the factor from A's maxima to them
//   kP0Ready    wg0 -> wg1  P of tile A (scaled to the pair's maxima) in tile A's block 8
//   kP1Ready    wg1 -> wg0  P of tile B in tile B's block 8
// Generic stores handed over through mbarriers, not bar.arrive / bar.sync pairs, so
// compute-sanitizer racecheck sees the order (docs/kernels.md).
enum Handoff : int { kMax0Ready = 0, kMax1Ready = 1, kP0Ready = 2, kP1Ready = 3, kNumHandoffs = 4 };

// Named barriers of one warpgroup (128 threads): its threads' zeroing of a tile's rows past the
// unit's keys is done before its P V reads them. Barrier 0 is __syncthreads.
inline constexpr int kWarpgroupBarrier0 = 1;  // + warpgroup index

// The shared-memory map, one declaration (base aligned to 1024 bytes by the kernel: the 128-byte
// swizzle atom). 223,232 bytes.
struct SharedStorage {
  alignas(1024) unsigned char q[kTileBytes];     // Q tile of the unit, [9 blocks][64 rows][128 B]
  alignas(1024) unsigned char k[2][kTileBytes];  // key tiles A and B of the pair
  float max0[64], scale0[64];                    // kMax0Ready's data, by row
  float max1[64], scale1[64];                    // kMax1Ready's data, by row
  float row_sum[2][64];                          // each warpgroup's row sums at a unit's end
  uint64_t full[2][2];                           // [TileBuf][TilePart]: that part has landed
  uint64_t handoff[kNumHandoffs];
};
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + alignment
static_assert(kSmemBytes <= kSmemLimit, "exceeds the 227 KiB shared memory of one Hopper SM");

// What every role function of one thread needs. Shared addresses are one base plus the
// SharedStorage offsets (constants), so they cost no registers of their own.
struct Cta {
  SharedStorage* ss;
  uint32_t base;                       // shared address of ss
  int tid, wgi, tw, lane, r_lo, r_hi;  // thread, warpgroup, thread in it, lane, accumulator rows
  bool tma;                            // key loads by TMA (plan header) or cp.async gathers
  SlotTable slots;

  __device__ __forceinline__ uint32_t q() const { return base + offsetof(SharedStorage, q); }
  __device__ __forceinline__ uint32_t k(int buf) const {
    return base + offsetof(SharedStorage, k) + buf * kTileBytes;
  }
  __device__ __forceinline__ uint32_t p(int buf) const { return k(buf) + kPOffset; }
  __device__ __forceinline__ uint32_t full(int buf, int part) const {
    return base + offsetof(SharedStorage, full) + 8 * (2 * buf + part);
  }
  __device__ __forceinline__ uint32_t handoff(Handoff h) const {
    return base + offsetof(SharedStorage, handoff) + 8 * h;
  }
};

}  // namespace mla::cuda::absorbed::seesaw
