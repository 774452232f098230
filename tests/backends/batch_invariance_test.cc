// Batch invariance (BackendOptions::batch_invariant, docs/reliability.md): on the cpu op set a
// request's output (o and lse) is bitwise the same whatever requests share its batch, in which
// position, and whatever the batch size. Random requests per mode (extend over cached prefixes,
// decode, target-verify, draft-extend) are each run alone, then inside random batches of 2..16 of
// the others; the request's rows must match the alone run bit for bit, for every backend kind.
// A control shows the option is needed: without it, paged_mla switches a whole batch to the MHA
// form once the batch's prefixes add up past mha_prefix_threshold, which changes the request's
// bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/backend_fixture.h"

namespace mla {
namespace {

constexpr int kHeads = 16;
constexpr int kRequests = 20;  // per mode

// One request: a single-request batch (its pool row, prefix and slots) and its layer inputs.
struct Request {
  ForwardBatch batch;
  testing::LayerInputs in;
};

// The requests of `ids`, in that order, as one batch with the inputs concatenated.
struct Composite {
  ForwardBatch batch;
  testing::LayerInputs in;
  std::vector<int64_t> first_token;  // of each member
};

Composite compose(const std::vector<Request>& reqs, const std::vector<int>& ids) {
  Composite c;
  c.batch.mode = reqs[ids[0]].batch.mode;
  c.batch.num_draft_tokens = reqs[ids[0]].batch.num_draft_tokens;
  c.in.heads = kHeads;
  auto append = [](auto& dst, const auto& src) { dst.insert(dst.end(), src.begin(), src.end()); };
  for (int id : ids) {
    const Request& r = reqs[id];
    c.first_token.push_back(c.in.tokens);
    append(c.batch.req_pool_indices, r.batch.req_pool_indices);
    append(c.batch.seq_lens, r.batch.seq_lens);
    append(c.batch.extend_prefix_lens, r.batch.extend_prefix_lens);
    append(c.batch.extend_seq_lens, r.batch.extend_seq_lens);
    append(c.batch.out_cache_loc, r.batch.out_cache_loc);
    append(c.in.q_nope, r.in.q_nope);
    append(c.in.q_pe, r.in.q_pe);
    append(c.in.c_kv, r.in.c_kv);
    append(c.in.k_pe, r.in.k_pe);
    c.in.tokens += r.in.tokens;
  }
  c.batch.batch_size = static_cast<int>(ids.size());
  finalize_batch(c.batch);
  return c;
}

std::vector<Request> make_requests(LatentKvPool& pool, ForwardMode mode, testing::Rng& rng) {
  std::vector<Request> reqs;
  for (int i = 0; i < kRequests; ++i) {
    testing::BatchSpec spec;
    spec.mode = mode;
    const int32_t prefix = static_cast<int32_t>(rng.uniform_int(
        mode == ForwardMode::kExtend || mode == ForwardMode::kDraftExtend ? 0 : 1, 150));
    spec.prefix_lens = {prefix};
    if (mode == ForwardMode::kExtend || mode == ForwardMode::kDraftExtend) {
      spec.new_lens = {
          mode == ForwardMode::kDraftExtend ? 3 : static_cast<int32_t>(rng.uniform_int(1, 12))};
    }
    if (mode == ForwardMode::kTargetVerify) spec.num_draft_tokens = 3;
    Request r;
    r.batch = testing::make_batch(pool, spec, rng);
    r.in = testing::random_layer_inputs(r.batch.num_tokens(), kHeads, rng);
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct Rows {
  std::vector<float> o, lse;
  bool operator==(const Rows&) const = default;
};

// Runs the batch and returns member m's rows of o [q_len, H, 128] and lse [q_len, H].
Rows run_member(AttentionBackend& backend, MlaLayer& layer, Composite& c, int m, Status* status) {
  testing::LayerRun run = testing::run_layer(backend, layer, c.batch, c.in);
  *status = run.status;
  Rows rows;
  if (!run.status.ok()) return rows;
  const int64_t t0 = c.first_token[static_cast<std::size_t>(m)];
  const int64_t t1 = m + 1 < static_cast<int>(c.first_token.size())
                         ? c.first_token[static_cast<std::size_t>(m) + 1]
                         : c.in.tokens;
  rows.o.assign(run.o.begin() + t0 * kHeads * 128, run.o.begin() + t1 * kHeads * 128);
  rows.lse.assign(run.lse.begin() + t0 * kHeads, run.lse.begin() + t1 * kHeads);
  return rows;
}

BackendContext context_for(LatentKvPool* pool, bool invariant) {
  BackendContext ctx;
  ctx.pool = pool;
  ctx.options = testing::small_options(kHeads);
  ctx.options.max_batch = 16;
  ctx.options.chunked_prefix_capacity = 96;  // several chunks over a batch's prefixes
  ctx.options.mha_prefix_threshold = 200;    // paged_mla: MHA once a batch's prefixes add up
  ctx.options.batch_invariant = invariant;
  return ctx;
}

struct Mismatch {
  int compared = 0, differing = 0;
};

// Every request alone, then kTrials random batches each holding a random target: the target's
// rows compared bitwise with its alone run.
Mismatch compare_in_batches(const std::string& kind, bool invariant, ForwardMode mode,
                            uint64_t seed) {
  Mismatch res;
  auto pool = testing::make_pool({16, kRequests, 512});
  auto layer = MlaLayer::create_random(testing::small_options(kHeads).model, 0, Device::cpu(), 7);
  EXPECT_TRUE(pool && layer.ok());
  if (!pool || !layer.ok()) return res;
  testing::Rng rng(seed);
  std::vector<Request> reqs = make_requests(*pool, mode, rng);
  auto backend = BackendRegistry::global().create(kind, context_for(pool.get(), invariant));
  EXPECT_TRUE(backend.ok()) << backend.status().to_string();
  if (!backend.ok()) return res;
  std::vector<Rows> alone(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    Composite c = compose(reqs, {i});
    Status s;
    alone[i] = run_member(**backend, **layer, c, 0, &s);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  constexpr int kTrials = 12;
  std::vector<int> all(kRequests);
  std::iota(all.begin(), all.end(), 0);
  for (int trial = 0; trial < kTrials; ++trial) {
    const int size = static_cast<int>(rng.uniform_int(2, 16));
    std::vector<int> ids = all;
    for (int i = kRequests - 1; i > 0; --i) {
      std::swap(ids[i], ids[static_cast<int>(rng.uniform_int(0, i))]);
    }
    ids.resize(static_cast<std::size_t>(size));
    const int m = static_cast<int>(rng.uniform_int(0, size - 1));
    Composite c = compose(reqs, ids);
    Status s;
    const Rows rows = run_member(**backend, **layer, c, m, &s);
    EXPECT_TRUE(s.ok()) << s.to_string();
    ++res.compared;
    if (!(rows == alone[ids[m]])) ++res.differing;
  }
  return res;
}

class BatchInvariance : public ::testing::TestWithParam<std::tuple<std::string, ForwardMode>> {};

TEST_P(BatchInvariance, RequestOutputIsBitwiseIndependentOfItsBatch) {
  const auto& [kind, mode] = GetParam();
  WorkspaceRegistry::global().release_all_for_testing();
  const Mismatch m = compare_in_batches(kind, true, mode, 100 + static_cast<int>(mode));
  EXPECT_EQ(m.compared, 12);
  EXPECT_EQ(m.differing, 0) << m.differing << " of " << m.compared
                            << " requests changed bits inside a batch";
  WorkspaceRegistry::global().release_all_for_testing();
}

INSTANTIATE_TEST_SUITE_P(
    KindsAndModes, BatchInvariance,
    ::testing::Combine(::testing::Values("paged_mla", "chunked_mla", "ondemand_mla"),
                       ::testing::Values(ForwardMode::kExtend, ForwardMode::kDecode,
                                         ForwardMode::kTargetVerify, ForwardMode::kDraftExtend)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" +
             std::string(forward_mode_name(std::get<1>(info.param)));
    });

// The control: without the option, paged_mla extends over cached prefixes change bits with the
// batch (the MHA / absorbed switch on the batch's prefix sum), so the test above can fail.
TEST(BatchInvarianceControl, PagedMlaExtendsDependOnTheBatchWithoutTheOption) {
  WorkspaceRegistry::global().release_all_for_testing();
  const Mismatch m = compare_in_batches("paged_mla", false, ForwardMode::kExtend, 100);
  EXPECT_GT(m.differing, 0) << "no request changed bits: the control does not show the effect";
  WorkspaceRegistry::global().release_all_for_testing();
}

}  // namespace
}  // namespace mla
