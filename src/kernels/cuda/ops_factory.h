// Factories for the CUDA ops owned by the prefill side (MHA attention, merge, kv write,
// up-projection, per-head GEMM). register.cc (cuda-decode) puts them into the "cuda" OpSet.
// Host-only header: no CUDA types, so any translation unit of mla_cuda may include it.
#pragma once

#include <memory>

#include "mla/ops.h"

namespace mla::cuda {

// Ragged MHA attention (q/k 192, v 128), FlashAttention-2 style on tensor cores.
std::shared_ptr<const MhaAttentionOp> make_cuda_mha_op();
// LSE merge of two partial states, in place into the accumulator.
std::shared_ptr<const MergeOp> make_cuda_merge_op();
// Latent row write into the paged cache (bf16; fp8 e4m3 with 1/k_scale).
std::shared_ptr<const KvWriteOp> make_cuda_kv_write_op();
// Gather latent rows by slot + cuBLAS up-projection through kv_b_proj + split into k / v.
std::shared_ptr<const UpProjectOp> make_cuda_up_project_op();
// Per-head GEMM through cublasGemmStridedBatchedEx.
std::shared_ptr<const HeadGemmOp> make_cuda_head_gemm_op();

}  // namespace mla::cuda
