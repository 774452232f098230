// Plain double-precision reference of every op. Inputs are the exact values the op sees
// (bf16/fp8 storage decoded to float); outputs are double. Semantics follow include/mla/ops.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mla/types.h"

namespace mla::testing {

struct RefAttention {
  std::vector<double> o;    // [T, H, Dv]
  std::vector<double> lse;  // [T, H] natural log; -inf for rows with no visible key
};

// Dense unpaged attention. q [tq, H, dqk]; k [tk, kv_heads, dqk]; v [tk, kv_heads, dv];
// kv_heads is H (MHA) or 1 (MQA). Causal is bottom-right: query j sees keys 0 .. tk - tq + j.
RefAttention dense_attention(std::span<const float> q, std::span<const float> k,
                             std::span<const float> v, int64_t tq, int64_t tk, int num_heads,
                             int kv_heads, int dqk, int dv, double sm_scale, bool causal);

// Absorbed paged attention. q [T, H, 576]; cache_stored [num_slots, 576] stored values
// (dequantised here: times k_scale only for fp8); the page table is req_to_token
// [rows, row_stride] or, when block_table is given, a block table of page ids [rows, row_stride].
// Output o [T, H, 512], lse [T, H].
struct AbsorbedRefProblem {
  int num_heads = 0;
  int page_size = 1;
  bool causal = true;
  double sm_scale = 0.0;
  DType cache_dtype = DType::kBF16;
  float k_scale = 1.0f;
  int64_t row_stride = 0;  // columns of the page table
  std::span<const int32_t> req_to_token;
  std::span<const int32_t> block_table;  // used instead of req_to_token when not empty
  std::span<const int32_t> req_rows;     // [bs]
  std::span<const int32_t> q_lens;       // [bs]
  std::span<const int32_t> kv_lens;      // [bs]
};
RefAttention reference_absorbed(const AbsorbedRefProblem& p, std::span<const float> q,
                                std::span<const float> cache_stored);

// Ragged MHA. q [Tq, H, 192], k [Tk, H, 192], v [Tk, H, 128]; indptrs [bs + 1].
RefAttention reference_mha(std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, std::span<const int32_t> qo_indptr,
                           std::span<const int32_t> kv_indptr, int num_heads, double sm_scale,
                           bool causal);

// Merge of two partial states, rows = T * H, o [rows, dim], lse [rows].
RefAttention reference_merge(std::span<const double> o_a, std::span<const double> lse_a,
                             std::span<const double> o_b, std::span<const double> lse_b,
                             int64_t rows, int dim);

// Latent KV write: the stored value of each written row, [T, 576] = [c_kv | k_pe]
// (divided by k_scale for fp8). c_kv [T, 512], k_pe [T, 64] contiguous.
std::vector<double> reference_kv_write(std::span<const float> c_kv, std::span<const float> k_pe,
                                       int64_t num_tokens, DType cache_dtype, float k_scale);

// Up-projection of gathered cache rows. cache_stored [num_slots, 576]; slots [N];
// kv_b_proj [H * 256, 512]. k [N, H, 192] = [c_kv @ W_UK^T | k_pe], v [N, H, 128].
struct RefUpProject {
  std::vector<double> k;
  std::vector<double> v;
};
RefUpProject reference_up_project(std::span<const float> cache_stored, DType cache_dtype,
                                  float k_scale, std::span<const int32_t> slots,
                                  std::span<const float> kv_b_proj, int num_heads);

// Per-head GEMM. x [T, H, K] contiguous; W_h at w + h * w_head_stride with rows of
// w_row_stride: [K, N] (transpose_w false) or [N, K] (true). y [T, H, N].
std::vector<double> reference_head_gemm(std::span<const float> x, std::span<const float> w,
                                        int64_t num_tokens, int num_heads, int k, int n,
                                        int64_t w_head_stride, int64_t w_row_stride,
                                        bool transpose_w);

}  // namespace mla::testing
