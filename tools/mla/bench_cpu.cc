// See bench_cpu.h. Timing: steady_clock around each run, warm-up run first, median of `iters`.
// Inputs are random normal/4 in bf16 (never zeros); the decode cache is sized past the L3
// (65536 cached tokens x 1152 bytes = 72 MiB per configuration).
#include "bench_cpu.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "conformance/case_gen.h"
#include "mla/model.h"
#include "mla/ops.h"
#include "mla/types.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MLA_BENCH_X86 1
#endif

namespace mla::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- ceilings ----

// Threads of the ceilings: the cpu ops' pool size (MLA_NUM_THREADS if set, else every cpu).
int bench_threads() {
  if (const char* s = std::getenv("MLA_NUM_THREADS"); s != nullptr && std::atoi(s) > 0) {
    return std::atoi(s);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// fn(thread) on `threads` threads at once.
template <typename Fn>
void on_threads(int threads, Fn fn) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(fn, t);
  fn(0);
  for (auto& th : pool) th.join();
}

typedef float V8 __attribute__((vector_size(32)));

// Sum of x[0:n) in 4 independent 8-wide lanes (a pure read stream).
float read_sum(const float* x, int64_t n) {
  V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    V8 v0, v1, v2, v3;
    std::memcpy(&v0, x + i, 32);
    std::memcpy(&v1, x + i + 8, 32);
    std::memcpy(&v2, x + i + 16, 32);
    std::memcpy(&v3, x + i + 24, 32);
    a0 += v0;
    a1 += v1;
    a2 += v2;
    a3 += v3;
  }
  const V8 s = (a0 + a1) + (a2 + a3);
  float r = 0.f;
  for (int k = 0; k < 8; ++k) r += s[k];
  for (; i < n; ++i) r += x[i];
  return r;
}

// STREAM-like read bandwidth: every pool thread sums its share of a 512 MiB array; best of 5.
double measure_stream_gbps() {
  const int64_t n = int64_t{128} << 20;  // floats
  std::vector<float> x(static_cast<std::size_t>(n));
  const int threads = bench_threads();
  const int64_t per = (n + threads - 1) / threads;
  const auto range = [&](int w) {
    return std::make_pair(std::min(n, w * per), std::min(n, (w + 1) * per));
  };
  // First touch by the threads that read it; the first timed pass is a warm-up.
  on_threads(threads, [&](int w) {
    for (int64_t i = range(w).first; i < range(w).second; ++i) {
      x[i] = 1.0f + static_cast<float>(i & 7);
    }
  });
  std::vector<float> sink(static_cast<std::size_t>(threads));
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = Clock::now();
    on_threads(threads, [&](int w) {
      sink[w] += read_sum(x.data() + range(w).first, range(w).second - range(w).first);
    });
    const double s = seconds_since(t0);
    if (rep > 0) best = std::min(best, s);
  }
  volatile float keep = sink[0];
  (void)keep;
  return static_cast<double>(n) * 4 / best / 1e9;
}

#ifdef MLA_BENCH_X86
// 10 independent FMA chains of 8 floats (more than latency x throughput on current x86 cores).
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters, float seed) {
  __m256 acc[10];
  for (int k = 0; k < 10; ++k) acc[k] = _mm256_set1_ps(seed + static_cast<float>(k));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 10; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  }
  __m256 s = acc[0];
  for (int k = 1; k < 10; ++k) s = _mm256_add_ps(s, acc[k]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}
#endif

// Scalar-width fallback: 10 chains of V8 multiply-add (two instructions per step).
float fma_loop_generic(int64_t iters, float seed) {
  V8 acc[10];
  for (int k = 0; k < 10; ++k) acc[k] = V8{} + (seed + static_cast<float>(k));
  const V8 a = V8{} + 0.999999f, b = V8{} + 1e-7f;
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 10; ++k) acc[k] = acc[k] * a + b;
  }
  V8 s = acc[0];
  for (int k = 1; k < 10; ++k) s += acc[k];
  return s[0];
}

