// Host-side encoding of TMA tensor maps (cuTensorMapEncodeTiled, reached through the runtime's
// driver entry point so nothing links libcuda directly). Plain host code.
#pragma once

#include <cstdint>

namespace mla::cuda::sm90 {

inline constexpr int kTensorMapBytes = 128;  // sizeof(CUtensorMap); 64-byte aligned

// A 2-D tensor [rows, cols] of elements of elem_bytes (2: bf16, 1: bytes such as fp8) with a
// row stride of row_stride_elems, read in boxes of [box_rows x box_cols], zeros outside.
// swizzle128: the 128-byte swizzle (box_cols * elem_bytes == 128 then), else none.
// l2_promotion_bytes: 0, 64, 128 or 256 (the L2 fill granularity of the copies).
struct TensorMap2d {
  const void* base = nullptr;
  int elem_bytes = 2;
  int64_t rows = 0, cols = 0, row_stride_elems = 0;
  int box_rows = 0, box_cols = 0;
  bool swizzle128 = true;
  int l2_promotion_bytes = 256;
};

// Writes kTensorMapBytes bytes to out (64-byte aligned). False when the driver has no entry
// point or rejects the shape (the caller falls back to another load path).
bool encode_tensor_map_2d(const TensorMap2d& t, void* out);

// The same through a per-thread cache of recent maps (keyed by every field), so a serving loop
// that runs the same layers' caches step after step encodes each map once. A map describes the
// address and shape only, never the contents.
bool cached_tensor_map_2d(const TensorMap2d& t, void* out);

}  // namespace mla::cuda::sm90
