// Seeded random inputs and paged layouts for tests, `mla check` and benchmarks. Independent of
// LatentKvPool: layouts are built directly (req_to_token with shuffled pages, dummy page 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "mla/types.h"

namespace mla::testing {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double normal() { return normal_(engine_); }
  // Uniform integer in [lo, hi] (inclusive).
  int64_t uniform_int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
  std::normal_distribution<double> normal_{0.0, 1.0};
};

// Derives an independent seed for a sub-stream (splitmix64 of seed ^ salt).
uint64_t mix_seed(uint64_t seed, uint64_t salt);

// n values drawn from normal(0, stddev), rounded to bf16.
std::vector<bf16> random_bf16(int64_t n, Rng& rng, float stddev = 0.25f);
// Exact float values of bf16 / fp8 storage.
std::vector<float> to_float(std::span<const bf16> v);
std::vector<float> to_float(std::span<const fp8_e4m3> v);
// Decodes raw storage of a dtype (bf16, f32, fp8e4m3) to float.
std::vector<float> decode_to_float(std::span<const std::byte> bytes, DType dtype);

// A paged request layout without a pool: request b owns pool row req_rows[b] of req_to_token;
// pages are handed out from ids 1.. (page 0 is the dummy page), shuffled when asked. Unused
// entries of req_to_token point into the dummy page. block_table lists the same pages as page
// ids (FlashMLA's / vLLM's form), rows indexed like req_to_token, unused entries page 0.
struct PagedLayout {
  int page_size = 1;
  int num_rows = 0;                   // rows of req_to_token (row 0 = padding row)
  int max_context_len = 0;            // columns of req_to_token
  int64_t num_slots = 0;              // rows of the cache, dummy page included
  std::vector<int32_t> req_to_token;  // i32 [num_rows, max_context_len]
  int max_blocks = 0;                 // columns of block_table: max_context_len / page_size
  std::vector<int32_t> block_table;   // i32 [num_rows, max_blocks]
  std::vector<int32_t> req_rows;      // i32 [bs]
  std::vector<int32_t> kv_lens;       // i32 [bs] tokens with a slot per request
  int64_t slot(int b, int64_t token) const;
};
PagedLayout make_paged_layout(std::span<const int32_t> kv_lens, int page_size, bool shuffle,
                              Rng& rng);

// Filler written into every cache slot no request token uses (dummy page, page tails): large
// enough that an op reading an unused slot produces a visibly wrong result.
inline constexpr float kUnusedSlotValue = 100.0f;

// A latent cache [num_slots, 576] in bf16 or fp8 e4m3. Used slots hold random rows
// (real value normal/4; fp8 stores value / k_scale); unused slots hold kUnusedSlotValue.
struct LatentCache {
  DType dtype = DType::kBF16;
  float k_scale = 1.0f;
  int64_t num_slots = 0;
  int latent_dim = 576;
  std::vector<std::byte> bytes;  // raw storage, num_slots * 576 * dtype_size
  std::vector<float> stored;     // [num_slots, 576] decoded stored values (before k_scale)
};
LatentCache make_latent_cache(const PagedLayout& layout, DType dtype, float k_scale, Rng& rng,
                              int latent_dim = 576);

// A bf16 cache stored as fp8 e4m3 the way the engines store one: the per-tensor scale
// k_scale = amax / 448 over the rows the layout's requests use (448: e4m3's largest finite value),
// each value / k_scale rounded to nearest even (unused slots saturate). `stored` holds the e4m3
// values; their dequantised value is stored * k_scale.
LatentCache quantize_to_fp8(const LatentCache& bf16_cache, const PagedLayout& layout);

// Dequantised value the ops must use for a stored cache value: stored * k_scale for fp8,
// stored for bf16 (k_scale ignored: SYSTEM.md 7).
inline double dequant(float stored, DType cache_dtype, float k_scale) {
  return cache_dtype == DType::kFP8E4M3 ? static_cast<double>(stored) * k_scale
                                        : static_cast<double>(stored);
}

// Raw bytes of a vector of trivially copyable values.
template <typename T>
std::span<const std::byte> as_bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

}  // namespace mla::testing
