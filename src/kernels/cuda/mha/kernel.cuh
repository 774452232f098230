// Ragged MHA forward, FlashAttention-2 style: one CTA of 8 warps runs a 128-row query tile of one
// head at a time (persistent grid over (tile, head) units of the plan), K/V in 64-key steps,
// double-buffered with cp.async, XOR-swizzled smem read through ldmatrix, mma.sync m16n8k16 bf16
// with fp32 accumulation, online softmax in registers (log2 domain).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/mha/params.h"
#include "kernels/cuda/mha/traits.h"

namespace mla::cuda::mha {

using Tr = MhaTraits;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kChunks chunks per row.
template <int kChunks>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return static_cast<uint32_t>((row * kChunks + (chunk ^ (row & 7))) * 16);
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16x8] += a[16x16] (row) * b[16x8] (col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Copies rows [0, rows_valid) of a [kRows, kChunks*8] bf16 global tile into swizzled smem;
// rows beyond rows_valid are zero-filled (never read from global).
template <int kRows, int kChunks>
__device__ __forceinline__ void load_tile(uint32_t smem, const uint16_t* g, int64_t row_stride,
                                          int rows_valid) {
  constexpr int kIters = kRows * kChunks / Tr::kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * Tr::kThreads + static_cast<int>(threadIdx.x);
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const bool valid = row < rows_valid;
    const uint16_t* src = valid ? g + row * row_stride + chunk * 8 : g;
    cp_async_16(smem + swizzle<kChunks>(row, chunk), src, valid);
  }
}

// s[16 x 64] = q[16 x 192] k^T for the warp's rows and the step's 64 keys. The q fragments are
// re-read from smem each step (keeping all 12 in registers spilled at 255 registers).
__device__ __forceinline__ void compute_qk(float (&s)[Tr::kBlockN / 8][4], uint32_t q_smem,
                                           uint32_t k_smem, int warp, int lane) {
#pragma unroll
  for (int j = 0; j < Tr::kBlockN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Tr::kQkChunks / 2; ++kk) {
    uint32_t qf[4];
    ldmatrix_x4(qf,
                q_smem + swizzle<Tr::kQkChunks>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
    for (int jp = 0; jp < Tr::kBlockN / 16; ++jp) {
      uint32_t b[4];
      const int n = jp * 16 + (lane >> 4) * 8 + (lane & 7);
      ldmatrix_x4(b, k_smem + swizzle<Tr::kQkChunks>(n, kk * 2 + ((lane >> 3) & 1)));
      mma_bf16(s[2 * jp], qf, b[0], b[1]);
      mma_bf16(s[2 * jp + 1], qf, b[2], b[3]);
    }
  }
}

// Scales logits into the log2 domain and masks keys a row may not see (key >= kv_len, or past
// the causal diagonal: key > diag + row).
__device__ __forceinline__ void scale_and_mask(float (&s)[Tr::kBlockN / 8][4], int key_base,
                                               int kv_len, int diag, int row0, float scale_log2,
                                               bool need_mask, int lane) {
  const int t = lane & 3;
#pragma unroll
  for (int j = 0; j < Tr::kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_base + j * 8 + 2 * t + (e & 1);
      const int row = row0 + (e >> 1) * 8;
      const bool visible = !need_mask || (key < kv_len && key <= diag + row);
      s[j][e] = visible ? s[j][e] * scale_log2 : -INFINITY;
    }
  }
}

// Online softmax over the step: updates the running max m and sum l of the thread's two rows,
// rescales the output accumulator and turns s into probabilities.
__device__ __forceinline__ void online_softmax(float (&s)[Tr::kBlockN / 8][4], float (&m)[2],
                                               float (&l)[2], float (&o)[Tr::kHeadDimV / 8][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < Tr::kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[r], mx);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet stays at 0
    const float alpha = exp2f(m[r] - m_use);
    m[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < Tr::kBlockN / 8; ++j) {
      s[j][2 * r] = exp2f(s[j][2 * r] - m_use);
      s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - m_use);
      sum += s[j][2 * r] + s[j][2 * r + 1];
    }
    l[r] = l[r] * alpha + sum;
#pragma unroll
    for (int d = 0; d < Tr::kHeadDimV / 8; ++d) {
      o[d][2 * r] *= alpha;
      o[d][2 * r + 1] *= alpha;
    }
  }
}

