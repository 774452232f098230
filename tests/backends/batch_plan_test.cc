// The plan as a value (issue 33, part 2): init_forward_metadata builds one BatchPlan per batch
// that the layer calls read. Its decisions (method, fallback) agree with the rule for every
// family, option and mode and are made once per batch; chunked_mla's fallback is a field of the
// plan whose ops run in paged_mla's workspace, not a second backend; each op's chooser is asked
// once per plan; building the graph state leaves the batch already planned intact.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "backends/backend_base.h"
#include "backends/backend_fixture.h"
#include "backends/chunked_mla/chunked_mla.h"
#include "backends/ondemand_mla/ondemand_mla.h"
#include "core/forwarding_op.h"
#include "planning/forward_method.h"

namespace mla {
namespace {

using backends::BackendBase;
using backends::BatchPlan;
using backends::ChunkedMlaBackend;

class BatchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkspaceRegistry::global().release_all_for_testing();
    pool_ = testing::make_pool({});
    ASSERT_NE(pool_, nullptr);
    options_ = testing::small_options();
    options_.chunked_prefix_capacity = 48;
    options_.mha_prefix_threshold = 32;
  }
  void TearDown() override { WorkspaceRegistry::global().release_all_for_testing(); }

  std::unique_ptr<AttentionBackend> make(std::string_view name, const BackendOptions& o) {
    BackendContext ctx{pool_.get(), o};
    auto b = BackendRegistry::global().create(name, ctx);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    return b.ok() ? std::move(b).value() : nullptr;
  }
  static const BatchPlan& plan_of(const AttentionBackend& b) {
    return dynamic_cast<const BackendBase&>(b).plan();
  }

  std::unique_ptr<LatentKvPool> pool_;
  BackendOptions options_;
  testing::Rng rng_{testing::base_seed()};
};

// For every family, every combination of the options the rule reads and every mode, the plan's
// method and fallback are decide_batch_method's answer for the batch, the backend's getters and
// its description report the plan's, the fallback counter counts exactly the plans that fell
// back, and a fallback plan's ops run in the fallback's workspace (paged_mla's), every other
// plan's in the family's own.
TEST_F(BatchPlanTest, DecisionsAgreeWithTheRuleForEveryFamilyOptionAndMode) {
  int checked = 0, fell_back = 0;
  for (std::string_view name : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    for (int bits = 0; bits < 8; ++bits) {
      WorkspaceRegistry::global().release_all_for_testing();
      BackendOptions o = options_;
      o.disable_chunked_prefix_cache = (bits & 1) != 0;
      o.piecewise_cuda_graph = (bits & 2) != 0;
      o.batch_invariant = (bits & 4) != 0;
      auto b = make(name, o);
      ASSERT_NE(b, nullptr);
      const BatchPlan& plan = plan_of(*b);
      EXPECT_EQ(plan.epoch, 0u);
      const auto* chunked = dynamic_cast<const ChunkedMlaBackend*>(b.get());
      const planning::MethodOptions mo = backends::method_options(b->options());
      uint64_t fallbacks = 0;
      for (const testing::BatchSpec& spec : testing::every_mode_specs()) {
        const std::string what =
            fmt::format("{} bits {} {}", name, bits, forward_mode_name(spec.mode));
        ForwardBatch batch = testing::make_batch(*pool_, spec, rng_);
        const uint64_t epoch = plan.epoch;
        ASSERT_TRUE(plan_batch(*b, batch).ok()) << what;
        const planning::BatchMethod d =
            planning::decide_batch_method(backends::family_extend_rule(name).value(), mo, batch);
        const bool expect_fallback = name != "paged_mla" && d.fell_back;
        EXPECT_EQ(plan.epoch, epoch + 1) << what;
        EXPECT_EQ(plan.mode, spec.mode) << what;
        EXPECT_EQ(plan.method, d.method) << what;
        EXPECT_EQ(plan.fell_back, expect_fallback) << what;
        EXPECT_EQ(b->forward_method(), plan.method) << what;
        EXPECT_EQ(b->fell_back(), plan.fell_back) << what;
        const PlanDescription desc = b->describe_plan();
        EXPECT_EQ(desc.method, plan.method) << what;
        EXPECT_EQ(desc.fell_back, plan.fell_back) << what;
        fallbacks += plan.fell_back ? 1 : 0;
        EXPECT_EQ(b->planning_stats().fallbacks, fallbacks) << what;
        // The workspace of the plan's ops.
        if (chunked != nullptr && chunked->parent() != nullptr) {
          EXPECT_EQ(plan.op.base == chunked->parent()->workspace().data(), plan.fell_back) << what;
        }
        if (name == "ondemand_mla") {
          const auto& own = dynamic_cast<const backends::OndemandMlaBackend&>(*b).workspace();
          EXPECT_EQ(plan.op.base, own.data()) << what;
        }
        testing::free_batch(*pool_, batch);
        ++checked;
      }
      fell_back += static_cast<int>(fallbacks);
    }
  }
  EXPECT_EQ(checked, 3 * 8 * 6);
  EXPECT_GT(fell_back, 0);
}

