// The GPU check (gpu_support.h): one rule, one capability query, one test seam.
#include "mla/gpu_support.h"

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <utility>

#include "mla/memory.h"

namespace mla {
namespace {

struct QuerySeam {
  std::mutex mu;
  ComputeCapabilityQuery query;
  std::atomic<bool> installed{false};  // lets the hot path skip the lock
};

QuerySeam& seam() {
  static QuerySeam s;
  return s;
}

std::string capability_list(std::span<const ComputeCapability> caps) {
  std::string out;
  for (std::size_t i = 0; i < caps.size(); ++i) {
    if (i > 0) out += i + 1 == caps.size() ? " or " : ", ";
    out += caps[i].to_string();
  }
  return out;
}

// "cuda:0 (NVIDIA A100-SXM4-80GB, 108 SMs, 80 GiB)" when the runtime knows the device.
std::string describe_device(Device device) {
  DeviceRuntime* rt = device_runtime(device.type);
  if (rt == nullptr || device.index < 0 || device.index >= rt->device_count()) {
    return device.to_string();
  }
  return fmt::format("{} ({})", device.to_string(), rt->describe(device.index));
}

}  // namespace

std::string ComputeCapability::to_string() const { return fmt::format("{}.{}", major, minor); }

Status check_compute_capability(std::string_view op_set,
                                std::span<const ComputeCapability> built_for,
                                ComputeCapability found, std::string_view device) {
  if (built_for.empty()) return Status::Ok();
  for (const ComputeCapability& c : built_for) {
    if (c == found) return Status::Ok();
  }
  return unsupported(
      "op set '{}' has device code for compute capability {} only, but {} has compute "
      "capability {}: mla cannot run on this GPU (nothing is launched); use another attention "
      "backend here",
      op_set, capability_list(built_for), device, found.to_string());
}

StatusOr<ComputeCapability> compute_capability(Device device) {
  QuerySeam& s = seam();
  if (s.installed.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.query) return s.query(device);
  }
  if (!device.is_cuda()) {
    return unsupported("{} has no compute capability (a cuda device has)", device.to_string());
  }
  DeviceRuntime* rt = device_runtime(device.type);
  if (rt == nullptr) {
    return unsupported("{}: this build of mla has no cuda runtime (built without CUDA)",
                       device.to_string());
  }
  if (device.index < 0 || device.index >= rt->device_count()) {
    return unsupported("{} is not present ({} cuda devices)", device.to_string(),
                       rt->device_count());
  }
  return rt->compute_capability(device.index);
}

Status check_device_code(std::string_view op_set, std::span<const ComputeCapability> built_for,
                         Device device) {
  if (built_for.empty()) return Status::Ok();
  StatusOr<ComputeCapability> found = compute_capability(device);
  if (!found.ok()) {
    return unsupported(
        "op set '{}' has device code for compute capability {} only, and the "
        "capability of {} is unknown: {}",
        op_set, capability_list(built_for), device.to_string(), found.status().message());
  }
  for (const ComputeCapability& c : built_for) {
    if (c == *found) return Status::Ok();  // the per-call path: no string is built
  }
  return check_compute_capability(op_set, built_for, *found, describe_device(device));
}

ComputeCapabilityQuery set_compute_capability_query(ComputeCapabilityQuery query) {
  QuerySeam& s = seam();
  std::lock_guard<std::mutex> lock(s.mu);
  ComputeCapabilityQuery previous = std::move(s.query);
  s.query = std::move(query);
  s.installed.store(static_cast<bool>(s.query), std::memory_order_release);
  return previous;
}

}  // namespace mla
