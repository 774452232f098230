// Host planning benchmark: init_forward_metadata per backend and mode on the cpu device, and
// graph replay planning. Heap allocations per plan are counted by replacing the global
// operator new in this binary. Run: build/<dir>/bench/mla_bench_planning
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "conformance/case_gen.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan.h"
#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/workspace.h"

namespace {
std::atomic<uint64_t> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace mla {
namespace {

constexpr int kMaxRequests = 256;
constexpr int kContext = 1024;
constexpr int kPageSize = 64;

LatentKvPool& pool() {
  static std::unique_ptr<LatentKvPool> p = [] {
    KvPoolConfig c;
    c.num_layers = 1;
    c.page_size = kPageSize;
    c.max_requests = kMaxRequests;
    c.max_context_len = kContext;
    c.num_pages = static_cast<int64_t>(kMaxRequests) * kContext / kPageSize;
    return std::move(LatentKvPool::create(c)).value();
  }();
  return *p;
}

// Requests 1..bs with random lengths (decode: seq_len in [64, 1000]; extend: given prefix).
ForwardBatch build_batch(ForwardMode mode, int bs, int32_t prefix, int32_t extend) {
  testing::Rng rng(42);
  LatentKvPool& p = pool();
  ForwardBatch b;
  b.mode = mode;
  b.batch_size = bs;
  for (int i = 0; i < bs; ++i) {
    const int row = *p.alloc_request();
    const int32_t pre =
        mode == ForwardMode::kDecode ? static_cast<int32_t>(rng.uniform_int(64, 1000)) : prefix;
    const int32_t fresh = mode == ForwardMode::kDecode ? 1 : extend;
    std::vector<int32_t> slots;
    p.extend_request(row, pre + fresh, &slots).ignore();
    b.req_pool_indices.push_back(row);
    b.seq_lens.push_back(pre + fresh);
    b.out_cache_loc.insert(b.out_cache_loc.end(), slots.end() - fresh, slots.end());
    if (mode != ForwardMode::kDecode) {
      b.extend_prefix_lens.push_back(pre);
      b.extend_seq_lens.push_back(fresh);
    }
  }
  finalize_batch(b);
  return b;
}

void release(const ForwardBatch& b) {
  for (int32_t r : b.req_pool_indices) pool().free_request(r).ignore();
}

std::unique_ptr<AttentionBackend> make_backend(const char* name) {
  BackendContext ctx;
  ctx.pool = &pool();
  ctx.options.device = Device::cpu();
  ctx.options.chunked_prefix_capacity = 2048;
  return std::move(BackendRegistry::global().create(name, ctx)).value();
}

// args: backend index, mode (0 decode, 1 extend with prefix chunking, 2 graph replay), batch.
void BM_Plan(benchmark::State& state) {
  static const char* kNames[] = {"paged_mla", "chunked_mla", "ondemand_mla"};
  const char* name = kNames[state.range(0)];
  const int mode = static_cast<int>(state.range(1));
  const int bs = static_cast<int>(state.range(2));
  WorkspaceRegistry::global().release_all_for_testing();
  auto backend = make_backend(name);
  const ForwardBatch batch = mode == 1 ? build_batch(ForwardMode::kExtend, bs, 900, 16)
                                       : build_batch(ForwardMode::kDecode, bs, 0, 1);
  if (mode == 2) {
    backend->init_cuda_graph_state(kMaxRequests, kMaxRequests).ignore();
    backend->init_forward_metadata_capture_cuda_graph(batch).ignore();
  }
  auto plan = [&] {
    return mode == 2 ? backend->init_forward_metadata_replay_cuda_graph(batch, bs)
                     : plan_batch(*backend, batch);
  };
  for (int i = 0; i < 3; ++i) plan().ignore();  // warm-up: buffers reach their size
  const uint64_t a0 = g_allocs.load();
  uint64_t plans = 0;
  for (auto _ : state) {
    Status s = plan();
    if (!s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
    ++plans;
  }
  state.counters["allocs_per_plan"] =
      plans ? static_cast<double>(g_allocs.load() - a0) / static_cast<double>(plans) : 0.0;
  state.counters["median_plan_ns"] = backend->median_plan_ns();
  state.SetLabel(fmt::format("{} {} bs={} method={}", name,
                             mode == 0   ? "decode"
                             : mode == 1 ? "extend+prefix"
                                         : "graph-replay",
                             bs, forward_method_name(backend->forward_method())));
  release(batch);
}

void args(benchmark::internal::Benchmark* b) {
  for (int backend = 0; backend < 3; ++backend) {
    for (int bs : {1, 64, 256}) b->Args({backend, 0, bs});
    b->Args({backend, 2, 256});
    for (int bs : {1, 8}) b->Args({backend, 1, bs});
  }
}
BENCHMARK(BM_Plan)->Apply(args)->Repetitions(3)->ReportAggregatesOnly(true);

// The CUDA absorbed op's host planner alone (pure host code, built without CUDA too): the split-KV
// schedule over 132 persistent CTAs (an H200) for decode (q_len 1) and speculative-verify
// batches (q_len 2-8 per request). args: heads, batch, max s_k, q_len, batch-invariant plans
// (AttnCapacity::batch_invariant: 0 or 1).
// On the GPU the backend adds to this what BM_Plan measures around the cpu op's plan (validation,
// collect, upload).
void BM_CudaAbsorbedPlan(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0));
  const int bs = static_cast<int>(state.range(1));
  const int max_kv = static_cast<int>(state.range(2));
  const int q_len = static_cast<int>(state.range(3));
  constexpr int kCtas = 132;
  testing::Rng rng(7);
  std::vector<int32_t> rows, q_lens, kv_lens;
  for (int b = 0; b < bs; ++b) {
    rows.push_back(b + 1);
    q_lens.push_back(q_len);
    kv_lens.push_back(static_cast<int32_t>(rng.uniform_int(max_kv / 2, max_kv)));
  }
  AbsorbedProblem problem;
  problem.num_heads = heads;
  problem.page_size = kPageSize;
  problem.causal = true;
  problem.req_rows = rows;
  problem.q_lens = q_lens;
  problem.kv_lens = kv_lens;
  AttnCapacity cap{kMaxRequests, 8 * kMaxRequests, 0, 8, heads};
  cap.batch_invariant = state.range(4) != 0;
  std::vector<std::byte> host_plan(cuda::absorbed::plan_layout(cap, kCtas).bytes);
  auto plan = [&] { return cuda::absorbed::build_plan(problem, cap, kCtas, host_plan); };
  for (int i = 0; i < 3; ++i) (void)plan();
  const uint64_t a0 = g_allocs.load();
  uint64_t plans = 0;
  for (auto _ : state) {
    auto r = plan();
    if (!r.ok()) {
      state.SkipWithError(r.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(host_plan.data());
    ++plans;
  }
  state.counters["allocs_per_plan"] =
      plans ? static_cast<double>(g_allocs.load() - a0) / static_cast<double>(plans) : 0.0;
  cuda::absorbed::PlanHeader header;
  std::memcpy(&header, host_plan.data(), sizeof(header));
  state.counters["units"] = header.num_units;
  state.counters["combines"] = header.num_combines;
  state.SetLabel(fmt::format("cuda absorbed plan h{} bs={} s_q={} s_k<={}{}", heads, bs, q_len,
                             max_kv, cap.batch_invariant ? " batch-invariant" : ""));
}
BENCHMARK(BM_CudaAbsorbedPlan)
    ->ArgsProduct({{16, 128}, {1, 64, 256}, {8192}, {1}, {0, 1}})
    ->ArgsProduct({{16, 128}, {64, 256}, {8192}, {2, 4}, {0}})
    ->ArgsProduct({{16, 128}, {64}, {8192}, {8}, {0}})
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

}  // namespace
}  // namespace mla

BENCHMARK_MAIN();
