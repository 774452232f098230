#include "mla/tensor.h"

#include <fmt/format.h>

namespace mla {

TensorView::TensorView(void* d, DType t, Device dev, std::initializer_list<int64_t> dims)
    : data(d), dtype(t), device(dev), ndim(static_cast<int>(dims.size())) {
  int i = 0;
  for (int64_t s : dims) shape[i++] = s;
  int64_t st = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    stride[k] = st;
    st *= shape[k];
  }
}

int64_t TensorView::numel() const {
  if (ndim == 0) return data ? 1 : 0;
  int64_t n = 1;
  for (int k = 0; k < ndim; ++k) n *= shape[k];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t st = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    if (shape[k] != 1 && stride[k] != st) return false;
    st *= shape[k];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string dims;
  for (int k = 0; k < ndim; ++k) dims += fmt::format("{}{}", k ? ", " : "", shape[k]);
  return fmt::format("{}[{}] on {}", dtype_name(dtype), dims, device.to_string());
}

static std::string shape_string(std::initializer_list<int64_t> shape) {
  std::string s;
  int i = 0;
  for (int64_t d : shape)
    s += fmt::format("{}{}", i++ ? ", " : "", d < 0 ? std::string("*") : std::to_string(d));
  return s;
}

Status expect_tensor(const TensorView& t, std::string_view name, DType dtype,
                     std::initializer_list<int64_t> shape, Device device, bool require_contiguous) {
  const auto want = [&] {
    return fmt::format("{}[{}] on {}", dtype_name(dtype), shape_string(shape), device.to_string());
  };
  if (t.data == nullptr && t.numel() != 0) {
    return invalid_argument("{}: null data for {}", name, t.describe());
  }
  if (t.dtype != dtype || t.ndim != static_cast<int>(shape.size()) || !(t.device == device)) {
    return invalid_argument("{}: expected {}, got {}", name, want(), t.describe());
  }
  int k = 0;
  for (int64_t d : shape) {
    if (d >= 0 && t.shape[k] != d) {
      return invalid_argument("{}: dimension {} is {}, expected {} ({} vs {})", name, k, t.shape[k],
                              d, t.describe(), want());
    }
    if (t.shape[k] < 0) return invalid_argument("{}: negative dimension {}", name, t.shape[k]);
    ++k;
  }
  if (require_contiguous && !t.is_contiguous()) {
    return invalid_argument("{}: must be contiguous, got {}", name, t.describe());
  }
  return Status::Ok();
}

}  // namespace mla
