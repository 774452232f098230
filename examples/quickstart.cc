// The README's C++ example: create a backend, plan a batch, run a layer (CPU; CI builds and runs
// it as the ctest `example_quickstart`). One request gets a 300-token prompt (an EXTEND batch),
// then decodes one token (a DECODE batch), through the chunked_mla backend.
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/layer.h"
#include "mla/model.h"

namespace {

// Stops the example with the Status's message (the library itself never exits).
#define CHECK_OK(expr)                                                  \
  do {                                                                  \
    const mla::Status st_ = (expr);                                     \
    if (!st_.ok()) {                                                    \
      std::fprintf(stderr, "%s: %s\n", #expr, st_.to_string().c_str()); \
      return 1;                                                         \
    }                                                                   \
  } while (0)

// bf16 views over host vectors: [tokens, heads, dim] or [tokens, dim].
mla::TensorView view(std::vector<mla::bf16>& v, std::initializer_list<int64_t> shape) {
  return mla::TensorView(v.data(), mla::DType::kBF16, mla::Device::cpu(), shape);
}

// n bf16 values of a fixed pseudo-random pattern in [-1, 1) (stands in for activations).
std::vector<mla::bf16> activations(int64_t n, uint32_t seed) {
  std::vector<mla::bf16> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = mla::bf16::from_float(static_cast<float>(seed >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

}  // namespace

int main() {
  // DeepSeek-V3 at tensor parallel 8: 16 query heads per rank, latent 512 + rope 64.
  const mla::ModelDims dims = *mla::model_preset("deepseek-v3-tp8");
  const int heads = dims.num_heads;

  // A paged latent cache: 1 layer, 64 pages of 64 tokens, 8 request rows.
  mla::KvPoolConfig pool_config;
  pool_config.num_pages = 64;
  pool_config.page_size = 64;
  pool_config.max_requests = 8;
  pool_config.max_context_len = 4096;
  auto pool = mla::LatentKvPool::create(pool_config);
  CHECK_OK(pool.status());

  // The backend (a strategy over the CPU op set) and one MLA layer with random weights.
  mla::BackendOptions options;
  options.model = dims;
  options.device = mla::Device::cpu();
  auto backend = mla::BackendRegistry::global().create("chunked_mla",
                                                       mla::BackendContext{pool->get(), options});
  CHECK_OK(backend.status());
  auto layer = mla::MlaLayer::create_random(dims, /*layer_index=*/0, mla::Device::cpu(),
                                            /*seed=*/1);
  CHECK_OK(layer.status());

  auto row = (*pool)->alloc_request();
  CHECK_OK(row.status());
  int32_t len = 0;
  for (int32_t fresh : {300, 1}) {  // prefill the prompt, then one decode step
    // The batch: slots for the new tokens, then the per-request lengths.
    mla::ForwardBatch batch;
    batch.mode = len == 0 ? mla::ForwardMode::kExtend : mla::ForwardMode::kDecode;
    batch.batch_size = 1;
    batch.req_pool_indices = {*row};
    CHECK_OK((*pool)->extend_request(*row, len + fresh, &batch.out_cache_loc));
    batch.seq_lens = {len + fresh};
    batch.extend_prefix_lens = {len};  // tokens already cached
    batch.extend_seq_lens = {fresh};   // new tokens
    mla::finalize_batch(batch);        // seq_lens_sum
    CHECK_OK(mla::plan_batch(**backend, batch));

    // The layer's inputs for the new tokens (the model's projections would produce them).
    std::vector<mla::bf16> q_nope = activations(int64_t{fresh} * heads * 128, 1);
    std::vector<mla::bf16> q_pe = activations(int64_t{fresh} * heads * 64, 2);
    std::vector<mla::bf16> c_kv = activations(int64_t{fresh} * 512, 3);
    std::vector<mla::bf16> k_pe = activations(int64_t{fresh} * 64, 4);
    std::vector<mla::bf16> o(static_cast<std::size_t>(fresh) * heads * 128);
    CHECK_OK((*layer)->forward(**backend, view(q_nope, {fresh, heads, 128}),
                               view(q_pe, {fresh, heads, 64}), view(c_kv, {fresh, 512}),
                               view(k_pe, {fresh, 64}), view(o, {fresh, heads, 128}),
                               mla::ExecContext{}));
    std::printf("%s batch: %d new tokens, method %s, o[0] = %.4f\n",
                std::string(mla::forward_mode_name(batch.mode)).c_str(), fresh,
                std::string(mla::forward_method_name((*backend)->forward_method())).c_str(),
                o[0].to_float());
    len += fresh;
  }
  CHECK_OK((*pool)->free_request(*row));
  return 0;
}
