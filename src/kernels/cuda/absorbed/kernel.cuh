// Absorbed paged MLA attention kernel: mma.sync m16n8k16 (bf16 in, fp32 accumulate), key tiles
// gathered from the paged latent cache by cp.async through a ring of 32-key half tiles (deeper
// for 16/32-row tiles, whose Q tile is small), online softmax in registers. One persistent block
// of 8 warps per SM walks its list of work units. An fp8 e4m3 cache is staged raw (576-byte
// rows) and converted to bf16 (exact) into one swizzled tile per step; k_scale is folded into the
// logit scale and the output scale.
//
// Warp layout for a tile of R = 16 * RG rows (RG = 1, 2, 4 row groups): warp w has row group
// rg = w % RG and column slice dc = w / RG of DC = 8 / RG slices. For QK^T a warp computes its
// 16 rows against keys [dc * 64 / DC, +64 / DC) of the tile; for PV it owns output columns
// [dc * 512 / DC, +512 / DC) of its 16 rows (accumulators: 16 x 512 / DC fp32 per warp). Row
// maxima and sums are exchanged through shared memory, probabilities through a bf16 P tile.
//
// Shared memory rows are 1152 bytes (72 chunks of 16 bytes); chunk c of row r lives at chunk
// (c & ~7) | ((c ^ r) & 7), so ldmatrix reading 8 rows at one logical chunk hits 8 banks groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/softmax.cuh"
#include "kernels/cuda/absorbed/traits.h"

namespace mla::cuda::absorbed {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ int swizzle_chunk(int row, int chunk) {
  return (chunk & ~7) | ((chunk ^ row) & 7);
}
__device__ __forceinline__ uint32_t row_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + swizzle_chunk(row, chunk) * 16);
}
__device__ __forceinline__ uint32_t p_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * (kBlockN * 2) + ((chunk ^ row) & 7) * 16);
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill the 16 bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c += a (16x16 bf16, row) * b (16x8 bf16, col)
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ int64_t key_slot(const AbsorbedParams& p, int pool_row, int64_t key,
                                            int page_size) {
  const int32_t* row = p.req_to_token + static_cast<int64_t>(pool_row) * p.req_to_token_stride;
  if (page_size == 1) return row[key];
  return static_cast<int64_t>(row[(key / page_size) * page_size]) + key % page_size;
}

// Cache slot of key `key` of the unit; -1 past kv_end (zero-filled, masked).
__device__ __forceinline__ int32_t unit_slot(const AbsorbedParams& p, const WorkUnit& u, int key,
                                             int page_size) {
  return key < u.kv_end ? static_cast<int32_t>(key_slot(p, u.pool_row, key, page_size)) : -1;
}

// Query rows of the unit into shared memory (rows past num_rows are zero).
__device__ __forceinline__ void load_q(const AbsorbedParams& p, const WorkUnit& u, int rows,
                                       unsigned char* q_s) {
  const uint32_t base = smem_addr(q_s);
  for (int c = threadIdx.x; c < rows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const bool valid = r < u.num_rows;
    const uint16_t* src =
        valid ? p.q + (static_cast<int64_t>(u.q_row_begin) + r) * kDimQk + ch * 8 : p.q;
    cp_async_16(base + row_offset(r, ch), src, valid);
  }
}

// One half tile (32 keys) gathered by slot into a ring slot (keys past the end are zero).
// bf16: swizzled 1152-byte rows; fp8: plain 576-byte rows.
template <bool kFp8>
__device__ __forceinline__ void load_half(const AbsorbedParams& p, const int32_t* slots,
                                          unsigned char* dst) {
  const uint32_t base = smem_addr(dst);
  if constexpr (!kFp8) {
    constexpr int kChunks = kHalfN * kChunksPerRow;  // 2304: 9 per thread
    static_assert(kChunks % kThreads == 0);
#pragma unroll
    for (int i = 0; i < kChunks / kThreads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int k = c / kChunksPerRow, ch = c % kChunksPerRow;
      const int32_t slot = slots[k];
      const uint16_t* src = slot >= 0 ? p.kv_cache + static_cast<int64_t>(slot) * kDimQk + ch * 8
                                      : p.kv_cache;
      cp_async_16(base + row_offset(k, ch), src, slot >= 0);
    }
  } else {
    constexpr int kRowChunks = kDimQk / 16;       // 36
    constexpr int kChunks = kHalfN * kRowChunks;  // 1152: 4.5 per thread
#pragma unroll
    for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < kChunks) {
        const int k = c / kRowChunks, ch = c % kRowChunks;
        const int32_t slot = slots[k];
        const unsigned char* src =
            slot >= 0 ? p.kv_cache_fp8 + static_cast<int64_t>(slot) * kDimQk + ch * 16
                      : p.kv_cache_fp8;
        cp_async_16(base + k * kDimQk + ch * 16, src, slot >= 0);
      }
    }
  }
}

