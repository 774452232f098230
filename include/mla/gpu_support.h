// Which GPUs mla's device code runs on: a GPU's compute capability, the one rule that checks it
// against what an op set was built for, and the seam tests use to fake the capability.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "mla/status.h"
#include "mla/types.h"

namespace mla {

struct ComputeCapability {
  int major = 0;
  int minor = 0;
  friend bool operator==(const ComputeCapability&, const ComputeCapability&) = default;
  std::string to_string() const;  // "9.0"
};

// What the "cuda" op set's device code is built for: sm_90a only (CMakeLists.txt,
// -gencode=arch=compute_90a,code=sm_90a). Architecture-specific ('a') code runs on compute
// capability 9.0 exactly (Hopper: H100, H200, GH200), and no PTX is shipped for a driver to
// compile for another GPU, so an A100 (8.0) or a B200 (10.0) has no kernel to launch.
inline constexpr ComputeCapability kCudaKernelCapabilities[] = {{9, 0}};

// The rule: an op set whose device code is built for `built_for` runs on a GPU of compute
// capability `found` only if `found` is one of them (empty `built_for`: no GPU code, any device
// of the set's type). Ok, or kUnsupported saying what the op set needs and what `device` (its
// description, "cuda:0 (NVIDIA A100 ...)") has.
Status check_compute_capability(std::string_view op_set,
                                std::span<const ComputeCapability> built_for,
                                ComputeCapability found, std::string_view device);

// The compute capability of a cuda device: from the cuda device runtime (cached per device), or
// from the query a test installed. kUnsupported for a cpu device, a build without CUDA or a
// device that is not present.
StatusOr<ComputeCapability> compute_capability(Device device);

// The check of an op set against a device: the rule above for the capability of `device` (Ok
// at once when `built_for` is empty). What the op sets' run() and the backends' construction
// call before anything is launched.
Status check_device_code(std::string_view op_set, std::span<const ComputeCapability> built_for,
                         Device device);

// Test seam: every compute_capability() call answers with `query` (all devices) until it is
// reset with an empty function. Returns the query it replaces (empty: the runtime's).
using ComputeCapabilityQuery = std::function<StatusOr<ComputeCapability>(Device)>;
ComputeCapabilityQuery set_compute_capability_query(ComputeCapabilityQuery query);

}  // namespace mla
