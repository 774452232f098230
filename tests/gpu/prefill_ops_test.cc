// GPU tests of the prefill-side CUDA ops (MHA attention, merge, kv write, up-projection, head
// GEMM): the shared conformance cases of these ops with a determinism re-run (the MHA host
// planner's tests are CPU tests: tests/unit/cuda_mha_plan_test.cc), MHA against the double
// reference across several 128-row tiles and 64-key steps, and CUDA graph capture + replay (after
// re-planning into the same plan buffer for MHA; cuBLAS-backed ops with their explicit workspace)
// equal to eager runs. Compiles to nothing without CUDA (the CPU-only build has no cuda_runtime.h).
#ifdef MLA_WITH_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "conformance/case_gen.h"
#include "conformance/compare.h"
#include "conformance/conformance.h"
#include "conformance/reference.h"
#include "mla/memory.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

// ---------------------------------------------------------------------------------------------
// Device helpers.

#define MLA_SKIP_WITHOUT_GPU()                                                     \
  do {                                                                             \
    if (!device_available(Device::cuda())) {                                       \
      GTEST_SKIP() << "no CUDA device: device_available(Device::cuda()) is false"; \
    }                                                                              \
  } while (0)

const OpSet& cuda_ops() {
  const OpSet* set = OpRegistry::global().find("cuda");
  EXPECT_NE(set, nullptr);
  return *set;
}

DeviceRuntime& rt() { return *device_runtime(DeviceType::kCuda); }

template <typename T>
DeviceBuffer upload(const std::vector<T>& host, const char* name) {
  const std::size_t bytes = host.size() * sizeof(T);
  auto buf =
      DeviceBuffer::allocate(Device::cuda(), std::max<std::size_t>(bytes, 1), name, "test", false);
  EXPECT_TRUE(buf.ok()) << buf.status().to_string();
  if (!host.empty()) {
    EXPECT_TRUE(rt().copy_to_device(buf->data(), host.data(), bytes, nullptr).ok());
  }
  // Done before work on any stream: a non-blocking stream does not wait for the legacy one.
  EXPECT_TRUE(rt().synchronize(nullptr).ok());
  return std::move(buf).value();
}

DeviceBuffer poisoned(std::size_t bytes, const char* name) {
  auto buf = DeviceBuffer::allocate(Device::cuda(), bytes, name, "test", false);
  EXPECT_TRUE(buf.ok()) << buf.status().to_string();
  EXPECT_TRUE(rt().memset(buf->data(), 0xFF, bytes, nullptr).ok());
  EXPECT_TRUE(rt().synchronize(nullptr).ok());  // as upload
  return std::move(buf).value();
}

template <typename T>
std::vector<T> download(const DeviceBuffer& buf, std::size_t count) {
  std::vector<T> host(count);
  EXPECT_TRUE(rt().synchronize(nullptr).ok());
  EXPECT_TRUE(rt().copy_to_host(host.data(), buf.data(), count * sizeof(T), nullptr).ok());
  return host;
}

TensorView view(const DeviceBuffer& b, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(b.data(), t, Device::cuda(), dims);
}

// One MHA problem on the device at capacity size; plan() output uploaded into `plan`.
struct MhaSetup {
  int heads = 16;
  AttnCapacity cap;
  std::vector<bf16> q, k, v;
  DeviceBuffer dq, dk, dv, o, lse, plan;

