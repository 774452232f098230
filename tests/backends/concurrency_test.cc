// Threads: several threads create and destroy backends of all three kinds (and chunked_mla with
// its fallback resources) while others run batches through their own backends at the same time,
// each with its own pool, layer and stream (ExecContext). Backends of one family share the
// process-global workspace (paged_mla.workspace, chunked_mla.workspace), so this proves that
// sharing stays consistent: every runner's output is bitwise the output it computed alone, and
// the zeroed workspace's reserved counter region is zero before every use. Run under
// ThreadSanitizer by the `tsan` preset (scripts/tsan.sh); in the other presets it checks the
// results.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "backends/backend_fixture.h"

namespace mla {
namespace {

struct Runner {
  std::string kind;
  std::unique_ptr<LatentKvPool> pool;
  std::unique_ptr<MlaLayer> layer;
  std::vector<ForwardBatch> batches;
  std::vector<testing::LayerInputs> inputs;
  std::vector<std::vector<float>> expected;  // o of each batch, computed alone
};

BackendContext context_for(LatentKvPool* pool, bool fallback = false) {
  BackendContext ctx;
  ctx.pool = pool;
  ctx.options = testing::small_options(16);
  ctx.options.max_batch = 8;
  ctx.options.chunked_prefix_capacity = 24;
  ctx.options.mha_prefix_threshold = 16;
  ctx.options.paged_workspace_bytes = 4u << 20;
  ctx.options.chunked_workspace_bytes = 4u << 20;
  ctx.options.disable_chunked_prefix_cache = fallback;
  return ctx;
}

std::unique_ptr<Runner> make_runner(const std::string& kind, uint64_t seed) {
  auto r = std::make_unique<Runner>();
  r->kind = kind;
  r->pool = testing::make_pool({16, 8, 256});
  auto layer = MlaLayer::create_random(testing::small_options(16).model, 0, Device::cpu(), seed);
  if (!r->pool || !layer.ok()) return nullptr;
  r->layer = std::move(layer).value();
  testing::Rng rng(seed);
  // An extend over cached prefixes (chunked MHA on every family), a decode and a verify.
  r->batches.push_back(
      testing::make_batch(*r->pool, {ForwardMode::kExtend, {40, 0}, {7, 12}}, rng));
  r->batches.push_back(testing::make_batch(*r->pool, {ForwardMode::kDecode, {30, 61, 5}, {}}, rng));
  r->batches.push_back(
      testing::make_batch(*r->pool, {ForwardMode::kTargetVerify, {20, 33}, {}, 3}, rng));
  for (const auto& b : r->batches) {
    r->inputs.push_back(testing::random_layer_inputs(b.num_tokens(), 16, rng));
  }
  return r;
}

// Plans and runs every batch of the runner once on `backend`; the o of each batch. before_each
// runs before every batch (the counters check).
std::vector<std::vector<float>> run_all(Runner& r, AttentionBackend& backend, Status* status,
                                        const std::function<void()>& before_each = {}) {
  std::vector<std::vector<float>> outs;
  for (std::size_t i = 0; i < r.batches.size(); ++i) {
    if (before_each) before_each();
    testing::LayerRun run = testing::run_layer(backend, *r.layer, r.batches[i], r.inputs[i]);
    if (!run.status.ok()) {
      *status = run.status;
      return outs;
    }
    outs.push_back(std::move(run.o));
  }
  return outs;
}

TEST(Concurrency, BackendsCreatedAndDestroyedWhileOthersRunBatches) {
  WorkspaceRegistry::global().release_all_for_testing();
  const std::vector<std::string> kinds = {"paged_mla", "chunked_mla", "ondemand_mla"};
  // Two runners per family, so two threads use one shared workspace at once.
  std::vector<std::unique_ptr<Runner>> runners;
  for (int i = 0; i < 6; ++i) {
    runners.push_back(make_runner(kinds[i % 3], 1000 + i));
    ASSERT_NE(runners.back(), nullptr);
  }
  for (auto& r : runners) {  // alone, one at a time
    auto b = BackendRegistry::global().create(r->kind, context_for(r->pool.get()));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    Status s;
    r->expected = run_all(*r, **b, &s);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  // The zeroed workspace exists now (chunked runners made it); keep a handle to its counters.
  WorkspaceSpec zeroed{"chunked_mla.workspace", Device::cpu(), 4u << 20,
                       WorkspacePolicy::kSharedZeroed, kChunkedWorkspaceEnv};
  auto ws = WorkspaceRegistry::global().acquire(zeroed, "concurrency_test");
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const std::size_t counter_bytes = align_workspace(8u * 16u * sizeof(int32_t));
  // Read under the workspace's use lock, so it sees the state between two users (and races with
  // no user's writes).
  auto counters_zero = [&] {
    const auto guard = (*ws)->lock_for_use();
    const auto* p = static_cast<const unsigned char*>((*ws)->data());
    for (std::size_t i = 0; i < counter_bytes; ++i) {
      if (p[i] != 0) return false;
    }
    return true;
  };

  constexpr int kIterations = 6;
  std::atomic<int> failures{0}, dirty_counters{0}, counter_checks{0}, runs{0}, churned{0};
  std::atomic<bool> stop{false};
  std::vector<std::string> errors(runners.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < runners.size(); ++i) {
    threads.emplace_back([&, i] {
      Runner& r = *runners[i];
      for (int it = 0; it < kIterations; ++it) {
        auto b = BackendRegistry::global().create(r.kind, context_for(r.pool.get()));
        if (!b.ok()) {
          errors[i] = b.status().to_string();
          ++failures;
          return;
        }
        // Before every batch of every runner (whatever its family: the chunked runners' batches
        // use the zeroed workspace, the others run meanwhile) and after the last.
        const auto check = [&] {
          ++counter_checks;
          if (!counters_zero()) ++dirty_counters;
        };
        Status s;
        const auto outs = run_all(r, **b, &s, check);
        check();
        if (!s.ok() || outs != r.expected) {
          errors[i] = s.ok() ? "output differs from the output computed alone" : s.to_string();
          ++failures;
        }
        ++runs;
      }
    });
  }
  // Churn: create and destroy backends of every kind (and a chunked_mla with fallback
  // resources, which creates a paged_mla inside) against a pool of their own.
  auto churn_pool = testing::make_pool({16, 4, 128});
  ASSERT_NE(churn_pool, nullptr);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      int n = 0;
      while (!stop.load()) {
        const std::string& kind = kinds[(n + t) % 3];
        auto b = BackendRegistry::global().create(kind, context_for(churn_pool.get(), n % 4 == 3));
        if (!b.ok()) ++failures;
        ++n;
        ++churned;
      }
    });
  }
  for (std::size_t i = 0; i < runners.size(); ++i) threads[i].join();
  stop = true;
  for (std::size_t i = runners.size(); i < threads.size(); ++i) threads[i].join();
  for (std::size_t i = 0; i < runners.size(); ++i) {
    EXPECT_TRUE(errors[i].empty()) << runners[i]->kind << " runner " << i << ": " << errors[i];
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(dirty_counters.load(), 0) << "chunked_mla.workspace counters not zero before a use";
  EXPECT_EQ(runs.load(), static_cast<int>(runners.size()) * kIterations);
  EXPECT_EQ(counter_checks.load(), static_cast<int>(runners.size()) * kIterations * 4);
  EXPECT_GT(churned.load(), 0);
  ws->reset();
  WorkspaceRegistry::global().release_all_for_testing();
}

}  // namespace
}  // namespace mla