// Peak fp32 FLOP/s of every pool thread running the FMA loop at once; best of 3.
double measure_fma_gflops(std::string* isa) {
  bool avx2 = false;
#ifdef MLA_BENCH_X86
  avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  *isa = avx2 ? "avx2+fma" : "generic";
  const int threads = bench_threads();
  const int64_t iters = 20'000'000;
  std::vector<float> sink(static_cast<std::size_t>(threads));
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    on_threads(threads, [&](int t) {
#ifdef MLA_BENCH_X86
      sink[t] = avx2 ? fma_loop_avx2(iters, static_cast<float>(t))
                     : fma_loop_generic(iters, static_cast<float>(t));
#else
      sink[t] = fma_loop_generic(iters, static_cast<float>(t));
#endif
    });
    const double s = seconds_since(t0);
    if (rep > 0) best = std::min(best, s);
  }
  volatile float keep = sink[0];
  (void)keep;
  return static_cast<double>(threads) * iters * 10 * 8 * 2 / best / 1e9;
}

struct Ceilings {
  double stream_gbps = 0;
  double fma_gflops = 0;
  std::string isa;
};

template <typename Fn>
StatusOr<std::pair<double, double>> time_runs(int iters, Fn fn) {
  MLA_RETURN_IF_ERROR(fn());  // warm-up
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    MLA_RETURN_IF_ERROR(fn());
    us.push_back(1e6 * seconds_since(t0));
  }
  std::sort(us.begin(), us.end());
  return std::make_pair(us[us.size() / 2], us.front());
}

nlohmann::json roofline_row(const Ceilings& ceil, double flops, double bytes, double us) {
  const double gflops = flops / (us * 1e-6) / 1e9, gbps = bytes / (us * 1e-6) / 1e9;
  const double t_compute = flops / (ceil.fma_gflops * 1e9);
  const double t_memory = bytes / (ceil.stream_gbps * 1e9);
  return {{"us", us},
          {"gflops", gflops},
          {"tflops", gflops / 1e3},
          {"gbps", gbps},
          {"bw_fraction", gbps / ceil.stream_gbps},
          {"flop_fraction", gflops / ceil.fma_gflops},
          {"bound", t_compute >= t_memory ? "compute" : "memory"},
          {"ceiling_fraction", std::max(t_compute, t_memory) / (us * 1e-6)}};
}

void fill_bf16(std::vector<uint16_t>& v, uint64_t seed) {
  testing::Rng rng(seed);
  const std::vector<bf16> r = testing::random_bf16(static_cast<int64_t>(v.size()), rng, 0.25f);
  std::memcpy(v.data(), r.data(), v.size() * 2);
}

// ---- decode: the absorbed op, s_q 1, page 64, b x s_k = 65536 cached tokens ----

struct DecodeShape {
  int b, h, s_k;
};

