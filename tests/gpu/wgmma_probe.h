// Probe of the wgmma primitives for the GPU unit test (tests/gpu/wgmma_gpu_test.cc): one
// warpgroup computes D[64 x N] = A[64 x K] . B through sm90/wgmma.cuh. No gtest / fmt here (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda::sm90 {

// a: bf16 bits [64][K] row-major. b: trans_b = false: [N][K] (B^T, K contiguous: K-major);
// trans_b = true: [K][N] (N contiguous: MN-major). d: f32 [64][N]. rs: A from registers.
// Supported (n, k): (32, 128), (64, 64), (64, 128), (256, 64), (256, 128); others return
// cudaErrorInvalidValue. Synchronous.
cudaError_t wgmma_probe(int n, int k, bool trans_b, bool rs, const uint16_t* a, const uint16_t* b,
                        float* d);

}  // namespace mla::cuda::sm90
