// Fault injection on the GPU (issue 13 item 2; mla/fault_injection.h): a short `mla run` on cuda
// (run_simulation: pool, target and draft backends, layers, the scheduler's steps; CUDA graphs
// and speculative verify in one scenario) with the k-th device allocation, device copy / memset
// or kernel launch failing, for k spread over the run. Every failure must come back from
// run_simulation as a Status (allocation: kOutOfMemory or kOutOfWorkspace; copy and launch:
// kCudaError naming the call), never an abort and never swallowed; once the run's objects are
// gone the ledger is back at its baseline; and the same process then runs the workload again
// with --check passing against the double-precision reference. The cpu suite's
// FaultInjection.* sweeps the allocation and copy sites on the cpu runtime; the launch site
// exists only here. Compiles to nothing without CUDA.
#ifdef MLA_WITH_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "mla/fault_injection.h"
#include "mla/memory.h"
#include "mla/workspace.h"
#include "sim/run_driver.h"
#include "soak/soak_driver.h"

namespace mla::testing {
namespace {

namespace fi = fault_injection;

struct Scenario {
  std::string backend;
  bool graph = false;  // --cuda-graph --speculative 2
};

std::string name_of(const Scenario& s) { return s.backend + (s.graph ? "_graph" : ""); }
void PrintTo(const Scenario& s, std::ostream* os) { *os << name_of(s); }

cli::RunConfig config_of(const Scenario& s, bool check) {
  cli::RunConfig c;
  c.backend = s.backend;
  c.device = Device::cuda();
  c.layers = 1;
  c.workload.num_requests = 10;
  c.workload.seed = 21;
  c.scheduler.seed = 21;
  c.cuda_graph = s.graph;
  c.scheduler.speculative_tokens = s.graph ? 2 : 0;
  c.check = check;
  c.check_steps = 2;
  c.progress = false;
  return c;
}

class FaultInjectionDevice : public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device: device_count is 0";
    fi::reset();
  }
  void TearDown() override { fi::reset(); }

  void sweep(fi::Site site, const std::vector<StatusCode>& allowed, std::string_view names) {
    const Scenario sc = GetParam();
    // Two clean runs: the first creates the process-lifetime resources (the cuBLAS handle and
    // its workspace), the second counts the events of a run as every later one sees them.
    for (int i = 0; i < 2; ++i) {
      fi::reset();
      auto clean = cli::run_simulation(config_of(sc, false));
      ASSERT_TRUE(clean.ok()) << clean.status().to_string();
      WorkspaceRegistry::global().release_all_for_testing();
    }
    const uint64_t events = fi::count(site);
    ASSERT_GT(events, 0u) << fi::site_name(site);
    const LedgerState baseline = ledger_state();
    // The first 4 events, the last, and 8 spread evenly between.
    std::vector<uint64_t> ks;
    for (uint64_t k = 1; k <= events; ++k) {
      if (k <= 4 || k == events || (k - 4) % std::max<uint64_t>(1, (events - 4) / 8) == 0) {
        ks.push_back(k);
      }
    }
    int failed = 0;
    for (const uint64_t k : ks) {
      SCOPED_TRACE(fmt::format("{}: {} {} of {}", name_of(sc), fi::site_name(site), k, events));
      fi::reset();
      fi::fail_at(site, k);
      auto hit = cli::run_simulation(config_of(sc, false));
      const bool fired = fi::fired(site);
      fi::reset();
      WorkspaceRegistry::global().release_all_for_testing();
      if (!fired) continue;  // a run with fewer events than counted (none seen so far)
      ++failed;
      ASSERT_FALSE(hit.ok()) << "an injected " << fi::site_name(site)
                             << " failure was swallowed: the run reported success";
      EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), hit.status().code()) != allowed.end())
          << hit.status().to_string();
      EXPECT_NE(hit.status().message().find(names), std::string::npos)
          << "not the injected failure: " << hit.status().to_string();
      EXPECT_EQ(ledger_state(), baseline) << "device or host bytes left in the ledger";
    }
    EXPECT_GT(failed, 0);
    // The process still runs the workload, and correctly.
    auto again = cli::run_simulation(config_of(sc, true));
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_TRUE(again->check_passed) << "max rel err " << again->max_rel_err;
    EXPECT_GT(again->checks.size(), 0u);
    WorkspaceRegistry::global().release_all_for_testing();
    std::printf(
        "fault injection cuda %s: %llu %s events, %d failed on purpose, each a Status; "
        "recovered run checked (max rel err %.2e)\n",
        name_of(sc).c_str(), static_cast<unsigned long long>(events),
        std::string(fi::site_name(site)).c_str(), failed, again->max_rel_err);
  }
};

TEST_P(FaultInjectionDevice, EveryLaunchFailureIsACudaError) {
  sweep(fi::Site::kLaunch, {StatusCode::kCudaError}, "launch of");
}

TEST_P(FaultInjectionDevice, EveryCopyFailureIsACudaError) {
  sweep(fi::Site::kCopy, {StatusCode::kCudaError}, "injected");
}

TEST_P(FaultInjectionDevice, EveryAllocationFailureIsOutOfMemory) {
  sweep(fi::Site::kAllocation, {StatusCode::kOutOfMemory, StatusCode::kOutOfWorkspace}, "injected");
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultInjectionDevice,
                         ::testing::Values(Scenario{"paged_mla", true}, Scenario{"chunked_mla"},
                                           Scenario{"ondemand_mla"}),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           return name_of(info.param);
                         });

}  // namespace
}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
