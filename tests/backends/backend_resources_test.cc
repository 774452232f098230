// Seed requirements: which workspaces each backend allocates and when, the skipped
// init_mha_chunk_metadata, fallback decisions per batch, out-of-workspace errors.
#include <gtest/gtest.h>

#include "backends/backend_fixture.h"
#include "backends/chunked_mla/chunked_mla.h"
#include "backends/ondemand_mla/ondemand_mla.h"
#include "backends/paged_mla/paged_mla.h"

namespace mla {
namespace {

using backends::ChunkedMlaBackend;
using backends::OndemandMlaBackend;
using backends::PagedMlaBackend;

class BackendResources : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkspaceRegistry::global().release_all_for_testing();
    pool_ = testing::make_pool({});
    ASSERT_NE(pool_, nullptr);
    ctx_.pool = pool_.get();
    ctx_.options = testing::small_options();
  }
  void TearDown() override { WorkspaceRegistry::global().release_all_for_testing(); }

  std::unique_ptr<AttentionBackend> make(std::string_view name) {
    auto b = BackendRegistry::global().create(name, ctx_);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    return b.ok() ? std::move(b).value() : nullptr;
  }

  std::unique_ptr<LatentKvPool> pool_;
  BackendContext ctx_;
  testing::Rng rng_{testing::base_seed()};
};

TEST_F(BackendResources, RegistryListsTheThreeFamilies) {
  const auto names = BackendRegistry::global().names();
  EXPECT_EQ(names, (std::vector<std::string>{"paged_mla", "chunked_mla", "ondemand_mla"}));
  for (const auto& n : names) EXPECT_FALSE(BackendRegistry::global().description(n).empty());
  auto bad = BackendRegistry::global().create("flash_mla", ctx_);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("paged_mla"), std::string::npos);
}

// Any head count 1..128 per rank is a valid model (8 heads: DeepSeek-V3 at TP16, Kimi-K2 at TP8);
// outside it every family refuses at construction, naming the field and the value.
TEST_F(BackendResources, HeadCountsOutsideOneTo128AreRefusedNamingTheField) {
  for (const std::string name : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    for (int heads : {1, 8, 63, 127}) {
      ctx_.options = testing::small_options(heads);
      auto b = BackendRegistry::global().create(name, ctx_);
      EXPECT_TRUE(b.ok()) << name << " heads " << heads << ": " << b.status().to_string();
      WorkspaceRegistry::global().release_all_for_testing();
    }
    for (int heads : {0, -1, 129, 256}) {
      ctx_.options = testing::small_options(heads);
      auto b = BackendRegistry::global().create(name, ctx_);
      ASSERT_FALSE(b.ok()) << name << " heads " << heads;
      EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(b.status().message().find(fmt::format("model.num_heads = {}", heads)),
                std::string::npos)
          << b.status().message();
    }
  }
  EXPECT_EQ(model_preset("deepseek-v3-tp16")->num_heads, 8);
}

// family_forward_method (what mla's Python backend asks) is each family's own chooser: the same
// method for every mode, prefix shape and option that the rules read.
TEST_F(BackendResources, FamilyForwardMethodIsEachBackendsOwnChooser) {
  auto batch = [](ForwardMode mode, std::vector<int32_t> prefix, int64_t seq_sum) {
    ForwardBatch b;
    b.mode = mode;
    b.batch_size = static_cast<int>(prefix.size());
    b.extend_prefix_lens = std::move(prefix);
    b.seq_lens_sum = seq_sum;
    return b;
  };
  const std::vector<ForwardBatch> batches = {
      batch(ForwardMode::kDecode, {}, 40),         batch(ForwardMode::kTargetVerify, {}, 90),
      batch(ForwardMode::kDraftExtend, {5}, 9),    batch(ForwardMode::kIdle, {}, 0),
      batch(ForwardMode::kExtend, {0, 0}, 30),     batch(ForwardMode::kExtend, {4, 0}, 30),
      batch(ForwardMode::kExtend, {40, 9}, 60),    batch(ForwardMode::kMixed, {50, 0}, 300),
      batch(ForwardMode::kExtend, {0}, 100000000),
  };
  int checked = 0;
  for (const std::string name : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    for (int variant = 0; variant < 5; ++variant) {
      BackendOptions o = testing::small_options();
      o.mha_prefix_threshold = variant == 1 ? 0 : 32;
      o.chunked_prefix_capacity = variant == 2 ? 48 : 4096;
      o.disable_chunked_prefix_cache = variant == 3;
      o.batch_invariant = variant == 4;
      ctx_.options = o;
      auto b = make(name);
      ASSERT_NE(b, nullptr);
      for (const ForwardBatch& fb : batches) {
        auto m = family_forward_method(name, o, fb);
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        EXPECT_EQ(forward_method_name(*m), forward_method_name(b->choose_forward_method(fb)))
            << name << " variant " << variant << " mode " << forward_mode_name(fb.mode);
        ++checked;
      }
      b.reset();
      WorkspaceRegistry::global().release_all_for_testing();
    }
  }
  EXPECT_EQ(checked, 3 * 5 * 9);
  auto bad = family_forward_method("flashinfer", ctx_.options, batches[0]);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'flashinfer'"), std::string::npos);
}

