// Host-side encoding of TMA tensor maps (cuTensorMapEncodeTiled, reached through the runtime's
// driver entry point so nothing links libcuda directly). Plain host code.
#pragma once

#include <cstdint>

namespace mla::cuda::sm90 {

inline constexpr int kTensorMapBytes = 128;  // sizeof(CUtensorMap); 64-byte aligned

// A 2-D bf16 tensor [rows, cols] with row stride row_stride_elems, read in boxes of
// [box_rows x box_cols] with the 128-byte swizzle (box_cols * 2 <= 128), zeros outside.
// Writes kTensorMapBytes bytes to out (64-byte aligned). False when the driver has no entry
// point or rejects the shape (the caller falls back to another load path).
// l2_promotion_bytes: 0, 64, 128 or 256 (the L2 fill granularity of the copies).
bool encode_bf16_tensor_map_sw128(const void* base, int64_t rows, int64_t cols,
                                  int64_t row_stride_elems, int box_rows, int box_cols,
                                  int l2_promotion_bytes, void* out);

// The same through a per-thread cache of recent maps (keyed by every argument), so a serving
// loop that runs the same layers' caches step after step encodes each map once. A map describes
// the address and shape only, never the contents.
bool cached_bf16_tensor_map_sw128(const void* base, int64_t rows, int64_t cols,
                                  int64_t row_stride_elems, int box_rows, int box_cols,
                                  int l2_promotion_bytes, void* out);

}  // namespace mla::cuda::sm90
