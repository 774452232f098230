// Plan uploads ordered on the caller's stream: a paged_mla backend on a non-blocking stream,
// a captured decode graph, and back-to-back re-plans + replays with the GPU kept busy so the
// host runs ahead. Every replay must see its own plan (the uploads go through pinned staging on
// the stream, and staging bytes are not overwritten while a copy may read them). A pageable
// upload on the legacy default stream is not ordered against the non-blocking stream and fails
// this test. Compiles to nothing without CUDA.
#ifdef MLA_WITH_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backends/backend_base.h"
#include "conformance/case_gen.h"
#include "conformance/conformance.h"
#include "conformance/reference.h"
#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"

namespace mla::testing {
namespace {

constexpr int kHeads = 16;
constexpr int kMaxBs = 8;
constexpr int kPage = 16;

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = v[i].to_float();
  return f;
}

// A one-layer cuda pool whose cache holds random rows (cache_f: their float values), and a
// paged_mla backend over it (DeepSeek-V3 at tensor parallel 8) on a new non-blocking stream.
struct StreamSetup {
  KvPoolConfig pc;
  std::unique_ptr<LatentKvPool> pool;
  std::vector<float> cache_f;
  BackendOptions opt;
  std::unique_ptr<AttentionBackend> backend;
  cudaStream_t stream = nullptr;
  ~StreamSetup() {
    backend.reset();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

void make_setup(int64_t num_pages, int max_requests, Rng& rng, StreamSetup* s) {
  s->pc.num_layers = 1;
  s->pc.num_pages = num_pages;
  s->pc.page_size = kPage;
  s->pc.max_requests = max_requests;
  s->pc.max_context_len = 1024;
  s->pc.device = Device::cuda();
  auto pool = LatentKvPool::create(s->pc);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  s->pool = std::move(pool).value();
  const TensorView cache = s->pool->layer_cache(0);
  const std::vector<bf16> cache_host = random_bf16(cache.numel(), rng);
  ASSERT_EQ(cudaMemcpy(cache.data, cache_host.data(), cache.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  s->cache_f = to_float(cache_host);
  auto model = model_preset("deepseek-v3-tp8");
  ASSERT_TRUE(model.ok());
  s->opt.model = *model;
  s->opt.device = Device::cuda();
  s->opt.max_batch = kMaxBs;
  s->opt.paged_workspace_bytes = 64u << 20;
  auto backend =
      BackendRegistry::global().create("paged_mla", BackendContext{s->pool.get(), s->opt});
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  s->backend = std::move(backend).value();
  ASSERT_EQ(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), cudaSuccess);
  s->backend->set_stream(s->stream);
}

// The double reference of decode batch b (q_f: its rows' absorbed queries) over `table`
// (req_to_token) and `cache`.
RefAttention decode_reference(const StreamSetup& s, const ForwardBatch& b,
                              const std::vector<int32_t>& table, const std::vector<float>& q_f,
                              const std::vector<float>& cache) {
  const std::vector<int32_t> q_lens(b.batch_size, 1);
  AbsorbedRefProblem p;
  p.num_heads = kHeads;
  p.page_size = kPage;
  p.causal = true;
  p.sm_scale = s.opt.model.sm_scale;
  p.row_stride = s.pc.max_context_len;
  p.req_to_token = table;
  p.req_rows = b.req_pool_indices;
  p.q_lens = q_lens;
  p.kv_lens = b.seq_lens;
  const std::span<const float> q_used(q_f.data(), std::size_t(b.batch_size) * kHeads * 576);
  return reference_absorbed(p, q_used, cache);
}

// ||o - ref|| / ||ref|| of a bf16 output.
double rel_err_bf16(const uint16_t* o, const std::vector<double>& ref) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    bf16 v;
    v.bits = o[i];
    err += (v.to_float() - ref[i]) * (v.to_float() - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(err / std::max(norm, 1e-30));
}

TEST(CudaBackendStream, BackToBackReplansOnNonBlockingStreamMatchReference) {
  if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device";
  Rng rng(mix_seed(base_seed(), 0x5747));
  StreamSetup setup;
  ASSERT_NO_FATAL_FAILURE(make_setup(1400, 32, rng, &setup));  // 24 requests of up to 900 tokens
  LatentKvPool& pool = *setup.pool;
  AttentionBackend& backend = *setup.backend;
  cudaStream_t stream = setup.stream;
  const ExecContext ctx{Device::cuda(), stream};

  // Requests with random lengths; batches are random subsets in shuffled order.
  std::vector<int> rows;
  std::vector<int32_t> lens;
  for (int r = 0; r < 24; ++r) {
    auto row = pool.alloc_request();
    ASSERT_TRUE(row.ok());
    const auto len = static_cast<int32_t>(rng.uniform_int(1, 900));
    std::vector<int32_t> slots;
    ASSERT_TRUE(pool.extend_request(*row, len, &slots).ok());
    rows.push_back(*row);
    lens.push_back(len);
  }
  auto make_batch = [&](int bs, int offset) {
    ForwardBatch b;
    b.mode = ForwardMode::kDecode;
    b.batch_size = bs;
    for (int i = 0; i < bs; ++i) {
      const int r = (offset + 5 * i) % static_cast<int>(rows.size());
      b.req_pool_indices.push_back(rows[r]);
      b.seq_lens.push_back(lens[r]);
      b.out_cache_loc.push_back(pool.slot(rows[r], lens[r] - 1));
    }
    finalize_batch(b);
    return b;
  };

  // Static inputs and outputs the graph points at.
  const std::vector<bf16> q_host = random_bf16(int64_t{kMaxBs} * kHeads * 576, rng);
  const std::vector<float> q_f = to_float(q_host);
  void *q = nullptr, *o = nullptr, *lse = nullptr;
  ASSERT_EQ(cudaMalloc(&q, q_host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&o, std::size_t{kMaxBs} * kHeads * 512 * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, std::size_t{kMaxBs} * kHeads * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(q, q_host.data(), q_host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  AttentionInputs in;
  in.save_kv_cache = false;
  in.q_absorbed = TensorView(q, DType::kBF16, Device::cuda(), {kMaxBs, kHeads, 576});
  AttentionOutputs out;
  out.o_latent = TensorView(o, DType::kBF16, Device::cuda(), {kMaxBs, kHeads, 512});
  out.lse = TensorView(lse, DType::kF32, Device::cuda(), {kMaxBs, kHeads});

  ASSERT_TRUE(backend.init_cuda_graph_state(kMaxBs, kMaxBs).ok());
  ASSERT_TRUE(backend.init_forward_metadata_capture_cuda_graph(make_batch(kMaxBs, 0)).ok());
  ASSERT_TRUE(backend.forward_decode(in, out, ctx).ok());  // warm-up outside capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status cap = backend.forward_decode(in, out, ctx);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(cap.ok()) << cap.to_string();
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  // Keep the GPU busy so the host plans several batches ahead of the replays.
  constexpr std::size_t kBusyBytes = std::size_t{1} << 30;
  void* busy = nullptr;
  ASSERT_EQ(cudaMalloc(&busy, kBusyBytes), cudaSuccess);
  for (int i = 0; i < 16; ++i) ASSERT_EQ(cudaMemsetAsync(busy, i, kBusyBytes, stream), cudaSuccess);

  constexpr int kReplays = 12;
  std::vector<ForwardBatch> batches;
  const std::size_t o_bytes = std::size_t{kMaxBs} * kHeads * 512 * 2;
  const std::size_t lse_bytes = std::size_t{kMaxBs} * kHeads * 4;
  void* hist = nullptr;
  ASSERT_EQ(cudaMalloc(&hist, kReplays * (o_bytes + lse_bytes)), cudaSuccess);
  auto* hist_b = static_cast<std::byte*>(hist);
  for (int k = 0; k < kReplays; ++k) {
    batches.push_back(make_batch(1 + k % kMaxBs, 3 * k + 1));
    const Status st = backend.init_forward_metadata_replay_cuda_graph(batches.back(), kMaxBs);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(hist_b + k * (o_bytes + lse_bytes), o, o_bytes,
                              cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(hist_b + k * (o_bytes + lse_bytes) + o_bytes, lse, lse_bytes,
                              cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<std::byte> hist_host(kReplays * (o_bytes + lse_bytes));
  ASSERT_EQ(cudaMemcpy(hist_host.data(), hist, hist_host.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);

  // The staging buffers are in the ledger and were reused (waited on), not re-grown per plan.
  const auto* base = dynamic_cast<const backends::BackendBase*>(&backend);
  ASSERT_NE(base, nullptr);
  EXPECT_LE(base->staging().grows(), 2u);
  int staging_records = 0;
  for (const auto& rec : MemoryLedger::global().snapshot()) {
    if (rec.name.rfind("paged_mla.upload_staging", 0) == 0) ++staging_records;
  }
  EXPECT_EQ(staging_records, 2);

  for (int k = 0; k < kReplays; ++k) {
    SCOPED_TRACE(k);
    const RefAttention ref =
        decode_reference(setup, batches[k], pool.req_to_token_host(), q_f, setup.cache_f);
    const auto* ob =
        reinterpret_cast<const uint16_t*>(hist_host.data() + k * (o_bytes + lse_bytes));
    const auto* lb =
        reinterpret_cast<const float*>(hist_host.data() + k * (o_bytes + lse_bytes) + o_bytes);
    double lse_err = 0;
    for (std::size_t i = 0; i < ref.lse.size(); ++i) {
      lse_err = std::max(lse_err, std::abs(lb[i] - ref.lse[i]));
    }
    EXPECT_LT(rel_err_bf16(ob, ref.o), 1e-2);
    EXPECT_LT(lse_err, 1e-2);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(busy);
  cudaFree(hist);
  cudaFree(q);
  cudaFree(o);
  cudaFree(lse);
}

// The pool's own uploads (req_to_token rows of extend_request, copy-on-write pages) go on the
// backend's stream (set_stream sets the pool's): with the legacy default stream kept busy, a
// decode on a non-blocking stream right after each step's extend_request must still read the
// new token's slot. Before, the pool uploaded on the legacy stream, which a non-blocking stream
// is not ordered after: the kernel could read the row before its upload landed.
TEST(CudaBackendStream, PoolUploadsAreOrderedOnTheBackendsStream) {
  if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device";
  Rng rng(mix_seed(base_seed(), 0x5748));
  StreamSetup setup;
  ASSERT_NO_FATAL_FAILURE(make_setup(600, 16, rng, &setup));
  LatentKvPool& pool = *setup.pool;
  AttentionBackend& backend = *setup.backend;
  cudaStream_t stream = setup.stream;
  EXPECT_EQ(pool.stream(), static_cast<void*>(stream));
  const ExecContext ctx{Device::cuda(), stream};
  std::vector<float> cache_f = setup.cache_f;  // the cache as it should be

  // kMaxBs requests; the second shares the first's first three pages and is truncated into the
  // third, so its first extend copies that page on write.
  std::vector<int> rows;
  std::vector<int32_t> lens;
  for (int r = 0; r < kMaxBs; ++r) {
    auto row = pool.alloc_request();
    ASSERT_TRUE(row.ok());
    int32_t len = static_cast<int32_t>(rng.uniform_int(1, 400));
    if (r == 1) {
      ASSERT_TRUE(pool.share_prefix(rows[0], *row, 3 * kPage).ok());
      len = 3 * kPage - 3;
      ASSERT_TRUE(pool.truncate_request(*row, len).ok());
    } else {
      if (r == 0) len = std::max<int32_t>(len, 3 * kPage + 5);
      ASSERT_TRUE(pool.extend_request(*row, len, nullptr).ok());
    }
    rows.push_back(*row);
    lens.push_back(len);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<bf16> q_host = random_bf16(int64_t{kMaxBs} * kHeads * 576, rng);
  const std::vector<float> q_f = to_float(q_host);
  void *q = nullptr, *o = nullptr, *lse = nullptr, *busy = nullptr, *hist = nullptr;
  constexpr int kSteps = 6;
  const std::size_t o_bytes = std::size_t{kMaxBs} * kHeads * 512 * 2;
  constexpr std::size_t kBusyBytes = std::size_t{1} << 30;
  ASSERT_EQ(cudaMalloc(&q, q_host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&o, o_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, std::size_t{kMaxBs} * kHeads * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&busy, kBusyBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&hist, kSteps * o_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(q, q_host.data(), q_host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  AttentionInputs in;
  in.save_kv_cache = false;  // the cache holds random rows at every slot already
  in.q_absorbed = TensorView(q, DType::kBF16, Device::cuda(), {kMaxBs, kHeads, 576});
  AttentionOutputs out;
  out.o_latent = TensorView(o, DType::kBF16, Device::cuda(), {kMaxBs, kHeads, 512});
  out.lse = TensorView(lse, DType::kF32, Device::cuda(), {kMaxBs, kHeads});

  std::vector<ForwardBatch> batches;
  std::vector<std::vector<int32_t>> tables;  // req_to_token as each step saw it
  std::vector<std::vector<float>> caches;    // the cache as each step should read it
  int cow_rows = 0;
  for (int step = 0; step < kSteps; ++step) {
    // Anything enqueued on the legacy stream now runs after ~16 GB of memsets.
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(cudaMemsetAsync(busy, step + i, kBusyBytes, nullptr), cudaSuccess);
    }
    ForwardBatch b;
    b.mode = ForwardMode::kDecode;
    b.batch_size = kMaxBs;
    for (int r = 0; r < kMaxBs; ++r) {
      std::vector<int32_t> slots;
      const std::vector<int32_t> before = pool.req_to_token_host();
      ASSERT_TRUE(pool.extend_request(rows[r], lens[r] + 1, &slots).ok());
      // A copy on write moved earlier tokens to a new page with their rows: so does the model.
      for (int32_t i = 0; i < lens[r]; ++i) {
        const int32_t from = before[std::size_t(rows[r]) * setup.pc.max_context_len + i];
        const int32_t to = pool.slot(rows[r], i);
        if (from == to) continue;
        ++cow_rows;
        std::copy_n(cache_f.begin() + std::size_t(from) * 576, 576,
                    cache_f.begin() + std::size_t(to) * 576);
      }
      ++lens[r];
      b.req_pool_indices.push_back(rows[r]);
      b.seq_lens.push_back(lens[r]);
      b.out_cache_loc.push_back(slots[0]);
    }
    finalize_batch(b);
    ASSERT_TRUE(backend.init_forward_metadata(b).ok());
    const Status st = backend.forward_decode(in, out, ctx);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(cudaMemcpyAsync(static_cast<std::byte*>(hist) + step * o_bytes, o, o_bytes,
                              cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
    batches.push_back(b);
    tables.push_back(pool.req_to_token_host());
    caches.push_back(cache_f);
  }
  EXPECT_EQ(cow_rows, 3 * kPage - 3 - 2 * kPage);  // the truncated request's third page
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<uint16_t> hist_host(kSteps * o_bytes / 2);
  ASSERT_EQ(cudaMemcpy(hist_host.data(), hist, kSteps * o_bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(step);
    const RefAttention ref =
        decode_reference(setup, batches[step], tables[step], q_f, caches[step]);
    EXPECT_LT(rel_err_bf16(hist_host.data() + step * o_bytes / 2, ref.o), 1e-2);
  }
  cudaFree(hist);
  cudaFree(busy);
  cudaFree(q);
  cudaFree(o);
  cudaFree(lse);
}

}  // namespace
}  // namespace mla::testing

#endif  // MLA_WITH_CUDA