TEST_F(BackendResources, TwoPagedMlaInstancesShareOneWorkspace) {
  auto target = PagedMlaBackend::create(ctx_, "paged_mla.target");
  auto draft = PagedMlaBackend::create(ctx_, "paged_mla.draft");
  ASSERT_TRUE(target.ok() && draft.ok());
  EXPECT_EQ((*target)->workspace().data(), (*draft)->workspace().data());
  EXPECT_EQ(testing::ledger_count_prefix("paged_mla.workspace"), 1);
  EXPECT_EQ(testing::ledger_bytes("paged_mla.workspace"), ctx_.options.paged_workspace_bytes);
}

TEST_F(BackendResources, ChunkedMlaAllocatesNoPagedWorkspaceWithoutPossibleFallback) {
  auto b = make("chunked_mla");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(testing::ledger_bytes("paged_mla.workspace"), 0u);
  EXPECT_EQ(testing::ledger_bytes("chunked_mla.workspace"), ctx_.options.chunked_workspace_bytes);
  for (const auto& r : MemoryLedger::global().snapshot()) {
    if (r.name == "chunked_mla.workspace") {
      EXPECT_TRUE(r.zeroed);
    }
  }
  EXPECT_EQ(static_cast<ChunkedMlaBackend*>(b.get())->parent(), nullptr);
}

TEST_F(BackendResources, ChunkedMlaCreatesFallbackResourcesAtConstruction) {
  for (int variant = 0; variant < 2; ++variant) {
    WorkspaceRegistry::global().release_all_for_testing();
    ctx_.options.disable_chunked_prefix_cache = variant == 0;
    ctx_.options.piecewise_cuda_graph = variant == 1;
    auto b = make("chunked_mla");
    ASSERT_NE(b, nullptr);
    // Before any batch or graph capture: the parent's workspace exists already.
    EXPECT_EQ(testing::ledger_bytes("paged_mla.workspace"), ctx_.options.paged_workspace_bytes);
    EXPECT_NE(static_cast<ChunkedMlaBackend*>(b.get())->parent(), nullptr);
    // Planning a fallback batch allocates no further workspace.
    ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kExtend, {32, 0}, {4, 3}}, rng_);
    ASSERT_TRUE(b->init_forward_metadata(batch).ok());
    EXPECT_TRUE(b->fell_back());
    EXPECT_EQ(testing::ledger_count_prefix("paged_mla.workspace"), 1);
    testing::free_batch(*pool_, batch);
  }
}

