// AttentionBackend::describe_plan: the plan the backend built for its last batch, in its own
// words (what `mla plan` prints). Checked against the chunked-prefix rule of SYSTEM.md 6 worked
// by hand, and across the states a plan goes through: nothing planned, absorbed, chunks not yet
// planned (paged_mla plans them in init_mha_chunk_metadata), chunks planned, fallback.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend_fixture.h"
#include "mla/backend.h"
#include "mla/kv_pool.h"

namespace mla {
namespace {

std::string detail(const PlanDescription& d, const std::string& name) {
  for (const auto& [n, v] : d.details) {
    if (n == name) return v;
  }
  return "<absent>";
}

struct PlanSetup {
  std::unique_ptr<LatentKvPool> pool;
  std::unique_ptr<AttentionBackend> backend;
};

PlanSetup make(const char* name, int64_t chunk_capacity, bool disable_chunked = false) {
  PlanSetup s;
  testing::PoolSetup ps;
  ps.max_requests = 4;
  ps.max_context_len = 128;
  s.pool = testing::make_pool(ps);
  BackendContext ctx;
  ctx.pool = s.pool.get();
  ctx.options = testing::small_options();
  ctx.options.max_batch = 4;
  ctx.options.chunked_prefix_capacity = chunk_capacity;
  ctx.options.mha_prefix_threshold = 1;  // paged_mla: MHA for any prefix
  ctx.options.disable_chunked_prefix_cache = disable_chunked;
  auto b = BackendRegistry::global().create(name, ctx);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (b.ok()) s.backend = std::move(b).value();
  return s;
}

// Prefixes 16, 32, 48, 64 at capacity 64 over 4 requests: L = 16, 4 chunks; chunk c holds 16
// tokens of every request whose prefix reaches past 16 c.
TEST(DescribePlan, ChunkedMlaReportsTheChunksItPlanned) {
  PlanSetup s = make("chunked_mla", 64);
  ASSERT_NE(s.backend, nullptr);
  const PlanDescription before = s.backend->describe_plan();
  EXPECT_EQ(before.backend, "chunked_mla");
  EXPECT_TRUE(before.chunks.empty());
  EXPECT_TRUE(before.details.empty());

  testing::Rng rng(7);
  const ForwardBatch batch =
      testing::make_batch(*s.pool, {ForwardMode::kExtend, {16, 32, 48, 64}, {4, 4, 4, 4}}, rng);
  ASSERT_TRUE(plan_batch(*s.backend, batch).ok());
  const PlanDescription d = s.backend->describe_plan();
  EXPECT_EQ(d.backend, "chunked_mla");
  EXPECT_EQ(d.mode, ForwardMode::kExtend);
  EXPECT_EQ(d.method, ForwardMethod::kMhaChunked);
  EXPECT_FALSE(d.fell_back);
  EXPECT_EQ(d.num_tokens, 16);
  EXPECT_EQ(d.chunk_capacity, 64);
  EXPECT_EQ(d.chunk_len, 16);
  ASSERT_EQ(d.chunks.size(), 4u);
  const std::vector<std::vector<int32_t>> lens = {
      {16, 16, 16, 16}, {0, 16, 16, 16}, {0, 0, 16, 16}, {0, 0, 0, 16}};
  for (std::size_t c = 0; c < 4; ++c) {
    EXPECT_EQ(d.chunks[c].start, static_cast<int64_t>(16 * c)) << c;
    EXPECT_EQ(d.chunks[c].lens, lens[c]) << c;
    EXPECT_EQ(d.chunks[c].num_tokens, 16 * (4 - static_cast<int64_t>(c))) << c;
    EXPECT_EQ(d.chunks[c].has_zero_kv, c > 0) << c;
  }
  EXPECT_EQ(detail(d, "requests"), "4");
  EXPECT_EQ(detail(d, "kv tokens"), std::to_string(16 + 32 + 48 + 64 + 16));
  EXPECT_EQ(detail(d, "op set"), "cpu");

  // The next batch replaces the description: a decode is absorbed, without chunks.
  testing::free_batch(*s.pool, batch);
  const ForwardBatch decode =
      testing::make_batch(*s.pool, {ForwardMode::kDecode, {9, 20}, {1, 1}}, rng);
  ASSERT_TRUE(plan_batch(*s.backend, decode).ok());
  const PlanDescription dd = s.backend->describe_plan();
  EXPECT_EQ(dd.mode, ForwardMode::kDecode);
  EXPECT_EQ(dd.method, ForwardMethod::kAbsorbed);
  EXPECT_TRUE(dd.chunks.empty());
  EXPECT_EQ(detail(dd, "requests"), "2");
}

TEST(DescribePlan, PagedMlaSaysWhenItsChunksAreNotPlannedYet) {
  PlanSetup s = make("paged_mla", 64);
  ASSERT_NE(s.backend, nullptr);
  testing::Rng rng(8);
  const ForwardBatch batch =
      testing::make_batch(*s.pool, {ForwardMode::kExtend, {16, 32, 48, 64}, {30, 30, 30, 30}}, rng);
  ASSERT_TRUE(s.backend->init_forward_metadata(batch).ok());
  ASSERT_EQ(s.backend->forward_method(), ForwardMethod::kMhaChunked);
  const PlanDescription half = s.backend->describe_plan();
  EXPECT_TRUE(half.chunks.empty());
  EXPECT_NE(detail(half, "prefix chunks").find("not planned yet"), std::string::npos);
  ASSERT_TRUE(s.backend->init_mha_chunk_metadata(batch).ok());
  const PlanDescription d = s.backend->describe_plan();
  EXPECT_EQ(detail(d, "prefix chunks"), "<absent>");
  EXPECT_EQ(d.chunk_len, 16);
  EXPECT_EQ(d.chunks.size(), 4u);
}

TEST(DescribePlan, ChunkedMlaFallbackDescribesTheParentsPlan) {
  PlanSetup s = make("chunked_mla", 64, /*disable_chunked=*/true);
  ASSERT_NE(s.backend, nullptr);
  testing::Rng rng(9);
  const ForwardBatch batch =
      testing::make_batch(*s.pool, {ForwardMode::kExtend, {16, 32}, {4, 4}}, rng);
  ASSERT_TRUE(plan_batch(*s.backend, batch).ok());
  const PlanDescription d = s.backend->describe_plan();
  EXPECT_EQ(d.backend, "chunked_mla");
  EXPECT_TRUE(d.fell_back);
  EXPECT_EQ(d.method, ForwardMethod::kAbsorbed);
  EXPECT_EQ(detail(d, "planned by"), "chunked_mla.fallback");
  EXPECT_TRUE(d.chunks.empty());
}

}  // namespace
}  // namespace mla
