// The CUDA DeviceRuntime: plain cudaMalloc/cudaFree, stream-ordered copies and memsets, registered
// with core at load time (register_device_runtime_factory; core builds it on first use). A machine
// without a GPU or driver reports device_count 0 and never crashes.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/common.h"
#include "mla/fault_injection.h"
#include "mla/memory.h"

namespace mla {
namespace cuda {

Status cuda_status(cudaError_t err, std::string_view call, const char* file, int line) {
  return make_status(StatusCode::kCudaError, "{} failed at {}:{}: {} ({})", call, file, line,
                     cudaGetErrorString(err), static_cast<int>(err));
}

bool sync_check_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MLA_CUDA_SYNC_CHECK");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return enabled;
}

Status check_launch(std::string_view kernel, cudaStream_t stream, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && fault_injection::should_fail(fault_injection::Site::kLaunch)) {
    err = cudaErrorLaunchFailure;  // as if the launch had failed (test hook)
  }
  if (err != cudaSuccess) {
    return cuda_status(err, fmt::format("launch of {}", kernel), file, line);
  }
  if (sync_check_enabled()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    err = cudaStreamIsCapturing(stream, &capture);
    if (err == cudaSuccess && capture == cudaStreamCaptureStatusNone) {
      err = cudaStreamSynchronize(stream);
    }
    if (err != cudaSuccess) {
      return cuda_status(err, fmt::format("{} (MLA_CUDA_SYNC_CHECK)", kernel), file, line);
    }
  }
  return Status::Ok();
}

int current_device() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) return -1;
  return d;
}

int sm_count(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) return 0;
  if (static_cast<std::size_t>(device) >= cache.size()) cache.resize(device + 1, -1);
  if (cache[device] < 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    cache[device] = n;
  }
  return cache[device];
}

namespace {

// Compute capability of a device, read once per device (it cannot change while the process
// runs) and then read without a lock: the GPU check asks it before every cuda op run. Entries
// hold major * 1000 + minor + 1 (0: not read yet); {-1, -1} when the driver does not answer.
constexpr int kCapabilityDevices = 64;

ComputeCapability device_capability(int device) {
  static std::array<std::atomic<int>, kCapabilityDevices> cache{};
  if (device < 0) return {-1, -1};
  int packed = device < kCapabilityDevices ? cache[device].load(std::memory_order_acquire) : 0;
  if (packed == 0) {
    int major = -1, minor = -1;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      cudaGetLastError();
      return {-1, -1};  // not cached: asked again next time
    }
    packed = major * 1000 + minor + 1;
    if (device < kCapabilityDevices) cache[device].store(packed, std::memory_order_release);
  }
  return {(packed - 1) / 1000, (packed - 1) % 1000};
}

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver / no device" error
      n = 0;
    }
    count_ = n;
  }
  DeviceType type() const override { return DeviceType::kCuda; }
  int device_count() const override { return count_; }

  std::string describe(int index) const override {
    if (index < 0 || index >= count_) return fmt::format("cuda:{} (not present)", index);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
      cudaGetLastError();
      return fmt::format("cuda:{} (properties unavailable)", index);
    }
    const double gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    return fmt::format("{}, {} SMs, {:.0f} GiB", prop.name, prop.multiProcessorCount, gib);
  }

  StatusOr<void*> malloc(int index, std::size_t bytes) override {
    if (bytes == 0) return static_cast<void*>(nullptr);
    MLA_RETURN_IF_ERROR(select(index));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return make_status(
          err == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError,
          "cudaMalloc of {} bytes on cuda:{} failed: {}", bytes, index, cudaGetErrorString(err));
    }
    return p;
  }

  void free(int index, void* p) override {
    if (p == nullptr) return;
    if (select(index).ok()) cudaFree(p);
    cudaGetLastError();
  }

  Status memset(void* dst, int value, std::size_t bytes, void* stream) override {
    if (fault_injection::should_fail(fault_injection::Site::kCopy)) {
      return fault_injection::injected(fault_injection::Site::kCopy, "cudaMemsetAsync");
    }
    if (bytes == 0) return Status::Ok();
    MLA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, as_stream(stream)));
    return Status::Ok();
  }
  Status copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream) override {
    return copy(dst, src, bytes, cudaMemcpyHostToDevice, stream);
  }
  Status copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream) override {
    MLA_RETURN_IF_ERROR(copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    // The caller reads the host bytes next: the copy must have finished.
    return synchronize(stream);
  }
  Status copy_device(void* dst, const void* src, std::size_t bytes, void* stream) override {
    return copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  Status synchronize(void* stream) override {
    MLA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(as_stream(stream)));
    return Status::Ok();
  }
  int multiprocessor_count(int index) const override {
    if (index < 0 || index >= count_) return 0;
    return sm_count(index);
  }
  StatusOr<ComputeCapability> compute_capability(int index) const override {
    if (index < 0 || index >= count_) {
      return unsupported("cuda:{} is not present ({} cuda devices)", index, count_);
    }
    const ComputeCapability c = device_capability(index);
    if (c.major < 0) {
      return make_status(StatusCode::kCudaError,
                         "cudaDeviceGetAttribute(compute capability) of cuda:{} failed", index);
    }
    return c;
  }

  StatusOr<void*> malloc_host(std::size_t bytes) override {
    if (bytes == 0) return static_cast<void*>(nullptr);
    void* p = nullptr;
    const cudaError_t err = cudaMallocHost(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return make_status(StatusCode::kOutOfMemory, "cudaMallocHost of {} bytes failed: {}", bytes,
                         cudaGetErrorString(err));
    }
    return p;
  }
  void free_host(void* p) override {
    if (p != nullptr) cudaFreeHost(p);
    cudaGetLastError();
  }
  StatusOr<void*> create_event() override {
    cudaEvent_t e = nullptr;
    MLA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return static_cast<void*>(e);
  }
  void destroy_event(void* event) override {
    if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
    cudaGetLastError();
  }
  Status record_event(void* event, void* stream) override {
    MLA_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event), as_stream(stream)));
    return Status::Ok();
  }
  Status wait_event(void* event) override {
    MLA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
    return Status::Ok();
  }
  StatusOr<bool> event_done(void* event) override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: clear it
      return false;
    }
    MLA_CUDA_RETURN_IF_ERROR(e);
    return true;
  }
  StatusOr<void*> create_stream() override {
    cudaStream_t s = nullptr;
    MLA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return static_cast<void*>(s);
  }
  void destroy_stream(void* stream) override {
    if (stream != nullptr) cudaStreamDestroy(as_stream(stream));
    cudaGetLastError();
  }

 private:
  static cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
  Status select(int index) const {
    if (index < 0 || index >= count_) {
      return invalid_argument("cuda device index {} out of range (device_count {})", index, count_);
    }
    MLA_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
    return Status::Ok();
  }
  Status copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, void* stream) {
    if (fault_injection::should_fail(fault_injection::Site::kCopy)) {
      return fault_injection::injected(fault_injection::Site::kCopy, "cudaMemcpyAsync");
    }
    if (bytes == 0) return Status::Ok();
    MLA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)));
    return Status::Ok();
  }
  int count_ = 0;
};

}  // namespace
}  // namespace cuda

namespace {

std::unique_ptr<DeviceRuntime> make_cuda_runtime() { return std::make_unique<cuda::CudaRuntime>(); }

// Core builds the runtime on the first device_runtime(DeviceType::kCuda).
[[maybe_unused]] const bool kRegistered =
    register_device_runtime_factory(DeviceType::kCuda, &make_cuda_runtime);

}  // namespace

}  // namespace mla