// ondemand_mla's workspace is sized by what the ops report for the batch (the absorbed op's
// split-KV scratch here), not by SYSTEM.md's num_SMs*H*max_q_len*513*4 formula (see
// ondemand_mla.h: the 64 MiB budget wins), and grows only when a batch needs more.
TEST_F(BackendResources, OndemandMlaAllocatesNeitherParentWorkspaceAndGrowsOnDemand) {
  // Enough request rows for a batch whose absorbed scratch outgrows a small batch's.
  pool_ = testing::make_pool({.page_size = 16, .max_requests = 256, .max_context_len = 64});
  ASSERT_NE(pool_, nullptr);
  ctx_.pool = pool_.get();
  ctx_.options.disable_chunked_prefix_cache = true;  // even with a possible fallback
  auto created = OndemandMlaBackend::create(ctx_);
  ASSERT_TRUE(created.ok());
  auto& b = **created;
  EXPECT_EQ(testing::ledger_bytes("paged_mla.workspace"), 0u);
  EXPECT_EQ(testing::ledger_bytes("chunked_mla.workspace"), 0u);
  EXPECT_EQ(testing::ledger_bytes("ondemand_mla.workspace"), 0u);  // nothing before first use
  EXPECT_EQ(b.parent(), nullptr);

  const AbsorbedAttentionOp* op =
      OpRegistry::global().default_for(DeviceType::kCpu)->absorbed.get();
  ASSERT_NE(op, nullptr);
  const int H = ctx_.options.model.num_heads;
  auto need = [&](int bs) { return op->workspace_bytes(AttnCapacity{bs, bs, 0, 1, H}); };

  ForwardBatch small = testing::make_batch(*pool_, {ForwardMode::kDecode, {10, 20}, {}}, rng_);
  ASSERT_TRUE(b.init_forward_metadata(small).ok());
  EXPECT_EQ(b.workspace().grow_count(), 1u);
  EXPECT_GE(b.workspace().capacity(), need(2));
  const std::size_t after_small = b.workspace().capacity();
  EXPECT_EQ(testing::ledger_bytes("ondemand_mla.workspace"), after_small);
  ASSERT_TRUE(b.init_forward_metadata(small).ok());  // same need: no growth
  EXPECT_EQ(b.workspace().grow_count(), 1u);

  // A larger decode batch needs more scratch: the workspace grows once, to at least that need.
  const int big_bs = 250;
  ASSERT_GT(need(big_bs), after_small) << "the test needs a batch that outgrows the first one";
  ForwardBatch big = testing::make_batch(
      *pool_, {ForwardMode::kDecode, std::vector<int32_t>(big_bs, 7), {}}, rng_);
  ASSERT_TRUE(b.init_forward_metadata(big).ok());
  EXPECT_EQ(b.workspace().grow_count(), 2u);
  EXPECT_GE(b.workspace().capacity(), need(big_bs));
  EXPECT_EQ(testing::ledger_bytes("ondemand_mla.workspace"), b.workspace().capacity());
  ASSERT_TRUE(b.init_forward_metadata(small).ok());  // smaller again: never shrinks or regrows
  EXPECT_EQ(b.workspace().grow_count(), 2u);
  testing::free_batch(*pool_, big);
  // A fallback extend runs on the own workspace: still no parent workspace.
  ForwardBatch ext = testing::make_batch(*pool_, {ForwardMode::kExtend, {16}, {2}}, rng_);
  ASSERT_TRUE(b.init_forward_metadata(ext).ok());
  EXPECT_TRUE(b.fell_back());
  EXPECT_EQ(testing::ledger_bytes("paged_mla.workspace"), 0u);
  EXPECT_EQ(testing::ledger_bytes("chunked_mla.workspace"), 0u);
}

TEST_F(BackendResources, ChunkedInitMhaChunkMetadataDoesNoWorkOutsideFallback) {
  auto b = make("chunked_mla");
  ASSERT_NE(b, nullptr);
  ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kExtend, {40, 3}, {5, 2}}, rng_);
  ASSERT_TRUE(b->init_forward_metadata(batch).ok());
  EXPECT_EQ(b->forward_method(), ForwardMethod::kMhaChunked);
  const PlanningStats before = b->planning_stats();
  EXPECT_EQ(before.mha_chunk_plans, 1u);  // its own chunks, planned in init_forward_metadata
  const uint64_t allocs = MemoryLedger::global().allocation_count();
  ASSERT_TRUE(b->init_mha_chunk_metadata(batch).ok());
  ASSERT_TRUE(b->init_mha_chunk_metadata(batch, /*disable_ragged=*/true).ok());
  const PlanningStats& after = b->planning_stats();
  EXPECT_EQ(after.mha_chunk_plans, before.mha_chunk_plans);
  EXPECT_EQ(after.mha_plans, before.mha_plans);
  EXPECT_EQ(after.absorbed_plans, before.absorbed_plans);
  EXPECT_EQ(after.chunks_planned, before.chunks_planned);
  EXPECT_EQ(after.mha_chunk_metadata_calls, 2u);
  EXPECT_EQ(after.mha_chunk_metadata_skipped, 2u);
  EXPECT_EQ(MemoryLedger::global().allocation_count(), allocs);
}

TEST_F(BackendResources, ChunkedFallbackDelegatesToParentPlannerWhenPresent) {
  ctx_.options.disable_chunked_prefix_cache = true;
  auto created = ChunkedMlaBackend::create(ctx_);
  ASSERT_TRUE(created.ok());
  auto& b = **created;
  ASSERT_NE(b.parent(), nullptr);
  ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kExtend, {40, 3}, {5, 2}}, rng_);
  ASSERT_TRUE(b.init_forward_metadata(batch).ok());
  EXPECT_TRUE(b.fell_back());
  EXPECT_EQ(b.forward_method(), ForwardMethod::kAbsorbed);
  const uint64_t parent_chunks = b.parent()->planning_stats().mha_chunk_plans;
  ASSERT_TRUE(b.init_mha_chunk_metadata(batch, /*disable_ragged=*/true).ok());
  EXPECT_EQ(b.parent()->planning_stats().mha_chunk_plans, parent_chunks + 1);
  EXPECT_EQ(b.planning_stats().mha_chunk_metadata_skipped, 0u);
}

