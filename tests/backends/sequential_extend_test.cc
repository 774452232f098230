// Chunked prefill as the serving simulation (`mla run`) runs it: one request extended twice
// through the MLA layer, so the second extend's cached prefix was written by the first extend's
// MHA pass (not straight into the cache as make_batch does). CLI-like options (default
// workspaces and chunk capacity, max_q_len 1), CLI-like input scales (activations 1.0, weights
// 0.08), no lse passed (the backend's own lse buffer) and o reused across steps.
#include <gtest/gtest.h>

#include "backends/backend_fixture.h"

namespace mla {
namespace {

constexpr int kHeads = 16;

ForwardBatch extend_batch(LatentKvPool& pool, int row, int32_t prefix, int32_t fresh) {
  ForwardBatch batch;
  batch.mode = ForwardMode::kExtend;
  batch.batch_size = 1;
  std::vector<int32_t> slots;
  EXPECT_TRUE(pool.extend_request(row, prefix + fresh, &slots).ok());
  batch.req_pool_indices.push_back(row);
  batch.out_cache_loc = slots;
  batch.seq_lens.push_back(prefix + fresh);
  batch.extend_prefix_lens.push_back(prefix);
  batch.extend_seq_lens.push_back(fresh);
  finalize_batch(batch);
  return batch;
}

testing::LayerInputs cli_like_inputs(int64_t tokens, testing::Rng& rng) {
  testing::LayerInputs in;
  in.tokens = tokens;
  in.heads = kHeads;
  in.q_nope = testing::random_bf16(tokens * kHeads * 128, rng, 1.0f);
  in.q_pe = testing::random_bf16(tokens * kHeads * 64, rng, 1.0f);
  in.c_kv = testing::random_bf16(tokens * 512, rng, 1.0f);
  in.k_pe = testing::random_bf16(tokens * 64, rng, 1.0f);
  return in;
}

TEST(SequentialExtend, ExtendOverAPrefixWrittenByAnEarlierMhaStep) {
  for (std::string_view name : {"chunked_mla", "ondemand_mla", "paged_mla"}) {
    WorkspaceRegistry::global().release_all_for_testing();
    auto pool = testing::make_pool({64, 4, 512, 0});
    ASSERT_NE(pool, nullptr);
    BackendOptions o;
    o.model = *model_preset("deepseek-v3-tp8");
    o.device = Device::cpu();
    o.max_batch = 32;
    o.max_q_len = 1;
    auto layer = MlaLayer::create_random(o.model, 0, Device::cpu(), 7, 0.08f);
    ASSERT_TRUE(layer.ok()) << layer.status().to_string();
    auto backend = BackendRegistry::global().create(name, BackendContext{pool.get(), o});
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    testing::Rng rng(testing::base_seed());
    const int row = *pool->alloc_request();
    std::vector<bf16> o_buf(static_cast<std::size_t>(48) * kHeads * 128);
    int32_t prefix = 0;
    for (int32_t fresh : {48, 32}) {  // `mla run --max-batch-tokens 48` on an 80-token prompt
      const ForwardBatch batch = extend_batch(*pool, row, prefix, fresh);
      testing::LayerInputs in = cli_like_inputs(fresh, rng);
      const testing::LayerReference ref =
          testing::reference_layer(*pool, 0, batch, in, (*layer)->kv_b_proj(), o.model.sm_scale);
      ASSERT_TRUE(plan_batch(**backend, batch).ok());
      if (name != "paged_mla") {
        EXPECT_EQ((*backend)->forward_method(), ForwardMethod::kMhaChunked) << name;
      }
      const TensorView o_view(o_buf.data(), DType::kBF16, Device::cpu(), {fresh, kHeads, 128});
      const Status st = (*layer)->forward(**backend, in.q_nope_view(), in.q_pe_view(),
                                          in.c_kv_view(), in.k_pe_view(), o_view, ExecContext{});
      ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
      const std::vector<bf16> o_used(o_buf.begin(), o_buf.begin() + fresh * kHeads * 128);
      EXPECT_LT(testing::rel_error(testing::to_float(o_used), ref.o), 2e-2)
          << name << " prefix " << prefix << " extend " << fresh;
      prefix += fresh;
    }
  }
  WorkspaceRegistry::global().release_all_for_testing();
}

}  // namespace
}  // namespace mla
