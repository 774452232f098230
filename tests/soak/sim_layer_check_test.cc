// `mla run --check` (tools/mla/run_layer.h) compares the KV cache with an independent model of
// what each request's slots should hold: here a write to a wrong slot is injected after a clean
// forward (two of a request's slots swapped; one request's token written over another
// request's slot) and the check must report the mismatching slots and fail the output check.
// (In this folder because its executable already links the `mla run` serving loop's sources.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/model.h"
#include "sim/run_layer.h"

namespace mla {
namespace {

class WrongSlot : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = model_preset("deepseek-v3-tp8");
    ASSERT_TRUE(model.ok());
    model_ = *model;
    KvPoolConfig pc;
    pc.num_layers = 1;
    pc.page_size = 16;
    pc.num_pages = 16;
    pc.max_requests = 4;
    pc.max_context_len = 128;
    pc.latent_dim = model_.latent_dim();
    auto pool = LatentKvPool::create(pc);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    pool_ = std::move(*pool);
    BackendContext ctx;
    ctx.pool = pool_.get();
    ctx.options.model = model_;
    ctx.options.max_batch = 4;
    auto backend = BackendRegistry::global().create("paged_mla", ctx);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    backend_ = std::move(*backend);
    auto layer = cli::SimLayer::create(model_, Device::cpu(), 1, pool_->num_slots(), 256, 7);
    ASSERT_TRUE(layer.ok()) << layer.status().to_string();
    layer_ = std::move(*layer);

    // Two requests of 40 and 24 tokens prefilled in one EXTEND.
    batch_.mode = ForwardMode::kExtend;
    for (int32_t len : {40, 24}) {
      auto row = pool_->alloc_request();
      ASSERT_TRUE(row.ok());
      rows_.push_back(*row);
      std::vector<int32_t> slots;
      ASSERT_TRUE(pool_->extend_request(*row, len, &slots).ok());
      batch_.req_pool_indices.push_back(*row);
      batch_.seq_lens.push_back(len);
      batch_.extend_prefix_lens.push_back(0);
      batch_.extend_seq_lens.push_back(len);
      batch_.out_cache_loc.insert(batch_.out_cache_loc.end(), slots.begin(), slots.end());
    }
    batch_.batch_size = 2;
    finalize_batch(batch_);
    ASSERT_TRUE(plan_batch(*backend_, batch_).ok());
    ASSERT_TRUE(layer_->forward(*backend_, batch_, 0, batch_.num_tokens()).ok());
  }

  StatusOr<cli::SimLayer::CheckResult> check() { return layer_->check(*backend_, batch_, 0, 3e8); }

  // The cache row of a slot (bf16, latent_dim elements).
  bf16* slot_row(int32_t slot) {
    return pool_->layer_cache(0).ptr<bf16>() + static_cast<int64_t>(slot) * model_.latent_dim();
  }
  std::size_t row_bytes() const { return sizeof(bf16) * model_.latent_dim(); }

  ModelDims model_;
  std::unique_ptr<LatentKvPool> pool_;
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<cli::SimLayer> layer_;
  ForwardBatch batch_;
  std::vector<int> rows_;
};

TEST_F(WrongSlot, CleanForwardPasses) {
  auto r = check();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kv_mismatches, 0) << r->kv_error;
  EXPECT_EQ(r->kv_slots_checked, 40 + 24);
  EXPECT_EQ(r->entries_checked, 2);
  EXPECT_LE(r->max_rel_err, 1e-2);
}

// Tokens 3 and 20 of request 0 written to each other's slots.
TEST_F(WrongSlot, SwappedSlotsOfOneRequestAreCaught) {
  const int32_t a = pool_->slot(rows_[0], 3), b = pool_->slot(rows_[0], 20);
  std::vector<bf16> tmp(slot_row(a), slot_row(a) + model_.latent_dim());
  std::memcpy(slot_row(a), slot_row(b), row_bytes());
  std::memcpy(slot_row(b), tmp.data(), row_bytes());
  auto r = check();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kv_mismatches, 2);
  EXPECT_FALSE(r->kv_error.empty());
}

// Request 0's token 39 written over request 1's slot of token 10 (a slot of another request).
TEST_F(WrongSlot, WriteIntoAnotherRequestsSlotIsCaught) {
  std::memcpy(slot_row(pool_->slot(rows_[1], 10)), slot_row(pool_->slot(rows_[0], 39)),
              row_bytes());
  auto r = check();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kv_mismatches, 1);
  EXPECT_NE(r->kv_error.find("slot"), std::string::npos) << r->kv_error;
}

}  // namespace
}  // namespace mla
