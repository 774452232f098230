// The paged latent KV pool: page allocator, per-layer latent buffers and req_to_token.
//
// Slot space: page p owns slots p*P .. p*P+P-1; page 0 is the dummy page. Token i of a request
// lives in page pages[i / P] at slot pages[i / P] * P + i % P, so req_to_token rows hold
// token-level slots and a request's page list is req_to_token[r, 0::P] / P.
#include "mla/kv_pool.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

namespace mla {
namespace {

int64_t pages_for(int64_t tokens, int page_size) { return (tokens + page_size - 1) / page_size; }

}  // namespace

bool is_supported_page_size(int page_size) {
  return std::find(std::begin(kPageSizes), std::end(kPageSizes), page_size) != std::end(kPageSizes);
}

std::string page_sizes_text() {
  return fmt::format("{}", fmt::join(std::begin(kPageSizes), std::end(kPageSizes), ", "));
}

Status check_page_size(int page_size, std::string_view field) {
  MLA_CHECK_ARG(is_supported_page_size(page_size),
                "{} = {} is not served (mla serves page sizes {} tokens)", field, page_size,
                page_sizes_text());
  return Status::Ok();
}

bool is_supported_cache_dtype(DType dtype) {
  return std::find(std::begin(kCacheDTypes), std::end(kCacheDTypes), dtype) !=
         std::end(kCacheDTypes);
}

Status check_cache_dtype(DType dtype, std::string_view field) {
  MLA_CHECK_ARG(is_supported_cache_dtype(dtype),
                "{} = {} is not served (mla stores the latent cache in bf16 or fp8e4m3)", field,
                dtype_name(dtype));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
PageAllocator::PageAllocator(int64_t num_pages)
    : num_pages_(std::max<int64_t>(num_pages, 0)),
      refs_(static_cast<std::size_t>(num_pages_ + 1), 0) {
  free_list_.reserve(static_cast<std::size_t>(num_pages_));
  // LIFO: the back is handed out first, so page 1 comes first on a fresh allocator.
  for (int64_t p = num_pages_; p >= 1; --p) free_list_.push_back(static_cast<int32_t>(p));
}

StatusOr<std::vector<int32_t>> PageAllocator::alloc(int64_t count) {
  MLA_CHECK_ARG(count >= 0, "page count = {} must be >= 0", count);
  if (count > free_pages()) {
    return make_status(StatusCode::kOutOfMemory,
                       "kv pool out of pages: need {} pages, {} of {} free", count, free_pages(),
                       num_pages_);
  }
  std::vector<int32_t> pages(static_cast<std::size_t>(count));
  for (auto& p : pages) {
    p = free_list_.back();
    free_list_.pop_back();
    refs_[static_cast<std::size_t>(p)] = 1;
  }
  return pages;
}

Status PageAllocator::retain(const std::vector<int32_t>& pages) {
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const int32_t p = pages[i];
    MLA_CHECK_ARG(p >= 1 && p <= num_pages_, "pages[{}] = {} is outside 1..{}", i, p, num_pages_);
    MLA_CHECK_ARG(refs_[static_cast<std::size_t>(p)] > 0, "pages[{}] = {} is not allocated", i, p);
  }
  for (int32_t p : pages) ++refs_[static_cast<std::size_t>(p)];
  return Status::Ok();
}

Status PageAllocator::release(const std::vector<int32_t>& pages) {
  // One pass, undone on the first bad entry so an error leaves every count unchanged (a page
  // listed more often than it is referenced is caught without a quadratic pre-check).
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const int32_t p = pages[i];
    const bool in_range = p >= 1 && p <= num_pages_;
    if (!in_range || refs_[static_cast<std::size_t>(p)] == 0) {
      for (std::size_t j = i; j-- > 0;) {
        auto& r = refs_[static_cast<std::size_t>(pages[j])];
        if (r == 0) free_list_.pop_back();  // pushed when this entry dropped it to zero
        ++r;
      }
      if (!in_range) return invalid_argument("pages[{}] = {} is outside 1..{}", i, p, num_pages_);
      return invalid_argument("pages[{}] = {} is not allocated (no references left)", i, p);
    }
    if (--refs_[static_cast<std::size_t>(p)] == 0) free_list_.push_back(p);
  }
  return Status::Ok();
}

int32_t PageAllocator::ref_count(int32_t page) const {
  if (page < 1 || page > num_pages_) return 0;
  return refs_[static_cast<std::size_t>(page)];
}

