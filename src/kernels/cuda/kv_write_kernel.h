// Latent KV write kernel: params and launcher (raw cudaError_t; kv_write_op.cc wraps it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

struct KvWriteParams {
  const uint16_t* c_kv;  // bf16 [T, 512], rows c_kv_row_stride elements apart
  const uint16_t* k_pe;  // bf16 [T, 64], rows k_pe_row_stride elements apart
  const int32_t* loc;    // i32 [T] slot of each token
  void* cache;           // bf16 | fp8 e4m3 [num_slots, 576], contiguous
  int64_t c_kv_row_stride;
  int64_t k_pe_row_stride;
  int64_t num_tokens;
  int64_t num_slots;
  bool fp8;  // cache is fp8 e4m3: stores value / k_scale, saturating
  float k_scale;
};

cudaError_t launch_kv_write(const KvWriteParams& params, cudaStream_t stream);

}  // namespace mla::cuda