  MhaSetup(int h, AttnCapacity c, uint64_t seed) : heads(h), cap(c) {
    Rng rng(seed);
    q = random_bf16(cap.max_q_tokens * h * 192, rng);
    k = random_bf16(cap.max_kv_tokens * h * 192, rng);
    v = random_bf16(cap.max_kv_tokens * h * 128, rng);
    dq = upload(q, "test.q");
    dk = upload(k, "test.k");
    dv = upload(v, "test.v");
    o = poisoned(static_cast<std::size_t>(cap.max_q_tokens * h * 128 * 2), "test.o");
    lse = poisoned(static_cast<std::size_t>(cap.max_q_tokens * h * 4), "test.lse");
    plan = poisoned(cuda_ops().mha->plan_bytes(cap), "test.plan");
  }
  Status replan(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv, bool causal) {
    std::vector<std::byte> host(cuda_ops().mha->plan_bytes(cap));
    MLA_ASSIGN_OR_RETURN(std::size_t used,
                         cuda_ops().mha->plan(MhaProblem{heads, causal, qo, kv}, cap, host));
    MLA_RETURN_IF_ERROR(rt().copy_to_device(plan.data(), host.data(), used, nullptr));
    // The copy is on the legacy stream, which a non-blocking stream's work does not wait for:
    // without this a replay could read a half-copied plan (an illegal address on the H200,
    // 2026-12-04, while other processes shared the GPU).
    return rt().synchronize(nullptr);
  }
  MhaArgs args() const {
    MhaArgs a;
    a.q = view(dq, DType::kBF16, {cap.max_q_tokens, heads, 192});
    a.k = view(dk, DType::kBF16, {cap.max_kv_tokens, heads, 192});
    a.v = view(dv, DType::kBF16, {cap.max_kv_tokens, heads, 128});
    a.o = view(o, DType::kBF16, {cap.max_q_tokens, heads, 128});
    a.lse = view(lse, DType::kF32, {cap.max_q_tokens, heads});
    a.sm_scale = 0.135234f;
    a.plan = plan.data();
    return a;
  }
  void poison() {
    ASSERT_TRUE(rt().memset(o.data(), 0xFF, o.bytes(), nullptr).ok());
    ASSERT_TRUE(rt().memset(lse.data(), 0xFF, lse.bytes(), nullptr).ok());
    ASSERT_TRUE(rt().synchronize(nullptr).ok());  // before work on any stream (as replan)
  }
};

// ---------------------------------------------------------------------------------------------
// Conformance cases of these ops, each run twice for bitwise determinism.

TEST(CudaPrefillOps, ConformanceCasesPassAndAreDeterministic) {
  MLA_SKIP_WITHOUT_GPU();
  const std::set<OpKind> mine{OpKind::kMha, OpKind::kMerge, OpKind::kKvWrite, OpKind::kUpProject,
                              OpKind::kHeadGemm};
  int ran = 0;
  for (const ConformanceCase& c : conformance_cases(ConformanceScope::kFull)) {
    if (!mine.count(c.op)) continue;
    RunOptions options;
    options.check_determinism = true;
    const CaseResult r = run_conformance_case(cuda_ops(), c, Device::cuda(), options);
    EXPECT_FALSE(r.skipped) << describe_result(r);
    EXPECT_TRUE(r.passed) << describe_result(r) << "\n" << r.message;
    EXPECT_TRUE(r.deterministic) << c.name;
    ++ran;
  }
  EXPECT_GT(ran, 10);
}

// ---------------------------------------------------------------------------------------------
// MHA against the double reference over several tiles, steps and masks.

void expect_mha_matches_reference(MhaSetup& s, const std::vector<int32_t>& qo,
                                  const std::vector<int32_t>& kv, bool causal) {
  ASSERT_TRUE(s.replan(qo, kv, causal).ok());
  s.poison();
  ASSERT_TRUE(cuda_ops().mha->run(s.args(), ExecContext{Device::cuda(), nullptr}).ok());
  const int64_t tq = qo.back();
  const auto o = download<bf16>(s.o, static_cast<std::size_t>(tq * s.heads * 128));
  const auto lse = download<float>(s.lse, static_cast<std::size_t>(tq * s.heads));
  const std::vector<float> qf = to_float(s.q);
  const std::vector<float> kf = to_float(s.k);
  const std::vector<float> vf = to_float(s.v);
  const RefAttention ref =
      reference_mha(std::span(qf).first(static_cast<std::size_t>(tq * s.heads * 192)),
                    std::span(kf).first(static_cast<std::size_t>(kv.back()) * s.heads * 192),
                    std::span(vf).first(static_cast<std::size_t>(kv.back()) * s.heads * 128), qo,
                    kv, s.heads, 0.135234, causal);
  const Comparison co = compare_values("o", to_float(o), ref.o, default_tolerance(DType::kBF16));
  EXPECT_TRUE(co.ok) << co.message;
  EXPECT_LT(co.global_rel_err, 1e-2);
  const Comparison cl = compare_values("lse", lse, ref.lse, lse_tolerance());
  EXPECT_TRUE(cl.ok) << cl.message;
}

