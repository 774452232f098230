// Soak on the cpu (soak_driver.h says what runs and what must hold at the end): a cpu pool with
// paged_mla and chunked_mla backends. Under ASan (Debug, -O0) the layers' attention runs on one
// step in 32 so that the soak stays within a few minutes of CI; planning, the KV cache writes,
// the pool and the scheduler run every step either way. The cuda run is
// tests/gpu/soak_gpu_test.cc.
#include <gtest/gtest.h>

#include <chrono>

#include "mla/workspace.h"
#include "soak/soak_driver.h"

#ifdef MLA_SOAK_ASAN
// ASan keeps freed blocks in a quarantine (256 MiB by default) that fills during the run, which
// made resident memory grow after warm-up; a 32 MiB quarantine fills within the warm-up, so the
// resident size measures the process again (ASAN_OPTIONS in the environment still wins).
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=32"; }
#endif

namespace mla::testing {
namespace {

// About 20 reference checks over the 2,868 steps either way.
#ifdef MLA_SOAK_ASAN
constexpr SoakConfig kConfig{32, 4, 3e7};
constexpr bool kCheckRss = true;  // resident memory measured under ASan only; Release prints it
#else
constexpr SoakConfig kConfig{1, 128, 2e8};
constexpr bool kCheckRss = false;
#endif

class Soak : public ::testing::TestWithParam<std::string> {};

TEST_P(Soak, TenThousandRequestsLeakNothing) {
  WorkspaceRegistry::global().release_all_for_testing();
  const LedgerState baseline = ledger_state();
  const auto t0 = std::chrono::steady_clock::now();
  SoakResult r;
  soak(GetParam(), Device::cpu(), 10000, kConfig, &r);
  if (HasFatalFailure()) return;
  WorkspaceRegistry::global().release_all_for_testing();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ledger_state(), baseline) << "ledger not back at its baseline";
  expect_soak_clean(GetParam(), r, 10000, kCheckRss, secs);
  RecordProperty("steps", static_cast<int>(r.steps));
}

// Under ASan (CI's asan-ubsan step, a few minutes) chunked_mla only: its path has the most
// moving parts (prefix chunks, the zeroed workspace, the fallback planner's counters).
#ifdef MLA_SOAK_ASAN
INSTANTIATE_TEST_SUITE_P(Backends, Soak, ::testing::Values("chunked_mla"));
#else
INSTANTIATE_TEST_SUITE_P(Backends, Soak, ::testing::Values("paged_mla", "chunked_mla"));
#endif

}  // namespace
}  // namespace mla::testing
