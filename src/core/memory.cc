#include "mla/memory.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "mla/fault_injection.h"

namespace mla {
namespace {

class CpuRuntime final : public DeviceRuntime {
 public:
  DeviceType type() const override { return DeviceType::kCpu; }
  int device_count() const override { return 1; }
  std::string describe(int) const override {
    return fmt::format("cpu, {} hardware threads", multiprocessor_count(0));
  }
  StatusOr<void*> malloc(int, std::size_t bytes) override {
    if (bytes == 0) return static_cast<void*>(nullptr);
    // 256-byte alignment, as on the GPU, so carving behaves the same on both.
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (!p) {
      return make_status(StatusCode::kOutOfMemory, "cpu: allocation of {} bytes failed", bytes);
    }
    return p;
  }
  void free(int, void* p) override { std::free(p); }
  // Copies and memsets count as fault-injection events (mla/fault_injection.h), so the error
  // paths of their callers are tested on the cpu as a failing cuda copy would exercise them.
  Status memset(void* dst, int value, std::size_t bytes, void*) override {
    if (fault_injection::should_fail(fault_injection::Site::kCopy)) {
      return fault_injection::injected(fault_injection::Site::kCopy, "cpu memset");
    }
    if (bytes) std::memset(dst, value, bytes);
    return Status::Ok();
  }
  Status copy_to_device(void* dst, const void* src, std::size_t bytes, void*) override {
    if (fault_injection::should_fail(fault_injection::Site::kCopy)) {
      return fault_injection::injected(fault_injection::Site::kCopy, "cpu copy_to_device");
    }
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status copy_to_host(void* dst, const void* src, std::size_t bytes, void*) override {
    if (fault_injection::should_fail(fault_injection::Site::kCopy)) {
      return fault_injection::injected(fault_injection::Site::kCopy, "cpu copy_to_host");
    }
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status copy_device(void* dst, const void* src, std::size_t bytes, void*) override {
    if (fault_injection::should_fail(fault_injection::Site::kCopy)) {
      return fault_injection::injected(fault_injection::Site::kCopy, "cpu copy_device");
    }
    if (bytes) std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  Status synchronize(void*) override { return Status::Ok(); }
  int multiprocessor_count(int) const override {
    return std::max(1u, std::thread::hardware_concurrency());
  }
};

}  // namespace

StatusOr<void*> DeviceRuntime::malloc_host(std::size_t bytes) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p) return make_status(StatusCode::kOutOfMemory, "host allocation of {} bytes failed", bytes);
  return p;
}

void DeviceRuntime::free_host(void* p) { std::free(p); }

StatusOr<ComputeCapability> DeviceRuntime::compute_capability(int index) const {
  return unsupported("{} device {} has no compute capability",
                     type() == DeviceType::kCpu ? "a cpu" : "this", index);
}

namespace {

struct RuntimeTable {
  std::mutex mu;
  std::unique_ptr<DeviceRuntime> cpu = std::make_unique<CpuRuntime>();
  std::unique_ptr<DeviceRuntime> cuda;
  DeviceRuntimeFactory cuda_factory = nullptr;  // registered by the cuda library
  bool cuda_built = false;
  // cuda.get() once built: the lock-free path of device_runtime (asked before every cuda op run
  // by the GPU check, gpu_support.h).
  std::atomic<DeviceRuntime*> cuda_ready{nullptr};
};

RuntimeTable& runtimes() {
  static RuntimeTable t;
  return t;
}

}  // namespace

DeviceRuntime* device_runtime(DeviceType type) {
  if (type == DeviceType::kCpu) return runtimes().cpu.get();
  RuntimeTable& t = runtimes();
  if (DeviceRuntime* ready = t.cuda_ready.load(std::memory_order_acquire)) return ready;
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.cuda_built && t.cuda_factory != nullptr) {
    t.cuda = t.cuda_factory();
    t.cuda_built = true;
    t.cuda_ready.store(t.cuda.get(), std::memory_order_release);
  }
  return t.cuda.get();
}

bool register_device_runtime_factory(DeviceType type, DeviceRuntimeFactory factory) {
  if (type != DeviceType::kCuda) return false;  // the cpu runtime is core's own
  RuntimeTable& t = runtimes();
  std::lock_guard<std::mutex> lock(t.mu);
  t.cuda_factory = factory;
  return true;
}

bool device_available(Device device) {
  DeviceRuntime* rt = device_runtime(device.type);
  return rt != nullptr && device.index >= 0 && device.index < rt->device_count();
}

// ---------------------------------------------------------------------------------------------
MemoryLedger& MemoryLedger::global() {
  static MemoryLedger ledger;
  return ledger;
}

uint64_t MemoryLedger::add(AllocationRecord rec) {
  std::lock_guard<std::mutex> lock(mu_);
  rec.id = next_id_++;
  ++allocations_;
  live_.push_back(std::move(rec));
  return live_.back().id;
}

void MemoryLedger::remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(live_.begin(), live_.end(),
                         [id](const AllocationRecord& r) { return r.id == id; });
  if (it != live_.end()) live_.erase(it);
}

std::vector<AllocationRecord> MemoryLedger::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

std::size_t MemoryLedger::total_bytes(Device device) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const auto& r : live_)
    if (r.device == device) n += r.bytes;
  return n;
}

std::size_t MemoryLedger::total_bytes_excluding_kv_pool(Device device) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const auto& r : live_) {
    if (r.device == device && r.owner.rfind("kv_pool", 0) != 0) n += r.bytes;
  }
  return n;
}

uint64_t MemoryLedger::allocation_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

// ---------------------------------------------------------------------------------------------
DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), device_(o.device_), id_(o.id_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
  o.id_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    id_ = o.id_;
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.id_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (data_) {
    if (DeviceRuntime* rt = device_runtime(device_.type)) rt->free(device_.index, data_);
  }
  if (id_) MemoryLedger::global().remove(id_);
  data_ = nullptr;
  bytes_ = 0;
  id_ = 0;
}

StatusOr<DeviceBuffer> DeviceBuffer::allocate(Device device, std::size_t bytes, std::string name,
                                              std::string owner, bool zeroed) {
  DeviceRuntime* rt = device_runtime(device.type);
  if (rt == nullptr || device.index < 0 || device.index >= rt->device_count()) {
    return unsupported("allocation '{}' ({} bytes): device {} is not available", name, bytes,
                       device.to_string());
  }
  if (fault_injection::should_fail(fault_injection::Site::kAllocation)) {
    return fault_injection::injected(
        fault_injection::Site::kAllocation,
        fmt::format("allocation '{}' of {} bytes on {}", name, bytes, device.to_string()));
  }
  auto p = rt->malloc(device.index, bytes);
  if (!p.ok()) {
    return make_status(p.status().code(), "allocation '{}' of {} bytes on {} failed: {}", name,
                       bytes, device.to_string(), p.status().message());
  }
  DeviceBuffer buf;
  buf.data_ = *p;
  buf.bytes_ = bytes;
  buf.device_ = device;
  if (zeroed && bytes) {
    MLA_RETURN_IF_ERROR(rt->memset(buf.data_, 0, bytes, nullptr));
    MLA_RETURN_IF_ERROR(rt->synchronize(nullptr));
  }
  buf.id_ = MemoryLedger::global().add(
      AllocationRecord{0, std::move(name), std::move(owner), device, bytes, zeroed});
  return buf;
}

}  // namespace mla