// ---------------------------------------------------------------------------------------------
LatentKvPool::LatentKvPool(const KvPoolConfig& c) : config_(c), allocator_(c.num_pages) {}

StatusOr<std::unique_ptr<LatentKvPool>> LatentKvPool::create(const KvPoolConfig& c) {
  MLA_CHECK_ARG(c.num_layers >= 1, "kv_pool.num_layers = {} must be >= 1", c.num_layers);
  MLA_CHECK_ARG(c.num_pages >= 0, "kv_pool.num_pages = {} must be >= 0", c.num_pages);
  MLA_RETURN_IF_ERROR(check_page_size(c.page_size, "kv_pool.page_size"));
  MLA_CHECK_ARG(c.max_requests >= 1, "kv_pool.max_requests = {} must be >= 1", c.max_requests);
  MLA_CHECK_ARG(c.max_context_len >= 1, "kv_pool.max_context_len = {} must be >= 1",
                c.max_context_len);
  MLA_CHECK_ARG(c.latent_dim >= 1, "kv_pool.latent_dim = {} must be >= 1", c.latent_dim);
  MLA_RETURN_IF_ERROR(check_cache_dtype(c.dtype, "kv_pool.dtype"));
  // Slots are int32 in req_to_token and out_cache_loc.
  const int64_t max_pages = std::numeric_limits<int32_t>::max() / c.page_size - 1;
  MLA_CHECK_ARG(c.num_pages <= max_pages,
                "kv_pool.num_pages = {} with page_size {} exceeds the int32 slot range (max {})",
                c.num_pages, c.page_size, max_pages);
  if (!device_available(c.device)) {
    return unsupported("kv_pool.device = {} is not available", c.device.to_string());
  }

  std::unique_ptr<LatentKvPool> pool(new LatentKvPool(c));
  const std::size_t layer_bytes = static_cast<std::size_t>(pool->num_slots()) *
                                  static_cast<std::size_t>(c.latent_dim) * dtype_size(c.dtype);
  pool->layers_.reserve(static_cast<std::size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    // Zeroed so the dummy page (and never-written slots) read as finite zeros.
    MLA_ASSIGN_OR_RETURN(
        DeviceBuffer buf,
        DeviceBuffer::allocate(c.device, layer_bytes, fmt::format("kv_pool.layer{}", l), "kv_pool",
                               /*zeroed=*/true));
    pool->layers_.push_back(std::move(buf));
  }
  pool->k_scales_.assign(static_cast<std::size_t>(c.num_layers), 1.0f);

  const std::size_t table_elems =
      static_cast<std::size_t>(c.max_requests + 1) * static_cast<std::size_t>(c.max_context_len);
  MLA_ASSIGN_OR_RETURN(pool->req_to_token_dev_,
                       DeviceBuffer::allocate(c.device, table_elems * sizeof(int32_t),
                                              "kv_pool.req_to_token", "kv_pool",
                                              /*zeroed=*/true));
  pool->req_to_token_host_.assign(table_elems, 0);
  pool->request_lens_.assign(static_cast<std::size_t>(c.max_requests) + 1, -1);
  pool->free_rows_.reserve(static_cast<std::size_t>(c.max_requests));
  for (int r = c.max_requests; r >= 1; --r) pool->free_rows_.push_back(r);
  return pool;
}

TensorView LatentKvPool::layer_cache(int layer) const {
  if (layer < 0 || layer >= config_.num_layers) return TensorView();
  return TensorView(layers_[static_cast<std::size_t>(layer)].data(), config_.dtype, config_.device,
                    {num_slots(), config_.latent_dim});
}

float LatentKvPool::k_scale(int layer) const {
  // The scale only applies to fp8 caches; a bf16 cache is never scaled.
  if (config_.dtype != DType::kFP8E4M3 || layer < 0 || layer >= config_.num_layers) return 1.0f;
  return k_scales_[static_cast<std::size_t>(layer)];
}

Status LatentKvPool::set_k_scale(int layer, float scale) {
  MLA_CHECK_ARG(layer >= 0 && layer < config_.num_layers,
                "set_k_scale: layer = {} is outside 0..{} (num_layers = {})", layer,
                config_.num_layers - 1, config_.num_layers);
  MLA_CHECK_ARG(std::isfinite(scale) && scale > 0.f,
                "set_k_scale: scale = {} for layer {} must be finite and > 0", scale, layer);
  k_scales_[static_cast<std::size_t>(layer)] = scale;
  return Status::Ok();
}

