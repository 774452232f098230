// The chunked-prefix planner (SYSTEM.md 6 test vectors + a coverage property), the fallback
// rule and the forward-method chooser.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "backends/backend_base.h"
#include "conformance/case_gen.h"
#include "conformance/conformance.h"
#include "mla/backend.h"
#include "planning/chunked_prefix.h"
#include "planning/forward_method.h"

namespace mla {
namespace {

using planning::ChunkedPrefixPlan;

std::vector<int32_t> chunk_lens(const ChunkedPrefixPlan& p, int c) {
  std::vector<int32_t> v;
  for (int b = 0; b < p.batch_size; ++b) v.push_back(p.len(c, b));
  return v;
}

TEST(ChunkedPrefixPlanner, SpecVectorEqualPrefixes) {
  ChunkedPrefixPlan p;
  const std::vector<int32_t> prefix{64, 64, 64};
  ASSERT_TRUE(planning::plan_chunked_prefix(prefix, 48, &p).ok());
  EXPECT_EQ(p.chunk_len, 16);
  ASSERT_EQ(p.num_chunks, 4);
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(p.start(c), 16 * c);
    EXPECT_EQ(chunk_lens(p, c), (std::vector<int32_t>{16, 16, 16}));
    EXPECT_EQ(p.num_tokens[c], 48);
    EXPECT_EQ(p.max_len[c], 16);
    EXPECT_EQ(p.has_zero_kv[c], 0);
  }
}

TEST(ChunkedPrefixPlanner, SpecVectorStaggeredPrefixes) {
  ChunkedPrefixPlan p;
  const std::vector<int32_t> prefix{16, 32, 48, 64};
  ASSERT_TRUE(planning::plan_chunked_prefix(prefix, 64, &p).ok());
  EXPECT_EQ(p.chunk_len, 16);
  ASSERT_EQ(p.num_chunks, 4);
  EXPECT_EQ(chunk_lens(p, 0), (std::vector<int32_t>{16, 16, 16, 16}));
  EXPECT_EQ(chunk_lens(p, 1), (std::vector<int32_t>{0, 16, 16, 16}));
  EXPECT_EQ(chunk_lens(p, 2), (std::vector<int32_t>{0, 0, 16, 16}));
  EXPECT_EQ(chunk_lens(p, 3), (std::vector<int32_t>{0, 0, 0, 16}));
  EXPECT_EQ(p.has_zero_kv[0], 0);
  EXPECT_EQ(p.has_zero_kv[1], 1);
  const auto cu = p.chunk_cu_len(1);
  EXPECT_EQ(std::vector<int32_t>(cu.begin(), cu.end()), (std::vector<int32_t>{0, 0, 16, 32, 48}));
}

TEST(ChunkedPrefixPlanner, SpecVectorUnevenCapacity) {
  ChunkedPrefixPlan p;
  const std::vector<int32_t> prefix{1, 64};
  ASSERT_TRUE(planning::plan_chunked_prefix(prefix, 31, &p).ok());
  EXPECT_EQ(p.chunk_len, 15);
  ASSERT_EQ(p.num_chunks, 5);
  const std::vector<int64_t> starts{0, 15, 30, 45, 60};
  const std::vector<std::vector<int32_t>> lens{{1, 15}, {0, 15}, {0, 15}, {0, 15}, {0, 4}};
  for (int c = 0; c < 5; ++c) {
    EXPECT_EQ(p.start(c), starts[c]);
    EXPECT_EQ(chunk_lens(p, c), lens[c]);
  }
  EXPECT_EQ(p.max_len[4], 4);
  EXPECT_EQ(p.num_tokens[4], 4);
}

TEST(ChunkedPrefixPlanner, NoPrefixMeansNoChunks) {
  ChunkedPrefixPlan p;
  const std::vector<int32_t> prefix{0, 0};
  ASSERT_TRUE(planning::plan_chunked_prefix(prefix, 100, &p).ok());
  EXPECT_EQ(p.num_chunks, 0);
}

TEST(ChunkedPrefixPlanner, CapacityBelowBatchSizeIsAnError) {
  ChunkedPrefixPlan p;
  const std::vector<int32_t> prefix{5, 5, 5};
  const Status s = planning::plan_chunked_prefix(prefix, 2, &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunked_prefix_capacity"), std::string::npos) << s.message();
}

// Property: over random batches, every (request, prefix token) appears exactly once across the
// chunks, at the slot req_to_token gives, and no chunk exceeds the capacity.
TEST(ChunkedPrefixPlanner, PropertyEveryPrefixTokenCoveredExactlyOnce) {
  testing::Rng rng(testing::base_seed());
  for (int iter = 0; iter < 200; ++iter) {
    const int bs = static_cast<int>(rng.uniform_int(1, 9));
    const int page = std::vector<int>{1, 16, 64}[rng.uniform_int(0, 2)];
    const int64_t width = 300;
    const int rows = bs + 1;
    // A synthetic req_to_token: token i of row r lives at slot 1000 * r + i (page aligned).
    std::vector<int32_t> table(static_cast<std::size_t>(rows * width));
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < width; ++i) table[r * width + i] = static_cast<int32_t>(1024 * r + i);
    }
    std::vector<int32_t> prefix(bs), req(bs);
    for (int b = 0; b < bs; ++b) {
      prefix[b] = static_cast<int32_t>(rng.uniform_int(0, 3) == 0 ? 0 : rng.uniform_int(0, 290));
      req[b] = b + 1;
    }
    const int64_t cap = rng.uniform_int(bs, 400);
    ChunkedPrefixPlan p;
    ASSERT_TRUE(planning::plan_chunked_prefix(prefix, cap, &p).ok());
    ASSERT_TRUE(planning::fill_chunk_kv_indices(req, table, width, page, &p).ok());
    std::map<int32_t, int> seen;  // slot -> count
    for (int c = 0; c < p.num_chunks; ++c) {
      EXPECT_LE(p.num_tokens[c], cap);
      EXPECT_EQ(p.kv_offsets[c + 1] - p.kv_offsets[c], p.num_tokens[c]);
      int64_t k = p.kv_offsets[c];
      for (int b = 0; b < bs; ++b) {
        for (int i = 0; i < p.len(c, b); ++i, ++k) {
          const int64_t token = p.start(c) + i;
          EXPECT_LT(token, prefix[b]);
          EXPECT_EQ(p.kv_indices[k], 1024 * req[b] + token);
          ++seen[p.kv_indices[k]];
        }
      }
    }
    int64_t total = std::accumulate(prefix.begin(), prefix.end(), int64_t{0});
    EXPECT_EQ(static_cast<int64_t>(seen.size()), total) << "iter " << iter;
    for (const auto& [slot, count] : seen) EXPECT_EQ(count, 1) << "slot " << slot;
  }
}

