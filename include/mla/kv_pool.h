// The paged latent KV pool (SYSTEM.md section 2): one [num_slots, 576] buffer per layer, a
// req_to_token table, and a page allocator. Slots 0..page_size-1 are the dummy page.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mla/batch.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/status.h"
#include "mla/tensor.h"

namespace mla {

// The page sizes (tokens per page) mla serves, the one list: every op set and backend serves each
// of them at full speed and refuses any other size at construction (check_page_size). Python
// reads it through torch.ops.mla.page_sizes (mla.PAGE_SIZES).
inline constexpr int kPageSizes[] = {1, 16, 32, 64, 128};
bool is_supported_page_size(int page_size);  // one of kPageSizes
std::string page_sizes_text();               // "1, 16, 32, 64, 128"
// Ok, or kInvalidArgument "<field> = <page_size> is not served (mla serves page sizes 1, 16, ...)".
Status check_page_size(int page_size, std::string_view field);
// The latent cache dtypes mla stores: bf16 and fp8 e4m3 (with a per-layer k_scale).
inline constexpr DType kCacheDTypes[] = {DType::kBF16, DType::kFP8E4M3};
bool is_supported_cache_dtype(DType dtype);  // one of kCacheDTypes
// Ok, or kInvalidArgument "<field> = <dtype> is not served (mla stores the latent cache in ...)".
Status check_cache_dtype(DType dtype, std::string_view field);

// Hands out page ids 1..num_pages (page 0 is the dummy page). Pages are reference counted so a
// shared prefix can be held by several requests. Running out is kOutOfMemory, never a crash.
class PageAllocator {
 public:
  explicit PageAllocator(int64_t num_pages);
  StatusOr<std::vector<int32_t>> alloc(int64_t count);  // all or nothing
  Status retain(const std::vector<int32_t>& pages);     // +1 reference each
  Status release(const std::vector<int32_t>& pages);    // -1; page is free again at 0
  int64_t free_pages() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t num_pages() const { return num_pages_; }
  int32_t ref_count(int32_t page) const;

 private:
  int64_t num_pages_;
  std::vector<int32_t> free_list_;  // LIFO so freed pages are reused first
  std::vector<int32_t> refs_;       // [num_pages + 1]
};

struct KvPoolConfig {
  int num_layers = 1;
  int64_t num_pages = 0;  // usable pages, the dummy page not counted
  int page_size = 1;
  int max_requests = 0;
  int max_context_len = 0;
  int latent_dim = kLatentDim;
  DType dtype = DType::kBF16;  // kBF16 or kFP8E4M3 (per-layer k_scale)
  Device device = Device::cpu();
};

class LatentKvPool {
 public:
  static StatusOr<std::unique_ptr<LatentKvPool>> create(const KvPoolConfig& config);

  const KvPoolConfig& config() const { return config_; }
  int64_t num_slots() const { return (config_.num_pages + 1) * config_.page_size; }
  TensorView layer_cache(int layer) const;  // [num_slots, latent_dim] on the pool's device
  float k_scale(int layer) const;           // fp8 only; 1.0 for bf16
  // Per-layer dequantisation scale of an fp8 cache (stored value * scale = real value). A bf16
  // pool accepts and keeps it but never applies it (k_scale() stays 1). Errors name the layer or
  // the value (not finite, <= 0) and leave the scale unchanged.
  Status set_k_scale(int layer, float scale);

  // req_to_token: int32 [max_requests + 1, max_context_len]; row 0 is the padding row.
  TensorView req_to_token() const;  // device copy, what kernels read
  const std::vector<int32_t>& req_to_token_host() const { return req_to_token_host_; }
  int32_t slot(int row, int token) const;  // host lookup

  // Request rows.
  StatusOr<int> alloc_request();       // a free row in 1..max_requests
  Status free_request(int row);        // releases its pages and the row
  int32_t request_len(int row) const;  // tokens with a slot
  // Grows request `row` to `new_len` tokens, allocating pages as needed, updates req_to_token
  // (host and device) and returns the slots of tokens [old_len, new_len) in *new_slots.
  // All or nothing: on kOutOfMemory nothing changes.
  Status extend_request(int row, int32_t new_len, std::vector<int32_t>* new_slots);
  // Shrinks a request (e.g. rejected draft tokens); frees pages no longer used.
  Status truncate_request(int row, int32_t new_len);
  // Makes `dst` (empty) share the first `len` tokens of `src`; len must be a multiple of
  // page_size (prefix cache hit). Pages are retained, not copied.
  Status share_prefix(int src, int dst, int32_t len);

  // The stream the pool's own device work is ordered on: req_to_token row uploads and
  // copy-on-write page copies (cuda: a cudaStream_t; nullptr, the default, is the legacy default
  // stream). The kernels that read the table and the cache must run on it, or after it: a kernel
  // on a non-blocking stream is not ordered after work on the legacy stream, and would read a
  // row before its upload lands. AttentionBackend::set_stream sets it for the pool of its
  // backend, so the backends of one pool share one stream.
  void set_stream(void* stream) { stream_ = stream; }
  void* stream() const { return stream_; }

  const PageAllocator& allocator() const { return allocator_; }
  int64_t free_pages() const { return allocator_.free_pages(); }
  BatchLimits batch_limits(int max_draft_tokens = 8) const;

 private:
  LatentKvPool(const KvPoolConfig& c);
  KvPoolConfig config_;
  PageAllocator allocator_;
  std::vector<DeviceBuffer> layers_;
  std::vector<float> k_scales_;
  DeviceBuffer req_to_token_dev_;
  std::vector<int32_t> req_to_token_host_;
  std::vector<int32_t> request_lens_;  // [max_requests + 1], -1 = row free
  std::vector<int32_t> free_rows_;
  void* stream_ = nullptr;
  Status sync_row(int row, int32_t from, int32_t to);  // upload part of one row
};

}  // namespace mla
