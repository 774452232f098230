// Fault injection for tests: makes the k-th allocation, device copy/memset or kernel launch from
// now fail, as a device that ran out of memory or hit an error would. Tests call these functions
// directly (there is no environment switch); when nothing is armed the hooks cost one atomic
// increment per event.
//
//   kAllocation  DeviceBuffer::allocate (every ledger allocation, host and device runtimes):
//                fails with kOutOfMemory before anything is allocated or recorded.
//   kCopy        DeviceRuntime memset / copy_to_device / copy_to_host / copy_device (cpu and
//                cuda runtimes): fails with kCudaError, as a failed cudaMemcpyAsync would.
//   kLaunch      the CUDA launch check (MLA_CUDA_CHECK_LAUNCH): fails with kCudaError after the
//                launch, as a failed launch would. The cpu ops launch nothing.
#pragma once

#include <cstdint>
#include <string_view>

#include "mla/status.h"

namespace mla::fault_injection {

enum class Site : uint8_t { kAllocation, kCopy, kLaunch };
std::string_view site_name(Site site);

// The k-th event (1-based) at `site` from now fails; k = 0 disarms. Restarts the site's count.
void fail_at(Site site, uint64_t k);
// Disarms every site and restarts every count.
void reset();
// Events seen at `site` since it was last armed or reset.
uint64_t count(Site site);
// Whether the armed failure at `site` has fired.
bool fired(Site site);

// For the runtimes: counts one event at `site`; true when this one must fail.
bool should_fail(Site site);
// The status an injected failure returns (kOutOfMemory for allocations, else kCudaError).
Status injected(Site site, std::string_view what);

}  // namespace mla::fault_injection
