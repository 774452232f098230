#include "kernels/cpu/cpu_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// The V8 helpers are always inlined into attend_block and its clone, so no vector value
// crosses a call boundary; the ABI note GCC emits for them does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

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
  if (t.ndim < 1)
    return invalid_argument("{}: expected at least one dimension, got {}", name, t.describe());
  if (t.shape[t.ndim - 1] > 1 && t.stride[t.ndim - 1] != 1) {
    return invalid_argument("{}: last dimension must have stride 1, got stride {} ({})", name,
                            t.stride[t.ndim - 1], t.describe());
  }
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.stride[d] < 0)
      return invalid_argument("{}: negative stride {} in dim {}", name, t.stride[d], d);
  }
  return Status::Ok();
}

namespace {

// 8-float vectors (GCC/Clang vector extension): two SSE registers on baseline x86-64, one AVX
// register in the x86-64-v3 clone of attend_block. Unaligned loads/stores through memcpy.
typedef float V8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof(v)); }
[[gnu::always_inline]] inline float hsum8(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

constexpr int kRowBlock = 4;  // query rows sharing each loaded key / value vector

// logits[r, i] (row stride lg_stride) = sm_scale * q[r] . k[i] for rows [r0, r0 + nr) (nr <= 4)
// and keys [0, count). d must be a multiple of 8 (all MLA head dims are). Two keys at a time:
// eight independent accumulator chains cover the FMA latency (4 cycles x 2 pipes); each
// (row, key) sum still runs over x in order, so the result does not depend on the blocking.
[[gnu::always_inline]] inline void logits_rows(const float* q, int64_t q_stride, int r0, int nr,
                                               int d, const float* k, int64_t k_stride, int count,
                                               int lg_stride, float sm_scale, float* logits) {
  const float* qr[kRowBlock];
  for (int j = 0; j < kRowBlock; ++j)
    qr[j] = q + static_cast<int64_t>(r0 + std::min(j, nr - 1)) * q_stride;
  int i = 0;
  for (; i + 2 <= count; i += 2) {
    const float* k0 = k + i * k_stride;
    const float* k1 = k0 + k_stride;
    V8 a00 = {}, a10 = {}, a20 = {}, a30 = {}, a01 = {}, a11 = {}, a21 = {}, a31 = {};
    for (int x = 0; x < d; x += 8) {
      const V8 kv0 = load8(k0 + x), kv1 = load8(k1 + x);
      V8 qv = load8(qr[0] + x);
      a00 += qv * kv0;
      a01 += qv * kv1;
      qv = load8(qr[1] + x);
      a10 += qv * kv0;
      a11 += qv * kv1;
      qv = load8(qr[2] + x);
      a20 += qv * kv0;
      a21 += qv * kv1;
      qv = load8(qr[3] + x);
      a30 += qv * kv0;
      a31 += qv * kv1;
    }
    const float s0[kRowBlock] = {hsum8(a00), hsum8(a10), hsum8(a20), hsum8(a30)};
    const float s1[kRowBlock] = {hsum8(a01), hsum8(a11), hsum8(a21), hsum8(a31)};
    for (int j = 0; j < nr; ++j) {
      logits[static_cast<int64_t>(r0 + j) * lg_stride + i] = sm_scale * s0[j];
      logits[static_cast<int64_t>(r0 + j) * lg_stride + i + 1] = sm_scale * s1[j];
    }
  }
  for (; i < count; ++i) {
    const float* kr = k + i * k_stride;
    V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int x = 0; x < d; x += 8) {
      const V8 kv = load8(kr + x);
      a0 += load8(qr[0] + x) * kv;
      a1 += load8(qr[1] + x) * kv;
      a2 += load8(qr[2] + x) * kv;
      a3 += load8(qr[3] + x) * kv;
    }
    const float s[kRowBlock] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
    for (int j = 0; j < nr; ++j)
      logits[static_cast<int64_t>(r0 + j) * lg_stride + i] = sm_scale * s[j];
  }
}

