// The CUDA absorbed op beyond the shared conformance cases: properties of the host plan (no GPU
// needed), CUDA graph capture + replay after re-planning into the same plan buffer, and split
// schedules against the double-precision reference. Built only with MLA_CUDA=ON (the plan
// lives in mla_cuda); the CPU-only CI build compiles this file to nothing.
#ifdef MLA_WITH_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/case_gen.h"
#include "common/compare.h"
#include "common/conformance.h"
#include "common/reference.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan.h"
#include "kernels/cuda/absorbed/traits.h"
#include "mla/memory.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

using cuda::absorbed::CombineUnit;
using cuda::absorbed::PlanHeader;
using cuda::absorbed::WorkUnit;

struct Batch {
  std::vector<int32_t> rows, q_lens, kv_lens;
};

Batch random_batch(Rng& rng, int bs, int max_q, int max_kv) {
  Batch b;
  for (int i = 0; i < bs; ++i) {
    const int q = static_cast<int>(rng.uniform_int(0, max_q));
    const int kv = q + static_cast<int>(rng.uniform_int(0, max_kv));
    b.rows.push_back(i + 1);
    b.q_lens.push_back(q);
    b.kv_lens.push_back(rng.uniform_int(0, 9) == 0 ? 0 : kv);
    if (b.kv_lens.back() == 0 && q > 0) b.q_lens.back() = 0;  // causal: kv_len >= q_len
  }
  return b;
}

// Every (row, key) the causal mask allows is covered by exactly one unit; splits are merged by
// exactly one combine; the partial count stays within its bound.
TEST(AbsorbedPlan, RandomBatchesCoverEveryRowAndKeyOnce) {
  Rng rng(mix_seed(base_seed(), 41));
  for (int iter = 0; iter < 200; ++iter) {
    const int heads = 16 << rng.uniform_int(0, 3);
    const int ctas = static_cast<int>(rng.uniform_int(1, 140));
    const Batch b = random_batch(rng, static_cast<int>(rng.uniform_int(1, 40)),
                                 static_cast<int>(rng.uniform_int(1, 9)),
                                 static_cast<int>(rng.uniform_int(0, 3000)));
    int64_t tokens = 0;
    for (int32_t q : b.q_lens) tokens += q;
    AttnCapacity cap{static_cast<int>(b.rows.size()) + 3, tokens + 5, 0, 9, heads};
    AbsorbedProblem p{heads, 16, true, b.rows, b.q_lens, b.kv_lens};
    const auto layout = cuda::absorbed::plan_layout(cap, ctas);
    std::vector<std::byte> plan(layout.bytes);
    auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
    ASSERT_TRUE(used.ok()) << used.status().to_string();
    PlanHeader h;
    std::memcpy(&h, plan.data(), sizeof(h));
    ASSERT_EQ(h.num_ctas, ctas);
    std::vector<int32_t> begin(ctas + 1);
    std::memcpy(begin.data(), plan.data() + h.cta_begin_offset, begin.size() * 4);
    ASSERT_EQ(begin[0], 0);
    ASSERT_EQ(begin[ctas], h.num_units);
    for (int g = 0; g < ctas; ++g) ASSERT_LE(begin[g], begin[g + 1]);
    std::vector<WorkUnit> units(h.num_units);
    std::memcpy(units.data(), plan.data() + h.units_offset, units.size() * sizeof(WorkUnit));
    std::vector<CombineUnit> combines(h.num_combines);
    std::memcpy(combines.data(), plan.data() + h.combines_offset,
                combines.size() * sizeof(CombineUnit));
    ASSERT_LE(h.num_partials, cuda::absorbed::max_partials(ctas));

    // coverage[(flat row)] = keys covered, counted per key range
    std::map<int64_t, std::vector<int>> covered;
    std::map<int64_t, int> partial_rows;
    for (const WorkUnit& u : units) {
      ASSERT_GT(u.num_rows, 0);
      ASSERT_LE(u.num_rows, h.rows_per_tile);
      ASSERT_EQ(u.kv_begin % cuda::absorbed::kBlockN, 0);
      ASSERT_LE(u.kv_begin, std::max(u.kv_end, 0));
      for (int r = 0; r < u.num_rows; ++r) {
        auto& keys = covered[int64_t{u.q_row_begin} + r];
        if (keys.empty()) keys.assign(u.kv_len + 1, 0);
        for (int k = u.kv_begin; k < u.kv_end; ++k) keys[k]++;
        keys[u.kv_len]++;  // units touching the row
      }
      if (u.partial >= 0) partial_rows[u.partial]++;
    }
    int64_t row = 0;
    for (size_t i = 0; i < b.rows.size(); ++i) {
      for (int64_t r = 0; r < int64_t{b.q_lens[i]} * heads; ++r, ++row) {
        auto it = covered.find(row);
        ASSERT_NE(it, covered.end()) << "row " << row << " not planned";
        const int query = static_cast<int>(r / heads);
        const int limit = b.kv_lens[i] == 0 ? 0 : b.kv_lens[i] - b.q_lens[i] + query + 1;
        for (int k = 0; k < limit; ++k) ASSERT_EQ(it->second[k], 1) << "row " << row << " key " << k;
      }
    }
    ASSERT_EQ(static_cast<int64_t>(covered.size()), row);
    int partials_in_combines = 0;
    for (const CombineUnit& c : combines) {
      ASSERT_GE(c.num_partials, 2);
      partials_in_combines += c.num_partials;
    }
    ASSERT_EQ(partials_in_combines, h.num_partials);
    ASSERT_EQ(static_cast<int>(partial_rows.size()), h.num_partials);
  }
}

