// The online-softmax steps of the absorbed tile kernel (sm90_ws.cuh), kept apart from it. A
// thread holds two rows (lo, hi) of the tile; logits are in the base-2 domain
// (scale * log2(e) folded in), masked keys are -inf.
#pragma once

#include <cmath>

namespace mla::cuda::absorbed {

// New running maxima from this tile's row maxima tmax: alpha = the factor that rescales the old
// output and sums (0 while a row has seen no key), m_use = the maximum to subtract (0 for a row
// with no key so far, so exp2(-inf - m_use) stays 0 instead of NaN). Scales l by alpha.
__device__ __forceinline__ void softmax_rescale(float (&m)[2], float (&l)[2],
                                                const float (&tmax)[2], float (&alpha)[2],
                                                float (&m_use)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], tmax[i]);
    m_use[i] = m_new == -INFINITY ? 0.f : m_new;
    alpha[i] = exp2f(m[i] - m_use[i]);  // m = -inf -> 0
    m[i] = m_new;
    l[i] *= alpha[i];
  }
}

// Probabilities of one accumulator quad (row lo: s0, s1; row hi: s2, s3), added to the rows'
// sums. Returns {p0, p1, p2, p3}.
__device__ __forceinline__ float4 softmax_probs(float s0, float s1, float s2, float s3,
                                                const float (&m_use)[2], float (&l)[2]) {
  const float4 p = make_float4(exp2f(s0 - m_use[0]), exp2f(s1 - m_use[0]), exp2f(s2 - m_use[1]),
                               exp2f(s3 - m_use[1]));
  l[0] += p.x + p.y;
  l[1] += p.z + p.w;
  return p;
}

}  // namespace mla::cuda::absorbed
