#include "conformance/compare.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace mla::testing {

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {1e-2, 2e-2, 1e-2};
    case DType::kFP8E4M3:
      return {1.0 / 512, 0.0625 + 1e-6, 0.0};
    case DType::kF32:
      return {1e-4, 1e-4, 1e-4};
    default:
      return {0.0, 0.0, 0.0};
  }
}

Tolerance lse_tolerance() { return {1e-2, 1e-4, 0.0}; }

std::string index_string(int64_t flat, std::span<const int64_t> shape) {
  if (shape.empty()) return fmt::format("[{}]", flat);
  std::vector<int64_t> idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    const int64_t ext = shape[k] > 0 ? shape[k] : 1;
    idx[k] = flat % ext;
    flat /= ext;
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

Comparison compare_values(std::string_view what, std::span<const float> out,
                          std::span<const double> ref, const Tolerance& tol) {
  Comparison c;
  if (out.size() != ref.size()) {
    c.ok = false;
    c.num_bad = 1;
    c.message =
        fmt::format("{}: size {} differs from reference size {}", what, out.size(), ref.size());
    return c;
  }
  double diff2 = 0.0, ref2 = 0.0, worst_excess = -1.0;
  int64_t first_nonfinite_mismatch = -1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double o = out[i], r = ref[i];
    const bool o_fin = std::isfinite(o), r_fin = std::isfinite(r);
    if (!o_fin || !r_fin) {
      const bool same = (std::isnan(o) && std::isnan(r)) || (o == r);  // same inf or both NaN
      if (!same) {
        ++c.num_bad;
        if (first_nonfinite_mismatch < 0) first_nonfinite_mismatch = static_cast<int64_t>(i);
      }
      continue;
    }
    const double err = std::fabs(o - r);
    diff2 += err * err;
    ref2 += r * r;
    const double allowed = tol.abs + tol.rel * std::fabs(r);
    if (err > allowed) ++c.num_bad;
    if (err > c.max_abs_err) c.max_abs_err = err;
    if (err - allowed > worst_excess) {
      worst_excess = err - allowed;
      c.worst_index = static_cast<int64_t>(i);
    }
  }
  c.global_rel_err = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (first_nonfinite_mismatch >= 0) c.worst_index = first_nonfinite_mismatch;
  if (c.worst_index >= 0) {
    c.worst_out = out[c.worst_index];
    c.worst_ref = ref[c.worst_index];
  }
  const bool global_bad = tol.global_rel > 0 && c.global_rel_err >= tol.global_rel;
  c.ok = c.num_bad == 0 && !global_bad;
  if (!c.ok) {
    c.message = fmt::format(
        "{}: {} of {} elements out of tolerance (abs {:g} + rel {:g}){}; global rel err {:.3e} "
        "(bound {:g}); worst index {}: out {:.6g} ref {:.6g}",
        what, c.num_bad, out.size(), tol.abs, tol.rel,
        first_nonfinite_mismatch >= 0 ? " incl. NaN/inf mismatch" : "", c.global_rel_err,
        tol.global_rel, c.worst_index, c.worst_out, c.worst_ref);
  }
  return c;
}

}  // namespace mla::testing
