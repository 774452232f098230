// Shared by the GPU tests of the absorbed op (built only with MLA_CUDA=ON): a host-to-device
// upload into a fresh buffer, and a fixture that skips without a device and holds the cuda op
// set's absorbed op.
#pragma once

#ifdef MLA_WITH_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>

#include "mla/memory.h"
#include "mla/ops.h"

namespace mla::testing {

// `bytes` of `src` in a new device buffer (at least 256 bytes), named `name` in the ledger.
inline StatusOr<DeviceBuffer> upload(const void* src, std::size_t bytes, const char* name) {
  MLA_ASSIGN_OR_RETURN(DeviceBuffer buf,
                       DeviceBuffer::allocate(Device::cuda(), std::max<std::size_t>(bytes, 256),
                                              name, "test", false));
  DeviceRuntime* rt = device_runtime(DeviceType::kCuda);
  MLA_RETURN_IF_ERROR(rt->copy_to_device(buf.data(), src, bytes, nullptr));
  // Done before the caller's work on any stream (a non-blocking one does not wait for this one).
  MLA_RETURN_IF_ERROR(rt->synchronize(nullptr));
  return buf;
}

// Skips without a CUDA device; op_ is the cuda op set's absorbed op.
class CudaAbsorbedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device: device_count is 0";
    const OpSet* set = OpRegistry::global().find("cuda");
    ASSERT_NE(set, nullptr);
    op_ = set->absorbed.get();
    ASSERT_NE(op_, nullptr);
  }
  const AbsorbedAttentionOp* op_ = nullptr;
};

}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
