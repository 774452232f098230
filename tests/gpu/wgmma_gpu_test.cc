// The sm90 wgmma primitives (src/kernels/cuda/sm90/wgmma.cuh) against a CPU product: 128B-swizzle
// descriptors for K-major and MN-major B, SS and RS forms, N from 32 to 256, K over one and two
// 64-wide swizzle blocks. Integer-valued bf16 inputs make the fp32 result exact, so any
// difference is a layout error, reported with the first wrong (row, column).
#ifdef MLA_WITH_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/wgmma_probe.h"

namespace mla::testing {
namespace {

uint16_t bf16_of_int(int v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);  // small integers are exact in bf16
}

struct ProbeCase {
  int n, k;
  bool trans_b, rs;
};

void PrintTo(const ProbeCase& p, std::ostream* os) {
  *os << "n " << p.n << ", k " << p.k << (p.trans_b ? ", B transposed" : "")
      << (p.rs ? ", A in registers" : "");
}

class WgmmaPrimitives : public ::testing::TestWithParam<ProbeCase> {};

TEST_P(WgmmaPrimitives, MatchesCpuProduct) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  const ProbeCase c = GetParam();
  std::vector<int> a(64 * c.k), bt(c.n * c.k);  // bt[n][k]
  uint32_t s = 12345u + static_cast<uint32_t>(c.n * 7 + c.k);
  const auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<int>((s >> 24) % 7) - 3;
  };
  for (int& v : a) v = next();
  for (int& v : bt) v = next();
  std::vector<uint16_t> a_h(a.size()), b_h(bt.size());
  for (size_t i = 0; i < a.size(); ++i) a_h[i] = bf16_of_int(a[i]);
  for (int n = 0; n < c.n; ++n)
    for (int k = 0; k < c.k; ++k) {
      const uint16_t v = bf16_of_int(bt[n * c.k + k]);
      if (c.trans_b)
        b_h[k * c.n + n] = v;
      else
        b_h[n * c.k + k] = v;
    }
  void *a_d = nullptr, *b_d = nullptr, *d_d = nullptr;
  ASSERT_EQ(cudaMalloc(&a_d, a_h.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b_d, b_h.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_d, 64 * c.n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(a_d, a_h.data(), a_h.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b_d, b_h.data(), b_h.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_d, 0xff, 64 * c.n * 4), cudaSuccess);
  const cudaError_t e =
      cuda::sm90::wgmma_probe(c.n, c.k, c.trans_b, c.rs, static_cast<uint16_t*>(a_d),
                              static_cast<uint16_t*>(b_d), static_cast<float*>(d_d));
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  std::vector<float> d(64 * c.n);
  ASSERT_EQ(cudaMemcpy(d.data(), d_d, d.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(a_d);
  cudaFree(b_d);
  cudaFree(d_d);
  int wrong = 0;
  for (int r = 0; r < 64; ++r)
    for (int n = 0; n < c.n; ++n) {
      int want = 0;
      for (int k = 0; k < c.k; ++k) want += a[r * c.k + k] * bt[n * c.k + k];
      const float got = d[r * c.n + n];
      if (got != static_cast<float>(want)) {
        if (wrong < 4) {
          ADD_FAILURE() << "D[" << r << "][" << n << "] = " << got << ", expected " << want;
        }
        ++wrong;
      }
    }
  EXPECT_EQ(wrong, 0) << wrong << " of " << 64 * c.n << " wrong (n " << c.n << ", k " << c.k
                      << (c.trans_b ? ", B MN-major" : ", B K-major") << (c.rs ? ", RS)" : ", SS)");
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, WgmmaPrimitives,
    ::testing::Values(ProbeCase{32, 128, false, false}, ProbeCase{64, 64, false, false},
                      ProbeCase{256, 128, false, false}, ProbeCase{64, 64, true, false},
                      ProbeCase{256, 64, true, false}, ProbeCase{256, 128, true, false},
                      ProbeCase{64, 128, false, true}, ProbeCase{64, 64, true, true},
                      ProbeCase{256, 64, true, true}),
    [](const ::testing::TestParamInfo<ProbeCase>& info) {
      const ProbeCase& c = info.param;
      return std::string(c.rs ? "rs" : "ss") + "_n" + std::to_string(c.n) + "_k" +
             std::to_string(c.k) + (c.trans_b ? "_mn" : "_k_major");
    });

}  // namespace
}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