// Variable lengths: no CTA gets much more than an equal share of the key tiles.
TEST(AbsorbedPlan, VariableLengthsStayBalanced) {
  Rng rng(mix_seed(base_seed(), 43));
  for (int heads : {16, 128}) {
    std::vector<int32_t> rows, q(128, 1), kv;
    for (int b = 0; b < 128; ++b) {
      rows.push_back(b + 1);
      kv.push_back(static_cast<int32_t>(rng.uniform_int(2048, 4096)));
    }
    const int ctas = 132;
    AttnCapacity cap{128, 128, 0, 1, heads};
    AbsorbedProblem p{heads, 64, true, rows, q, kv};
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
    ASSERT_TRUE(cuda::absorbed::build_plan(p, cap, ctas, plan).ok());
    PlanHeader h;
    std::memcpy(&h, plan.data(), sizeof(h));
    std::vector<int32_t> begin(ctas + 1);
    std::memcpy(begin.data(), plan.data() + h.cta_begin_offset, begin.size() * 4);
    std::vector<WorkUnit> units(h.num_units);
    std::memcpy(units.data(), plan.data() + h.units_offset, units.size() * sizeof(WorkUnit));
    int64_t total = 0, worst = 0;
    for (int g = 0; g < ctas; ++g) {
      int64_t cost = 0;
      for (int i = begin[g]; i < begin[g + 1]; ++i) {
        cost += (units[i].kv_end - units[i].kv_begin + 63) / 64 + 1;
      }
      total += cost;
      worst = std::max(worst, cost);
    }
    const int64_t groups = heads == 128 ? 2 : 1;
    const double ideal = static_cast<double>(total) / (ctas / groups * groups);
    EXPECT_LE(worst, ideal * 1.1 + 4) << "heads " << heads << ": worst CTA " << worst
                                      << " key tiles vs equal share " << ideal;
  }
}

TEST(AbsorbedPlan, RowsPerTileFollowHeadsTimesQueryLength) {
  EXPECT_EQ(cuda::absorbed::rows_per_tile(16, 1), 16);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(16, 2), 32);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(16, 4), 64);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(32, 1), 32);
  EXPECT_EQ(cuda::absorbed::rows_per_tile(128, 1), 64);
}

