#include "conformance/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "conformance/case_gen.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Softmax-weighted sum over `n` keys: logits [n] -> o [dv] += p * v_row(i), returns the LSE.
// Rows with n == 0 leave o at zero and return -inf.
template <typename VRow>
double softmax_accumulate(const std::vector<double>& logits, int64_t n, int dv, VRow v_row,
                          double* o) {
  std::fill(o, o + dv, 0.0);
  if (n == 0) return kNegInf;
  double m = kNegInf;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double p = std::exp(logits[i] - m);
    sum += p;
    const auto v = v_row(i);
    for (int d = 0; d < dv; ++d) o[d] += p * v(d);
  }
  for (int d = 0; d < dv; ++d) o[d] /= sum;
  return m + std::log(sum);
}

// Number of keys query j of a request (q_len, kv_len) sees.
int64_t visible_keys(bool causal, int64_t q_len, int64_t kv_len, int64_t j) {
  if (!causal) return kv_len;
  return std::clamp<int64_t>(kv_len - q_len + j + 1, 0, kv_len);
}

}  // namespace

RefAttention dense_attention(std::span<const float> q, std::span<const float> k,
                             std::span<const float> v, int64_t tq, int64_t tk, int num_heads,
                             int kv_heads, int dqk, int dv, double sm_scale, bool causal) {
  RefAttention r;
  r.o.assign(static_cast<std::size_t>(tq * num_heads * dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(tq * num_heads), kNegInf);
  std::vector<double> logits(static_cast<std::size_t>(tk));
  for (int64_t t = 0; t < tq; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      const int kh = kv_heads == 1 ? 0 : h;
      const float* qr = q.data() + (t * num_heads + h) * dqk;
      const int64_t n = visible_keys(causal, tq, tk, t);
      for (int64_t i = 0; i < n; ++i) {
        const float* kr = k.data() + (i * kv_heads + kh) * dqk;
        double s = 0.0;
        for (int d = 0; d < dqk; ++d) s += static_cast<double>(qr[d]) * kr[d];
        logits[i] = s * sm_scale;
      }
      auto v_row = [&](int64_t i) {
        const float* vr = v.data() + (i * kv_heads + kh) * dv;
        return [vr](int d) { return static_cast<double>(vr[d]); };
      };
      r.lse[t * num_heads + h] =
          softmax_accumulate(logits, n, dv, v_row, r.o.data() + (t * num_heads + h) * dv);
    }
  }
  return r;
}

RefAttention reference_absorbed(const AbsorbedRefProblem& p, std::span<const float> q,
                                std::span<const float> cache_stored) {
  constexpr int kLatent = 576, kDv = 512;
  const int h_count = p.num_heads;
  int64_t total_q = 0;
  for (int32_t ql : p.q_lens) total_q += ql;
  RefAttention r;
  r.o.assign(static_cast<std::size_t>(total_q * h_count * kDv), 0.0);
  r.lse.assign(static_cast<std::size_t>(total_q * h_count), kNegInf);
  int64_t q_base = 0;
  std::vector<double> kv;  // [kv_len, 576] dequantised rows of this request
  std::vector<double> logits;
  for (std::size_t b = 0; b < p.q_lens.size(); ++b) {
    const int64_t q_len = p.q_lens[b], kv_len = p.kv_lens[b];
    kv.assign(static_cast<std::size_t>(kv_len * kLatent), 0.0);
    for (int64_t i = 0; i < kv_len; ++i) {
      const int64_t slot =
          p.block_table.empty()
              ? slot_of_token(p.req_to_token.data(), p.row_stride, p.req_rows[b], i, p.page_size)
              : slot_of_block(p.block_table.data(), p.row_stride, p.req_rows[b], i, p.page_size);
      for (int d = 0; d < kLatent; ++d) {
        kv[i * kLatent + d] = dequant(cache_stored[slot * kLatent + d], p.cache_dtype, p.k_scale);
      }
    }
    logits.assign(static_cast<std::size_t>(kv_len), 0.0);
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t t = q_base + j;
      const int64_t n = visible_keys(p.causal, q_len, kv_len, j);
      for (int h = 0; h < h_count; ++h) {
        const float* qr = q.data() + (t * h_count + h) * kLatent;
        for (int64_t i = 0; i < n; ++i) {
          double s = 0.0;
          for (int d = 0; d < kLatent; ++d) s += static_cast<double>(qr[d]) * kv[i * kLatent + d];
          logits[i] = s * p.sm_scale;
        }
        auto v_row = [&](int64_t i) {
          const double* vr = kv.data() + i * kLatent;
          return [vr](int d) { return vr[d]; };
        };
        r.lse[t * h_count + h] =
            softmax_accumulate(logits, n, kDv, v_row, r.o.data() + (t * h_count + h) * kDv);
      }
    }
    q_base += q_len;
  }
  return r;
}

