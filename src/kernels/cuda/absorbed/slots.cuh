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

// The page table as the kernel reads it, derived once per CTA from the parameters and the plan's
// page size (make_slot_table), so a lookup does no division: pages are powers of two (1, 16, 32,
// 64, 128: is_supported_page_size), a key's page is key >> shift, and the block-table bound
// (num_slots / page_size pages) is computed here once instead of per key.
struct SlotTable {
  const int32_t* table;  // req_to_token (either form)
  int64_t row_stride;    // elements between rows
  uint32_t num_slots;    // rows of the cache
  uint32_t num_pages;    // block table: page ids below this are inside the cache
  int32_t shift;         // log2(page_size)
  int32_t mode;          // kSlotsPage1, kSlotsBlocks or kSlotsTokens
};
inline constexpr int32_t kSlotsPage1 = 0;   // page 1: a slot per key (either form)
inline constexpr int32_t kSlotsBlocks = 1;  // block table: a page id per page
inline constexpr int32_t kSlotsTokens = 2;  // req_to_token: the page's first slot at its first key

__device__ __forceinline__ SlotTable make_slot_table(const AbsorbedParams& p, int page_size) {
  SlotTable t;
  t.table = p.req_to_token;
  t.row_stride = p.req_to_token_stride;
  t.num_slots = p.num_slots;
  t.shift = __ffs(page_size) - 1;
  t.num_pages = p.num_slots >> t.shift;
  t.mode = page_size == 1 ? kSlotsPage1 : (p.page_table_blocks ? kSlotsBlocks : kSlotsTokens);
  return t;
}

// Row pool_row of the table (computed once per tile, not per key).
__device__ __forceinline__ const int32_t* slot_row(const SlotTable& t, int pool_row) {
  return t.table + static_cast<int64_t>(pool_row) * t.row_stride;
}

// A lookup in two steps, so that no instruction waits for a table load where it is issued:
// load_entry reads the table entry of `key` (a page id, a page's first slot or, at page 1, the
// slot), two tiles before the tile is loaded; resolve_slot turns it into the slot when the tile
// is loaded. (Bounding the slot right after its load made each producer thread wait for its four
// loads one after another, every tile: page 1, 16 and 32 ran 1.4x slower than page 64 on the
// H200, 2026-12-03.) Keys at or past kv_end read the row's first entry, which is never used.
__device__ __forceinline__ int32_t load_entry(const SlotTable& t, const int32_t* row, int kv_end,
                                              int key) {
  const uint32_t k = static_cast<uint32_t>(key);
  const uint32_t idx = t.mode == kSlotsPage1    ? k
                       : t.mode == kSlotsBlocks ? k >> t.shift
                                                : k & ~((1u << t.shift) - 1u);
  return row[key < kv_end ? idx : 0u];
}

// Slot of `key` from its table entry; -1 at or past kv_end (callers zero-fill such rows),
// kSlotOutside when the table points outside the cache. Unsigned 32-bit arithmetic: a negative
// entry wraps past every valid slot, so one compare bounds both ends (slots are int32 and the
// cache has at most 2^31 of them).
__device__ __forceinline__ int32_t resolve_slot(const SlotTable& t, int32_t entry, int kv_end,
                                                int key) {
  if (key >= kv_end) return -1;
  const uint32_t e = static_cast<uint32_t>(entry);
  const uint32_t in_page = static_cast<uint32_t>(key) & ((1u << t.shift) - 1u);
  uint32_t slot = e;
  if (t.mode == kSlotsBlocks) {
    if (e >= t.num_pages) return kSlotOutside;
    slot = (e << t.shift) + in_page;
  } else if (t.mode == kSlotsTokens) {
    if (e >= t.num_slots) return kSlotOutside;
    slot = e + in_page;
  }
  return slot < t.num_slots ? static_cast<int32_t>(slot) : kSlotOutside;
}

}  // namespace mla::cuda::absorbed
