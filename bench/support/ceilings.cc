// See ceilings.h.
#include "ceilings.h"

#include <cublas_v2.h>

#include <cstdint>
#include <utility>

#include "bench_cuda.h"
#include "fill.h"
#include "mla/memory.h"

namespace mla::cli {
namespace {

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return make_status(StatusCode::kCudaError, "ceilings: {} failed: cuBLAS status {}", what,
                     static_cast<int>(s));
}

StatusOr<double> measure_gemm(cudaStream_t stream) {
  constexpr int64_t kN = 8192;
  MLA_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::allocate(Device::cuda(), kN * kN * 2,
                                                              "bench.gemm_a", "bench", false));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(Device::cuda(), kN * kN * 2,
                                                              "bench.gemm_b", "bench", false));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer c, DeviceBuffer::allocate(Device::cuda(), kN * kN * 2,
                                                              "bench.gemm_c", "bench", false));
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::fill_random_bf16(a.data(), kN * kN, 31, 0.25f, stream));
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::fill_random_bf16(b.data(), kN * kN, 32, 0.25f, stream));
  cublasHandle_t handle = nullptr;
  MLA_RETURN_IF_ERROR(cublas_status(cublasCreate(&handle), "cublasCreate"));
  Status st = cublas_status(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  StatusOr<std::pair<double, double>> us = internal_error("ceilings: GEMM not run");
  if (st.ok()) {
    us = time_runs(stream, 3, 10, [&] {
      return cublas_status(
          cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &alpha, a.data(), CUDA_R_16BF,
                       kN, b.data(), CUDA_R_16BF, kN, &beta, c.data(), CUDA_R_16BF, kN,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
    });
  }
  cublasDestroy(handle);
  MLA_RETURN_IF_ERROR(st);
  MLA_ASSIGN_OR_RETURN(const auto t, std::move(us));
  return 2.0 * kN * kN * kN / (t.first * 1e-6) / 1e12;
}

}  // namespace

StatusOr<Ceilings> measure_ceilings(cudaStream_t stream) {
  Ceilings c;
  {
    constexpr int64_t kBytes = int64_t{4} << 30;  // far past the 60 MB L2
    MLA_ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::allocate(Device::cuda(), kBytes,
                                                                  "bench.stream", "bench", false));
    int sms = 0;
    MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int blocks = sms * 8;
    MLA_ASSIGN_OR_RETURN(
        DeviceBuffer partial,
        DeviceBuffer::allocate(Device::cuda(), blocks * 8, "bench.partial", "bench", false));
    MLA_BENCH_CUDA_RETURN_IF_ERROR(
        cuda::fill_random_bf16(src.data(), kBytes / 2, 30, 0.25f, stream));
    MLA_ASSIGN_OR_RETURN(
        const auto read_us, time_runs(stream, 3, 15, [&]() -> Status {
          MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::launch_stream_read(
              src.data(), kBytes, static_cast<long long*>(partial.data()), blocks, stream));
          return Status::Ok();
        }));
    c.stream_read_gbps = kBytes / (read_us.first * 1e-6) / 1e9;
    constexpr int64_t kCopy = kBytes / 2;
    char* base = static_cast<char*>(src.data());
    MLA_ASSIGN_OR_RETURN(const auto copy_us, time_runs(stream, 3, 15, [&]() -> Status {
                           MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                               base + kCopy, base, kCopy, cudaMemcpyDeviceToDevice, stream));
                           return Status::Ok();
                         }));
    c.copy_gbps = 2.0 * kCopy / (copy_us.first * 1e-6) / 1e9;
  }
  MLA_ASSIGN_OR_RETURN(c.gemm_tflops, measure_gemm(stream));
  return c;
}

}  // namespace mla::cli