// Two e4m3 values (low byte first) -> two bf16, exact. One conversion instruction (e4m3x2 ->
// f16x2, exact); f16 values from e4m3 are normal or zero, so shifting exponent and mantissa right
// by 3 is the bf16 pattern of value * 2^-112 (biases 15 vs 127; the dropped mantissa bits are
// zero), still normal; one bf16x2 multiply by 2^112 restores the value. Avoids the f16 -> f32 ->
// bf16 conversions, which run at a quarter of the integer/FMA rate.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two) {
  const __half2_raw hr =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const uint32_t w = static_cast<uint32_t>(hr.x) | (static_cast<uint32_t>(hr.y) << 16);
  const uint32_t b = ((w >> 3) & 0x0fff0fffu) | (w & 0x80008000u);
  __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&b);
  v = __hmul2(v, __nv_bfloat162(__float2bfloat16_rn(0x1p112f), __float2bfloat16_rn(0x1p112f)));
  return *reinterpret_cast<uint32_t*>(&v);
}

// fp8 half tile (32 plain rows of 576 bytes) -> bf16 half tile (32 swizzled rows of 1152 bytes).
// Eight consecutive threads write the eight chunks of one swizzle group: no bank conflicts.
__device__ __forceinline__ void convert_half(const unsigned char* src, unsigned char* dst) {
  constexpr int kChunks = kHalfN * kChunksPerRow;  // 2304 bf16 chunks of 8 values: 9 per thread
#pragma unroll 3
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int k = c / kChunksPerRow, ch = c % kChunksPerRow;
    const uint2 raw = *reinterpret_cast<const uint2*>(src + k * kDimQk + ch * 8);
    uint4 v;
    v.x = fp8x2_to_bf16x2(raw.x & 0xffffu);
    v.y = fp8x2_to_bf16x2(raw.x >> 16);
    v.z = fp8x2_to_bf16x2(raw.y & 0xffffu);
    v.w = fp8x2_to_bf16x2(raw.y >> 16);
    *reinterpret_cast<uint4*>(dst + row_offset(k, ch)) = v;
  }
}

// S[16 rows, 8 * NT keys] = Q[rows] . K[keys]^T over 576 dims.
template <int NT, int kChains>
__device__ __forceinline__ void compute_qk(const unsigned char* q_s, const unsigned char* k_s,
                                           int row0, int key0, float (&s)[NT][4]) {
  const int lane = threadIdx.x & 31;
  float acc[kChains][NT][4];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][n][i] = 0.f;
  const uint32_t q_base = smem_addr(q_s), k_base = smem_addr(k_s);
  const int a_row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_half = lane >> 4;
  const int b_key = key0 + (lane & 7);
  const int b_quarter = lane >> 3;
#pragma unroll 3
  for (int kk = 0; kk < kDimQk / 32; ++kk) {  // 32 dims (two mma k-steps) per iteration
    uint32_t a0[4], a1[4];
    ldmatrix_x4(q_base + row_offset(a_row, kk * 4 + a_half), a0);
    ldmatrix_x4(q_base + row_offset(a_row, kk * 4 + 2 + a_half), a1);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t b[4];  // key rows n*8.., chunks kk*4 + 0..3
      ldmatrix_x4(k_base + row_offset(b_key + n * 8, kk * 4 + b_quarter), b);
      mma_bf16(acc[0][n], a0, b[0], b[1]);
      mma_bf16(acc[kChains - 1][n], a1, b[2], b[3]);
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = kChains == 2 ? acc[0][n][i] + acc[kChains - 1][n][i]
                                                       : acc[0][n][i];
}

