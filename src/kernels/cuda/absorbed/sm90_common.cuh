// Pieces of the Hopper (sm_90a) tile kernel of the absorbed op (sm90_ws.cuh): the shared-memory
// tile shape of a 64-row query tile or a 64-key tile in the 128-byte swizzle, the query-tile
// gather, the output write, the logits' scale / mask / max.
//
// Tile layout: [9 column blocks][64 rows][128 B]; chunk c of row r at c ^ (r % 8) inside its
// block (sm90/wgmma.cuh), base aligned to 1024 bytes, so one key tile serves as the K-major B
// operand of Q K^T and as the MN-major B operand of P V.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/slots.cuh"
#include "kernels/cuda/absorbed/softmax.cuh"
#include "kernels/cuda/absorbed/traits.h"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/wgmma.cuh"

namespace mla::cuda::absorbed::wg {

using namespace mla::cuda::sm90;

inline constexpr int kBlocks = kDimQk / 64;               // 9 column blocks of 64 elements
inline constexpr int kBlockBytes = 64 * 128;              // [64 rows][128 B]
inline constexpr int kTileBytes = kBlocks * kBlockBytes;  // 73728: Q or one key tile
static_assert(kBlockN == 64 && kMaxRows == 64 && kThreads == 256);

// Byte offset of 16-byte chunk ch (0..71) of row r of a [64 x 576] tile.
__device__ __forceinline__ uint32_t tile_offset(int r, int ch) {
  return static_cast<uint32_t>((ch >> 3) * kBlockBytes) + sw128_offset(r, ch & 7);
}

// The unit's query rows into the Q tile by threads [0, kLoaders) (rows past num_rows read as 0).
template <int kLoaders>
__device__ __forceinline__ void load_q(const AbsorbedParams& p, const WorkUnit& u, uint32_t q_s,
                                       int t) {
  for (int c = t; c < 64 * 72; c += kLoaders) {
    const int r = c / 72, ch = c % 72;
    const bool valid = r < u.num_rows;
    const uint16_t* src =
        valid ? p.q + (static_cast<int64_t>(u.q_row_begin) + r) * kDimQk + ch * 8 : p.q;
    cp_async_16(q_s + tile_offset(r, ch), src, valid);
  }
}

__device__ __forceinline__ int key_tiles(const WorkUnit& u) {
  return (u.kv_end - u.kv_begin + kBlockN - 1) / kBlockN;
}

// Causal / range limit of one row of the tile: keys at or past it are masked.
__device__ __forceinline__ int row_limit(const WorkUnit& u, const PlanHeader& h, int r) {
  const int query = (u.row_in_req + r) / h.num_heads;
  const int causal_end = h.causal ? u.kv_len - u.q_len + query + 1 : u.kv_len;
  return min(causal_end, u.kv_end);
}

// o / lse (or the unit's partial slot) for this thread's rows r_lo, r_lo + 8 and its 64 column
// pairs starting at col0 (wgmma accumulator layout: o[4 j + 2 i + {0, 1}] = row i, columns
// col0 + 8 j + {0, 1}). inv = 1 / row sum (0 for an empty row); lse is written by lse_writer.
__device__ __forceinline__ void write_o(const AbsorbedParams& p, const WorkUnit& u,
                                        const float (&o)[128], const float (&inv)[2],
                                        const float (&lse)[2], int r_lo, int col0,
                                        bool lse_writer) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r_lo + 8 * i;
    if (r >= u.num_rows) continue;
    const int64_t row = static_cast<int64_t>(u.q_row_begin) + r;
    if (u.partial < 0) {
      uint16_t* dst = p.o + row * kDimV + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(dst + 8 * j) =
            pack_bf16(o[4 * j + 2 * i] * inv[i], o[4 * j + 2 * i + 1] * inv[i]);
      }
      if (lse_writer) p.lse[row] = lse[i];
    } else {
      const int64_t prow = static_cast<int64_t>(u.partial) * kMaxRows + r;
      float* dst = p.partial_o + prow * kDimV + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[4 * j + 2 * i] * inv[i], o[4 * j + 2 * i + 1] * inv[i]);
      }
      if (lse_writer) p.partial_lse[prow] = lse[i];
    }
  }
}

// Scales one thread's logits of a wgmma accumulator (kJ column groups of 8 keys; s[4 j + i]: row
// lo / hi for i / 2, key key0 + 8 j + 2 (lane % 4) + i % 2) to the base-2 domain, masks keys at
// or past each row's limit, and returns the two rows' maxima over the quad of threads.
template <int kJ>
__device__ __forceinline__ void scale_mask_max(float (&s)[4 * kJ], int key0, int lane,
                                               const int (&lim)[2], float scale, float (&tmax)[2]) {
  tmax[0] = tmax[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < kJ; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = key0 + 8 * j + 2 * (lane & 3) + (i & 1);
      float v = s[4 * j + i] * scale;
      if (key >= lim[i >> 1]) v = -INFINITY;
      s[4 * j + i] = v;
      tmax[i >> 1] = fmaxf(tmax[i >> 1], v);
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
    tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
  }
}

// Online-softmax rescale of a 64 x 256 accumulator by the rows' factors. Always applied, with no
// branch: the wgmma that follows must be reached by the four warps of the warpgroup at the same
// instruction, and a per-warp skip (when no row of the warp changed its maximum) let the compiler
// duplicate the code after it, which compute-sanitizer synccheck reports as a warpgroup MMA
// sequence error (2026-12-03). A factor of 1 leaves o bitwise the same.
__device__ __forceinline__ void rescale_o(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= a0;
    o[4 * j + 1] *= a0;
    o[4 * j + 2] *= a1;
    o[4 * j + 3] *= a1;
  }
}

}  // namespace mla::cuda::absorbed::wg
