// Same-run ceilings of `mla bench --device cuda` (issue 10): lent H200s differ by up to 12 % in
// absolute speed, so every row is compared with ceilings measured by the same binary on the same
// machine in the same run, not with numbers from another day.
//   stream_read_gbps: a read-only kernel summing a 4 GiB buffer (16-byte loads, every SM), the
//                     rate a read-mostly kernel such as decode can reach;
//   copy_gbps:        cudaMemcpyAsync device to device of 2 GiB, bytes read + written;
//   gemm_tflops:      cuBLAS bf16 GEMM 8192^3 with fp32 accumulation (cublasGemmEx).
// Each is the median of repeated timed runs after a warm-up.
#pragma once

#include <cuda_runtime.h>

#include "mla/status.h"

namespace mla::cli {

struct Ceilings {
  double stream_read_gbps = 0;
  double copy_gbps = 0;
  double gemm_tflops = 0;
};

StatusOr<Ceilings> measure_ceilings(cudaStream_t stream);

}  // namespace mla::cli
