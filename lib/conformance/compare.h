// The comparison policy shared by every conformance check: NaN/inf at the same positions,
// per-element |out - ref| <= abs + rel * |ref| per dtype, a global relative error bound
// ||out - ref|| / ||ref||, and failure messages naming the worst index and values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "mla/types.h"

namespace mla::testing {

struct Tolerance {
  double abs = 0.0;  // per element: |out - ref| <= abs + rel * |ref|
  double rel = 0.0;
  double global_rel = 0.0;  // ||out - ref||_2 / ||ref||_2 over finite entries; <= 0 disables
};

// bf16 outputs: abs 1e-2, rel 2e-2, global 1e-2. f32 LSE: abs 1e-2 (rel 1e-4), no global bound.
// fp8 e4m3 (cache writes): abs 2^-9 (smallest subnormal), rel 0.0625 (half an ulp is 1/16).
Tolerance default_tolerance(DType dtype);
Tolerance lse_tolerance();

struct Comparison {
  bool ok = true;
  double global_rel_err = 0.0;
  double max_abs_err = 0.0;
  int64_t num_bad = 0;       // elements out of tolerance or with mismatched NaN/inf
  int64_t worst_index = -1;  // flat index of the worst element (first mismatch if non-finite)
  double worst_out = 0.0;
  double worst_ref = 0.0;
  std::string message;  // "<what>: 3 of 4096 elements out of tolerance; worst [17] ..."
};

// Compares out (decoded from storage) with the reference. `what` names the tensor in messages.
Comparison compare_values(std::string_view what, std::span<const float> out,
                          std::span<const double> ref, const Tolerance& tol);

// Unravels a flat index into "[i, j, k]" for the given shape (up to 4 dims).
std::string index_string(int64_t flat, std::span<const int64_t> shape);

}  // namespace mla::testing
