// LSE merge kernel: params and launcher (raw cudaError_t; merge_op.cc wraps it in a Status).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

struct MergeParams {
  uint16_t* o_acc;                        // bf16 [T, H, D] in/out, last dim contiguous
  float* lse_acc;                         // f32 [T, H] in/out, heads contiguous
  const uint16_t* o_b;                    // bf16 [T, H, D]
  const float* lse_b;                     // f32 [T, H]
  int64_t num_tokens;                     // T
  int num_heads;                          // H
  int head_dim;                           // D, a multiple of 8
  int64_t oa_row_stride, oa_head_stride;  // elements
  int64_t ob_row_stride, ob_head_stride;
  int64_t la_row_stride, lb_row_stride;
};

cudaError_t launch_merge(const MergeParams& params, cudaStream_t stream);

}  // namespace mla::cuda