// 16-row tiles: the A fragments of the whole Q tile (36 k-steps x 4 registers) stay in registers
// for a unit, so the 8 warps (each on 8 keys) stop re-reading 18 KB of Q per key tile.
inline constexpr int kQSteps = kDimQk / 16;  // 36
__device__ __forceinline__ void load_q_frags(const unsigned char* q_s, uint32_t (&qf)[kQSteps][4]) {
  const int lane = threadIdx.x & 31;
  const uint32_t q_base = smem_addr(q_s);
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_half = lane >> 4;
#pragma unroll
  for (int j = 0; j < kQSteps; ++j) ldmatrix_x4(q_base + row_offset(a_row, j * 2 + a_half), qf[j]);
}

// S[16 rows, 8 keys] = Q . K[key0 .. key0 + 8)^T with Q from registers; kCh accumulator chains
// (36 / kCh dependent mma each).
template <int kCh>
__device__ __forceinline__ void compute_qk_qreg(const uint32_t (&qf)[kQSteps][4],
                                                const unsigned char* k_s, int key0,
                                                float (&s)[1][4]) {
  static_assert(kCh == 2 || kCh == 4);
  const int lane = threadIdx.x & 31;
  const uint32_t k_base = smem_addr(k_s);
  const int b_key = key0 + (lane & 7);
  const int b_quarter = lane >> 3;
  float acc[kCh][4];
#pragma unroll
  for (int c = 0; c < kCh; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[c][i] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kQSteps / 2; ++kk) {
    uint32_t b[4];  // key rows, chunks kk*4 + 0..3
    ldmatrix_x4(k_base + row_offset(b_key, kk * 4 + b_quarter), b);
    mma_bf16(acc[(2 * kk) % kCh], qf[2 * kk], b[0], b[1]);
    mma_bf16(acc[(2 * kk + 1) % kCh], qf[2 * kk + 1], b[2], b[3]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s[0][i] = kCh == 4 ? (acc[0][i] + acc[1][i]) + (acc[2 % kCh][i] + acc[3 % kCh][i])
                       : acc[0][i] + acc[1][i];
  }
}

// O[16 rows, 8 * NO cols] += P[16 rows, 64 keys] . V[64 keys, cols].
// V rows 0..31 of the tile are in half v_a, rows 32..63 in half v_b.
template <int NO>
__device__ __forceinline__ void compute_pv(const unsigned char* p_s, const unsigned char* v_a,
                                           const unsigned char* v_b, int row0, int col0,
                                           float (&o)[NO][4]) {
  const int lane = threadIdx.x & 31;
  const uint32_t p_base = smem_addr(p_s), va = smem_addr(v_a), vb = smem_addr(v_b);
  const int a_row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_half = lane >> 4;
  const int b_key = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int b_chunk = col0 / 8 + (lane >> 4);
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(p_base + p_offset(a_row, ks * 2 + a_half), a);
    const uint32_t v_base = ks < 2 ? va : vb;
#pragma unroll
    for (int n = 0; n < NO; n += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(v_base + row_offset((ks & 1) * 16 + b_key, b_chunk + n), b);
      mma_bf16(o[n], a, b[0], b[1]);
      mma_bf16(o[n + 1], a, b[2], b[3]);
    }
  }
}