// ---------------------------------------------------------------------------------------------
ForwardBatch extend_batch(ForwardMode mode, std::vector<int32_t> prefix, std::vector<int32_t> ext) {
  ForwardBatch b;
  b.mode = mode;
  b.batch_size = static_cast<int>(prefix.size());
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    b.req_pool_indices.push_back(static_cast<int32_t>(i + 1));
    b.seq_lens.push_back(prefix[i] + ext[i]);
  }
  b.extend_prefix_lens = prefix;
  b.extend_seq_lens = ext;
  finalize_batch(b);
  return b;
}

// Two decode requests of 5 and 9 keys.
ForwardBatch decode_batch() {
  ForwardBatch b;
  b.mode = ForwardMode::kDecode;
  b.batch_size = 2;
  b.req_pool_indices = {1, 2};
  b.seq_lens = {5, 9};
  finalize_batch(b);
  return b;
}

TEST(FallbackRule, FourRowTruthTableForExtends) {
  const ForwardBatch with_prefix = extend_batch(ForwardMode::kExtend, {0, 8}, {4, 4});
  const ForwardBatch no_prefix = extend_batch(ForwardMode::kExtend, {0, 0}, {4, 4});
  struct Row {
    bool disable_chunked, piecewise, expect_with_prefix, expect_no_prefix;
  };
  const Row rows[] = {{false, false, false, false},
                      {true, false, true, false},
                      {false, true, true, true},
                      {true, true, true, true}};
  for (const Row& r : rows) {
    BackendOptions o;
    o.disable_chunked_prefix_cache = r.disable_chunked;
    o.piecewise_cuda_graph = r.piecewise;
    EXPECT_EQ(planning::should_fall_back(backends::method_options(o), with_prefix),
              r.expect_with_prefix)
        << r.disable_chunked << r.piecewise;
    EXPECT_EQ(planning::should_fall_back(backends::method_options(o), no_prefix),
              r.expect_no_prefix)
        << r.disable_chunked << r.piecewise;
    EXPECT_EQ(planning::fallback_possible(backends::method_options(o)),
              r.disable_chunked || r.piecewise);
    // The chooser agrees with the rule for chunked_mla.
    EXPECT_EQ(planning::choose_forward_method(planning::ExtendRule::kChunkedUnlessFallback,
                                              backends::method_options(o), with_prefix),
              r.expect_with_prefix ? ForwardMethod::kAbsorbed : ForwardMethod::kMhaChunked);
  }
}

