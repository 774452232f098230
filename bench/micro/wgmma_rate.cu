// Tensor-core rate of wgmma m64nNk16 (bf16 -> f32) on one Hopper SM, by N and operand source:
// the question an fp8 decode kernel for 16 or 32 heads must settle before it swaps A and B
// (S^T = K Q^T with N = heads, O^T = V^T P^T with N = heads): does a small-N wgmma run at its
// share of the SM's rate (2 x 64 x N x 16 FLOP in N / 8 clocks at 4096 FLOP per clock), or at a
// per-instruction floor? One CTA per SM (the whole GPU, so clocks and power are those of a busy
// part), kWarpgroups warpgroups each issuing kChain wgmmas per commit group, kGroups groups,
// waiting for all but one group; the operands are bf16 ones in shared memory (and registers for
// RS), so only the issue rate counts. Prints one JSON line per case: clocks per wgmma per
// SM, FLOP per clock per SM, TFLOP/s over the GPU at the measured clock.
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I src \
//     bench/micro/wgmma_rate.cu -o wgmma_rate
//   ./wgmma_rate                    (on the GPU machine; ~1 s)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/cuda/sm90/wgmma.cuh"

using namespace mla::cuda::sm90;

namespace {

constexpr int kChain = 8;     // wgmmas per commit group
constexpr int kGroups = 512;  // commit groups per warpgroup
constexpr int kSmem = 64 * 1024;
constexpr uint32_t kOnes = 0x3f803f80u;  // two bf16 1.0: busy data, finite sums

template <int N, bool kRs>
__global__ void __launch_bounds__(256, 1) rate_kernel(long long* clocks, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < kSmem / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(kOnes, kOnes, kOnes, kOnes);
  }
  __syncthreads();
  fence_proxy_async();
  const uint32_t base = smem_u32(smem);
  const uint64_t desc_a = desc_k_sw128(base), desc_b = desc_k_sw128(base + 32 * 1024);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const uint32_t a[4] = {kOnes, kOnes, kOnes, kOnes};
  __syncthreads();
  const long long t0 = clock64();
  for (int g = 0; g < kGroups; ++g) {
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kChain; ++c) {
      if constexpr (kRs) {
        wgmma_rs_bf16<N, 0>(d, a, desc_b + 2 * c, true);
      } else {
        wgmma_ss_bf16<N, 0>(d, desc_a + 2 * c, desc_b + 2 * c, true);
      }
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  fence_regs(d);
  const long long t1 = clock64();
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += d[i];
  sink[threadIdx.x] = s;  // keeps the chain alive
  if (threadIdx.x == 0) clocks[blockIdx.x] = t1 - t0;
}

template <int N, bool kRs>
void run_case(int sms, int warpgroups, long long* clocks, float* sink, double clock_ghz) {
  auto kernel = rate_kernel<N, kRs>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  for (int rep = 0; rep < 2; ++rep) {  // the first launch warms up
    kernel<<<sms, 128 * warpgroups, kSmem>>>(clocks, sink);
  }
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::printf("{\"n\": %d, \"error\": \"%s\"}\n", N, cudaGetErrorString(e));
    return;
  }
  long long host[1024];
  cudaMemcpy(host, clocks, sizeof(long long) * sms, cudaMemcpyDeviceToHost);
  long long worst = 0;
  for (int i = 0; i < sms; ++i) worst = host[i] > worst ? host[i] : worst;
  const double wgmmas = static_cast<double>(kGroups) * kChain * warpgroups;  // per SM
  const double clk_per = static_cast<double>(worst) / wgmmas;
  const double flop_per_clk = 2.0 * 64 * N * 16 / clk_per;
  std::printf(
      "{\"bench\": \"wgmma_rate\", \"n\": %d, \"a\": \"%s\", \"warpgroups\": %d, "
      "\"clocks_per_wgmma\": %.2f, \"flop_per_clock_per_sm\": %.0f, \"tflops_at_clock\": %.1f, "
      "\"clock_ghz\": %.3f}\n",
      N, kRs ? "registers" : "shared", warpgroups, clk_per, flop_per_clk,
      flop_per_clk * sms * clock_ghz * 1e-3, clock_ghz);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const double ghz = clock_khz * 1e-6;
  std::printf("{\"gpu\": \"%s\", \"sms\": %d, \"max_clock_ghz\": %.3f}\n", prop.name,
              prop.multiProcessorCount, ghz);
  long long* clocks = nullptr;
  float* sink = nullptr;
  cudaMalloc(&clocks, sizeof(long long) * 1024);
  cudaMalloc(&sink, sizeof(float) * 256);
  const int sms = prop.multiProcessorCount;
  for (int wg = 1; wg <= 2; ++wg) {
    run_case<16, true>(sms, wg, clocks, sink, ghz);
    run_case<32, true>(sms, wg, clocks, sink, ghz);
    run_case<64, true>(sms, wg, clocks, sink, ghz);
    run_case<16, false>(sms, wg, clocks, sink, ghz);
    run_case<32, false>(sms, wg, clocks, sink, ghz);
    run_case<64, false>(sms, wg, clocks, sink, ghz);
    run_case<256, false>(sms, wg, clocks, sink, ghz);
  }
  return 0;
}