template <int RG, bool kFp8>
__device__ void attention_variant(const AbsorbedParams& p, const PlanHeader& h,
                                  unsigned char* smem) {
  using L = VariantLayout<RG, kFp8>;
  constexpr int kDc = kWarps / RG;            // column slices
  constexpr int kRows = 16 * RG;              // rows per tile
  constexpr int kNt = kBlockN / kDc / 8;      // key n-tiles per warp in QK^T (= RG)
  constexpr int kNo = kDimV / kDc / 8;        // output n-tiles per warp (= 8 RG)
  constexpr int kChains = RG == 1 ? 2 : 1;    // independent accumulators for short QK^T chains
  constexpr int kRing = L::kRing;             // ring slots (half tiles)
  static_assert(kNt >= 1 && kNo % 2 == 0 && kDc * kRows == kRedFloats);
  static_assert(kBlockN == 2 * kHalfN && kBlockN / kDc <= kHalfN);

  unsigned char* q_s = smem;
  unsigned char* p_s = smem + L::kPOff;
  float* red = reinterpret_cast<float*>(smem + L::kRedOff);
  int32_t* lists = reinterpret_cast<int32_t*>(smem + L::kSlotsOff);  // [kSlotEntries][32]
  unsigned char* tile_s = smem + L::kTileOff;  // fp8: the converted bf16 tile
  unsigned char* ring = smem + L::kRingOff;
  const auto list_of = [&](int half) { return lists + (half % kSlotEntries) * kHalfN; };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rg = warp % RG, dc = warp / RG;
  const int row0 = rg * 16;                   // warp's first row in the tile
  const int key0 = dc * (kBlockN / kDc);      // warp's first key in a key tile (QK^T)
  const int col0 = dc * (kDimV / kDc);        // warp's first output column (PV)
  const int r_lo = row0 + (lane >> 2), r_hi = r_lo + 8;  // this thread's two rows
  const int key_half = key0 / kHalfN, key_in_half = key0 % kHalfN;  // QK^T keys: one half

  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];

  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = (u.kv_end - u.kv_begin + kBlockN - 1) / kBlockN;
    const int n_halves = 2 * n_tiles;
    __syncthreads();  // the previous unit is done with every buffer
    // Slot lists of halves 0 .. kRing - 1; threads 0..63 keep the slots of halves kRing and
    // kRing + 1 in a register (stored one step ahead, so the lookup latency is hidden).
    {
      const int half = threadIdx.x / kHalfN, i = threadIdx.x % kHalfN;
      if (half < kRing && half < n_halves) {
        list_of(half)[i] = unit_slot(p, u, u.kv_begin + half * kHalfN + i, h.page_size);
      }
    }
    int32_t next_slot = -1;
    if (threadIdx.x < 2 * kHalfN) {
      const int half = kRing + threadIdx.x / kHalfN;
      if (half < n_halves) {
        next_slot = unit_slot(p, u, u.kv_begin + half * kHalfN + threadIdx.x % kHalfN,
                              h.page_size);
      }
    }
    load_q(p, u, kRows, q_s);
    __syncthreads();
    // One cp.async group per half, empty ones included, so wait counts are compile-time.
    // bf16: halves kRing - 2 and kRing - 1 are issued by step 0; fp8: all kRing now.
    constexpr int kPrologue = kFp8 ? kRing : kRing - 2;
#pragma unroll
    for (int hf = 0; hf < kPrologue; ++hf) {
      if (hf < n_halves) load_half<kFp8>(p, list_of(hf), ring + hf * L::kSlotBytes);
      cp_async_commit();
    }

    // 16-row tiles: Q (in cp.async group 0) into registers once per unit.
    [[maybe_unused]] uint32_t qf[RG == 1 ? kQSteps : 1][4];
    if constexpr (RG == 1) {
      cp_async_wait<kPrologue - 1>();
      __syncthreads();
      load_q_frags(q_s, qf);
    }

    // Causal limit (exclusive) of this thread's two rows, clipped to the unit's key range.
    int lim[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = i == 0 ? r_lo : r_hi;
      const int query = (u.row_in_req + r) / h.num_heads;
      const int causal_end = h.causal ? u.kv_len - u.q_len + query + 1 : u.kv_len;
      lim[i] = min(causal_end, u.kv_end);
    }

    float o[kNo][4];