// chunked_mla's fallback is a field of its plan, not a second backend: no buffer of a second
// backend ("chunked_mla.fallback.*") exists, the fallback batch is planned into chunked_mla's own
// plan with its ops in the shared paged_mla workspace, and its output is bitwise paged_mla's
// absorbed prefill of the same batch (the same ops and plan). The next batch's plan is its own.
TEST_F(BatchPlanTest, ChunkedFallbackIsAFieldOfThePlanAndRunsPagedMlasAbsorbedPrefill) {
  BackendOptions o = options_;
  o.disable_chunked_prefix_cache = true;
  auto layer = MlaLayer::create_random(o.model, 0, Device::cpu(), 5);
  ASSERT_TRUE(layer.ok());
  auto chunked = make("chunked_mla", o);
  auto paged = make("paged_mla", o);  // disabled chunked prefix: absorbed for any prefix
  ASSERT_TRUE(chunked != nullptr && paged != nullptr);
  const auto& c = dynamic_cast<const ChunkedMlaBackend&>(*chunked);
  ASSERT_NE(c.parent(), nullptr);
  EXPECT_EQ(testing::ledger_count_prefix("chunked_mla.fallback"), 0);

  ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kExtend, {40, 3}, {5, 2}}, rng_);
  testing::LayerInputs in = testing::random_layer_inputs(batch.num_tokens(), 16, rng_);
  const testing::LayerRun via_paged = testing::run_layer(*paged, **layer, batch, in);
  ASSERT_TRUE(via_paged.status.ok()) << via_paged.status.to_string();
  ASSERT_EQ(paged->forward_method(), ForwardMethod::kAbsorbed);
  const testing::LayerRun via_fallback = testing::run_layer(*chunked, **layer, batch, in);
  ASSERT_TRUE(via_fallback.status.ok()) << via_fallback.status.to_string();
  const BatchPlan& plan = c.plan();
  EXPECT_TRUE(plan.fell_back);
  EXPECT_EQ(plan.method, ForwardMethod::kAbsorbed);
  EXPECT_EQ(plan.op.base, c.parent()->workspace().data());
  EXPECT_EQ(via_fallback.o, via_paged.o);
  EXPECT_EQ(via_fallback.lse, via_paged.lse);
  EXPECT_EQ(c.parent()->planning_stats().absorbed_plans, 1u);
  EXPECT_EQ(c.parent()->planning_stats().init_forward_metadata_calls, 1u);
  EXPECT_EQ(testing::ledger_count_prefix("chunked_mla.fallback"), 0);
  testing::free_batch(*pool_, batch);

  // A decode next: chunked_mla's own path and workspace, the fallback's counters unchanged.
  ForwardBatch decode = testing::make_batch(*pool_, {ForwardMode::kDecode, {9, 20}, {}}, rng_);
  testing::LayerInputs din = testing::random_layer_inputs(decode.num_tokens(), 16, rng_);
  const testing::LayerRun run = testing::run_layer(*chunked, **layer, decode, din);
  ASSERT_TRUE(run.status.ok()) << run.status.to_string();
  EXPECT_FALSE(plan.fell_back);
  EXPECT_NE(plan.op.base, c.parent()->workspace().data());
  EXPECT_EQ(c.parent()->planning_stats().absorbed_plans, 1u);
  testing::free_batch(*pool_, decode);
}