// o[16 x 128] += p[16 x 64] v[64 x 128]; p comes straight from the s accumulators.
__device__ __forceinline__ void compute_pv(float (&o)[Tr::kHeadDimV / 8][4],
                                           const float (&s)[Tr::kBlockN / 8][4], uint32_t v_smem,
                                           int lane) {
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockN / 16; ++kk) {
    const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                           pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                           pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < Tr::kHeadDimV / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_smem + swizzle<Tr::kVChunks>(kk * 16 + (lane & 15),
                                                          dp * 2 + (lane >> 4)));
      mma_bf16(o[2 * dp], a, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Normalises and stores the warp's rows; a row that saw no key gets o = 0, lse = -inf.
__device__ __forceinline__ void write_o(const MhaParams& p, const MhaTile& tile, int head,
                                        float (&o)[Tr::kHeadDimV / 8][4], const float (&m)[2],
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
    for (int d = 0; d < Tr::kHeadDimV / 8; ++d) {
      *reinterpret_cast<uint32_t*>(dst + d * 8) =
          pack_bf16(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    }
    if (p.lse != nullptr && t == 0) {
      p.lse[q_row * p.lse_row_stride + head] =
          empty ? -INFINITY : (m[r] + log2f(l[r])) * 0.69314718055994531f;
    }
  }
}

__device__ __forceinline__ void run_unit(const MhaParams& p, const MhaTile& tile, int head,
                                         uint32_t q_smem, uint32_t k_smem, uint32_t v_smem) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row0 = warp * 16 + (lane >> 2);
  // Keys the tile needs at all: the last row sees diag + q_rows of them.
  int kv_end = tile.kv_len;
  if (tile.diag != kNoDiag) kv_end = min(kv_end, max(tile.diag + tile.q_rows, 0));
  const int num_steps = (kv_end + Tr::kBlockN - 1) / Tr::kBlockN;

  float o[Tr::kHeadDimV / 8][4];
#pragma unroll
  for (int d = 0; d < Tr::kHeadDimV / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  if (num_steps > 0) {
    const uint16_t* q_g = p.q + tile.q_start * p.q_row_stride + head * p.q_head_stride;
    const uint16_t* k_g = p.k + tile.kv_start * p.k_row_stride + head * p.k_head_stride;
    const uint16_t* v_g = p.v + tile.kv_start * p.v_row_stride + head * p.v_head_stride;
    load_tile<Tr::kBlockM, Tr::kQkChunks>(q_smem, q_g, p.q_row_stride, tile.q_rows);
    load_tile<Tr::kBlockN, Tr::kQkChunks>(k_smem, k_g, p.k_row_stride, kv_end);
    load_tile<Tr::kBlockN, Tr::kVChunks>(v_smem, v_g, p.v_row_stride, kv_end);
    cp_async_commit();

    for (int step = 0; step < num_steps; ++step) {
      const int stage = step & 1;
      if (step + 1 < num_steps) {
        const int next = (step + 1) * Tr::kBlockN;
        load_tile<Tr::kBlockN, Tr::kQkChunks>(k_smem + (stage ^ 1) * Tr::kKBytes,
                                              k_g + next * p.k_row_stride, p.k_row_stride,
                                              kv_end - next);
        load_tile<Tr::kBlockN, Tr::kVChunks>(v_smem + (stage ^ 1) * Tr::kVBytes,
                                             v_g + next * p.v_row_stride, p.v_row_stride,
                                             kv_end - next);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();

      float s[Tr::kBlockN / 8][4];
      compute_qk(s, q_smem, k_smem + stage * Tr::kKBytes, warp, lane);
      const int key_base = step * Tr::kBlockN;
      const bool need_mask =
          key_base + Tr::kBlockN > tile.kv_len || key_base + Tr::kBlockN - 1 > tile.diag;
      scale_and_mask(s, key_base, tile.kv_len, tile.diag, row0, p.scale_log2, need_mask, lane);
      online_softmax(s, m, l, o);
      compute_pv(o, s, v_smem + stage * Tr::kVBytes, lane);
      __syncthreads();  // the stage is refilled by the next step's prefetch
    }
  }
  write_o(p, tile, head, o, m, l, row0, lane);
}

__global__ void __launch_bounds__(Tr::kThreads, 1) mha_fwd_kernel(const MhaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_smem = smem_addr(smem);
  const uint32_t k_smem = q_smem + Tr::kQBytes;
  const uint32_t v_smem = k_smem + Tr::kStages * Tr::kKBytes;
  const auto* header = static_cast<const MhaPlanHeader*>(p.plan);
  const auto* tiles = reinterpret_cast<const MhaTile*>(header + 1);
  const int num_units = header->num_tiles * p.num_heads;
  for (int unit = static_cast<int>(blockIdx.x); unit < num_units;
       unit += static_cast<int>(gridDim.x)) {
    const MhaTile tile = tiles[unit / p.num_heads];
    run_unit(p, tile, unit % p.num_heads, q_smem, k_smem, v_smem);
  }
}

}  // namespace mla::cuda::mha
