// Non-owning tensor views. Shapes are row-major with explicit strides in elements.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "mla/status.h"
#include "mla/types.h"

namespace mla {

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements

  TensorView() = default;
  // Contiguous view of the given shape.
  TensorView(void* d, DType t, Device dev, std::initializer_list<int64_t> dims);

  int64_t numel() const;
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  bool empty() const { return numel() == 0; }
  int64_t size(int d) const { return shape[d]; }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string describe() const;  // "bf16[7, 128, 576] on cuda:0"
};

// Checks dtype, rank, every extent (-1 = any) and the device; names the argument in the error.
//   MLA_RETURN_IF_ERROR(expect_tensor(q, "q", DType::kBF16, {T, H, 576}, dev));
Status expect_tensor(const TensorView& t, std::string_view name, DType dtype,
                     std::initializer_list<int64_t> shape, Device device,
                     bool require_contiguous = true);

}  // namespace mla