TEST(FallbackRule, DecodeVerifyAndDraftExtendNeverFallBack) {
  BackendOptions o;
  o.disable_chunked_prefix_cache = true;
  o.piecewise_cuda_graph = true;
  ForwardBatch decode = decode_batch();
  ForwardBatch verify = decode;
  verify.mode = ForwardMode::kTargetVerify;
  verify.num_draft_tokens = 2;
  verify.extend_prefix_lens.clear();
  verify.extend_seq_lens.clear();
  finalize_batch(verify);
  ForwardBatch draft = extend_batch(ForwardMode::kDraftExtend, {7, 9}, {2, 1});
  for (const ForwardBatch* b : {&decode, &verify, &draft}) {
    EXPECT_FALSE(planning::should_fall_back(backends::method_options(o), *b))
        << forward_mode_name(b->mode);
    for (auto rule :
         {planning::ExtendRule::kPrefixThreshold, planning::ExtendRule::kChunkedUnlessFallback}) {
      EXPECT_EQ(planning::choose_forward_method(rule, backends::method_options(o), *b),
                ForwardMethod::kAbsorbed);
    }
  }
}

// decide_batch_method (chunked_mla's init_forward_metadata asks the fallback rule once) gives
// what the rule and the chooser give separately, for every mode, rule and option combination.
TEST(FallbackRule, DecideBatchMethodAgreesWithTheRuleAndTheChooser) {
  const ForwardBatch decode = decode_batch();
  const ForwardBatch batches[] = {
      decode,
      extend_batch(ForwardMode::kExtend, {0, 8}, {4, 4}),
      extend_batch(ForwardMode::kExtend, {0, 0}, {4, 4}),
      extend_batch(ForwardMode::kMixed, {3, 9}, {1, 5}),
      extend_batch(ForwardMode::kDraftExtend, {7, 9}, {2, 1}),
  };
  for (int bits = 0; bits < 16; ++bits) {
    BackendOptions o;
    o.disable_chunked_prefix_cache = (bits & 1) != 0;
    o.piecewise_cuda_graph = (bits & 2) != 0;
    o.batch_invariant = (bits & 4) != 0;
    o.mha_prefix_threshold = (bits & 8) != 0 ? 1 : 1 << 20;
    o.chunked_prefix_capacity = 10;
    const planning::MethodOptions mo = backends::method_options(o);
    for (const ForwardBatch& b : batches) {
      for (auto rule :
           {planning::ExtendRule::kPrefixThreshold, planning::ExtendRule::kChunkedUnlessFallback}) {
        const planning::BatchMethod d = planning::decide_batch_method(rule, mo, b);
        EXPECT_EQ(d.fell_back, planning::should_fall_back(mo, b)) << bits;
        EXPECT_EQ(d.method, planning::choose_forward_method(rule, mo, b))
            << bits << " " << forward_mode_name(b.mode);
      }
    }
  }
}

TEST(ForwardMethodChooser, PagedMlaRules) {
  BackendOptions o;
  o.mha_prefix_threshold = 100;
  o.chunked_prefix_capacity = 1000;
  const auto paged = [&](const ForwardBatch& b) {
    return planning::choose_forward_method(planning::ExtendRule::kPrefixThreshold,
                                           backends::method_options(o), b);
  };
  // No prefix: MHA, one-shot when it fits one chunk, else chunked.
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {0, 0}, {10, 10})),
            ForwardMethod::kMhaOneShot);
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {0, 0}, {600, 600})),
            ForwardMethod::kMhaChunked);
  // Short prefix: absorbed. Long prefix: MHA (one-shot or chunked by sum(seq_lens)).
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {50, 49}, {4, 4})), ForwardMethod::kAbsorbed);
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {50, 50}, {4, 4})),
            ForwardMethod::kMhaOneShot);
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {500, 500}, {4, 4})),
            ForwardMethod::kMhaChunked);
  // Chunked prefix disabled with a prefix: absorbed however long.
  o.disable_chunked_prefix_cache = true;
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {500, 500}, {4, 4})),
            ForwardMethod::kAbsorbed);
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {0, 0}, {4, 4})), ForwardMethod::kMhaOneShot);
  // Piecewise graphs: absorbed for everything.
  o.disable_chunked_prefix_cache = false;
  o.piecewise_cuda_graph = true;
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {0, 0}, {4, 4})), ForwardMethod::kAbsorbed);
  EXPECT_EQ(paged(extend_batch(ForwardMode::kExtend, {500, 500}, {4, 4})),
            ForwardMethod::kAbsorbed);
}

TEST(ForwardMethodChooser, ChunkedRuleUsesChunkedMhaForEveryExtend) {
  BackendOptions o;
  const auto rule = planning::ExtendRule::kChunkedUnlessFallback;
  const planning::MethodOptions mo = backends::method_options(o);
  EXPECT_EQ(planning::choose_forward_method(rule, mo, extend_batch(ForwardMode::kExtend, {0}, {3})),
            ForwardMethod::kMhaChunked);
  EXPECT_EQ(
      planning::choose_forward_method(rule, mo, extend_batch(ForwardMode::kMixed, {3, 9}, {1, 5})),
      ForwardMethod::kMhaChunked);
}

}  // namespace
}  // namespace mla
