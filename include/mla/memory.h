// Device memory: allocation through per-device runtimes, with every byte recorded in one ledger
// (name, owner, device, bytes, zeroed) that tests, `mla info` and `mla run --json` read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mla/gpu_support.h"
#include "mla/status.h"
#include "mla/types.h"

namespace mla {

// What a device must provide. One implementation per device type (cpu always; cuda when built).
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType type() const = 0;
  virtual int device_count() const = 0;
  virtual std::string describe(int index) const = 0;  // "NVIDIA H200, 132 SMs, 139 GiB"
  virtual StatusOr<void*> malloc(int index, std::size_t bytes) = 0;
  virtual void free(int index, void* p) = 0;
  // All copies/memsets are ordered on `stream` (nullptr = the default stream); cpu runs inline.
  virtual Status memset(void* dst, int value, std::size_t bytes, void* stream) = 0;
  virtual Status copy_to_device(void* dst, const void* src_host, std::size_t bytes,
                                void* stream) = 0;
  virtual Status copy_to_host(void* dst_host, const void* src, std::size_t bytes, void* stream) = 0;
  virtual Status copy_device(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  // Strided copy of `rows` rows of `row_bytes` bytes (cudaMemcpy2D semantics), device to device.
  // The default issues one copy_device per row; runtimes with a 2-D copy override it.
  virtual Status copy_device_2d(void* dst, std::size_t dst_pitch, const void* src,
                                std::size_t src_pitch, std::size_t row_bytes, std::size_t rows,
                                void* stream) {
    for (std::size_t r = 0; r < rows; ++r) {
      MLA_RETURN_IF_ERROR(copy_device(static_cast<std::byte*>(dst) + r * dst_pitch,
                                      static_cast<const std::byte*>(src) + r * src_pitch, row_bytes,
                                      stream));
    }
    return Status::Ok();
  }
  virtual Status synchronize(void* stream) = 0;
  virtual int multiprocessor_count(int index) const = 0;  // cpu: hardware threads
  // The GPU's compute capability (what gpu_support.h's compute_capability() asks); the default
  // (the cpu) is kUnsupported: a device type without one.
  virtual StatusOr<ComputeCapability> compute_capability(int index) const;

  // Host memory that asynchronous uploads can read (cuda: page-locked; cpu: ordinary memory).
  virtual StatusOr<void*> malloc_host(std::size_t bytes);
  virtual void free_host(void* p);
  // Events ordered on a stream (cpu: nothing to wait for; handles may be null).
  virtual StatusOr<void*> create_event() { return static_cast<void*>(nullptr); }
  virtual void destroy_event(void* /*event*/) {}
  virtual Status record_event(void* /*event*/, void* /*stream*/) { return Status::Ok(); }
  // Blocks the calling thread until the work before the event's last record has finished.
  virtual Status wait_event(void* /*event*/) { return Status::Ok(); }
  // Whether the work before the event's last record has finished (never blocks).
  virtual StatusOr<bool> event_done(void* /*event*/) { return true; }
  // A stream of the caller's own (cuda: non-blocking, so not ordered after the legacy default
  // stream); the cpu has none (nullptr: it runs inline). destroy_stream(nullptr) does nothing.
  virtual StatusOr<void*> create_stream() { return static_cast<void*>(nullptr); }
  virtual void destroy_stream(void* /*stream*/) {}
};

// nullptr when the device type is not built in or has no devices.
DeviceRuntime* device_runtime(DeviceType type);
// Device libraries register their runtime here: a static registrar in the device library (linked
// whole) calls this at load time, and the factory runs on the first device_runtime(type). Core
// calls no device code of its own; the cpu runtime (host memory) is core's. Returns true (for
// `static const bool registered = ...`).
using DeviceRuntimeFactory = std::unique_ptr<DeviceRuntime> (*)();
bool register_device_runtime_factory(DeviceType type, DeviceRuntimeFactory factory);
// Whether the device exists on this machine.
bool device_available(Device device);

struct AllocationRecord {
  uint64_t id = 0;
  std::string name;   // "paged_mla.workspace"
  std::string owner;  // "paged_mla" or "shared:paged_mla" / "kv_pool" / "test"
  Device device;
  std::size_t bytes = 0;
  bool zeroed = false;
};

// Process-wide ledger of live allocations.
class MemoryLedger {
 public:
  static MemoryLedger& global();
  uint64_t add(AllocationRecord rec);  // returns id
  void remove(uint64_t id);
  std::vector<AllocationRecord> snapshot() const;
  std::size_t total_bytes(Device device) const;
  // Bytes on `device` whose owner does not start with "kv_pool" (workspaces, plans, buffers).
  std::size_t total_bytes_excluding_kv_pool(Device device) const;
  // Counts every allocation ever made (for "allocates nothing during replay" tests).
  uint64_t allocation_count() const;

 private:
  mutable std::mutex mu_;
  std::vector<AllocationRecord> live_;
  uint64_t next_id_ = 1;
  uint64_t allocations_ = 0;
};

// Owning, move-only device allocation recorded in the ledger for its lifetime.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // zeroed: memset to 0 after allocation (synchronously).
  static StatusOr<DeviceBuffer> allocate(Device device, std::size_t bytes, std::string name,
                                         std::string owner, bool zeroed);

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool valid() const { return data_ != nullptr || bytes_ == 0; }
  uint64_t ledger_id() const { return id_; }
  void reset();

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  uint64_t id_ = 0;
};

}  // namespace mla