// init_mha_chunk_metadata reads the fallback from the plan: given a batch other than the one
// planned, it refuses (kInvalidArgument naming both) instead of deciding again for that batch.
TEST_F(BatchPlanTest, ChunkMetadataOfAnotherBatchThanThePlannedOneIsRefused) {
  BackendOptions o = options_;
  o.disable_chunked_prefix_cache = true;
  auto b = make("chunked_mla", o);
  ASSERT_NE(b, nullptr);
  ForwardBatch ext = testing::make_batch(*pool_, {ForwardMode::kExtend, {24, 8}, {3, 2}}, rng_);
  ForwardBatch decode = testing::make_batch(*pool_, {ForwardMode::kDecode, {9}, {}}, rng_);
  ASSERT_TRUE(b->init_forward_metadata(ext).ok());
  ASSERT_TRUE(b->fell_back());
  const Status s = b->init_mha_chunk_metadata(decode);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("decode batch of 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("extend batch of 2"), std::string::npos) << s.message();
  EXPECT_TRUE(b->fell_back());
  EXPECT_TRUE(b->init_mha_chunk_metadata(ext).ok());
  testing::free_batch(*pool_, ext);
  testing::free_batch(*pool_, decode);
}

// ---------------------------------------------------------------------------------------------
// A cpu op set whose absorbed and MHA ops count their supports() and plan() calls, and whose
// up-projection counts its runs and rows.
struct Counts {
  std::atomic<int> absorbed_supports{0}, absorbed_plans{0}, mha_supports{0}, mha_plans{0};
  std::atomic<int64_t> up_project_runs{0}, up_project_rows{0};
};
Counts& counts() {
  static Counts c;
  return c;
}

class CountingAbsorbed final : public Forwarding<AbsorbedAttentionOp> {
 public:
  explicit CountingAbsorbed(std::shared_ptr<const AbsorbedAttentionOp> op)
      : Forwarding(std::move(op)) {}
  Status supports(int h, int p, DType d) const override {
    ++counts().absorbed_supports;
    return op_->supports(h, p, d);
  }
  StatusOr<std::size_t> plan(const AbsorbedProblem& p, const AttnCapacity& c,
                             std::span<std::byte> out) const override {
    ++counts().absorbed_plans;
    return op_->plan(p, c, out);
  }
  Status run(const AbsorbedArgs& a, const ExecContext& ctx) const override {
    return op_->run(a, ctx);
  }
};

class CountingMha final : public Forwarding<MhaAttentionOp> {
 public:
  explicit CountingMha(std::shared_ptr<const MhaAttentionOp> op) : Forwarding(std::move(op)) {}
  Status supports(int h) const override {
    ++counts().mha_supports;
    return op_->supports(h);
  }
  StatusOr<std::size_t> plan(const MhaProblem& p, const AttnCapacity& c,
                             std::span<std::byte> out) const override {
    ++counts().mha_plans;
    return op_->plan(p, c, out);
  }
  Status run(const MhaArgs& a, const ExecContext& ctx) const override { return op_->run(a, ctx); }
};

class CountingUpProject final : public Forwarding<UpProjectOp> {
 public:
  explicit CountingUpProject(std::shared_ptr<const UpProjectOp> op) : Forwarding(std::move(op)) {}
  Status run(const UpProjectArgs& a, const ExecContext& ctx) const override {
    ++counts().up_project_runs;
    counts().up_project_rows += a.slots.numel();
    return op_->run(a, ctx);
  }
};

const char* counting_op_set() {
  static const bool registered = [] {
    OpSet set = *OpRegistry::global().default_for(DeviceType::kCpu);
    set.name = "cpu.counting";
    set.absorbed = std::make_shared<CountingAbsorbed>(set.absorbed);
    set.mha = std::make_shared<CountingMha>(set.mha);
    set.up_project = std::make_shared<CountingUpProject>(set.up_project);
    OpRegistry::global().add(std::move(set));
    return true;
  }();
  (void)registered;
  return "cpu.counting";
}

// Each op's chooser is asked once per plan: supports() at construction only (check_backend_config
// for the absorbed op, resolve_ops for the MHA op), then one plan() per pass planned.
TEST_F(BatchPlanTest, EachOpsChooserIsAskedOncePerPlan) {
  BackendOptions o = options_;
  o.op_set = counting_op_set();
  for (std::string_view name : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    WorkspaceRegistry::global().release_all_for_testing();
    const int absorbed_supports0 = counts().absorbed_supports;
    const int mha_supports0 = counts().mha_supports;
    auto b = make(name, o);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(counts().absorbed_supports - absorbed_supports0, 1) << name;
    EXPECT_EQ(counts().mha_supports - mha_supports0, 1) << name;
    const int absorbed_plans0 = counts().absorbed_plans;
    const int mha_plans0 = counts().mha_plans;
    for (const testing::BatchSpec& spec : testing::every_mode_specs()) {
      ForwardBatch batch = testing::make_batch(*pool_, spec, rng_);
      ASSERT_TRUE(plan_batch(*b, batch).ok()) << name;
      testing::free_batch(*pool_, batch);
    }
    const PlanningStats& st = b->planning_stats();
    EXPECT_EQ(counts().absorbed_supports - absorbed_supports0, 1) << name;
    EXPECT_EQ(counts().mha_supports - mha_supports0, 1) << name;
    EXPECT_EQ(static_cast<uint64_t>(counts().absorbed_plans - absorbed_plans0), st.absorbed_plans)
        << name;
    // One plan for the pass over the new tokens, one per prefix chunk.
    EXPECT_EQ(static_cast<uint64_t>(counts().mha_plans - mha_plans0),
              st.mha_plans + st.chunks_planned)
        << name;
    EXPECT_GE(st.absorbed_plans, 3u) << name;  // decode, verify, draft-extend at least
    EXPECT_GE(st.mha_plans, 1u) << name;
  }
}

// init_cuda_graph_state sizes the graph's buffers and may grow an on-demand workspace; the plan
// of the batch planned before it keeps its op scratch, carved again from the workspace as it is
// now (never left pointing into a buffer the growth freed), and its layer call still matches.
TEST_F(BatchPlanTest, GraphStateLeavesThePlannedBatchIntact) {
  pool_ = testing::make_pool({.page_size = 16, .max_requests = 256, .max_context_len = 64});
  ASSERT_NE(pool_, nullptr);
  BackendOptions o = options_;
  auto layer = MlaLayer::create_random(o.model, 0, Device::cpu(), 3);
  ASSERT_TRUE(layer.ok());
  auto b = make("ondemand_mla", o);
  ASSERT_NE(b, nullptr);
  const auto& ws = dynamic_cast<const backends::OndemandMlaBackend&>(*b).workspace();
  ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kDecode, {10, 20}, {}}, rng_);
  testing::LayerInputs in = testing::random_layer_inputs(batch.num_tokens(), 16, rng_);
  const testing::LayerRun before = testing::run_layer(*b, **layer, batch, in);
  ASSERT_TRUE(before.status.ok()) << before.status.to_string();
  const std::size_t op_bytes = plan_of(*b).op.op_bytes;
  const uint64_t grows = ws.grow_count();
  ASSERT_TRUE(b->init_cuda_graph_state(250, 250).ok());
  ASSERT_GT(ws.grow_count(), grows) << "the test needs graph state that outgrows the batch";
  const BatchPlan& plan = plan_of(*b);
  EXPECT_EQ(plan.op.base, ws.data());
  EXPECT_EQ(plan.op.op_bytes, op_bytes);
  EXPECT_EQ(plan.mode, ForwardMode::kDecode);
  const testing::LayerRun after = testing::run_layer(*b, **layer, batch, in, /*plan=*/false);
  ASSERT_TRUE(after.status.ok()) << after.status.to_string();
  EXPECT_EQ(after.o, before.o);
  EXPECT_EQ(after.lse, before.lse);
  testing::free_batch(*pool_, batch);
}