TEST(AbsorbedPlan, RejectsProblemsBeyondCapacity) {
  std::vector<int32_t> rows{1, 2}, q{1, 1}, kv{5, 0};
  AttnCapacity cap{1, 8, 0, 1, 16};
  AbsorbedProblem p{16, 1, true, rows, q, kv};
  std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, 8).bytes);
  auto r = cuda::absorbed::build_plan(p, cap, 8, plan);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_batch"), std::string::npos) << r.status().message();
}

// ---- device tests ----------------------------------------------------------------------------

struct DeviceProblem {
  int heads = 0, page_size = 1;
  DType cache_dtype = DType::kBF16;
  float k_scale = 1.0f;  // fp8 only
  PagedLayout layout;
  LatentCache cache;
  std::vector<bf16> q;
  Batch batch;
  int64_t tokens = 0;
};

DeviceProblem make_problem(uint64_t seed, int heads, int page_size, const Batch& b,
                           DType cache_dtype = DType::kBF16, float k_scale = 1.0f) {
  DeviceProblem d;
  Rng rng(seed);
  d.heads = heads;
  d.page_size = page_size;
  d.cache_dtype = cache_dtype;
  d.k_scale = k_scale;
  d.batch = b;
  d.layout = make_paged_layout(b.kv_lens, page_size, true, rng);
  d.batch.rows = d.layout.req_rows;
  d.cache = make_latent_cache(d.layout, cache_dtype, k_scale, rng);
  for (int32_t ql : b.q_lens) d.tokens += ql;
  d.q = random_bf16(d.tokens * heads * 576, rng);
  return d;
}

StatusOr<DeviceBuffer> upload(const void* src, std::size_t bytes, const char* name) {
  MLA_ASSIGN_OR_RETURN(DeviceBuffer buf,
                       DeviceBuffer::allocate(Device::cuda(), std::max<std::size_t>(bytes, 256),
                                              name, "test", false));
  MLA_RETURN_IF_ERROR(device_runtime(DeviceType::kCuda)->copy_to_device(buf.data(), src, bytes,
                                                                        nullptr));
  return buf;
}

RefAttention reference_of(const DeviceProblem& d) {
  AbsorbedRefProblem rp;
  rp.num_heads = d.heads;
  rp.page_size = d.page_size;
  rp.causal = true;
  rp.sm_scale = 0.135234;
  rp.cache_dtype = d.cache_dtype;
  rp.k_scale = d.k_scale;
  rp.row_stride = d.layout.max_context_len;
  rp.req_to_token = d.layout.req_to_token;
  rp.req_rows = d.batch.rows;
  rp.q_lens = d.batch.q_lens;
  rp.kv_lens = d.batch.kv_lens;
  return reference_absorbed(rp, to_float(d.q), d.cache.stored);
}

class AbsorbedDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device: device_count is 0";
    const OpSet* set = OpRegistry::global().find("cuda");
    ASSERT_NE(set, nullptr);
    op_ = set->absorbed.get();
    ASSERT_NE(op_, nullptr);
  }
  const AbsorbedAttentionOp* op_ = nullptr;
};

