// Planning helpers of the op layer shared by its two files: torch_ops.cc (the ops and their plan
// holders' staging rings) and engine_ops.cc (the engine planner bound for mla.Backend).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "mla/ops.h"

namespace mla::torch_ops {

// Host lengths as an int32 span: an int32 tensor is read in place; an int64 one (SGLang's host
// mirrors) is narrowed into `scratch`, each value checked to fit. Contiguous 1-D cpu tensors.
std::span<const int32_t> host_lengths(const at::Tensor& t, std::string_view name,
                                      std::string_view op, std::vector<int32_t>& scratch);

// The absorbed op's plan of (req_rows, q_lens, kv_lens) for `cap` into a plan holder's `plan`
// buffer through its staging ring (handle `staging`, torch_ops.cc), then the table extents the
// run checks (an int64 cpu tensor of 7 entries) when given. Raises naming what is wrong; writes
// nothing on error.
void absorbed_plan_spans(std::span<const int32_t> req_rows, std::span<const int32_t> q_lens,
                         std::span<const int32_t> kv_lens, int64_t staging, const at::Tensor& plan,
                         const AttnCapacity& cap, int64_t page_size, bool causal,
                         const std::optional<at::Tensor>& extents, std::string_view op);

// The MHA op's plan of (qo_indptr, kv_indptr) for `cap` into a plan holder's buffer through its
// staging ring. Raises naming what is wrong; writes nothing on error.
void mha_plan_spans(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                    int64_t staging, const at::Tensor& plan, const AttnCapacity& cap, bool causal,
                    std::string_view op);

}  // namespace mla::torch_ops