// The up-projection of a layer call has one owner, the backend: through MlaLayer every latent row
// an MHA pass reads (the new tokens' and the prefix's) is up-projected exactly once per call,
// by the backend (the layer and the backend share the counting op set, so either one's runs
// count), into the backend's buffers; the layer's scratch holds q only. Before, the layer
// up-projected the new tokens itself, also on the one-shot path where the backend gathers and
// up-projects them again.
TEST_F(BatchPlanTest, EveryLatentRowIsUpProjectedOncePerMhaLayerCallByTheBackend) {
  struct Variant {
    const char* backend;
    testing::BatchSpec spec;
    int64_t capacity;
    ForwardMethod expect;
    bool gather;  // one-shot with a prefix: prefix and new tokens gathered together
  };
  const Variant variants[] = {
      {"paged_mla",
       {ForwardMode::kExtend, {0, 0}, {9, 5}},
       4096,
       ForwardMethod::kMhaOneShot,
       false},
      {"paged_mla",
       {ForwardMode::kExtend, {40, 33}, {6, 4}},
       4096,
       ForwardMethod::kMhaOneShot,
       true},
      {"paged_mla",
       {ForwardMode::kExtend, {40, 33}, {6, 4}},
       48,
       ForwardMethod::kMhaChunked,
       false},
      {"chunked_mla",
       {ForwardMode::kExtend, {40, 0}, {6, 4}},
       48,
       ForwardMethod::kMhaChunked,
       false},
      {"ondemand_mla",
       {ForwardMode::kMixed, {30, 14}, {5, 1}},
       48,
       ForwardMethod::kMhaChunked,
       false},
  };
  for (const Variant& v : variants) {
    WorkspaceRegistry::global().release_all_for_testing();
    BackendOptions o = options_;
    o.op_set = counting_op_set();
    o.chunked_prefix_capacity = v.capacity;
    o.mha_prefix_threshold = 1;
    auto layer = MlaLayer::create_random(o.model, 0, Device::cpu(), 9, 0.05f, o.op_set);
    ASSERT_TRUE(layer.ok()) << layer.status().to_string();
    auto b = make(v.backend, o);
    ASSERT_NE(b, nullptr);
    ForwardBatch batch = testing::make_batch(*pool_, v.spec, rng_);
    testing::LayerInputs in = testing::random_layer_inputs(batch.num_tokens(), 16, rng_);
    ASSERT_TRUE(plan_batch(*b, batch).ok());
    const BatchPlan& plan = plan_of(*b);
    ASSERT_EQ(plan.method, v.expect) << v.backend;
    const int64_t runs0 = counts().up_project_runs, rows0 = counts().up_project_rows;
    const testing::LayerRun run = testing::run_layer(*b, **layer, batch, in, /*plan=*/false);
    ASSERT_TRUE(run.status.ok()) << run.status.to_string();
    const std::string what = fmt::format("{} {}", v.backend, forward_method_name(v.expect));
    EXPECT_EQ(counts().up_project_rows - rows0, plan.kv_tokens) << what;
    const int64_t passes = plan.method == ForwardMethod::kMhaChunked && plan.has_prefix
                               ? 1 + plan.chunks.num_chunks
                               : 1;
    EXPECT_EQ(counts().up_project_runs - runs0, passes) << what;
    const std::size_t T = static_cast<std::size_t>(batch.num_tokens()), H = 16;
    EXPECT_LT((*layer)->scratch().capacity(), T * H * (192 + 192) * 2) << what << ": k, v in it";
    EXPECT_EQ(testing::ledger_bytes(std::string(v.backend) + ".mha_new_kv") > 0, !v.gather) << what;
    testing::free_batch(*pool_, batch);
  }
}

