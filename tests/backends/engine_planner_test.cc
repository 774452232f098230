// The engine planner (issue 33, one strategy): the per-batch decisions the engine adapters
// (mla.Backend over an engine's own pools) get from C++ are the C++ backends' own. The per-mode
// lengths are ForwardBatch::q_len / kv_len; the method and fallback are what a real backend of
// the family plans for the same batch, for every option the rule reads and random batches of
// every mode; the holder a batch is planned into follows the graph / eager / grow policy; and
// malformed lengths are refused naming the field.
#include "mla/engine_planner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/backend_fixture.h"
#include "mla/backend.h"
#include "mla/workspace.h"

namespace mla {
namespace {

EngineBatch engine_batch(const ForwardBatch& b) {
  EngineBatch e;
  e.mode = b.mode;
  e.req_rows = b.req_pool_indices;
  e.seq_lens = b.seq_lens;
  const bool ext = b.mode == ForwardMode::kExtend || b.mode == ForwardMode::kMixed ||
                   b.mode == ForwardMode::kDraftExtend;
  if (ext) {
    e.extend_seq_lens = b.extend_seq_lens;
    e.extend_prefix_lens = b.extend_prefix_lens;
  }
  e.num_draft_tokens = b.num_draft_tokens;
  return e;
}

// Random specs of every mode: decode, verify, draft-extend, extend and mixed, with and without
// cached prefixes (some long enough for paged_mla's threshold of 32).
testing::BatchSpec random_spec(testing::Rng& rng) {
  testing::BatchSpec s;
  const int kind = static_cast<int>(rng.uniform_int(0, 4));
  const int bs = static_cast<int>(rng.uniform_int(1, 4));
  s.mode = kind == 0   ? ForwardMode::kDecode
           : kind == 1 ? ForwardMode::kTargetVerify
           : kind == 2 ? ForwardMode::kDraftExtend
           : kind == 3 ? ForwardMode::kExtend
                       : ForwardMode::kMixed;
  const bool no_prefix = rng.uniform_int(0, 2) == 0;
  for (int b = 0; b < bs; ++b) {
    s.prefix_lens.push_back(no_prefix && s.mode == ForwardMode::kExtend
                                ? 0
                                : static_cast<int32_t>(rng.uniform_int(0, 60)));
    if (s.mode == ForwardMode::kDecode || s.mode == ForwardMode::kTargetVerify) continue;
    s.new_lens.push_back(static_cast<int32_t>(rng.uniform_int(1, 8)));
  }
  if (s.mode == ForwardMode::kTargetVerify) s.num_draft_tokens = 3;
  if (s.mode == ForwardMode::kDecode) {
    for (auto& p : s.prefix_lens) p = std::max<int32_t>(p, 0);
  }
  return s;
}

TEST(ResolveLengths, AreForwardBatchQLenAndKvLenForEveryMode) {
  auto pool = testing::make_pool({});
  ASSERT_NE(pool, nullptr);
  testing::Rng rng(testing::base_seed());
  BatchLengths l;
  for (int i = 0; i < 200; ++i) {
    const ForwardBatch b = testing::make_batch(*pool, random_spec(rng), rng);
    const BatchShape s = resolve_lengths(b.mode, b.seq_lens, b.extend_seq_lens, b.num_draft_tokens,
                                         /*kv_extra=*/0, &l);
    ASSERT_EQ(s.batch_size, b.batch_size);
    int64_t q = 0, kv = 0;
    int32_t max_q = 1;
    for (int r = 0; r < b.batch_size; ++r) {
      EXPECT_EQ(l.q_lens[r], b.q_len(r)) << forward_mode_name(b.mode) << " request " << r;
      EXPECT_EQ(l.kv_lens[r], b.kv_len(r)) << forward_mode_name(b.mode) << " request " << r;
      EXPECT_EQ(l.prefix_lens[r], b.kv_len(r) - b.q_len(r));
      q += b.q_len(r);
      kv += b.kv_len(r);
      max_q = std::max(max_q, b.q_len(r));
      EXPECT_EQ(l.qo_indptr[r + 1], q);
      EXPECT_EQ(l.kv_indptr[r + 1], kv);
    }
    EXPECT_EQ(s.num_tokens, b.num_tokens());
    EXPECT_EQ(s.kv_tokens, kv);
    EXPECT_EQ(s.max_q_len, max_q);
    EXPECT_EQ(s.has_prefix, kv > q);
    // A draft step's extra keys land on every kv_len and nowhere else.
    BatchLengths d;
    resolve_lengths(b.mode, b.seq_lens, b.extend_seq_lens, b.num_draft_tokens, 2, &d);
    for (int r = 0; r < b.batch_size; ++r) {
      EXPECT_EQ(d.q_lens[r], l.q_lens[r]);
      EXPECT_EQ(d.kv_lens[r], l.kv_lens[r] + 2);
    }
    testing::free_batch(*pool, b);
  }
}

// The method and fallback an engine adapter gets are the ones a C++ backend of the family plans
// for the same batch (the adapters have no one-shot form: an MHA batch is "mha" without a
// prefix and "mha_chunked" with one), for every option the rule reads.
TEST(EnginePlanner, DecidesAsTheFamilysBackendForRandomBatches) {
  auto pool = testing::make_pool({});
  ASSERT_NE(pool, nullptr);
  testing::Rng rng(testing::base_seed() + 1);
  int checked = 0, absorbed = 0, mha = 0, chunked = 0, fell_back = 0;
  for (std::string_view family : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    for (int bits = 0; bits < 8; ++bits) {
      WorkspaceRegistry::global().release_all_for_testing();
      BackendOptions o = testing::small_options();
      o.mha_prefix_threshold = 32;
      o.disable_chunked_prefix_cache = (bits & 1) != 0;
      o.piecewise_cuda_graph = (bits & 2) != 0;
      o.batch_invariant = (bits & 4) != 0;
      auto backend = BackendRegistry::global().create(family, BackendContext{pool.get(), o});
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      StatusOr<EnginePlanner> planner = EnginePlanner::create(family, o);
      ASSERT_TRUE(planner.ok()) << planner.status().to_string();
      for (int i = 0; i < 24; ++i) {
        const ForwardBatch b = testing::make_batch(*pool, random_spec(rng), rng);
        ASSERT_TRUE((*backend)->init_forward_metadata(b).ok());
        EngineDecision d;
        const Status st = planner->plan(engine_batch(b), &d);
        ASSERT_TRUE(st.ok()) << st.to_string();
        const ForwardMethod want = (*backend)->forward_method();
        const std::string where =
            fmt::format("{} options {} {} batch {}", family, bits, forward_mode_name(b.mode), i);
        EXPECT_EQ(d.method == EngineMethod::kAbsorbed, want == ForwardMethod::kAbsorbed) << where;
        EXPECT_EQ(d.fell_back, (*backend)->fell_back()) << where;
        if (d.method != EngineMethod::kAbsorbed) {
          EXPECT_EQ(d.method == EngineMethod::kMhaChunked, b.has_prefix()) << where;
        }
        EXPECT_EQ(d.shape.num_tokens, b.num_tokens()) << where;
        ++checked;
        absorbed += d.method == EngineMethod::kAbsorbed;
        mha += d.method == EngineMethod::kMha;
        chunked += d.method == EngineMethod::kMhaChunked;
        fell_back += d.fell_back;
        testing::free_batch(*pool, b);
      }
    }
  }
  EXPECT_EQ(checked, 3 * 8 * 24);
  // Every answer occurred (the batches are random, the set is not degenerate).
  EXPECT_GT(absorbed, 0);
  EXPECT_GT(mha, 0);
  EXPECT_GT(chunked, 0);
  EXPECT_GT(fell_back, 0);
  WorkspaceRegistry::global().release_all_for_testing();
}

ForwardBatch decode_of(std::vector<int32_t> seq) {
  ForwardBatch b;
  b.mode = ForwardMode::kDecode;
  b.batch_size = static_cast<int>(seq.size());
  for (int r = 0; r < b.batch_size; ++r) b.req_pool_indices.push_back(r + 1);
  b.seq_lens = std::move(seq);
  return b;
}

TEST(EnginePlanner, PicksTheGraphHolderThenTheEagerOneAndGrowsByTheFamilysPolicy) {
  BackendOptions o = testing::small_options();
  o.max_batch = 4;
  o.max_q_len = 2;
  StatusOr<EnginePlanner> paged = EnginePlanner::create("paged_mla", o);
  ASSERT_TRUE(paged.ok());
  const AttnCapacity first = paged->initial_eager_capacity();
  EXPECT_EQ(first.max_batch, 4);
  EXPECT_EQ(first.max_q_tokens, 8);
  EXPECT_EQ(first.max_q_len, 2);
  EngineDecision d;
  const ForwardBatch small = decode_of({5, 9});
  // No holder yet: build the construction capacity.
  ASSERT_TRUE(paged->plan(engine_batch(small), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kGrowEager);
  EXPECT_EQ(d.capacity.max_batch, 4);
  EXPECT_EQ(d.capacity.max_q_tokens, 8);
  paged->set_eager_capacity(d.capacity);
  ASSERT_TRUE(paged->plan(engine_batch(small), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kEager);
  // A graph holder takes the decode batches that fit it.
  paged->set_graph_capacity(graph_capacity(2, 4, 16, false));
  EXPECT_EQ(paged->graph_capacity().max_q_len, 2);
  ASSERT_TRUE(paged->plan(engine_batch(small), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kGraph);
  const ForwardBatch wide = decode_of({3, 3, 3});
  ASSERT_TRUE(paged->plan(engine_batch(wide), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kEager);
  const ForwardBatch huge = decode_of({1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(paged->plan(engine_batch(huge), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kGrowEager);
  EXPECT_EQ(d.capacity.max_batch, 6);
  EXPECT_EQ(d.capacity.max_q_tokens, 8);  // never below what it held
  EXPECT_EQ(d.capacity.max_q_len, 2);
  // ondemand_mla builds nothing at construction and holds what the batches needed.
  StatusOr<EnginePlanner> ondemand = EnginePlanner::create("ondemand_mla", o);
  ASSERT_TRUE(ondemand.ok());
  EXPECT_EQ(ondemand->initial_eager_capacity().max_batch, 0);
  ASSERT_TRUE(ondemand->plan(engine_batch(small), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kGrowEager);
  EXPECT_EQ(d.capacity.max_batch, 2);
  EXPECT_EQ(d.capacity.max_q_tokens, 2);
  EXPECT_EQ(d.capacity.max_q_len, 1);
  // An MHA batch goes to the MHA holder: built for max_batch requests and max_extend_tokens
  // new tokens at least (8192 by default), then grown to what a batch needs.
  ForwardBatch ext;
  ext.mode = ForwardMode::kExtend;
  ext.batch_size = 3;
  ext.req_pool_indices = {1, 2, 3};
  ext.seq_lens = {5, 6, 7};
  ext.extend_seq_lens = {5, 6, 7};
  ext.extend_prefix_lens = {0, 0, 0};
  ASSERT_TRUE(paged->plan(engine_batch(ext), &d).ok());
  EXPECT_EQ(d.method, EngineMethod::kMha);
  EXPECT_EQ(d.target, PlanTarget::kGrowMha);
  EXPECT_EQ(d.capacity.max_batch, 4);
  EXPECT_EQ(d.capacity.max_q_tokens, 8192);
  EXPECT_EQ(d.capacity.max_kv_tokens, 8192);
  paged->set_mha_capacity(d.capacity);
  ASSERT_TRUE(paged->plan(engine_batch(ext), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kMha);
  // Idle batches plan nothing.
  ForwardBatch idle;
  idle.mode = ForwardMode::kIdle;
  ASSERT_TRUE(ondemand->plan(engine_batch(idle), &d).ok());
  EXPECT_EQ(d.target, PlanTarget::kNone);
}

TEST(EnginePlanner, RefusesMalformedLengthsNamingTheField) {
  StatusOr<EnginePlanner> p = EnginePlanner::create("chunked_mla", testing::small_options());
  ASSERT_TRUE(p.ok());
  const std::vector<int32_t> rows{1, 2}, seq{10, 4}, ext{3, 4}, bad_prefix{6, 0}, one{3};
  EngineBatch b;
  b.mode = ForwardMode::kExtend;
  b.req_rows = rows;
  b.seq_lens = seq;
  b.extend_seq_lens = ext;
  b.extend_prefix_lens = bad_prefix;
  EngineDecision d;
  Status st = p->plan(b, &d);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("extend_prefix_lens[0] = 6"), std::string::npos) << st.message();
  b.extend_prefix_lens = {};
  b.extend_seq_lens = one;
  st = p->plan(b, &d);
  EXPECT_NE(st.message().find("extend_seq_lens has 1 entries"), std::string::npos) << st.message();
  b.mode = ForwardMode::kTargetVerify;
  st = p->plan(b, &d);
  EXPECT_NE(st.message().find("num_draft_tokens = 0"), std::string::npos) << st.message();
  EXPECT_EQ(EnginePlanner::create("flashinfer", testing::small_options()).status().code(),
            StatusCode::kInvalidArgument);
}

// The workspace an adapter backs a family's ops with (family_workspace) is the one the family's
// C++ backend acquires: policy, size (options, environment or default), counters, fallback.
TEST(FamilyWorkspace, IsTheWorkspaceTheFamilysBackendHolds) {
  auto pool = testing::make_pool({});
  ASSERT_NE(pool, nullptr);
  for (std::string_view family : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    for (const bool fallback : {false, true}) {
      WorkspaceRegistry::global().release_all_for_testing();
      BackendOptions o = testing::small_options();
      o.disable_chunked_prefix_cache = fallback;
      o.paged_workspace_bytes = std::size_t{3} << 20;
      o.chunked_workspace_bytes = std::size_t{2} << 20;
      const std::string where = fmt::format("{} fallback {}", family, fallback);
      StatusOr<FamilyWorkspace> w = family_workspace(family, o);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      auto backend = BackendRegistry::global().create(family, BackendContext{pool.get(), o});
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      const std::size_t paged = testing::ledger_bytes("paged_mla.workspace");
      const std::size_t chunked = testing::ledger_bytes("chunked_mla.workspace");
      if (family == "paged_mla") {
        EXPECT_EQ(w->policy, WorkspacePolicy::kSharedLazy) << where;
        EXPECT_EQ(w->bytes, paged) << where;
        EXPECT_EQ(w->bytes, o.paged_workspace_bytes) << where;
        EXPECT_EQ(w->reserved + w->fallback_bytes, 0u) << where;
      } else if (family == "chunked_mla") {
        EXPECT_EQ(w->policy, WorkspacePolicy::kSharedZeroed) << where;
        EXPECT_EQ(w->bytes, chunked) << where;
        EXPECT_EQ(w->reserved, align_workspace(static_cast<std::size_t>(o.max_batch) *
                                               o.model.num_heads * sizeof(int32_t)))
            << where;
        EXPECT_EQ(w->fallback_bytes, paged) << where;  // held iff a fallback is possible
        EXPECT_EQ(paged != 0, fallback) << where;
      } else {
        EXPECT_EQ(w->policy, WorkspacePolicy::kOnDemand) << where;
        EXPECT_EQ(w->bytes + w->reserved + w->fallback_bytes, 0u) << where;
        EXPECT_EQ(paged + chunked + testing::ledger_bytes("ondemand_mla.workspace"), 0u) << where;
      }
    }
  }
  WorkspaceRegistry::global().release_all_for_testing();
  BackendOptions tiny = testing::small_options();
  tiny.chunked_workspace_bytes = 256;  // the counters alone need more
  EXPECT_EQ(family_workspace("chunked_mla", tiny).status().code(), StatusCode::kOutOfWorkspace);
  EXPECT_EQ(family_workspace("flashinfer", tiny).status().code(), StatusCode::kInvalidArgument);
}

// The engine's prefix chunks are accepted when they cover every request's prefix exactly (the
// chunk planner's own chunks are), refused naming the request otherwise; each chunk's capacity
// holds its keys.
TEST(EnginePlanner, PrefixChunksMustCoverEveryPrefixExactly) {
  StatusOr<EnginePlanner> p = EnginePlanner::create("chunked_mla", testing::small_options());
  ASSERT_TRUE(p.ok());
  const std::vector<int32_t> rows{1, 2, 3}, prefix{40, 0, 17}, ext{3, 5, 1}, seq{43, 5, 18};
  EngineBatch b;
  b.mode = ForwardMode::kExtend;
  b.req_rows = rows;
  b.seq_lens = seq;
  b.extend_seq_lens = ext;
  b.extend_prefix_lens = prefix;
  EngineDecision d;
  ASSERT_TRUE(p->plan(b, &d).ok());
  EXPECT_EQ(d.method, EngineMethod::kMhaChunked);
  std::vector<int32_t> lens;
  StatusOr<int> chunks = prefix_chunk_lens(prefix, 48, &lens);
  ASSERT_TRUE(chunks.ok());
  std::vector<int32_t> cu;
  for (int c = 0; c < *chunks; ++c) {
    cu.push_back(0);
    for (int r = 0; r < 3; ++r) cu.push_back(cu.back() + lens[static_cast<std::size_t>(c * 3 + r)]);
  }
  std::vector<AttnCapacity> caps;
  ASSERT_TRUE(p->check_prefix_chunks(cu, *chunks, &caps).ok());
  ASSERT_EQ(caps.size(), static_cast<std::size_t>(*chunks));
  for (int c = 0; c < *chunks; ++c) {
    EXPECT_EQ(caps[static_cast<std::size_t>(c)].max_kv_tokens,
              std::max<int64_t>(cu[static_cast<std::size_t>(c * 4 + 3)], 1));
    EXPECT_EQ(caps[static_cast<std::size_t>(c)].max_q_tokens, 9);
  }
  cu[3] -= 1;  // the first chunk misses a key of request 2
  const Status st = p->check_prefix_chunks(cu, *chunks, &caps);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("of request 2, whose cached prefix has 17"), std::string::npos)
      << st.message();
}

TEST(PrefixChunkLens, IsTheChunkPlannersSpecVector) {
  std::vector<int32_t> lens;
  const std::vector<int32_t> prefix{16, 32, 48, 64};
  StatusOr<int> c = prefix_chunk_lens(prefix, 64, &lens);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 4);
  EXPECT_EQ(lens, (std::vector<int32_t>{16, 16, 16, 16, 0, 16, 16, 16, 0, 0, 16, 16, 0, 0, 0, 16}));
}

}  // namespace
}  // namespace mla
