#include "kernels/cpu/cpu_common.h"

#include <cmath>
#include <limits>

namespace mla::cpu {

std::array<float, 256> fp8_table(float scale) {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) {
    fp8_e4m3 f;
    f.bits = static_cast<uint8_t>(i);
    t[i] = f.to_float() * scale;
  }
  return t;
}

Status expect_inner_dense(const TensorView& t, std::string_view name) {
  if (t.ndim < 1) return invalid_argument("{}: expected at least one dimension, got {}", name, t.describe());
  if (t.shape[t.ndim - 1] > 1 && t.stride[t.ndim - 1] != 1) {
    return invalid_argument("{}: last dimension must have stride 1, got stride {} ({})", name,
                            t.stride[t.ndim - 1], t.describe());
  }
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.stride[d] < 0) return invalid_argument("{}: negative stride {} in dim {}", name, t.stride[d], d);
  }
  return Status::Ok();
}

void attend_block(const float* q, int64_t q_stride, int rows, int dqk, const float* k,
                  int64_t k_stride, const float* v, int64_t v_stride, int dv, int nk,
                  const int* visible, float sm_scale, float* logits, float* acc, float* m,
                  float* l) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < rows; ++r) {
    const int vis = std::min(visible[r], nk);
    if (vis <= 0) continue;
    float* lg = logits + static_cast<int64_t>(r) * nk;
    const float* qr = q + r * q_stride;
    float mx = kNegInf;
    for (int i = 0; i < vis; ++i) {
      lg[i] = sm_scale * dot(qr, k + i * k_stride, dqk);
      mx = std::max(mx, lg[i]);
    }
    float* ar = acc + static_cast<int64_t>(r) * dv;
    const float m_new = std::max(m[r], mx);
    if (m[r] != m_new) {
      const float corr = m[r] == kNegInf ? 0.f : std::exp(m[r] - m_new);
      for (int d = 0; d < dv; ++d) ar[d] *= corr;
      l[r] *= corr;
      m[r] = m_new;
    }
    float sum = 0.f;
    for (int i = 0; i < vis; ++i) {
      lg[i] = std::exp(lg[i] - m_new);
      sum += lg[i];
    }
    l[r] += sum;
    for (int i = 0; i < vis; ++i) axpy(lg[i], v + i * v_stride, ar, dv);
  }
}

void finish_row(const float* acc, float m, float l, int dv, uint16_t* o, float* lse) {
  if (l <= 0.f) {
    std::fill(o, o + dv, uint16_t{0});
    if (lse) *lse = -std::numeric_limits<float>::infinity();
    return;
  }
  const float inv = 1.f / l;
  for (int d = 0; d < dv; ++d) o[d] = float_to_bf16_bits(acc[d] * inv);
  if (lse) *lse = m + std::log(l);
}

}  // namespace mla::cpu
