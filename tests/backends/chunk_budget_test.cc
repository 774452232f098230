// The up-projected chunk buffer ("<backend>.mha_chunk_kv") is bounded by
// BackendOptions::mha_chunk_kv_budget_bytes whatever the prefix: a 100k-token prefix on the
// DeepSeek-V3 128-head model plans within the budget (slot list and per-new-token partials
// included), by more chunks instead of a bigger buffer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"

namespace mla {
namespace {

std::size_t ledger_bytes(const std::string& name) {
  std::size_t bytes = 0;
  for (const AllocationRecord& r : MemoryLedger::global().snapshot()) {
    if (r.name == name) bytes += r.bytes;
  }
  return bytes;
}

TEST(ChunkBudget, HundredThousandTokenPrefixStaysWithinTheBudget) {
  constexpr int32_t kPrefix = 100'000;
  constexpr int32_t kNew = 16;
  constexpr std::size_t kBudget = std::size_t{8} << 20;
  auto model = model_preset("deepseek-v3");
  ASSERT_TRUE(model.ok());
  for (const char* name : {"chunked_mla", "paged_mla"}) {
    KvPoolConfig pc;
    pc.num_layers = 1;
    pc.page_size = 64;
    pc.max_requests = 2;
    pc.max_context_len = kPrefix + kNew;
    pc.num_pages = (kPrefix + kNew + 63) / 64;
    pc.latent_dim = model->latent_dim();
    auto pool = LatentKvPool::create(pc);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    BackendContext ctx;
    ctx.pool = pool->get();
    ctx.options.model = *model;
    ctx.options.max_batch = 2;
    ctx.options.mha_chunk_kv_budget_bytes = kBudget;
    ctx.options.mha_prefix_threshold = 1;  // paged_mla: the MHA path for any prefix
    auto backend = BackendRegistry::global().create(name, ctx);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();

    auto row = (*pool)->alloc_request();
    ASSERT_TRUE(row.ok());
    ASSERT_TRUE((*pool)->extend_request(*row, kPrefix, nullptr).ok());
    std::vector<int32_t> slots;
    ASSERT_TRUE((*pool)->extend_request(*row, kPrefix + kNew, &slots).ok());
    ForwardBatch b;
    b.mode = ForwardMode::kExtend;
    b.batch_size = 1;
    b.req_pool_indices = {*row};
    b.seq_lens = {kPrefix + kNew};
    b.extend_prefix_lens = {kPrefix};
    b.extend_seq_lens = {kNew};
    b.out_cache_loc = slots;
    finalize_batch(b);
    ASSERT_TRUE(plan_batch(**backend, b).ok()) << name;
    EXPECT_EQ((*backend)->forward_method(), ForwardMethod::kMhaChunked) << name;
    // Many chunks, each within the budget's rows.
    EXPECT_GT((*backend)->planning_stats().chunks_planned, 10u) << name;
    const std::size_t buffer = ledger_bytes(std::string(name) + ".mha_chunk_kv");
    EXPECT_GT(buffer, kBudget / 2) << name;  // the budget is used, not a token of it
    EXPECT_LE(buffer, kBudget) << name;      // slot list and partials included
  }
}

TEST(ChunkBudget, ABudgetBelowOneRowPerRequestIsAnError) {
  auto model = model_preset("deepseek-v3");
  ASSERT_TRUE(model.ok());
  KvPoolConfig pc;
  pc.num_layers = 1;
  pc.page_size = 64;
  pc.max_requests = 8;
  pc.max_context_len = 1024;
  pc.num_pages = 16;
  pc.latent_dim = model->latent_dim();
  auto pool = LatentKvPool::create(pc);
  ASSERT_TRUE(pool.ok());
  BackendContext ctx;
  ctx.pool = pool->get();
  ctx.options.model = *model;
  ctx.options.max_batch = 8;
  ctx.options.mha_chunk_kv_budget_bytes = 4096;  // not one 128-head row
  auto backend = BackendRegistry::global().create("chunked_mla", ctx);
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("mha_chunk_kv_budget_bytes"), std::string::npos)
      << backend.status().message();
}

}  // namespace
}  // namespace mla