Status bench_decode(const OpSet& set, const DecodeShape& d, int iters, const Ceilings& ceil,
                    const std::vector<uint16_t>& cache, int64_t cache_slots,
                    const CpuBenchSink& sink) {
  const AbsorbedAttentionOp& op = *set.absorbed;
  constexpr int kPage = 64;
  testing::Rng rng(static_cast<uint64_t>(d.b * 131 + d.h * 7 + d.s_k));
  std::vector<int32_t> kv_lens(d.b, d.s_k), q_lens(d.b, 1);
  const testing::PagedLayout layout = testing::make_paged_layout(kv_lens, kPage, true, rng);
  if (layout.num_slots > cache_slots) {
    return internal_error("cpu decode bench: layout needs {} slots, cache has {}", layout.num_slots,
                          cache_slots);
  }
  const int64_t t = d.b;
  const AttnCapacity cap{d.b, t, 0, 1, d.h};
  const AbsorbedProblem prob{d.h, kPage, true, layout.req_rows, q_lens, kv_lens};
  std::vector<std::byte> plan(op.plan_bytes(cap));
  MLA_RETURN_IF_ERROR(op.plan(prob, cap, plan).status());
  std::vector<std::byte> ws(op.workspace_bytes(cap));
  std::vector<uint16_t> q(static_cast<std::size_t>(t * d.h * kLatentDim)), o(t * d.h * kKvLoraRank);
  std::vector<float> lse(static_cast<std::size_t>(t * d.h));
  fill_bf16(q, 7);
  const Device dev = Device::cpu();
  AbsorbedArgs a;
  a.q = TensorView(q.data(), DType::kBF16, dev, {t, d.h, kLatentDim});
  a.kv_cache =
      TensorView(const_cast<uint16_t*>(cache.data()), DType::kBF16, dev, {cache_slots, kLatentDim});
  a.req_to_token = TensorView(const_cast<int32_t*>(layout.req_to_token.data()), DType::kI32, dev,
                              {layout.num_rows, layout.max_context_len});
  a.o = TensorView(o.data(), DType::kBF16, dev, {t, d.h, kKvLoraRank});
  a.lse = TensorView(lse.data(), DType::kF32, dev, {t, d.h});
  a.sm_scale = kDeepSeekV3SoftmaxScale;
  a.plan = plan.data();
  a.workspace = ws.data();
  a.workspace_bytes = ws.size();
  const ExecContext ctx{dev, nullptr};
  MLA_ASSIGN_OR_RETURN(auto times, time_runs(iters, [&] { return op.run(a, ctx); }));
  const double keys = double(d.b) * d.s_k;
  const double flops = 2.0 * keys * d.h * (kLatentDim + kKvLoraRank);
  const double bytes = keys * kLatentDim * 2 + double(t) * d.h * (kLatentDim + kKvLoraRank) * 2;
  nlohmann::json row = {{"op", "decode"},
                        {"backend", "cpu"},
                        {"b", d.b},
                        {"s_q", 1},
                        {"h_q", d.h},
                        {"s_k", d.s_k},
                        {"page_size", kPage},
                        {"varlen", false},
                        {"cache_dtype", "bf16"},
                        {"us_min", times.second},
                        {"iters", iters}};
  row.update(roofline_row(ceil, flops, bytes, times.first));
  sink(row);
  return Status::Ok();
}

// ---- prefill: the MHA op, 192/128, causal, one request ----

struct PrefillShape {
  int h, s;
};

Status bench_prefill(const OpSet& set, const PrefillShape& p, int iters, const Ceilings& ceil,
                     const CpuBenchSink& sink) {
  const MhaAttentionOp& op = *set.mha;
  const int64_t t = p.s;
  std::vector<uint16_t> q(static_cast<std::size_t>(t * p.h * kQkHeadDim)), k(q.size()),
      v(static_cast<std::size_t>(t * p.h * kVHeadDim)), o(v.size());
  std::vector<float> lse(static_cast<std::size_t>(t * p.h));
  fill_bf16(q, 11);
  fill_bf16(k, 12);
  fill_bf16(v, 13);
  const std::vector<int32_t> indptr{0, p.s};
  const AttnCapacity cap{1, t, t, 1, p.h};
  std::vector<std::byte> plan(op.plan_bytes(cap));
  MLA_RETURN_IF_ERROR(op.plan(MhaProblem{p.h, true, indptr, indptr}, cap, plan).status());
  std::vector<std::byte> ws(op.workspace_bytes(cap));
  const Device dev = Device::cpu();
  MhaArgs a;
  a.q = TensorView(q.data(), DType::kBF16, dev, {t, p.h, kQkHeadDim});
  a.k = TensorView(k.data(), DType::kBF16, dev, {t, p.h, kQkHeadDim});
  a.v = TensorView(v.data(), DType::kBF16, dev, {t, p.h, kVHeadDim});
  a.o = TensorView(o.data(), DType::kBF16, dev, {t, p.h, kVHeadDim});
  a.lse = TensorView(lse.data(), DType::kF32, dev, {t, p.h});
  a.sm_scale = kDeepSeekV3SoftmaxScale;
  a.plan = plan.data();
  a.workspace = ws.data();
  a.workspace_bytes = ws.size();
  const ExecContext ctx{dev, nullptr};
  MLA_ASSIGN_OR_RETURN(auto times, time_runs(iters, [&] { return op.run(a, ctx); }));
  // Half of the square (causal), as the GPU rows (PERF.md).
  const double flops = 2.0 * (double(p.s) * p.s / 2) * p.h * (kQkHeadDim + kVHeadDim);
  const double bytes = double(t) * p.h * (kQkHeadDim + kQkHeadDim + kVHeadDim + kVHeadDim) * 2;
  nlohmann::json row = {{"op", "prefill_mha"},
                        {"backend", "cpu"},
                        {"b", 1},
                        {"s_q", p.s},
                        {"h_q", p.h},
                        {"s_k", p.s},
                        {"page_size", 0},
                        {"varlen", false},
                        {"causal", true},
                        {"us_min", times.second},
                        {"iters", iters}};
  row.update(roofline_row(ceil, flops, bytes, times.first));
  sink(row);
  return Status::Ok();
}

}  // namespace

