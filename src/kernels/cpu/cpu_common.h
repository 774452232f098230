// Shared helpers of the cpu ops: storage conversion, vectorisable dot/axpy, argument checks,
// workspace carving and the plan blob header.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "mla/ops.h"
#include "mla/status.h"
#include "mla/tensor.h"
#include "mla/types.h"
#include "mla/workspace.h"

namespace mla::cpu {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Converts n bf16 values to float.
inline void bf16_row_to_float(const uint16_t* src /* [n] */, int64_t n, float* dst /* [n] */) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// 256-entry decode table of fp8 e4m3 times `scale`.
std::array<float, 256> fp8_table(float scale);

// Dequantises one cache row of n values into float: bf16 as is (k_scale ignored), fp8 through
// the table (which already holds value * k_scale).
inline void cache_row_to_float(const void* cache, DType dtype, int64_t row, int64_t row_stride,
                               int64_t n, const float* fp8_lut, float* dst /* [n] */) {
  if (dtype == DType::kFP8E4M3) {
    const uint8_t* src = static_cast<const uint8_t*>(cache) + row * row_stride;
    for (int64_t i = 0; i < n; ++i) dst[i] = fp8_lut[src[i]];
  } else {
    bf16_row_to_float(static_cast<const uint16_t*>(cache) + row * row_stride, n, dst);
  }
}

// fp32 dot product and axpy, vectorised (8-wide lanes; x86-64-v3 clone where available).
float dot(const float* a /* [n] */, const float* b /* [n] */, int64_t n);
// y[0:n] += alpha * x[0:n]
void axpy(float alpha, const float* x /* [n] */, float* y /* [n] */, int64_t n);

inline uint16_t float_to_bf16_bits(float f) { return bf16::from_float(f).bits; }

// Checks a view's inner dims are dense (stride 1 last, rows may be strided).
Status expect_inner_dense(const TensorView& t, std::string_view name);

// The library's workspace carver (mla/workspace.h): named, 256-byte aligned carves, measuring
// when built without a buffer; the ops use take(), which fails at the first carve that does not
// fit with kOutOfWorkspace naming the carve and the shortfall.
using Carver = WorkspaceCarver;

// Header at the start of every cpu plan blob.
struct PlanHeader {
  uint32_t magic = 0;  // per op
  uint32_t version = 1;
  int32_t batch_size = 0;
  int32_t num_heads = 0;
  int32_t page_size = 0;
  int32_t causal = 0;
  int64_t total_q = 0;
  int64_t total_kv = 0;
  int32_t max_q_len = 0;
  int32_t max_kv_len = 0;
};
inline constexpr uint32_t kAbsorbedPlanMagic = 0x4d4c4141;  // "AALM"
inline constexpr uint32_t kMhaPlanMagic = 0x4d4c414d;       // "MALM"

// Online-softmax attention of `rows` query rows against one block of `nk` keys, all in fp32.
// q [rows, dqk] (row stride q_stride); k [nk, dqk] (k_stride); v [nk, dv] (v_stride);
// visible[r] = keys of this block row r may see (0..nk, keys past it are masked);
// logits [rows, nk] scratch; acc [rows, dv], m [rows], l [rows] running state. dqk and dv must
// be multiples of 8 (576, 512, 192, 128 are).
void attend_block(const float* q, int64_t q_stride, int rows, int dqk, const float* k,
                  int64_t k_stride, const float* v, int64_t v_stride, int dv, int nk,
                  const int* visible, float sm_scale, float* logits, float* acc, float* m,
                  float* l);

// Writes one finished row: o = acc / l as bf16 and *lse = m + log(l); a row with l == 0 (no
// visible key) gets o = 0 and lse = -inf. lse may be null.
void finish_row(const float* acc /* [dv] */, float m, float l, int dv, uint16_t* o /* [dv] */,
                float* lse);

// SYSTEM.md 1's merge of two states by their LSEs la, lb: o = ca * o_a + cb * o_b and the merged
// lse; empty when both are -inf (then o = 0, lse = -inf). The merge op and merge_row share it.
struct MergeWeights {
  bool empty = true;
  float ca = 0.f, cb = 0.f, lse = 0.f;
};
MergeWeights merge_weights(float la, float lb);

// Merges one finished row into a state already in (o, *lse) (MhaArgs::merge_into_output): the
// row's own state is o_b = acc / l, lse_b = m + log(l) (empty when l == 0), and the result is
// SYSTEM.md 1's merge of the two, rounded to bf16 once. lse must not be null.
void merge_row(const float* acc /* [dv] */, float m, float l, int dv, uint16_t* o /* [dv] */,
               float* lse);

// Factories of the cpu ops (one file each).
std::shared_ptr<const AbsorbedAttentionOp> make_absorbed_op();
std::shared_ptr<const MhaAttentionOp> make_mha_op();
std::shared_ptr<const MergeOp> make_merge_op();
std::shared_ptr<const KvWriteOp> make_kv_write_op();
std::shared_ptr<const UpProjectOp> make_up_project_op();
std::shared_ptr<const HeadGemmOp> make_head_gemm_op();

}  // namespace mla::cpu