// Outputs of one run: o as bf16 bits, lse as f32.
struct Outputs {
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

// One long request per row tile count: the plan splits each tile over many blocks; the result
// must match the double-precision reference (fp8: dequantised stored value * k_scale).
void check_split_schedule(const AbsorbedAttentionOp* op, int heads, int page, DType cache_dtype,
                          float k_scale, uint64_t seed, std::vector<int32_t> q_lens = {1, 2, 1}) {
  const std::string what = fmt::format("heads {} page {} {} k_scale {} q_lens [{}]", heads, page,
                                       dtype_name(cache_dtype), k_scale, fmt::join(q_lens, ","));
  Batch b{{}, q_lens, {3000, 1777, 64}};
  DeviceProblem d = make_problem(seed, heads, page, b, cache_dtype, k_scale);
  AttnCapacity cap{4, 8, 0, 2, heads};
  std::vector<std::byte> plan(op->plan_bytes(cap));
  AbsorbedProblem p{heads, page, true, d.batch.rows, d.batch.q_lens, d.batch.kv_lens};
  auto used = op->plan(p, cap, plan);
  ASSERT_TRUE(used.ok()) << used.status().to_string();
  PlanHeader h;
  std::memcpy(&h, plan.data(), sizeof(h));
  EXPECT_GT(h.num_combines, 0) << "expected a split schedule";
  auto q = upload(d.q.data(), d.q.size() * 2, "q");
  auto kv = upload(d.cache.bytes.data(), d.cache.bytes.size(), "kv");
  auto r2t = upload(d.layout.req_to_token.data(), d.layout.req_to_token.size() * 4, "r2t");
  auto plan_d = upload(plan.data(), plan.size(), "plan");
  ASSERT_TRUE(q.ok() && kv.ok() && r2t.ok() && plan_d.ok());
  auto ws = DeviceBuffer::allocate(Device::cuda(), op->workspace_bytes(cap), "ws", "test", false);
  auto o = DeviceBuffer::allocate(Device::cuda(), d.tokens * heads * 512 * 2, "o", "test", false);
  auto lse = DeviceBuffer::allocate(Device::cuda(), d.tokens * heads * 4, "lse", "test", false);
  ASSERT_TRUE(ws.ok() && o.ok() && lse.ok());
  DeviceRuntime* rt = device_runtime(DeviceType::kCuda);
  ASSERT_TRUE(rt->memset(o->data(), 0xff, o->bytes(), nullptr).ok());
  ASSERT_TRUE(rt->memset(lse->data(), 0xff, lse->bytes(), nullptr).ok());
  AbsorbedArgs a;
  a.q = TensorView(q->data(), DType::kBF16, Device::cuda(), {d.tokens, heads, 576});
  a.kv_cache = TensorView(kv->data(), cache_dtype, Device::cuda(), {d.layout.num_slots, 576});
  a.k_scale = k_scale;
  a.req_to_token = TensorView(r2t->data(), DType::kI32, Device::cuda(),
                              {d.layout.num_rows, d.layout.max_context_len});
  a.o = TensorView(o->data(), DType::kBF16, Device::cuda(), {d.tokens, heads, 512});
  a.lse = TensorView(lse->data(), DType::kF32, Device::cuda(), {d.tokens, heads});
  a.sm_scale = 0.135234f;
  a.plan = plan_d->data();
  a.workspace = ws->data();
  a.workspace_bytes = ws->bytes();
  const Status st = op->run(a, ExecContext{Device::cuda(), nullptr});
  ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
  std::vector<bf16> o_h(d.tokens * heads * 512);
  std::vector<float> lse_h(d.tokens * heads);
  const Status c1 = rt->copy_to_host(o_h.data(), o->data(), o->bytes(), nullptr);
  ASSERT_TRUE(c1.ok()) << c1.to_string();
  const Status c2 = rt->copy_to_host(lse_h.data(), lse->data(), lse->bytes(), nullptr);
  ASSERT_TRUE(c2.ok()) << c2.to_string();
  const RefAttention ref = reference_of(d);
  const Comparison co = compare_values("o", to_float(o_h), ref.o, default_tolerance(DType::kBF16));
  const Comparison cl = compare_values("lse", lse_h, ref.lse, lse_tolerance());
  EXPECT_TRUE(co.ok) << what << ": " << co.message;
  EXPECT_TRUE(cl.ok) << what << ": " << cl.message;
}

TEST_F(AbsorbedDevice, SplitScheduleMatchesReference) {
  for (int heads : {16, 128}) {
    check_split_schedule(op_, heads, 16, DType::kBF16, 1.0f, mix_seed(base_seed(), heads));
  }
  // 16-row tiles (16 heads, one query each).
  check_split_schedule(op_, 16, 1, DType::kBF16, 1.0f, mix_seed(base_seed(), 17), {1, 1, 1});
}

// fp8 e4m3 cache: random data, k_scale != 1, split schedule, every row-tile variant (16 rows:
// 16 heads x 1 query; 32: 16 x 2; 64: 128 heads), token-level and paged index tables.
TEST_F(AbsorbedDevice, SplitScheduleFp8MatchesReference) {
  const float k_scale = 0.37f;
  for (int page : {1, 64}) {
    check_split_schedule(op_, 16, page, DType::kFP8E4M3, k_scale,
                         mix_seed(base_seed(), 1000 + page), {1, 1, 1});
    check_split_schedule(op_, 16, page, DType::kFP8E4M3, k_scale,
                         mix_seed(base_seed(), 2000 + page));
    check_split_schedule(op_, 128, page, DType::kFP8E4M3, k_scale,
                         mix_seed(base_seed(), 3000 + page));
  }
}

// A bf16 cache ignores k_scale (SYSTEM.md 7): the result equals the reference without it.
TEST_F(AbsorbedDevice, Bf16IgnoresKScale) {
  check_split_schedule(op_, 32, 16, DType::kBF16, 3.5f, mix_seed(base_seed(), 555));
}

// Capture the run in a CUDA graph for batch A, re-plan batch B into the same plan buffer
// (same q/o buffers, sized for the capacity), replay, and compare with an eager run of B.
void check_graph_replay(const AbsorbedAttentionOp* op_, DType cache_dtype) {
  SCOPED_TRACE(std::string(dtype_name(cache_dtype)));
  const int heads = 32, page = 64;
  Batch a_batch{{}, {1, 1, 1, 1}, {700, 1, 2, 65}};
  Batch b_batch{{}, {2, 1, 2, 1}, {2000, 129, 2, 1000}};
  const float k_scale = cache_dtype == DType::kFP8E4M3 ? 0.5f : 1.0f;
  DeviceProblem d =
      make_problem(mix_seed(base_seed(), 77), heads, page, b_batch, cache_dtype, k_scale);
  // Batch A reuses B's layout rows with shorter lengths (a prefix of each request).
  AbsorbedProblem pa{heads, page, true, d.batch.rows, a_batch.q_lens, a_batch.kv_lens};
  AbsorbedProblem pb{heads, page, true, d.batch.rows, d.batch.q_lens, d.batch.kv_lens};
  AttnCapacity cap{8, 16, 0, 2, heads};
  const int64_t cap_tokens = cap.max_q_tokens;
  std::vector<std::byte> plan_a(op_->plan_bytes(cap)), plan_b(op_->plan_bytes(cap));
  ASSERT_TRUE(op_->plan(pa, cap, plan_a).ok());
  ASSERT_TRUE(op_->plan(pb, cap, plan_b).ok());
  std::vector<bf16> q_full(cap_tokens * heads * 576);
  std::copy(d.q.begin(), d.q.end(), q_full.begin());
  auto q = upload(q_full.data(), q_full.size() * 2, "q");
  auto kv = upload(d.cache.bytes.data(), d.cache.bytes.size(), "kv");
  auto r2t = upload(d.layout.req_to_token.data(), d.layout.req_to_token.size() * 4, "r2t");
  auto plan_d = upload(plan_a.data(), plan_a.size(), "plan");
  auto ws = DeviceBuffer::allocate(Device::cuda(), op_->workspace_bytes(cap), "ws", "test", false);
  auto o = DeviceBuffer::allocate(Device::cuda(), cap_tokens * heads * 512 * 2, "o", "test", false);
  auto lse = DeviceBuffer::allocate(Device::cuda(), cap_tokens * heads * 4, "lse", "test", false);
  ASSERT_TRUE(q.ok() && kv.ok() && r2t.ok() && plan_d.ok() && ws.ok() && o.ok() && lse.ok());
  DeviceRuntime* rt = device_runtime(DeviceType::kCuda);
  AbsorbedArgs a;
  a.q = TensorView(q->data(), DType::kBF16, Device::cuda(), {cap_tokens, heads, 576});
  a.kv_cache = TensorView(kv->data(), cache_dtype, Device::cuda(), {d.layout.num_slots, 576});
  a.k_scale = k_scale;
  a.req_to_token = TensorView(r2t->data(), DType::kI32, Device::cuda(),
                              {d.layout.num_rows, d.layout.max_context_len});
  a.o = TensorView(o->data(), DType::kBF16, Device::cuda(), {cap_tokens, heads, 512});
  a.lse = TensorView(lse->data(), DType::kF32, Device::cuda(), {cap_tokens, heads});
  a.sm_scale = 0.135234f;
  a.plan = plan_d->data();
  a.workspace = ws->data();
  a.workspace_bytes = ws->bytes();

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const ExecContext ctx{Device::cuda(), stream};
  const auto read = [&](Outputs* out) {
    out->o.resize(d.tokens * heads * 512);
    out->lse.resize(d.tokens * heads);
    ASSERT_TRUE(rt->copy_to_host(out->o.data(), o->data(), out->o.size() * 2, stream).ok());
    ASSERT_TRUE(rt->copy_to_host(out->lse.data(), lse->data(), out->lse.size() * 4, stream).ok());
    ASSERT_TRUE(rt->synchronize(stream).ok());
  };
  const auto poison = [&] {
    ASSERT_TRUE(rt->memset(o->data(), 0xff, o->bytes(), stream).ok());
    ASSERT_TRUE(rt->memset(lse->data(), 0xff, lse->bytes(), stream).ok());
  };

  // Eager B.
  ASSERT_TRUE(rt->copy_to_device(plan_d->data(), plan_b.data(), plan_b.size(), stream).ok());
  poison();
  ASSERT_TRUE(op_->run(a, ctx).ok());
  Outputs eager;
  read(&eager);

  // Capture with plan A in place, then re-plan B into the same buffer and replay.
  ASSERT_TRUE(rt->copy_to_device(plan_d->data(), plan_a.data(), plan_a.size(), stream).ok());
  ASSERT_TRUE(rt->synchronize(stream).ok());
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const uint64_t allocs_before = MemoryLedger::global().allocation_count();
  const Status st = op_->run(a, ctx);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(MemoryLedger::global().allocation_count(), allocs_before) << "run() allocated";
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_TRUE(rt->copy_to_device(plan_d->data(), plan_b.data(), plan_b.size(), stream).ok());
  poison();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  Outputs replay;
  read(&replay);
  EXPECT_EQ(eager.o, replay.o) << "graph replay differs from the eager run";
  EXPECT_EQ(0, std::memcmp(eager.lse.data(), replay.lse.data(), eager.lse.size() * 4));

  const RefAttention ref = reference_of(d);
  std::vector<float> o_f(eager.o.size());
  for (size_t i = 0; i < o_f.size(); ++i) o_f[i] = bf16{eager.o[i]}.to_float();
  const Comparison co = compare_values("o", o_f, ref.o, default_tolerance(DType::kBF16));
  EXPECT_TRUE(co.ok) << co.message;
  const Comparison cl = compare_values("lse", eager.lse, ref.lse, lse_tolerance());
  EXPECT_TRUE(cl.ok) << cl.message;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(AbsorbedDevice, GraphReplayAfterReplanEqualsEager) {
  check_graph_replay(op_, DType::kBF16);
  check_graph_replay(op_, DType::kFP8E4M3);
}

}  // namespace
}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