#pragma unroll
    for (int n = 0; n < kNo; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[n][i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.f, 0.f};

    for (int t = 0; t < n_tiles; ++t) {
      const int tile_start = u.kv_begin + t * kBlockN;
      cp_async_wait<L::kPending>();
      __syncthreads();  // halves 2t, 2t+1 visible to all; every warp is done with step t - 1
      if (threadIdx.x < 2 * kHalfN) {  // slot list of halves 2t + kRing (+1), issued next
        const int half = 2 * t + kRing + threadIdx.x / kHalfN;
        list_of(half)[threadIdx.x % kHalfN] = next_slot;
        next_slot = half + 2 < n_halves
                        ? unit_slot(p, u, u.kv_begin + (half + 2) * kHalfN + threadIdx.x % kHalfN,
                                    h.page_size)
                        : -1;
      }
      const unsigned char* half_a;
      const unsigned char* half_b;
      if constexpr (kFp8) {
        convert_half(ring + ((2 * t) % kRing) * L::kSlotBytes, tile_s);
        convert_half(ring + ((2 * t + 1) % kRing) * L::kSlotBytes, tile_s + kHalfBytes);
        __syncthreads();  // bf16 tile complete; the two fp8 slots are free again
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int half = 2 * t + kRing + j;
          if (half < n_halves) {
            load_half<true>(p, list_of(half), ring + ((2 * t + j) % kRing) * L::kSlotBytes);
          }
          cp_async_commit();
        }
        half_a = tile_s;
        half_b = tile_s + kHalfBytes;
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // into the slots of step t - 1
          const int half = 2 * t + kRing - 2 + j;
          if (half < n_halves) {
            load_half<false>(p, list_of(half), ring + (half % kRing) * L::kSlotBytes);
          }
          cp_async_commit();
        }
        half_a = ring + ((2 * t) % kRing) * L::kSlotBytes;
        half_b = ring + ((2 * t + 1) % kRing) * L::kSlotBytes;
      }

      // compute_qk
      float s[kNt][4];
      if constexpr (RG == 1) {
        // fp8: two chains (the conversion needs the registers; four spill there)
        compute_qk_qreg<kFp8 ? 2 : 4>(qf, key_half == 0 ? half_a : half_b, key_in_half, s);
      } else {
        compute_qk<kNt, kChains>(q_s, key_half == 0 ? half_a : half_b, row0, key_in_half, s);
      }

      // online_softmax: scale, mask, row maxima across the DC warps of a row group
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kNt; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = tile_start + key0 + n * 8 + (lane & 3) * 2 + (i & 1);
          const int half = i >> 1;
          float v = s[n][i] * p.scale_log2;
          if (key >= lim[half]) v = -INFINITY;
          s[n][i] = v;
          tmax[half] = fmaxf(tmax[half], v);
        }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
      }
      if constexpr (kDc > 1) {
        if ((lane & 3) == 0) {
          red[dc * kRows + r_lo] = tmax[0];
          red[dc * kRows + r_hi] = tmax[1];
        }
        __syncthreads();
#pragma unroll
        for (int d = 0; d < kDc; ++d) {
          tmax[0] = fmaxf(tmax[0], red[d * kRows + r_lo]);
          tmax[1] = fmaxf(tmax[1], red[d * kRows + r_hi]);
        }
      }
      float alpha[2], m_use[2];
      softmax_rescale(m, l, tmax, alpha, m_use);
      // probabilities -> bf16 P tile
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        const float4 pr = softmax_probs(s[n][0], s[n][1], s[n][2], s[n][3], m_use, l);
        const int key = key0 + n * 8 + (lane & 3) * 2;  // within the tile
        const int chunk = key / 8, byte = (key % 8) * 2;
        *reinterpret_cast<uint32_t*>(p_s + p_offset(r_lo, chunk) + byte) = pack_bf16(pr.x, pr.y);
        *reinterpret_cast<uint32_t*>(p_s + p_offset(r_hi, chunk) + byte) = pack_bf16(pr.z, pr.w);
      }