TEST_F(BackendResources, ChunkedFallbackWithoutParentPlannerDoesNotCrash) {
  ctx_.options.disable_chunked_prefix_cache = true;
  auto created = ChunkedMlaBackend::create(ctx_, ChunkedMlaBackend::ParentPolicy::kNever);
  ASSERT_TRUE(created.ok());
  auto& b = **created;
  EXPECT_EQ(b.parent(), nullptr);
  EXPECT_EQ(testing::ledger_bytes("paged_mla.workspace"), 0u);
  ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kExtend, {40}, {5}}, rng_);
  EXPECT_TRUE(b.init_mha_chunk_metadata(batch, true).ok());
  EXPECT_TRUE(b.init_mha_chunk_metadata(batch, false).ok());
  EXPECT_EQ(b.planning_stats().mha_chunk_plans, 0u);
  // Planning the fallback itself needs the parent: a clear error, not a crash.
  const Status s = b.init_forward_metadata(batch);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("paged_mla"), std::string::npos);
}

TEST_F(BackendResources, FallbackDecisionDoesNotLeakIntoTheNextVerifyBatch) {
  ctx_.options.disable_chunked_prefix_cache = true;
  for (std::string_view name : {"chunked_mla", "ondemand_mla"}) {
    auto b = make(name);
    ASSERT_NE(b, nullptr);
    ForwardBatch ext = testing::make_batch(*pool_, {ForwardMode::kExtend, {24}, {3}}, rng_);
    ASSERT_TRUE(b->init_forward_metadata(ext).ok());
    EXPECT_TRUE(b->fell_back()) << name;
    ForwardBatch verify =
        testing::make_batch(*pool_, {ForwardMode::kTargetVerify, {9, 4}, {}, 2}, rng_);
    ASSERT_TRUE(b->init_forward_metadata(verify).ok());
    EXPECT_FALSE(b->fell_back()) << name;
    EXPECT_EQ(b->planning_stats().fallbacks, 1u) << name;
    EXPECT_EQ(b->forward_method(), ForwardMethod::kAbsorbed);
    // And chunk metadata for the verify batch is skipped, not delegated.
    const uint64_t skipped = b->planning_stats().mha_chunk_metadata_skipped;
    ASSERT_TRUE(b->init_mha_chunk_metadata(verify).ok());
    EXPECT_EQ(b->planning_stats().mha_chunk_metadata_skipped, skipped + 1);
    testing::free_batch(*pool_, ext);
    testing::free_batch(*pool_, verify);
  }
}

TEST_F(BackendResources, TooSmallPagedWorkspaceIsOutOfWorkspace) {
  ctx_.options.paged_workspace_bytes = 256;  // the cpu absorbed op needs per-thread scratch
  auto b = make("paged_mla");
  ASSERT_NE(b, nullptr);
  ForwardBatch decode = testing::make_batch(*pool_, {ForwardMode::kDecode, {10, 20}, {}}, rng_);
  const Status s = b->init_forward_metadata(decode);
  ASSERT_EQ(s.code(), StatusCode::kOutOfWorkspace) << s.to_string();
  EXPECT_NE(s.message().find("paged_mla.workspace"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("more"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(kPagedWorkspaceEnv), std::string::npos) << s.message();
}

TEST_F(BackendResources, MalformedBatchIsRejectedBeforePlanning) {
  auto b = make("paged_mla");
  ASSERT_NE(b, nullptr);
  ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kDecode, {10}, {}}, rng_);
  batch.seq_lens[0] = 100000;
  batch.seq_lens_sum = 100000;
  const Status s = b->init_forward_metadata(batch);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("seq_lens[0]"), std::string::npos) << s.message();
  EXPECT_EQ(b->planning_stats().absorbed_plans, 0u);
}

// set_stream orders the pool's own device work (req_to_token uploads, copy-on-write copies) on
// the backend's stream too (tests/gpu/backend_stream_test.cc shows why on cuda); on the cpu the
// stream is only a handle.
TEST_F(BackendResources, SetStreamAlsoSetsThePoolsStream) {
  EXPECT_EQ(pool_->stream(), nullptr);
  for (const char* name : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    auto b = make(name);
    ASSERT_NE(b, nullptr);
    int handle = 0;
    b->set_stream(&handle);
    EXPECT_EQ(pool_->stream(), static_cast<void*>(&handle)) << name;
    auto row = pool_->alloc_request();
    ASSERT_TRUE(row.ok());
    EXPECT_TRUE(pool_->extend_request(*row, 20, nullptr).ok()) << name;
    EXPECT_TRUE(pool_->free_request(*row).ok());
    b->set_stream(nullptr);
    EXPECT_EQ(pool_->stream(), nullptr) << name;
  }
}

}  // namespace
}  // namespace mla
