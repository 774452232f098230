// The cache slot of a key (the one slot lookup of the absorbed kernels): req_to_token row
// pool_row lists a slot per key (page 1) or the first slot of each page at the page's first
// key (pages of P keys hold consecutive slots), as mla::paged_slot (include/mla/ops.h) on the
// host.
#pragma once

#include <cstdint>

#include "kernels/cuda/absorbed/params.h"

namespace mla::cuda::absorbed {

// Slot of `key` of request row pool_row; -1 at or past kv_end (callers zero-fill such rows).
__device__ __forceinline__ int32_t slot_of(const AbsorbedParams& p, int pool_row, int kv_end,
                                           int key, int page_size) {
  if (key >= kv_end) return -1;
  const int32_t* row = p.req_to_token + static_cast<int64_t>(pool_row) * p.req_to_token_stride;
  if (page_size == 1) return row[key];
  return row[(key / page_size) * page_size] + key % page_size;
}

}  // namespace mla::cuda::absorbed
