#include "kernels/cuda/absorbed/choose.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/absorbed/traits.h"
#include "mla/kv_pool.h"
#include "mla/model.h"

namespace mla::cuda::absorbed {

int rows_per_tile(int num_heads, int max_q_len) {
  const int64_t rows = int64_t{num_heads} * std::max(max_q_len, 1);
  if (rows <= 16) return 16;
  if (rows <= 32) return 32;
  return kMaxRows;
}

StatusOr<KernelChoice> choose_kernel(int num_heads, int q_len, int page_size, DType cache_dtype) {
  if (!supported_head_count(num_heads)) {
    return unsupported("cuda absorbed: num_heads = {} (supported: 1 to {})", num_heads, kMaxHeads);
  }
  if (!is_supported_page_size(page_size)) {
    return unsupported("cuda absorbed: page_size = {} (supported: {})", page_size,
                       page_sizes_text());
  }
  if (q_len < 1) return unsupported("cuda absorbed: q_len = {} must be at least 1", q_len);
  KernelChoice c;
  c.tile_rows = rows_per_tile(num_heads, q_len);
  if (cache_dtype != DType::kBF16 && cache_dtype != DType::kFP8E4M3) {
    return unsupported("cuda absorbed: {} latent cache (supported: bf16, fp8e4m3)",
                       dtype_name(cache_dtype));
  }
  // One kernel for both caches (an fp8 tile is converted to bf16 in shared memory after it
  // lands); TMA boxes of 64 key rows for pages of 64 and more, cp.async gathers below.
  const bool fp8 = cache_dtype == DType::kFP8E4M3;
  const bool tma = page_size >= kTmaBoxRows;
  c.kernel = kernel_for_cache(cache_dtype);
  c.tma_box_rows = tma ? kTmaBoxRows : 0;
  c.name = fp8 ? (tma ? "sm90 wgmma, fp8, TMA" : "sm90 wgmma, fp8, cp.async")
               : (tma ? "sm90 wgmma, TMA" : "sm90 wgmma, cp.async");
  return c;
}

}  // namespace mla::cuda::absorbed