TEST(CudaPrefillOps, MhaMatchesReferenceAcrossTilesAndSteps) {
  MLA_SKIP_WITHOUT_GPU();
  MhaSetup s(16, AttnCapacity{4, 512, 1400, 1, 16}, mix_seed(base_seed(), 0x51));
  // Causal: a 300-row request on a 1000-key prefix+extend (3 tiles, 16 steps), a request of
  // exactly one tile and one of a single row.
  expect_mha_matches_reference(s, {0, 300, 429, 430}, {0, 1000, 1129, 1206}, true);
  // Non-causal (a prefix chunk): a request with no keys gets o = 0, lse = -inf.
  expect_mha_matches_reference(s, {0, 200, 203, 333}, {0, 0, 150, 213}, false);
}

// Edges of the wgmma kernel's tiles (128 query rows = 2 warpgroups of 64, 128-key steps):
// lengths off the tile grid, causal offsets that put the diagonal inside a warpgroup's rows or on
// its boundary, square prefill, zero-length q and kv rows, and 8 to 128 heads (fewer heads than
// a head group too; with 64 and 128 heads a CTA runs several units, so the next unit's Q and
// first K/V stage are prefetched during the last step of the previous one).
TEST(CudaPrefillOps, MhaWgmmaTileEdgesMatchReference) {
  MLA_SKIP_WITHOUT_GPU();
  {
    MhaSetup s(16, AttnCapacity{4, 700, 1500, 1, 16}, mix_seed(base_seed(), 0x54));
    // Causal: 1 row on 1 key; 128 rows on 256 keys (offset 128); 261 rows on 443 keys (offset
    // 182: the diagonal cuts both warpgroups and the key steps off the grid); 300 square.
    expect_mha_matches_reference(s, {0, 1, 129, 390, 690}, {0, 1, 257, 700, 1000}, true);
    // Causal offsets of exactly 64 (warpgroup boundary) and 1, and a request with no query rows.
    expect_mha_matches_reference(s, {0, 200, 200, 455}, {0, 264, 300, 556}, true);
    // Non-causal chunks: no keys, 129 keys, 385 keys, 1 key.
    expect_mha_matches_reference(s, {0, 70, 200, 201, 330}, {0, 0, 129, 514, 515}, false);
  }
  for (const int heads : {8, 32, 64, 128}) {
    SCOPED_TRACE(heads);
    MhaSetup s(heads, AttnCapacity{2, 200, 400, 1, heads}, mix_seed(base_seed(), 0x55 + heads));
    expect_mha_matches_reference(s, {0, 150, 190}, {0, 330, 370}, true);
    expect_mha_matches_reference(s, {0, 130, 190}, {0, 200, 333}, false);
    // Units without keys between units with keys (the cross-unit prefetch skips them).
    expect_mha_matches_reference(s, {0, 60, 190}, {0, 0, 370}, false);
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs.

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// Captures fn(stream) into g; fn's Status must be OK.
template <typename Fn>
void capture(cudaStream_t stream, Graph& g, Fn fn) {
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status st = fn(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &g.graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
}

TEST(CudaPrefillOps, MhaGraphReplayAfterReplanEqualsEager) {
  MLA_SKIP_WITHOUT_GPU();
  MhaSetup s(32, AttnCapacity{4, 600, 2200, 1, 32}, mix_seed(base_seed(), 0x52));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const ExecContext ctx{Device::cuda(), stream};
  ASSERT_TRUE(s.replan({0, 300, 400}, {0, 1000, 1300}, true).ok());
  Graph g;
  capture(stream, g, [&](cudaStream_t) { return cuda_ops().mha->run(s.args(), ctx); });

  // New lengths, more requests, same plan buffer: replay must follow the new plan.
  const std::vector<int32_t> qo{0, 128, 129, 577};
  const std::vector<int32_t> kv{0, 500, 501, 2101};
  ASSERT_TRUE(s.replan(qo, kv, true).ok());
  s.poison();
  ASSERT_EQ(cudaGraphLaunch(g.exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto o_graph = download<uint16_t>(s.o, s.o.bytes() / 2);
  const auto lse_graph = download<uint32_t>(s.lse, s.lse.bytes() / 4);
  s.poison();
  ASSERT_TRUE(cuda_ops().mha->run(s.args(), ctx).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto o_eager = download<uint16_t>(s.o, s.o.bytes() / 2);
  const auto lse_eager = download<uint32_t>(s.lse, s.lse.bytes() / 4);
  EXPECT_TRUE(o_graph == o_eager);
  EXPECT_TRUE(lse_graph == lse_eager);
  // Rows of the new plan were written (not poison).
  const std::size_t last_row = static_cast<std::size_t>(qo.back() - 1) * 32 * 128;
  EXPECT_NE(o_graph[last_row], 0xFFFF);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaPrefillOps, CublasOpsCaptureAndReplayEqualEager) {
  MLA_SKIP_WITHOUT_GPU();
  constexpr int kHeads = 16;
  constexpr int64_t kTokens = 37;
  constexpr int64_t kSlots = 64;
  Rng rng(mix_seed(base_seed(), 0x53));
  // head_gemm: q_abs = q_nope @ W_UK into the first 512 columns of a [T, H, 576] buffer.
  const DeviceBuffer x = upload(random_bf16(kTokens * kHeads * 128, rng), "test.x");
  const DeviceBuffer w = upload(random_bf16(kHeads * 256 * 512, rng), "test.kv_b_proj");
  DeviceBuffer y = poisoned(kTokens * kHeads * 576 * 2, "test.y");
  HeadGemmArgs hg;
  hg.x = view(x, DType::kBF16, {kTokens, kHeads, 128});
  hg.w = view(w, DType::kBF16, {kHeads * 256, 512});
  hg.w_head_stride = 256 * 512;
  hg.w_row_stride = 512;
  hg.transpose_w = false;
  hg.y = view(y, DType::kBF16, {kTokens, kHeads, 576});
  hg.y.shape[2] = 512;
  // up_project: gather 37 shuffled slots of a 64-row cache.
  const DeviceBuffer cache = upload(random_bf16(kSlots * 576, rng), "test.cache");
  std::vector<int32_t> slots(kTokens);
  for (auto& sl : slots) sl = static_cast<int32_t>(rng.uniform_int(0, kSlots - 1));
  const DeviceBuffer dslots = upload(slots, "test.slots");
  DeviceBuffer k = poisoned(kTokens * kHeads * 192 * 2, "test.k");
  DeviceBuffer v = poisoned(kTokens * kHeads * 128 * 2, "test.v");
  const std::size_t ws_bytes = cuda_ops().up_project->workspace_bytes(kTokens, kHeads);
  const DeviceBuffer ws = poisoned(ws_bytes, "test.ws");
  UpProjectArgs up;
  up.kv_cache = view(cache, DType::kBF16, {kSlots, 576});
  up.slots = view(dslots, DType::kI32, {kTokens});
  up.kv_b_proj = hg.w;
  up.k = view(k, DType::kBF16, {kTokens, kHeads, 192});
  up.v = view(v, DType::kBF16, {kTokens, kHeads, 128});
  up.workspace = ws.data();
  up.workspace_bytes = ws_bytes;

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const ExecContext ctx{Device::cuda(), stream};
  const auto both = [&](cudaStream_t) -> Status {
    MLA_RETURN_IF_ERROR(cuda_ops().head_gemm->run(hg, ctx));
    return cuda_ops().up_project->run(up, ctx);
  };
  ASSERT_TRUE(both(stream).ok());  // eager first: creates the cuBLAS handle outside capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto y_eager = download<uint16_t>(y, y.bytes() / 2);
  const auto k_eager = download<uint16_t>(k, k.bytes() / 2);
  const auto v_eager = download<uint16_t>(v, v.bytes() / 2);
  Graph g;
  capture(stream, g, both);
  for (DeviceBuffer* b : {&y, &k, &v}) {
    ASSERT_TRUE(rt().memset(b->data(), 0xFF, b->bytes(), nullptr).ok());
  }
  ASSERT_TRUE(rt().synchronize(nullptr).ok());
  ASSERT_EQ(cudaGraphLaunch(g.exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(download<uint16_t>(y, y.bytes() / 2) == y_eager);
  EXPECT_TRUE(download<uint16_t>(k, k.bytes() / 2) == k_eager);
  EXPECT_TRUE(download<uint16_t>(v, v.bytes() / 2) == v_eager);
  // The strided y view left the k_pe columns (512..575) untouched.
  EXPECT_EQ(y_eager[575], 0xFFFF);
  EXPECT_NE(y_eager[0], 0xFFFF);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
