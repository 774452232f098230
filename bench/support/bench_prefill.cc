// See bench_prefill.h. Timing as PERF.md: CUDA events around every run, warm-up first, median.
// Inputs are random normal/4 (device fill, never zeros); one input set suffices because every
// configuration reads far more than the 60 MB L2 per run (q alone is 200 MB at b1, 4096).
#include "bench_prefill.h"

#ifdef MLA_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_cuda.h"
#include "fill.h"
#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/ops.h"

namespace mla::cli {
namespace {

constexpr int kHeads = 128;

StatusOr<DeviceBuffer> random_buffer(int64_t elems, uint64_t seed, cudaStream_t stream,
                                     const char* name) {
  MLA_ASSIGN_OR_RETURN(DeviceBuffer b,
                       DeviceBuffer::allocate(Device::cuda(), elems * 2, name, "bench", false));
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::fill_random_bf16(b.data(), elems, seed, 0.25f, stream));
  return b;
}

// Requests of q_lens[i] queries on kv_lens[i] keys; causal (q_lens == kv_lens then) or not (a
// prefix chunk). Equal lengths: the row's b, s_q, s_k; ragged: b, the mean s_q and s_k, varlen.
Status bench_mha(const std::vector<int>& q_lens, const std::vector<int>& kv_lens, bool causal,
                 int iters, cudaStream_t stream, const BenchSink& sink) {
  const OpSet* set = OpRegistry::global().find("cuda");
  if (set == nullptr || !set->mha) return unsupported("no cuda mha op registered");
  const MhaAttentionOp& op = *set->mha;
  const int b = static_cast<int>(q_lens.size());
  std::vector<int32_t> indptr(static_cast<std::size_t>(b) + 1, 0), kv_indptr(indptr.size(), 0);
  double pairs = 0;  // (query, key) pairs computed; causal: half the square, as the dense rows
  for (int i = 0; i < b; ++i) {
    indptr[i + 1] = indptr[i] + q_lens[i];
    kv_indptr[i + 1] = kv_indptr[i] + kv_lens[i];
    pairs += causal ? double(q_lens[i]) * kv_lens[i] / 2 : double(q_lens[i]) * kv_lens[i];
  }
  const int64_t t = indptr[b];
  const int64_t tk = kv_indptr[b];
  const bool ragged =
      std::any_of(q_lens.begin(), q_lens.end(), [&](int l) { return l != q_lens[0]; }) ||
      std::any_of(kv_lens.begin(), kv_lens.end(), [&](int l) { return l != kv_lens[0]; });
  const Device dev = Device::cuda();
  MLA_ASSIGN_OR_RETURN(DeviceBuffer q,
                       random_buffer(t * kHeads * kQkHeadDim, 11, stream, "bench.q"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer k,
                       random_buffer(tk * kHeads * kQkHeadDim, 12, stream, "bench.k"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer v,
                       random_buffer(tk * kHeads * kVHeadDim, 13, stream, "bench.v"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer o,
                       random_buffer(t * kHeads * kVHeadDim, 14, stream, "bench.o"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer lse,
                       DeviceBuffer::allocate(dev, t * kHeads * 4, "bench.lse", "bench", false));
  const AttnCapacity cap{b, t, tk, 1, kHeads};
  std::vector<std::byte> host_plan(op.plan_bytes(cap));
  MLA_ASSIGN_OR_RETURN(std::size_t used,
                       op.plan(MhaProblem{kHeads, causal, indptr, kv_indptr}, cap, host_plan));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer plan,
                       DeviceBuffer::allocate(dev, host_plan.size(), "bench.plan", "bench", false));
  MLA_BENCH_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(plan.data(), host_plan.data(), used, cudaMemcpyHostToDevice, stream));
  MhaArgs a;
  a.q = TensorView(q.data(), DType::kBF16, dev, {t, kHeads, kQkHeadDim});
  a.k = TensorView(k.data(), DType::kBF16, dev, {tk, kHeads, kQkHeadDim});
  a.v = TensorView(v.data(), DType::kBF16, dev, {tk, kHeads, kVHeadDim});
  a.o = TensorView(o.data(), DType::kBF16, dev, {t, kHeads, kVHeadDim});
  a.lse = TensorView(lse.data(), DType::kF32, dev, {t, kHeads});
  a.sm_scale = kDeepSeekV3SoftmaxScale;
  a.plan = plan.data();
  const ExecContext ctx{dev, stream};
  MLA_ASSIGN_OR_RETURN(auto times, time_runs(stream, 3, iters, [&] { return op.run(a, ctx); }));
  const double flops = 2.0 * pairs * kHeads * (kQkHeadDim + kVHeadDim);
  const double tflops = flops / (times.first * 1e-6) / 1e12;
  sink({{"op", "prefill_mha"},
        {"backend", "cuda"},
        {"b", b},
        {"s_q", t / b},
        {"h_q", kHeads},
        {"s_k", tk / b},
        {"page_size", 0},
        {"varlen", ragged},
        {"causal", causal},
        {"us", times.first},
        {"us_min", times.second},
        {"tflops", tflops},
        {"gbps", 0.0},
        {"iters", iters}});
  return Status::Ok();
}

// 4096 new tokens on a 32768-token prefix, one request, page 64, 128 heads, one layer.
Status bench_extend(const std::string& backend_name, int iters, cudaStream_t stream,
                    const BenchSink& sink) {
  constexpr int32_t kPrefix = 32768;
  constexpr int32_t kNew = 4096;
  constexpr int kPage = 64;
  const Device dev = Device::cuda();
  KvPoolConfig pc;
  pc.num_layers = 1;
  pc.page_size = kPage;
  pc.num_pages = (kPrefix + kNew) / kPage + 4;
  pc.max_requests = 2;
  pc.max_context_len = kPrefix + kNew + kPage;
  pc.device = dev;
  MLA_ASSIGN_OR_RETURN(auto pool, LatentKvPool::create(pc));
  MLA_ASSIGN_OR_RETURN(int row, pool->alloc_request());
  std::vector<int32_t> slots;
  MLA_RETURN_IF_ERROR(pool->extend_request(row, kPrefix, &slots));
  MLA_RETURN_IF_ERROR(pool->extend_request(row, kPrefix + kNew, &slots));
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::fill_random_bf16(
      pool->layer_cache(0).data, pool->num_slots() * kLatentDim, 21, 0.25f, stream));

  ForwardBatch batch;
  batch.mode = ForwardMode::kExtend;
  batch.batch_size = 1;
  batch.req_pool_indices = {row};
  batch.seq_lens = {kPrefix + kNew};
  batch.extend_prefix_lens = {kPrefix};
  batch.extend_seq_lens = {kNew};
  batch.out_cache_loc = slots;
  finalize_batch(batch);

  BackendContext bctx;
  bctx.pool = pool.get();
  bctx.options.device = dev;
  MLA_ASSIGN_OR_RETURN(bctx.options.model, model_preset("deepseek-v3"));
  bctx.options.max_batch = 2;
  MLA_ASSIGN_OR_RETURN(auto backend, BackendRegistry::global().create(backend_name, bctx));
  MLA_RETURN_IF_ERROR(plan_batch(*backend, batch));

  const int64_t t = kNew;
  MLA_ASSIGN_OR_RETURN(DeviceBuffer q,
                       random_buffer(t * kHeads * kQkHeadDim, 31, stream, "bench.q"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer k,
                       random_buffer(t * kHeads * kQkHeadDim, 32, stream, "bench.k"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer v,
                       random_buffer(t * kHeads * kVHeadDim, 33, stream, "bench.v"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer ckv, random_buffer(t * kLatentDim, 34, stream, "bench.c_kv"));
  MLA_ASSIGN_OR_RETURN(
      DeviceBuffer w, random_buffer(int64_t{kHeads} * kKvBProjRowsPerHead * kKvLoraRank, 35, stream,
                                    "bench.kv_b_proj"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer o,
                       random_buffer(t * kHeads * kVHeadDim, 36, stream, "bench.o"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer lse,
                       DeviceBuffer::allocate(dev, t * kHeads * 4, "bench.lse", "bench", false));
  AttentionInputs in;
  in.layer = 0;
  in.c_kv = TensorView(ckv.data(), DType::kBF16, dev, {t, kKvLoraRank});
  in.c_kv.stride[0] = kLatentDim;  // c_kv and k_pe are the two parts of one [T, 576] row
  in.k_pe = TensorView(static_cast<uint16_t*>(ckv.data()) + kKvLoraRank, DType::kBF16, dev,
                       {t, kQkRopeDim});
  in.k_pe.stride[0] = kLatentDim;
  in.q = TensorView(q.data(), DType::kBF16, dev, {t, kHeads, kQkHeadDim});
  in.k = TensorView(k.data(), DType::kBF16, dev, {t, kHeads, kQkHeadDim});
  in.v = TensorView(v.data(), DType::kBF16, dev, {t, kHeads, kVHeadDim});
  in.kv_b_proj =
      TensorView(w.data(), DType::kBF16, dev, {int64_t{kHeads} * kKvBProjRowsPerHead, kKvLoraRank});
  AttentionOutputs out;
  out.o = TensorView(o.data(), DType::kBF16, dev, {t, kHeads, kVHeadDim});
  out.lse = TensorView(lse.data(), DType::kF32, dev, {t, kHeads});
  const ExecContext ctx{dev, stream};
  MLA_ASSIGN_OR_RETURN(auto times, time_runs(stream, 2, iters, [&] {
                         return backend->forward_extend(in, out, ctx);
                       }));
  const double pairs = double(kNew) * kPrefix + double(kNew) * (kNew + 1) / 2;
  const double flops = pairs * kHeads * 2 * (kQkHeadDim + kVHeadDim);
  const double tflops = flops / (times.first * 1e-6) / 1e12;
  sink({{"op", "extend"},
        {"backend", backend_name},
        {"method", std::string(forward_method_name(backend->forward_method()))},
        {"b", 1},
        {"s_q", kNew},
        {"h_q", kHeads},
        {"s_k", kPrefix + kNew},
        {"page_size", kPage},
        {"varlen", false},
        {"us", times.first},
        {"us_min", times.second},
        {"tflops", tflops},
        {"gbps", 0.0},
        {"iters", iters}});
  return Status::Ok();
}

}  // namespace

Status run_prefill_benches(bool prefill, bool extend, bool quick, const BenchSink& sink) {
  cudaStream_t stream = nullptr;
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int iters = quick ? 5 : 10;
  Status first_error = Status::Ok();
  const auto note = [&](Status st) {
    if (!st.ok() && first_error.ok()) first_error = st;
  };
  if (prefill) {
    std::vector<std::pair<int, int>> shapes{{1, 4096}, {4, 2048}, {1, 16384}};
    if (quick) shapes.resize(1);
    for (auto [b, s] : shapes) {
      const std::vector<int> lens(b, s);
      note(bench_mha(lens, lens, true, iters, stream, sink));
    }
    if (!quick) {
      // The chunked extend's prefix-chunk attention: 4096 queries on a 16384-key chunk.
      note(bench_mha({4096}, {16384}, false, iters, stream, sink));
      // A ragged batch (issue 11): 16 requests, lengths uniform in [256, 4096] (a fixed LCG).
      std::vector<int> lens(16);
      uint32_t x = 20261204u;
      for (int& l : lens) {
        x = x * 1664525u + 1013904223u;
        l = 256 + static_cast<int>((x >> 8) % (4096 - 256 + 1));
      }
      note(bench_mha(lens, lens, true, iters, stream, sink));
    }
  }
  if (extend) {
    for (const char* name : {"chunked_mla", "paged_mla"}) {
      note(bench_extend(name, iters, stream, sink));
    }
  }
  cudaStreamDestroy(stream);
  return first_error;
}

}  // namespace mla::cli

#else  // !MLA_WITH_CUDA

namespace mla::cli {
Status run_prefill_benches(bool, bool, bool, const BenchSink&) {
  return unsupported("prefill benchmarks need a build with MLA_CUDA=ON");
}
}  // namespace mla::cli

#endif  // MLA_WITH_CUDA