TensorView LatentKvPool::req_to_token() const {
  return TensorView(req_to_token_dev_.data(), DType::kI32, config_.device,
                    {config_.max_requests + 1, config_.max_context_len});
}

int32_t LatentKvPool::slot(int row, int token) const {
  if (row < 0 || row > config_.max_requests || token < 0 || token >= config_.max_context_len) {
    return -1;
  }
  return req_to_token_host_[static_cast<std::size_t>(row) * config_.max_context_len +
                            static_cast<std::size_t>(token)];
}

int32_t LatentKvPool::request_len(int row) const {
  if (row < 1 || row > config_.max_requests) return 0;
  return std::max(request_lens_[static_cast<std::size_t>(row)], 0);
}

BatchLimits LatentKvPool::batch_limits(int max_draft_tokens) const {
  BatchLimits l;
  l.max_requests = config_.max_requests;
  l.max_context_len = config_.max_context_len;
  l.num_slots = num_slots();
  l.page_size = config_.page_size;
  l.max_draft_tokens = max_draft_tokens;
  return l;
}

// ---------------------------------------------------------------------------------------------
StatusOr<int> LatentKvPool::alloc_request() {
  if (free_rows_.empty()) {
    return make_status(StatusCode::kOutOfMemory, "kv pool out of request rows: all {} in use",
                       config_.max_requests);
  }
  const int row = free_rows_.back();
  free_rows_.pop_back();
  request_lens_[static_cast<std::size_t>(row)] = 0;
  return row;
}

Status LatentKvPool::sync_row(int row, int32_t from, int32_t to) {
  if (to <= from) return Status::Ok();
  DeviceRuntime* rt = device_runtime(config_.device.type);
  if (rt == nullptr)
    return internal_error("kv pool: no runtime for {}", config_.device.to_string());
  const std::size_t offset =
      static_cast<std::size_t>(row) * config_.max_context_len + static_cast<std::size_t>(from);
  return rt->copy_to_device(req_to_token_dev_.as<int32_t>() + offset,
                            req_to_token_host_.data() + offset,
                            static_cast<std::size_t>(to - from) * sizeof(int32_t), stream_);
}

#define MLA_CHECK_LIVE_ROW(field, row)                                                          \
  MLA_CHECK_ARG((row) >= 1 && (row) <= config_.max_requests, "{} = {} is outside 1..{}", field, \
                row, config_.max_requests);                                                     \
  MLA_CHECK_ARG(request_lens_[static_cast<std::size_t>(row)] >= 0,                              \
                "{} = {} is not an allocated request row", field, row)

Status LatentKvPool::free_request(int row) {
  MLA_CHECK_LIVE_ROW("row", row);
  MLA_RETURN_IF_ERROR(truncate_request(row, 0));
  request_lens_[static_cast<std::size_t>(row)] = -1;
  free_rows_.push_back(row);
  return Status::Ok();
}

Status LatentKvPool::extend_request(int row, int32_t new_len, std::vector<int32_t>* new_slots) {
  MLA_CHECK_LIVE_ROW("row", row);
  const int32_t old_len = request_lens_[static_cast<std::size_t>(row)];
  MLA_CHECK_ARG(new_len >= old_len,
                "new_len = {} is below the current length {} of row {} (use truncate_request)",
                new_len, old_len, row);
  MLA_CHECK_ARG(new_len <= config_.max_context_len,
                "new_len = {} of row {} exceeds max_context_len = {}", new_len, row,
                config_.max_context_len);
  const int P = config_.page_size;
  int32_t* table =
      req_to_token_host_.data() +
      static_cast<std::size_t>(row) * static_cast<std::size_t>(config_.max_context_len);
  const int64_t old_pages = pages_for(old_len, P);
  const int64_t new_pages = pages_for(new_len, P);
  // Copy-on-write: new tokens that land in a partly filled last page held by another request
  // (a shared prefix truncated mid-page) must not overwrite that request's rows.
  const bool cow = old_len % P != 0 && new_len > old_len &&
                   allocator_.ref_count(table[(old_len / P) * P] / P) > 1;
  const int64_t need = new_pages - old_pages + (cow ? 1 : 0);
  MLA_ASSIGN_OR_RETURN(std::vector<int32_t> fresh, allocator_.alloc(need));

  std::size_t next = 0;
  int32_t first_changed = old_len;
  int32_t cow_old_page = 0;
  if (cow) {
    first_changed = (old_len / P) * P;
    cow_old_page = table[first_changed] / P;
    const int32_t page = fresh[next++];
    DeviceRuntime* rt = device_runtime(config_.device.type);
    const std::size_t row_bytes =
        static_cast<std::size_t>(config_.latent_dim) * dtype_size(config_.dtype);
    for (auto& layer : layers_) {
      auto* base = layer.as<std::byte>();
      Status s =
          rt->copy_device(base + static_cast<std::size_t>(page) * P * row_bytes,
                          base + static_cast<std::size_t>(cow_old_page) * P * row_bytes,
                          static_cast<std::size_t>(old_len - first_changed) * row_bytes, stream_);
      if (!s.ok()) {
        allocator_.release(fresh).ignore();
        return s;
      }
    }
    for (int32_t i = first_changed; i < old_len; ++i) table[i] = page * P + i % P;
  }
  for (int32_t i = old_len; i < new_len; ++i) {
    table[i] = (i % P == 0) ? fresh[next++] * P : table[i - i % P] + i % P;
  }
  if (Status s = sync_row(row, first_changed, new_len); !s.ok()) {
    // Undo on the host; the device row is re-synced best effort.
    for (int32_t i = first_changed; i < old_len; ++i) table[i] = cow_old_page * P + i % P;
    std::fill(table + old_len, table + new_len, 0);
    allocator_.release(fresh).ignore();
    sync_row(row, first_changed, new_len).ignore();
    return s;
  }
  // The shared page stays with the request(s) that still hold it.
  if (cow) allocator_.release({cow_old_page}).ignore();
  request_lens_[static_cast<std::size_t>(row)] = new_len;
  if (new_slots != nullptr) new_slots->assign(table + old_len, table + new_len);
  return Status::Ok();
}