// A caller that brings the new tokens' k and v (a benchmark timing attention alone) gets what
// the backend's own up-projection of the written rows gives: bitwise the layer's output.
TEST_F(BatchPlanTest, CallerBroughtNewTokenKvMatchesTheBackendsUpProjection) {
  for (std::string_view name : {"paged_mla", "chunked_mla"}) {
    WorkspaceRegistry::global().release_all_for_testing();
    auto layer = MlaLayer::create_random(options_.model, 0, Device::cpu(), 4);
    ASSERT_TRUE(layer.ok());
    auto b = make(name, options_);
    ASSERT_NE(b, nullptr);
    ForwardBatch batch = testing::make_batch(*pool_, {ForwardMode::kExtend, {40, 0}, {6, 4}}, rng_);
    const int64_t T = batch.num_tokens(), H = 16;
    testing::LayerInputs in = testing::random_layer_inputs(T, static_cast<int>(H), rng_);
    const testing::LayerRun via_layer = testing::run_layer(*b, **layer, batch, in);
    ASSERT_TRUE(via_layer.status.ok()) << via_layer.status.to_string();
    ASSERT_NE(b->forward_method(), ForwardMethod::kAbsorbed);

    // k, v of the rows the layer call wrote, up-projected by the caller; q = [q_nope | q_pe].
    const OpSet& ops = *OpRegistry::global().default_for(DeviceType::kCpu);
    std::vector<bf16> q(static_cast<std::size_t>(T * H * 192)), k(q.size()),
        v(static_cast<std::size_t>(T * H * 128));
    for (int64_t r = 0; r < T * H; ++r) {
      std::copy_n(in.q_nope.begin() + r * 128, 128, q.begin() + r * 192);
      std::copy_n(in.q_pe.begin() + r * 64, 64, q.begin() + r * 192 + 128);
    }
    std::vector<std::byte> ws(ops.up_project->workspace_bytes(T, static_cast<int>(H)));
    UpProjectArgs up;
    up.kv_cache = pool_->layer_cache(0);
    up.slots = b->out_cache_loc();
    up.kv_b_proj = (*layer)->kv_b_proj();
    up.k = TensorView(k.data(), DType::kBF16, Device::cpu(), {T, H, 192});
    up.v = TensorView(v.data(), DType::kBF16, Device::cpu(), {T, H, 128});
    up.workspace = ws.data();
    up.workspace_bytes = ws.size();
    ASSERT_TRUE(ops.up_project->run(up, ExecContext{}).ok());
    AttentionInputs ai;
    ai.layer = 0;
    ai.save_kv_cache = false;  // written by the layer call
    ai.q = TensorView(q.data(), DType::kBF16, Device::cpu(), {T, H, 192});
    ai.k = up.k;
    ai.v = up.v;
    ai.kv_b_proj = (*layer)->kv_b_proj();
    std::vector<bf16> o(static_cast<std::size_t>(T * H * 128));
    std::vector<float> lse(static_cast<std::size_t>(T * H));
    AttentionOutputs ao;
    ao.o = TensorView(o.data(), DType::kBF16, Device::cpu(), {T, H, 128});
    ao.lse = TensorView(lse.data(), DType::kF32, Device::cpu(), {T, H});
    ASSERT_TRUE(b->forward_extend(ai, ao, ExecContext{}).ok()) << name;
    std::vector<float> of(o.size());
    for (std::size_t i = 0; i < o.size(); ++i) of[i] = o[i].to_float();
    EXPECT_EQ(of, via_layer.o) << name;
    EXPECT_EQ(lse, via_layer.lse) << name;
    testing::free_batch(*pool_, batch);
  }
}

}  // namespace
}  // namespace mla