// acc[r] += sum_{i < count} p[r, i] * v[i] for rows [r0, r0 + nr); p rows have stride
// p_stride and are zero past their own keys. 16 columns at a time (eight accumulator chains),
// 8 for a remainder; each element's sum runs over i in order.
[[gnu::always_inline]] inline void pv_rows(const float* p, int p_stride, int count, int r0, int nr,
                                           const float* v, int64_t v_stride, int dv, float* acc) {
  const float* pr[kRowBlock];
  float* ar[kRowBlock];
  for (int j = 0; j < kRowBlock; ++j) {
    const int r = r0 + std::min(j, nr - 1);
    pr[j] = p + static_cast<int64_t>(r) * p_stride;
    ar[j] = acc + static_cast<int64_t>(r) * dv;
  }
  int x = 0;
  for (; x + 16 <= dv; x += 16) {
    V8 a0 = load8(ar[0] + x), a1 = load8(ar[1] + x), a2 = load8(ar[2] + x), a3 = load8(ar[3] + x);
    V8 b0 = load8(ar[0] + x + 8), b1 = load8(ar[1] + x + 8), b2 = load8(ar[2] + x + 8),
       b3 = load8(ar[3] + x + 8);
    for (int i = 0; i < count; ++i) {
      const float* vr = v + i * v_stride + x;
      const V8 v0 = load8(vr), v1 = load8(vr + 8);
      a0 += pr[0][i] * v0;
      b0 += pr[0][i] * v1;
      a1 += pr[1][i] * v0;
      b1 += pr[1][i] * v1;
      a2 += pr[2][i] * v0;
      b2 += pr[2][i] * v1;
      a3 += pr[3][i] * v0;
      b3 += pr[3][i] * v1;
    }
    // Duplicated rows (nr < 4) computed the same values; store each distinct row once.
    store8(ar[0] + x, a0);
    store8(ar[0] + x + 8, b0);
    if (nr > 1) {
      store8(ar[1] + x, a1);
      store8(ar[1] + x + 8, b1);
    }
    if (nr > 2) {
      store8(ar[2] + x, a2);
      store8(ar[2] + x + 8, b2);
    }
    if (nr > 3) {
      store8(ar[3] + x, a3);
      store8(ar[3] + x + 8, b3);
    }
  }
  for (; x < dv; x += 8) {
    V8 a0 = load8(ar[0] + x), a1 = load8(ar[1] + x), a2 = load8(ar[2] + x), a3 = load8(ar[3] + x);
    for (int i = 0; i < count; ++i) {
      const V8 vv = load8(v + i * v_stride + x);
      a0 += pr[0][i] * vv;
      a1 += pr[1][i] * vv;
      a2 += pr[2][i] * vv;
      a3 += pr[3][i] * vv;
    }
    store8(ar[0] + x, a0);
    if (nr > 1) store8(ar[1] + x, a1);
    if (nr > 2) store8(ar[2] + x, a2);
    if (nr > 3) store8(ar[3] + x, a3);
  }
}

}  // namespace

// Not under ThreadSanitizer: a target_clones function is an ifunc whose resolver the dynamic
// loader runs while relocating, before the TSan runtime is initialised; gcc instruments the
// resolver (__tsan_func_entry), so every TSan binary crashed at start (SIGSEGV in
// "dot [clone .resolver]" under _dl_relocate_object, with or without setarch -R).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define MLA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MLA_CPU_CLONES
#endif

MLA_CPU_CLONES float dot(const float* a, const float* b, int64_t n) {
  V8 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += load8(a + i) * load8(b + i);
    acc1 += load8(a + i + 8) * load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) acc0 += load8(a + i) * load8(b + i);
  float s = hsum8(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

MLA_CPU_CLONES void axpy(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) + alpha * load8(x + i));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// Cloned for x86-64-v3 (AVX2 + FMA) with a baseline fallback chosen at load time: the hot loop
// of both attention ops.
MLA_CPU_CLONES void attend_block(const float* q, int64_t q_stride, int rows, int dqk,
                                 const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                                 int dv, int nk, const int* visible, float sm_scale, float* logits,
                                 float* acc, float* m, float* l) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int nr = std::min(kRowBlock, rows - r0);
    int max_vis = 0;
    for (int j = 0; j < nr; ++j) max_vis = std::max(max_vis, std::min(visible[r0 + j], nk));
    if (max_vis == 0) continue;
    logits_rows(q, q_stride, r0, nr, dqk, k, k_stride, max_vis, nk, sm_scale, logits);
    // Online softmax per row; masked keys get p = 0 so the shared PV loop can run to max_vis.
    for (int j = 0; j < nr; ++j) {
      const int r = r0 + j;
      const int vis = std::min(visible[r], nk);
      float* lg = logits + static_cast<int64_t>(r) * nk;
      float mx = kNegInf;
      for (int i = 0; i < vis; ++i) mx = std::max(mx, lg[i]);
      float* ar = acc + static_cast<int64_t>(r) * dv;
      const float m_new = std::max(m[r], mx);
      if (vis > 0 && m[r] != m_new) {
        const float corr = m[r] == kNegInf ? 0.f : std::exp(m[r] - m_new);
        for (int x = 0; x < dv; ++x) ar[x] *= corr;
        l[r] *= corr;
        m[r] = m_new;
      }
      float sum = 0.f;
      for (int i = 0; i < vis; ++i) {
        lg[i] = std::exp(lg[i] - m_new);
        sum += lg[i];
      }
      for (int i = vis; i < max_vis; ++i) lg[i] = 0.f;
      l[r] += sum;
    }
    pv_rows(logits, nk, max_vis, r0, nr, v, v_stride, dv, acc);
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

MergeWeights merge_weights(float la, float lb) {
  MergeWeights w;
  const float m = std::max(la, lb);
  if (m == -std::numeric_limits<float>::infinity()) return w;  // neither state saw a key
  const float wa = std::exp(la - m), wb = std::exp(lb - m);
  const float inv = 1.f / (wa + wb);
  w.empty = false;
  w.ca = wa * inv;
  w.cb = wb * inv;
  w.lse = m + std::log(wa + wb);
  return w;
}

void merge_row(const float* acc, float m, float l, int dv, uint16_t* o, float* lse) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float lb = l > 0.f ? m + std::log(l) : kNegInf;
  const MergeWeights w = merge_weights(*lse, lb);
  if (w.empty) {
    std::fill(o, o + dv, uint16_t{0});
    *lse = kNegInf;
    return;
  }
  if (lb == kNegInf) return;  // this pass saw no key: the state stays as it is
  const float cb = w.cb / l;  // acc / l is the row's own o
  for (int d = 0; d < dv; ++d) o[d] = float_to_bf16_bits(w.ca * bf16_to_float(o[d]) + cb * acc[d]);
  *lse = w.lse;
}

}  // namespace mla::cpu