#pragma unroll
      for (int n = 0; n < kNo; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
      __syncthreads();  // P complete
      compute_pv<kNo>(p_s, half_a, half_b, row0, col0, o);
    }

    cp_async_wait_all();  // nothing may stay in flight into buffers the next unit reuses
    // write_o: total row sums across the quad and the DC warps, then normalise.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    __syncthreads();  // every warp is past its last read of red / p_s
    if constexpr (kDc > 1) {
      if ((lane & 3) == 0) {
        red[dc * kRows + r_lo] = l[0];
        red[dc * kRows + r_hi] = l[1];
      }
      __syncthreads();
      l[0] = l[1] = 0.f;
#pragma unroll
      for (int d = 0; d < kDc; ++d) {
        l[0] += red[d * kRows + r_lo];
        l[1] += red[d * kRows + r_hi];
      }
    }
    const float ln2 = 0.69314718055994530942f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = i == 0 ? r_lo : r_hi;
      if (r >= u.num_rows) continue;
      const float o_scale = kFp8 ? p.o_scale : 1.f;
      const float inv = l[i] > 0.f ? o_scale / l[i] : 0.f;
      const float lse = l[i] > 0.f ? (m[i] + log2f(l[i])) * ln2 : -INFINITY;
      const int64_t row = static_cast<int64_t>(u.q_row_begin) + r;
      if (u.partial < 0) {
        uint16_t* dst = p.o + row * kDimV + col0 + (lane & 3) * 2;
#pragma unroll
        for (int n = 0; n < kNo; ++n) {
          *reinterpret_cast<uint32_t*>(dst + n * 8) =
              pack_bf16(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
        }
        if (dc == 0 && (lane & 3) == 0) p.lse[row] = lse;
      } else {
        const int64_t prow = static_cast<int64_t>(u.partial) * kMaxRows + r;
        float* dst = p.partial_o + prow * kDimV + col0 + (lane & 3) * 2;
#pragma unroll
        for (int n = 0; n < kNo; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) =
              make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
        }
        if (dc == 0 && (lane & 3) == 0) p.partial_lse[prow] = lse;
      }
    }
  }
}

template <bool kFp8>
__device__ __forceinline__ void attention_entry(const AbsorbedParams& p, unsigned char* smem) {
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  if (static_cast<int>(blockIdx.x) >= h.num_ctas) return;
  switch (h.rows_per_tile) {
    case 16: attention_variant<1, kFp8>(p, h, smem); break;
    case 32: attention_variant<2, kFp8>(p, h, smem); break;
    default: attention_variant<4, kFp8>(p, h, smem); break;
  }
}

// bf16 latent cache.
__global__ void __launch_bounds__(kThreads, 1) absorbed_attention_kernel(AbsorbedParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  attention_entry<false>(p, smem_raw);
}

// fp8 e4m3 latent cache (p.kv_cache_fp8).
__global__ void __launch_bounds__(kThreads, 1) absorbed_attention_fp8_kernel(AbsorbedParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  attention_entry<true>(p, smem_raw);
}

// Merges the partial results of split tiles: one block per split tile, one warp per row.
__global__ void __launch_bounds__(256) absorbed_combine_kernel(AbsorbedParams p) {
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  const CombineUnit* combines = reinterpret_cast<const CombineUnit*>(p.plan + h.combines_offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int ci = blockIdx.x; ci < h.num_combines; ci += gridDim.x) {
    const CombineUnit c = combines[ci];
    for (int r = warp; r < c.num_rows; r += 8) {
      float mx = -INFINITY;
      for (int j = 0; j < c.num_partials; ++j) {
        mx = fmaxf(mx, p.partial_lse[static_cast<int64_t>(c.first_partial + j) * kMaxRows + r]);
      }
      float acc[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[i] = 0.f;
      float wsum = 0.f;
      if (mx != -INFINITY) {
        for (int j = 0; j < c.num_partials; ++j) {
          const int64_t prow = static_cast<int64_t>(c.first_partial + j) * kMaxRows + r;
          const float w = __expf(p.partial_lse[prow] - mx);
          wsum += w;
          const float4* src = reinterpret_cast<const float4*>(p.partial_o + prow * kDimV);
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // columns (i * 32 + lane) * 4 .. + 3
            const float4 v = src[i * 32 + lane];
            acc[i * 4 + 0] += w * v.x;
            acc[i * 4 + 1] += w * v.y;
            acc[i * 4 + 2] += w * v.z;
            acc[i * 4 + 3] += w * v.w;
          }
        }
      }
      const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
      const int64_t row = static_cast<int64_t>(c.q_row_begin) + r;
      uint16_t* dst = p.o + row * kDimV;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint2 v;
        v.x = pack_bf16(acc[i * 4 + 0] * inv, acc[i * 4 + 1] * inv);
        v.y = pack_bf16(acc[i * 4 + 2] * inv, acc[i * 4 + 3] * inv);
        *reinterpret_cast<uint2*>(dst + (i * 32 + lane) * 4) = v;
      }
      if (lane == 0) p.lse[row] = wsum > 0.f ? mx + logf(wsum) : -INFINITY;
    }
  }
}

}  // namespace mla::cuda::absorbed
