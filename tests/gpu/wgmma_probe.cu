#include "gpu/wgmma_probe.h"
#include "kernels/cuda/sm90/wgmma.cuh"

namespace mla::cuda::sm90 {
namespace {

// Element (row, col) of a [rows x cols] bf16 matrix stored as cols / 64 swizzled column blocks.
__device__ uint32_t blocked_offset(int rows, int row, int col) {
  return static_cast<uint32_t>((col / 64) * rows * 128) + sw128_offset(row, (col % 64) / 8) +
         (col % 8) * 2;
}

template <int N, int K, int kTransB, bool kRs>
__global__ void __launch_bounds__(128)
    probe_kernel(const uint16_t* a, const uint16_t* b, float* d) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* a_s = smem;               // [64 x K]: K / 64 blocks of 8 KiB
  unsigned char* b_s = smem + 64 * K * 2;  // trans 0: [N x K]; trans 1: [K x N]
  const int t = threadIdx.x;
  for (int i = t; i < 64 * K; i += 128) {
    const int r = i / K, c = i % K;
    *reinterpret_cast<uint16_t*>(a_s + blocked_offset(64, r, c)) = a[i];
  }
  for (int i = t; i < N * K; i += 128) {
    if (kTransB) {
      const int r = i / N, c = i % N;  // r: k, c: n
      *reinterpret_cast<uint16_t*>(b_s + blocked_offset(K, r, c)) = b[i];
    } else {
      const int r = i / K, c = i % K;  // r: n, c: k
      *reinterpret_cast<uint16_t*>(b_s + blocked_offset(N, r, c)) = b[i];
    }
  }
  fence_proxy_async();
  __syncthreads();
  const int w = t / 32, lane = t % 32;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  uint32_t afrag[K / 16][4];
  if constexpr (kRs) {
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = 16 * w + lane / 4 + 8 * (j & 1);
        const int c = ks * 16 + 2 * (lane % 4) + 8 * (j >> 1);
        afrag[ks][j] =
            static_cast<uint32_t>(a[r * K + c]) | (static_cast<uint32_t>(a[r * K + c + 1]) << 16);
      }
    }
  }
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    uint64_t db;
    if (kTransB) {
      db = desc_mn_sw128(smem_u32(b_s) + ks * 2048, K * 128);
    } else {
      db = desc_k_sw128(smem_u32(b_s) + (ks / 4) * N * 128 + (ks % 4) * 32);
    }
    if constexpr (kRs) {
      wgmma_rs_bf16<N, kTransB>(acc, afrag[ks], db, ks > 0);
    } else {
      const uint64_t da = desc_k_sw128(smem_u32(a_s) + (ks / 4) * 64 * 128 + (ks % 4) * 32);
      wgmma_ss_bf16<N, kTransB>(acc, da, db, ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(acc);
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * w + lane / 4 + 8 * (i / 2), c = 8 * j + 2 * (lane % 4) + i % 2;
      d[r * N + c] = acc[4 * j + i];
    }
}

template <int N, int K, int kTransB, bool kRs>
cudaError_t launch(const uint16_t* a, const uint16_t* b, float* d) {
  const int smem = (64 * K + N * K) * 2;
  cudaError_t e = cudaFuncSetAttribute(probe_kernel<N, K, kTransB, kRs>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  probe_kernel<N, K, kTransB, kRs><<<1, 128, smem>>>(a, b, d);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

template <int N, int K>
cudaError_t launch_nk(bool trans_b, bool rs, const uint16_t* a, const uint16_t* b, float* d) {
  if (rs) return trans_b ? launch<N, K, 1, true>(a, b, d) : launch<N, K, 0, true>(a, b, d);
  return trans_b ? launch<N, K, 1, false>(a, b, d) : launch<N, K, 0, false>(a, b, d);
}

}  // namespace

cudaError_t wgmma_probe(int n, int k, bool trans_b, bool rs, const uint16_t* a, const uint16_t* b,
                        float* d) {
  if (n == 32 && k == 128) return launch_nk<32, 128>(trans_b, rs, a, b, d);
  if (n == 64 && k == 64) return launch_nk<64, 64>(trans_b, rs, a, b, d);
  if (n == 64 && k == 128) return launch_nk<64, 128>(trans_b, rs, a, b, d);
  if (n == 256 && k == 64) return launch_nk<256, 64>(trans_b, rs, a, b, d);
  if (n == 256 && k == 128) return launch_nk<256, 128>(trans_b, rs, a, b, d);
  return cudaErrorInvalidValue;
}

}  // namespace mla::cuda::sm90
