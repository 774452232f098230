// The cache slot of a key (the one slot lookup of the absorbed kernels), from either page-table
// form: req_to_token row pool_row lists a slot per key (page 1) or the first slot of each page at
// the page's first key (pages of P keys hold consecutive slots), as mla::slot_of_token
// (include/mla/ops.h) on the host; a block table row lists the page id of each P keys, as
// mla::slot_of_block. The TMA loads (pages of 64 and more) take the slot of a box's first key
// from here too, so either form serves both load paths. A slot outside the cache is never read:
// it is reported as kSlotOutside (the op checks no device table: that would need a sync; see
// docs/design-decisions.md).
#pragma once

#include <cstdint>

#include "kernels/cuda/absorbed/params.h"

namespace mla::cuda::absorbed {

// An entry of the page table pointing outside the cache: negative, so the cp.async path
// zero-fills the row, and so far below row 0 that a TMA box starting there lies wholly outside
// the tensor map (the copy engine fills zeros).
inline constexpr int32_t kSlotOutside = -(1 << 30);

// Slot of `key` of request row pool_row; -1 at or past kv_end (callers zero-fill such rows),
// kSlotOutside when the table points outside the cache.
__device__ __forceinline__ int32_t slot_of(const AbsorbedParams& p, int pool_row, int kv_end,
                                           int key, int page_size) {
  if (key >= kv_end) return -1;
  const int32_t* row = p.req_to_token + static_cast<int64_t>(pool_row) * p.req_to_token_stride;
  // Unsigned 32-bit arithmetic: a negative entry wraps past every valid slot, so one compare
  // bounds both ends (slots are int32 and the cache has at most 2^31 of them).
  uint32_t slot;
  if (page_size == 1) {
    slot = static_cast<uint32_t>(row[key]);
  } else if (p.page_table_blocks) {
    const uint32_t page = static_cast<uint32_t>(row[key / page_size]);
    if (page >= p.num_slots / static_cast<uint32_t>(page_size)) return kSlotOutside;
    slot = page * static_cast<uint32_t>(page_size) + static_cast<uint32_t>(key % page_size);
  } else {
    const uint32_t first = static_cast<uint32_t>(row[(key / page_size) * page_size]);
    if (first >= p.num_slots) return kSlotOutside;
    slot = first + static_cast<uint32_t>(key % page_size);
  }
  return slot < p.num_slots ? static_cast<int32_t>(slot) : kSlotOutside;
}

}  // namespace mla::cuda::absorbed