Status run_cpu_benches(bool decode, bool prefill, bool quick, int iters, const nlohmann::json& base,
                       const CpuBenchSink& sink) {
  const OpSet* set = OpRegistry::global().default_for(DeviceType::kCpu);
  if (set == nullptr || !set->absorbed || !set->mha) {
    return unsupported("no cpu OpSet with absorbed and mha ops registered");
  }
  Ceilings ceil;
  ceil.stream_gbps = measure_stream_gbps();
  ceil.fma_gflops = measure_fma_gflops(&ceil.isa);
  nlohmann::json b = base;
  b["threads"] = bench_threads();
  b["stream_gbps"] = ceil.stream_gbps;
  b["fma_gflops"] = ceil.fma_gflops;
  b["fma_isa"] = ceil.isa;
  const auto emit = [&](const nlohmann::json& row) {
    nlohmann::json r = b;
    r.update(row);
    sink(r);
  };
  Status first_error = Status::Ok();
  const auto note = [&](const Status& st) {
    if (!st.ok() && first_error.ok()) first_error = st;
  };
  if (decode) {
    std::vector<DecodeShape> grid;
    if (quick) {
      grid = {{16, 16, 4096}, {4, 16, 16384}};
    } else {
      for (int h : {16, 128}) {
        for (int s_k : {1024, 4096, 16384}) grid.push_back({65536 / s_k, h, s_k});
      }
    }
    int64_t slots = 0;
    for (const auto& d : grid) {
      // Every request's pages, the dummy page and spare pages (make_paged_layout's layout).
      slots = std::max<int64_t>(slots, (int64_t{d.b} * ((d.s_k + 63) / 64) + 8) * 64);
    }
    std::vector<uint16_t> cache(static_cast<std::size_t>(slots * kLatentDim));
    fill_bf16(cache, 20261203);
    for (const auto& d : grid) {
      // 128 heads do 8x the work of 16: fewer runs keep the grid to about a minute on 2 cores.
      const int n = d.h > 16 ? std::max(1, iters / 4) : iters;
      note(bench_decode(*set, d, n, ceil, cache, slots, emit));
    }
  }
  if (prefill) {
    std::vector<PrefillShape> grid;
    if (quick) {
      grid = {{16, 1024}};
    } else {
      grid = {{16, 512}, {16, 1024}, {16, 2048}, {128, 512}};
    }
    for (const auto& p : grid) note(bench_prefill(*set, p, std::max(1, iters / 2), ceil, emit));
  }
  return first_error;
}

}  // namespace mla::cli