Status LatentKvPool::truncate_request(int row, int32_t new_len) {
  MLA_CHECK_LIVE_ROW("row", row);
  const int32_t old_len = request_lens_[static_cast<std::size_t>(row)];
  MLA_CHECK_ARG(new_len >= 0 && new_len <= old_len,
                "new_len = {} of row {} is outside 0..{} (its current length)", new_len, row,
                old_len);
  const int P = config_.page_size;
  int32_t* table =
      req_to_token_host_.data() +
      static_cast<std::size_t>(row) * static_cast<std::size_t>(config_.max_context_len);
  std::vector<int32_t> dropped;
  for (int64_t k = pages_for(new_len, P); k < pages_for(old_len, P); ++k) {
    dropped.push_back(table[k * P] / P);
  }
  const std::vector<int32_t> saved(table + new_len, table + old_len);
  std::fill(table + new_len, table + old_len, 0);
  if (Status s = sync_row(row, new_len, old_len); !s.ok()) {
    std::copy(saved.begin(), saved.end(), table + new_len);
    return s;
  }
  MLA_RETURN_IF_ERROR(allocator_.release(dropped));
  request_lens_[static_cast<std::size_t>(row)] = new_len;
  return Status::Ok();
}

Status LatentKvPool::share_prefix(int src, int dst, int32_t len) {
  MLA_CHECK_LIVE_ROW("src", src);
  MLA_CHECK_LIVE_ROW("dst", dst);
  MLA_CHECK_ARG(src != dst, "src = dst = {}: a request cannot share with itself", src);
  const int32_t src_len = request_lens_[static_cast<std::size_t>(src)];
  const int32_t dst_len = request_lens_[static_cast<std::size_t>(dst)];
  MLA_CHECK_ARG(dst_len == 0, "dst = {} must be empty, it holds {} tokens", dst, dst_len);
  MLA_CHECK_ARG(len >= 0 && len <= src_len, "len = {} is outside 0..{} (length of src = {})", len,
                src_len, src);
  const int P = config_.page_size;
  MLA_CHECK_ARG(len % P == 0, "len = {} is not a multiple of page_size = {}", len, P);
  const std::size_t ctx = static_cast<std::size_t>(config_.max_context_len);
  const int32_t* from = req_to_token_host_.data() + static_cast<std::size_t>(src) * ctx;
  int32_t* to = req_to_token_host_.data() + static_cast<std::size_t>(dst) * ctx;
  std::vector<int32_t> pages;
  for (int32_t k = 0; k < len / P; ++k) pages.push_back(from[k * P] / P);
  MLA_RETURN_IF_ERROR(allocator_.retain(pages));
  std::copy(from, from + len, to);
  request_lens_[static_cast<std::size_t>(dst)] = len;
  return sync_row(dst, 0, len);
}

#undef MLA_CHECK_LIVE_ROW

}  // namespace mla
