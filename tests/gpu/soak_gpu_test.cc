// Soak on the GPU (issue 13 item 5; soak_driver.h says what runs and what must hold at the end):
// the cpu soak's 10,000 requests with the pool, the backends and the layers on cuda, the layers
// on every step and a sampled reference check (against the double-precision reference, and
// every KV slot each checked batch reads against what the simulation wrote) on one step in 128.
// The shared workspaces keep their default sizes (the cpu soak's 16 MiB are too small for the
// cuda absorbed op's split-KV partials: init_cuda_graph_state failed, H200 2026-12-04).
#ifdef MLA_WITH_CUDA
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "mla/memory.h"
#include "mla/workspace.h"
#include "soak/soak_driver.h"

namespace mla::testing {
namespace {

class SoakDevice : public ::testing::TestWithParam<std::string> {};

TEST_P(SoakDevice, TenThousandRequestsLeakNothing) {
  if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device: device_count is 0";
  // A short soak first: the op library's process-lifetime resources (the cuBLAS handle and its
  // 4 MiB workspace, created on first use: the ledger held one record more than the baseline
  // without this, H200 2026-12-04) exist before the baseline is taken.
  {
    SoakResult warm;
    soak(GetParam(), Device::cuda(), 200, SoakConfig{1, 128, 2e8}, &warm);
    if (HasFatalFailure()) return;
  }
  WorkspaceRegistry::global().release_all_for_testing();
  const LedgerState baseline = ledger_state();
  const auto t0 = std::chrono::steady_clock::now();
  SoakResult r;
  soak(GetParam(), Device::cuda(), 10000, SoakConfig{1, 128, 2e8}, &r);
  if (HasFatalFailure()) return;
  WorkspaceRegistry::global().release_all_for_testing();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ledger_state(), baseline) << "ledger not back at its baseline";
  expect_soak_clean("cuda " + GetParam(), r, 10000, /*check_rss=*/true, secs);
}

INSTANTIATE_TEST_SUITE_P(Backends, SoakDevice,
                         ::testing::Values("paged_mla", "chunked_mla", "ondemand_mla"));

}  // namespace
}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
