// Gather step of the up-projection: latent rows by slot into a contiguous c_kv scratch, and k_pe
// broadcast into every head of k. Params and launcher (raw cudaError_t; up_project_op.cc wraps).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

struct GatherParams {
  const void* cache;                    // bf16 | fp8 e4m3 [num_slots, 576], contiguous
  const int32_t* slots;                 // i32 [N]
  uint16_t* c_kv;                       // bf16 [N, 512] scratch, contiguous
  uint16_t* k;                          // bf16 [N, H, 192]; columns 128..191 of every head get k_pe
  int64_t k_row_stride, k_head_stride;  // elements
  int64_t num_tokens;                   // N
  int64_t num_slots;
  int num_heads;  // H
  bool fp8;       // cache is fp8 e4m3: value = stored * k_scale
  float k_scale;
};

cudaError_t launch_gather_latent(const GatherParams& params, cudaStream_t stream);

}  // namespace mla::cuda
