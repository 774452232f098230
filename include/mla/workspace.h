// Workspaces: named device buffers with three policies (SYSTEM.md 5), every byte recorded in the
// MemoryLedger, and two-phase carving (the size query and the carving are one function).
//
//   kSharedLazy    process-global per (name, device), created on first use, not zeroed
//                  (paged_mla: one per device, shared by every paged_mla instance).
//   kSharedZeroed  process-global per (name, device), zeroed at creation. Contract: users reset
//                  whatever they change (counters) back to zero after use, so it is never handed
//                  to a user of another policy (one that scribbles on it).
//   kOnDemand      per owner (GrowableBuffer), allocated on first use, grown only when a larger
//                  request needs more (ondemand_mla's split-KV partials, chunk scratch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "mla/memory.h"
#include "mla/status.h"
#include "mla/types.h"

namespace mla {

inline constexpr std::size_t kWorkspaceAlignment = 256;
constexpr std::size_t align_workspace(std::size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

enum class WorkspacePolicy : uint8_t { kSharedLazy, kSharedZeroed, kOnDemand };
std::string_view workspace_policy_name(WorkspacePolicy p);  // "shared", "shared-zeroed", ...

// Environment variables for the shared workspace sizes (bytes; K/M/G suffixes accepted).
inline constexpr const char* kPagedWorkspaceEnv = "MLA_PAGED_WORKSPACE_BYTES";
inline constexpr const char* kChunkedWorkspaceEnv = "MLA_CHUNKED_WORKSPACE_BYTES";

// The size of a workspace: `option_bytes` when non-zero, else the environment variable when set,
// else `default_bytes`. A malformed environment value is kInvalidArgument naming the variable.
StatusOr<std::size_t> resolve_workspace_bytes(std::size_t option_bytes, const char* env_var,
                                              std::size_t default_bytes);

// What a user asks the registry for.
struct WorkspaceSpec {
  std::string name;  // "paged_mla.workspace"
  Device device;
  std::size_t bytes = 0;
  WorkspacePolicy policy = WorkspacePolicy::kSharedLazy;  // kSharedLazy or kSharedZeroed
  std::string env_var;  // the variable that sizes it, named in kOutOfWorkspace errors
};

// One process-global workspace; lives while the registry or any user holds it.
class SharedWorkspace {
 public:
  SharedWorkspace(WorkspaceSpec spec, DeviceBuffer buffer)
      : spec_(std::move(spec)), buffer_(std::move(buffer)) {}
  const std::string& name() const { return spec_.name; }
  Device device() const { return spec_.device; }
  WorkspacePolicy policy() const { return spec_.policy; }
  const std::string& env_var() const { return spec_.env_var; }
  void* data() const { return buffer_.data(); }
  std::size_t bytes() const { return buffer_.bytes(); }
  // One user at a time: backends hold this lock while their ops run on the workspace. Two
  // backends of one family on two threads otherwise carve the same per-worker scratch and
  // write it at once (the cpu ops finish before the lock is released). On cuda the lock orders
  // the issue of the work, not its execution: users on different streams must still order those
  // streams (docs/reliability.md).
  std::unique_lock<std::mutex> lock_for_use() const {
    return std::unique_lock<std::mutex>(use_mu_);
  }

 private:
  WorkspaceSpec spec_;
  DeviceBuffer buffer_;
  mutable std::mutex use_mu_;
};

class WorkspaceRegistry {
 public:
  static WorkspaceRegistry& global();

  // The process-global workspace spec.name on spec.device, created on first use with spec.bytes
  // (recorded in the ledger with owner "shared:<requester>"). Later requests get the same
  // buffer. A request with another policy is kInvalidArgument (a zeroed workspace is never
  // shared with a user that scribbles on it); one for more bytes than the buffer has is
  // kOutOfWorkspace naming the buffer, both sizes and the environment variable.
  StatusOr<std::shared_ptr<SharedWorkspace>> acquire(const WorkspaceSpec& spec,
                                                     std::string_view requester);

  struct Entry {
    std::string name;
    Device device;
    std::size_t bytes = 0;
    WorkspacePolicy policy = WorkspacePolicy::kSharedLazy;
    long users = 0;  // holders besides the registry
  };
  std::vector<Entry> list() const;
  // Whether the registry holds a workspace of this name on this device.
  bool contains(std::string_view name, Device device) const;

  // Drops the registry's references (buffers are freed once their last user is gone), so each
  // test starts from an empty registry.
  void release_all_for_testing();

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<SharedWorkspace>> entries_;
};

// A per-owner buffer grown only when a request needs more than it has (policy kOnDemand).
// Contents are not preserved across growth and never zeroed.
class GrowableBuffer {
 public:
  GrowableBuffer() = default;
  GrowableBuffer(std::string name, std::string owner, Device device)
      : name_(std::move(name)), owner_(std::move(owner)), device_(device) {}

  // Allocates on first use, re-allocates only when bytes > capacity(). No-op otherwise.
  Status reserve(std::size_t bytes);
  void* data() const { return buffer_.data(); }
  std::size_t capacity() const { return buffer_.bytes(); }
  const std::string& name() const { return name_; }
  Device device() const { return device_; }
  uint64_t grow_count() const { return grow_count_; }  // allocations made so far
  void release() { buffer_.reset(); }

 private:
  std::string name_;
  std::string owner_;
  Device device_;
  DeviceBuffer buffer_;
  uint64_t grow_count_ = 0;
};

// The one workspace carver of the library (backends, layer, cpu ops). Two-phase carving (CUB
// style): run the same sequence of carve() calls once on a measuring carver (for the size) and
// once on the real buffer (for the pointers), so size and layout cannot drift. Every carve is
// named and 256-B aligned; running out names the buffer, the carve and the shortfall.
class WorkspaceCarver {
 public:
  // Measures only: carve() returns nullptr, required_bytes() grows.
  explicit WorkspaceCarver(std::string_view buffer_name)
      : buffer_name_(buffer_name), measuring_(true) {}
  WorkspaceCarver(std::string_view buffer_name, void* base, std::size_t capacity_bytes,
                  std::string_view env_var = {})
      : buffer_name_(buffer_name),
        env_var_(env_var),
        base_(static_cast<std::byte*>(base)),
        capacity_(capacity_bytes) {}

  // Next `bytes` bytes at a 256-B aligned offset; nullptr when measuring, when bytes == 0, or
  // when the buffer is too small (status() then says which carve and by how much).
  void* carve(std::string_view what, std::size_t bytes);
  template <typename T>
  T* carve_as(std::string_view what, std::size_t count) {
    return static_cast<T*>(carve(what, count * sizeof(T)));
  }
  // The carve as a typed pointer, or kOutOfWorkspace at once (status()); nullptr when measuring
  // or when count == 0. For code that stops at the first carve that does not fit.
  template <typename T>
  StatusOr<T*> take(std::string_view what, std::size_t count) {
    T* p = carve_as<T>(what, count);
    if (p == nullptr && !measuring_ && count != 0) return status();
    return p;
  }
  std::size_t required_bytes() const { return offset_; }
  // required_bytes() rounded up to the alignment: the size of a block that is carved again
  // after itself (per-worker scratch) or summed with others.
  std::size_t aligned_bytes() const { return align_workspace(offset_); }
  // OK, or kOutOfWorkspace: "workspace 'paged_mla.workspace' has 1048576 bytes, but carve
  // 'absorbed.op' needs 2097152 bytes in total (1048576 more); set MLA_PAGED_WORKSPACE_BYTES".
  Status status() const;

 private:
  std::string_view buffer_name_;
  std::string_view env_var_;
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t offset_ = 0;
  bool measuring_ = false;
  std::string first_failed_;  // name of the first carve that did not fit
};

// Sizes `buffer` for `carve_all(WorkspaceCarver&)` (a measuring pass), grows it, then carves it
// with the same function: the carving pass's status (OK, or which carve ran out).
template <typename CarveAll>
Status carve_buffer(GrowableBuffer& buffer, CarveAll&& carve_all) {
  WorkspaceCarver measure(buffer.name());
  carve_all(measure);
  MLA_RETURN_IF_ERROR(buffer.reserve(measure.required_bytes()));
  WorkspaceCarver carver(buffer.name(), buffer.data(), buffer.capacity());
  carve_all(carver);
  return carver.status();
}

}  // namespace mla
