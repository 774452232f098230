// Argument checks shared by the prefill-side CUDA ops: strided bf16/f32 views whose last
// dimension is contiguous and whose rows suit 16-byte (or 4-byte) vector access.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "mla/status.h"
#include "mla/tensor.h"

namespace mla::cuda {

// expect_tensor (dtype, rank, extents, device) without the contiguity requirement, plus: last
// dimension contiguous, every other stride and the base address aligned to `align_bytes`.
inline Status expect_strided(const TensorView& t, std::string_view name, DType dtype,
                             std::initializer_list<int64_t> shape, Device device, int align_bytes) {
  MLA_RETURN_IF_ERROR(expect_tensor(t, name, dtype, shape, device, /*require_contiguous=*/false));
  if (t.numel() == 0) return Status::Ok();
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  MLA_CHECK_ARG(t.stride[t.ndim - 1] == 1, "{}: last dimension must be contiguous, got {}", name,
                t.describe());
  for (int d = 0; d + 1 < t.ndim; ++d) {
    MLA_CHECK_ARG(t.shape[d] <= 1 || (t.stride[d] * elem) % align_bytes == 0,
                  "{}: stride {} of dimension {} is not a multiple of {} bytes ({})", name,
                  t.stride[d], d, align_bytes, t.describe());
  }
  MLA_CHECK_ARG(reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(align_bytes) == 0,
                "{}: data pointer is not {}-byte aligned", name, align_bytes);
  return Status::Ok();
}

}  // namespace mla::cuda
