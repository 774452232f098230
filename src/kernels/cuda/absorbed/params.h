// Absorbed paged MLA attention on CUDA: the plan layout (host-written, uploaded once, read by the
// kernels) and the kernel parameters. Plain structs shared by host and device code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mla::cuda::absorbed {

// The kernels of the absorbed op; choose_kernel (choose.h) picks one per (heads, q_len, page,
// cache dtype) and the launcher runs the one named in AbsorbedParams::kernel.
enum class AbsorbedKernel : int32_t {
  kSm90 = 1,     // sm90_ws.cuh: 64-row wgmma tiles, warp-specialised, TMA / cp.async (bf16)
  kSm90Fp8 = 2,  // the same over an fp8 e4m3 cache (tiles converted in shared memory)
};

// Plan bytes: PlanHeader | cta_unit_begin int32[num_ctas + 1] | WorkUnit[max_units] |
// CombineUnit[max_combines]. Offsets are in the header so the kernels need nothing else.
struct PlanHeader {
  int32_t num_ctas;          // grid of the attention kernel (fixed by the capacity)
  int32_t rows_per_tile;     // 16, 32 or 64: rows (token x head) of one tensor-core tile
  int32_t num_units;         // work units written
  int32_t num_combines;      // split tiles to merge
  int32_t num_heads;         // H
  int32_t page_size;         // P
  int32_t causal;            // 1: bottom-right causal mask
  int32_t num_partials;      // partial slots used
  int32_t cta_begin_offset;  // byte offset of cta_unit_begin
  int32_t units_offset;      // byte offset of the WorkUnit array
  int32_t combines_offset;   // byte offset of the CombineUnit array
  int32_t tma_box_rows;      // sm90 kernel: key rows per TMA box (kTmaBoxRows), 0: cp.async
};
static_assert(sizeof(PlanHeader) == 48);

// Key rows per TMA box of the sm90 kernel's key loads (one 64-key tile = 9 boxes of 64 x 64).
inline constexpr int32_t kTmaBoxRows = 64;

// One piece of work: a tile of rows of one request against a key range.
struct WorkUnit {
  int32_t pool_row;     // row of req_to_token
  int32_t q_row_begin;  // first flat row (token * H + head) of q / o / lse
  int32_t num_rows;     // valid rows of the tile (<= rows_per_tile)
  int32_t row_in_req;   // index of the tile's first row inside its request (query = row / H)
  int32_t q_len;        // query tokens of the request
  int32_t kv_len;       // keys of the request
  int32_t kv_begin;     // first key of this unit (multiple of the key tile)
  int32_t kv_end;       // one past the last key of this unit (half-open)
  int32_t partial;      // -1: write o / lse directly; else the partial slot to write
  int32_t reserved[3];
};
static_assert(sizeof(WorkUnit) == 48);

// A tile split across several units: merge partial slots [first, first + count) into o / lse.
struct CombineUnit {
  int32_t q_row_begin;  // first flat row of q / o / lse
  int32_t num_rows;     // valid rows
  int32_t first_partial;
  int32_t num_partials;
};
static_assert(sizeof(CombineUnit) == 16);

// Kernel arguments (by value). bf16 pointers are typed as uint16_t storage here so this header
// needs no CUDA types.
struct AbsorbedParams {
  const uint16_t* q;         // bf16 [T, H, 576] contiguous
  const uint16_t* kv_cache;  // bf16 [num_slots, 576]
  // The page table, either form (slots.cuh reads it): token-level req_to_token, or a block
  // table of page ids when page_table_blocks is 1.
  const int32_t* req_to_token;  // i32 [rows, req_to_token_stride]
  int64_t req_to_token_stride;  // elements between rows of req_to_token
  int32_t page_table_blocks;    // 1: req_to_token holds page ids [rows, max_blocks]
  uint32_t num_slots;           // rows of the cache: a slot outside [0, num_slots) reads zeros
  uint16_t* o;                  // bf16 [T, H, 512]
  float* lse;                   // f32 [T, H]
  float* partial_o;             // f32 [max_partials, 64, 512] (workspace)
  float* partial_lse;           // f32 [max_partials, 64] (workspace)
  const unsigned char* plan;    // device copy of the plan bytes
  float scale_log2;             // sm_scale * log2(e) (* k_scale * 2^120 for fp8): base-2 logits
  int32_t kernel;               // AbsorbedKernel chosen by choose_kernel (choose.h)
  int32_t num_heads;            // H
  // fp8 e4m3 cache (kv_cache unused): rows of 576 bytes. The kernel converts the stored values
  // to bf16 exactly, times 2^-120; k_scale and 2^120 are folded into scale_log2 (logits), 2^120
  // into P and k_scale into o_scale (o = P @ V).
  const unsigned char* kv_cache_fp8;  // fp8 [num_slots, 576], or null for a bf16 cache
  float o_scale;                      // k_scale for fp8, 1 for bf16
  // TMA tensor map (CUtensorMap) over the cache, boxes of kTmaBoxRows key rows x 64 columns
  // (bf16: 128-byte swizzle), read through the kernel parameter (__grid_constant__). Used by the
  // sm90 kernel when the plan header's tma_box_rows > 0 (choose_kernel: pages of 64 and more)
  // and kv_tmap_valid (the driver encoded it); otherwise its loads are cp.async gathers.
  alignas(64) unsigned char kv_tmap[128];
  int32_t kv_tmap_valid;
};

}  // namespace mla::cuda::absorbed
