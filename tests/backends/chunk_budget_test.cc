// The up-projected chunk buffer ("<backend>.mha_chunk_kv") is bounded by
// BackendOptions::mha_chunk_kv_budget_bytes whatever the prefix: a 100k-token prefix on the
// DeepSeek-V3 128-head model plans within the budget (slot list included), by more chunks
// instead of a bigger buffer. The new tokens take none of it: each chunk's attention merges
// into the layer's output itself, so the chunk count does not depend on how many tokens are new.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/status.h"

namespace mla {
namespace {

std::size_t ledger_bytes(const std::string& name) {
  std::size_t bytes = 0;
  for (const AllocationRecord& r : MemoryLedger::global().snapshot()) {
    if (r.name == name) bytes += r.bytes;
  }
  return bytes;
}

struct PlannedChunks {
  uint64_t chunks = 0;
  std::size_t buffer_bytes = 0;
  ForwardMethod method = ForwardMethod::kAbsorbed;
};

// Plans one extend of `fresh` new tokens over a `prefix`-token cached prefix on the DeepSeek-V3
// 128-head model with an mha_chunk_kv budget of `budget` bytes.
StatusOr<PlannedChunks> plan_prefix_extend(const char* backend_name, int32_t prefix, int32_t fresh,
                                           std::size_t budget) {
  MLA_ASSIGN_OR_RETURN(ModelDims model, model_preset("deepseek-v3"));
  KvPoolConfig pc;
  pc.num_layers = 1;
  pc.page_size = 64;
  pc.max_requests = 2;
  pc.max_context_len = prefix + fresh;
  pc.num_pages = (prefix + fresh + 63) / 64;
  pc.latent_dim = model.latent_dim();
  MLA_ASSIGN_OR_RETURN(auto pool, LatentKvPool::create(pc));
  BackendContext ctx;
  ctx.pool = pool.get();
  ctx.options.model = model;
  ctx.options.max_batch = 2;
  ctx.options.max_q_len = fresh;
  ctx.options.mha_chunk_kv_budget_bytes = budget;
  ctx.options.mha_prefix_threshold = 1;  // paged_mla: the MHA path for any prefix
  MLA_ASSIGN_OR_RETURN(auto backend, BackendRegistry::global().create(backend_name, ctx));
  MLA_ASSIGN_OR_RETURN(int32_t row, pool->alloc_request());
  MLA_RETURN_IF_ERROR(pool->extend_request(row, prefix, nullptr));
  std::vector<int32_t> slots;
  MLA_RETURN_IF_ERROR(pool->extend_request(row, prefix + fresh, &slots));
  ForwardBatch b;
  b.mode = ForwardMode::kExtend;
  b.batch_size = 1;
  b.req_pool_indices = {row};
  b.seq_lens = {prefix + fresh};
  b.extend_prefix_lens = {prefix};
  b.extend_seq_lens = {fresh};
  b.out_cache_loc = slots;
  finalize_batch(b);
  MLA_RETURN_IF_ERROR(plan_batch(*backend, b));
  PlannedChunks out;
  out.chunks = backend->planning_stats().chunks_planned;
  out.buffer_bytes = ledger_bytes(std::string(backend_name) + ".mha_chunk_kv");
  out.method = backend->forward_method();
  return out;
}

TEST(ChunkBudget, HundredThousandTokenPrefixStaysWithinTheBudget) {
  constexpr std::size_t kBudget = std::size_t{8} << 20;
  for (const char* name : {"chunked_mla", "paged_mla"}) {
    auto planned = plan_prefix_extend(name, 100'000, 16, kBudget);
    ASSERT_TRUE(planned.ok()) << name << ": " << planned.status().to_string();
    EXPECT_EQ(planned->method, ForwardMethod::kMhaChunked) << name;
    // Many chunks, each within the budget's rows.
    EXPECT_GT(planned->chunks, 10u) << name;
    EXPECT_GT(planned->buffer_bytes, kBudget / 2) << name;  // the budget is used, not a token of it
    EXPECT_LE(planned->buffer_bytes, kBudget) << name;      // slot list included
  }
}

TEST(ChunkBudget, NewTokensTakeNoneOfTheBudget) {
  // 16 or 1024 new tokens over the same prefix: the same chunks. Before the chunks' attention
  // merged into the output itself, 1024 new tokens x 128 heads of bf16 partials (32 MiB) and
  // their LSEs came out of this budget, and the chunks shrank with every new token.
  constexpr std::size_t kBudget = std::size_t{48} << 20;
  for (const char* name : {"chunked_mla", "paged_mla"}) {
    auto few = plan_prefix_extend(name, 20'000, 16, kBudget);
    auto many = plan_prefix_extend(name, 20'000, 1024, kBudget);
    ASSERT_TRUE(few.ok()) << name << ": " << few.status().to_string();
    ASSERT_TRUE(many.ok()) << name << ": " << many.status().to_string();
    EXPECT_EQ(many->method, ForwardMethod::kMhaChunked) << name;
    EXPECT_GT(few->chunks, 1u) << name;
    EXPECT_EQ(many->chunks, few->chunks) << name;
    EXPECT_LE(many->buffer_bytes, kBudget) << name;
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
