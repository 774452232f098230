// Threads and streams on the GPU (issue 13 item 3; the cpu suite's Concurrency.* is the same on
// the cpu): three threads each run a short `mla run` (run_simulation: its own pool, target and
// draft backends, layers; speculative verify; --check against the double reference) of one
// backend family on a stream of its own (RunConfig::own_stream: a non-blocking cuda stream, set
// on the backends, their pool and the layers), while two more threads create and destroy cuda
// backends of every family over a pool of their own. Every run must pass its checks, and once
// everything is gone the ledger is back at its baseline.
// One family per running thread: backends of one family share a process-global workspace whose
// lock orders the issue of their work, not its execution on different streams (workspace.h).
// Compiles to nothing without CUDA.
#ifdef MLA_WITH_CUDA
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/workspace.h"
#include "sim/run_driver.h"
#include "soak/soak_driver.h"

namespace mla::testing {
namespace {

cli::RunConfig config_of(const std::string& backend, uint64_t seed) {
  cli::RunConfig c;
  c.backend = backend;
  c.device = Device::cuda();
  c.layers = 1;
  c.workload.num_requests = 24;
  c.workload.seed = seed;
  c.scheduler.seed = seed;
  c.scheduler.speculative_tokens = 2;
  c.check = true;
  c.check_steps = 4;
  c.progress = false;
  c.own_stream = true;
  return c;
}

TEST(ConcurrencyDevice, RunsOnTheirOwnStreamsWhileOthersCreateAndDestroyBackends) {
  if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device: device_count is 0";
  const std::vector<std::string> families = {"paged_mla", "chunked_mla", "ondemand_mla"};
  // One clean run per family first: the process-lifetime resources (the cuBLAS handle and its
  // workspace) exist before the baseline.
  for (const auto& f : families) {
    auto warm = cli::run_simulation(config_of(f, 3));
    ASSERT_TRUE(warm.ok()) << f << ": " << warm.status().to_string();
    ASSERT_TRUE(warm->check_passed) << f << ": max rel err " << warm->max_rel_err;
  }
  WorkspaceRegistry::global().release_all_for_testing();
  const LedgerState baseline = ledger_state();

  std::vector<StatusOr<cli::RunReport>> reports(
      families.size(), StatusOr<cli::RunReport>(internal_error("not run")));
  std::atomic<int> running{static_cast<int>(families.size())};
  std::atomic<int> churned{0};
  std::vector<std::string> churn_errors(2);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < families.size(); ++i) {
    threads.emplace_back([&, i] {
      reports[i] = cli::run_simulation(config_of(families[i], 40 + i));
      --running;
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      KvPoolConfig pc;
      pc.num_layers = 1;
      pc.num_pages = 64;
      pc.page_size = 64;
      pc.max_requests = 8;
      pc.max_context_len = 1024;
      pc.device = Device::cuda();
      auto pool = LatentKvPool::create(pc);
      if (!pool.ok()) {
        churn_errors[t] = pool.status().to_string();
        return;
      }
      BackendContext ctx;
      ctx.pool = pool->get();
      ctx.options.model = *model_preset("deepseek-v3-tp8");
      ctx.options.device = Device::cuda();
      ctx.options.max_batch = 8;
      ctx.options.disable_chunked_prefix_cache = t == 1;  // chunked_mla's fallback resources
      for (int k = 0; running.load() > 0 || k < 3; ++k) {
        auto b = BackendRegistry::global().create(families[(t + k) % families.size()], ctx);
        if (!b.ok()) {
          churn_errors[t] = b.status().to_string();
          return;
        }
        ++churned;
      }
    });
  }
  for (auto& th : threads) th.join();

  for (const auto& e : churn_errors) EXPECT_TRUE(e.empty()) << e;
  EXPECT_GE(churned.load(), 6);
  for (std::size_t i = 0; i < families.size(); ++i) {
    SCOPED_TRACE(families[i]);
    ASSERT_TRUE(reports[i].ok()) << reports[i].status().to_string();
    EXPECT_TRUE(reports[i]->check_passed) << "max rel err " << reports[i]->max_rel_err;
    EXPECT_GT(reports[i]->checks.size(), 0u);
    std::printf("concurrency cuda %s: %zu checks on its own stream, max rel err %.2e\n",
                families[i].c_str(), reports[i]->checks.size(), reports[i]->max_rel_err);
  }
  std::printf("concurrency cuda: %d backends created and destroyed meanwhile\n", churned.load());
  WorkspaceRegistry::global().release_all_for_testing();
  EXPECT_EQ(ledger_state(), baseline) << "device or host bytes left in the ledger";
}

}  // namespace
}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