RefAttention reference_mha(std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, std::span<const int32_t> qo_indptr,
                           std::span<const int32_t> kv_indptr, int num_heads, double sm_scale,
                           bool causal) {
  constexpr int kDqk = 192, kDv = 128;
  const int64_t total_q = qo_indptr.empty() ? 0 : qo_indptr.back();
  RefAttention r;
  r.o.assign(static_cast<std::size_t>(total_q * num_heads * kDv), 0.0);
  r.lse.assign(static_cast<std::size_t>(total_q * num_heads), kNegInf);
  for (std::size_t b = 0; b + 1 < qo_indptr.size(); ++b) {
    const int64_t q0 = qo_indptr[b], tq = qo_indptr[b + 1] - q0;
    const int64_t k0 = kv_indptr[b], tk = kv_indptr[b + 1] - k0;
    RefAttention part = dense_attention(q.subspan(q0 * num_heads * kDqk, tq * num_heads * kDqk),
                                        k.subspan(k0 * num_heads * kDqk, tk * num_heads * kDqk),
                                        v.subspan(k0 * num_heads * kDv, tk * num_heads * kDv), tq,
                                        tk, num_heads, num_heads, kDqk, kDv, sm_scale, causal);
    std::copy(part.o.begin(), part.o.end(), r.o.begin() + q0 * num_heads * kDv);
    std::copy(part.lse.begin(), part.lse.end(), r.lse.begin() + q0 * num_heads);
  }
  return r;
}

RefAttention reference_merge(std::span<const double> o_a, std::span<const double> lse_a,
                             std::span<const double> o_b, std::span<const double> lse_b,
                             int64_t rows, int dim) {
  RefAttention r;
  r.o.assign(static_cast<std::size_t>(rows * dim), 0.0);
  r.lse.assign(static_cast<std::size_t>(rows), kNegInf);
  for (int64_t i = 0; i < rows; ++i) {
    const double la = lse_a[i], lb = lse_b[i];
    const double m = std::max(la, lb);
    if (m == kNegInf) continue;  // both empty: o = 0, lse = -inf
    const double wa = std::exp(la - m), wb = std::exp(lb - m);
    for (int d = 0; d < dim; ++d) {
      r.o[i * dim + d] = (wa * o_a[i * dim + d] + wb * o_b[i * dim + d]) / (wa + wb);
    }
    r.lse[i] = m + std::log(wa + wb);
  }
  return r;
}

std::vector<double> reference_kv_write(std::span<const float> c_kv, std::span<const float> k_pe,
                                       int64_t num_tokens, DType cache_dtype, float k_scale) {
  constexpr int kRank = 512, kRope = 64, kLatent = 576;
  const double inv = cache_dtype == DType::kFP8E4M3 ? 1.0 / k_scale : 1.0;
  std::vector<double> rows(static_cast<std::size_t>(num_tokens * kLatent));
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int d = 0; d < kRank; ++d) rows[t * kLatent + d] = c_kv[t * kRank + d] * inv;
    for (int d = 0; d < kRope; ++d) rows[t * kLatent + kRank + d] = k_pe[t * kRope + d] * inv;
  }
  return rows;
}

RefUpProject reference_up_project(std::span<const float> cache_stored, DType cache_dtype,
                                  float k_scale, std::span<const int32_t> slots,
                                  std::span<const float> kv_b_proj, int num_heads) {
  constexpr int kRank = 512, kLatent = 576, kNope = 128, kRope = 64, kDv = 128, kDqk = 192;
  const int64_t n_rows = static_cast<int64_t>(slots.size());
  RefUpProject r;
  r.k.assign(static_cast<std::size_t>(n_rows * num_heads * kDqk), 0.0);
  r.v.assign(static_cast<std::size_t>(n_rows * num_heads * kDv), 0.0);
  std::vector<double> row(kLatent);
  for (int64_t n = 0; n < n_rows; ++n) {
    for (int d = 0; d < kLatent; ++d) {
      row[d] = dequant(cache_stored[slots[n] * int64_t{kLatent} + d], cache_dtype, k_scale);
    }
    for (int h = 0; h < num_heads; ++h) {
      const float* w_uk = kv_b_proj.data() + static_cast<int64_t>(h) * 256 * kRank;
      const float* w_uv = w_uk + kNope * kRank;
      double* k_out = r.k.data() + (n * num_heads + h) * kDqk;
      double* v_out = r.v.data() + (n * num_heads + h) * kDv;
      for (int e = 0; e < kNope; ++e) {
        double sk = 0.0, sv = 0.0;
        for (int d = 0; d < kRank; ++d) {
          sk += row[d] * w_uk[e * kRank + d];
          sv += row[d] * w_uv[e * kRank + d];
        }
        k_out[e] = sk;
        v_out[e] = sv;
      }
      for (int d = 0; d < kRope; ++d) k_out[kNope + d] = row[kRank + d];
    }
  }
  return r;
}

std::vector<double> reference_head_gemm(std::span<const float> x, std::span<const float> w,
                                        int64_t num_tokens, int num_heads, int k, int n,
                                        int64_t w_head_stride, int64_t w_row_stride,
                                        bool transpose_w) {
  std::vector<double> y(static_cast<std::size_t>(num_tokens * num_heads * n), 0.0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      const float* xr = x.data() + (t * num_heads + h) * k;
      const float* wh = w.data() + h * w_head_stride;
      double* yr = y.data() + (t * num_heads + h) * n;
      for (int j = 0; j < n; ++j) {
        double s = 0.0;
        for (int i = 0; i < k; ++i) {
          const float wv = transpose_w ? wh[j * w_row_stride + i] : wh[i * w_row_stride + j];
          s += static_cast<double>(xr[i]) * wv;
        }
        yr[j] = s;
      }
    }
  }
  return y;
}

}  // namespace mla::testing
