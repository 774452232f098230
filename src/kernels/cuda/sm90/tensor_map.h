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

// A 3-D tensor of elem_bytes elements: dims[0] contiguous, dims[1] and dims[2] at strides (in
// elements) stride1 and stride2, read in boxes of box[0] x box[1] x box[2] elements (box[0] *
// elem_bytes == 128 with the 128-byte swizzle), zeros outside. A [tokens, heads, dim] view is
// dims {dim, heads, tokens}; a box {64, 1, rows} lands as rows x 128 bytes.
struct TensorMap3d {
  const void* base = nullptr;
  int elem_bytes = 2;
  int64_t dims[3] = {0, 0, 0};
  int64_t stride1 = 0, stride2 = 0;
  int box[3] = {0, 0, 0};
  bool swizzle128 = true;
  int l2_promotion_bytes = 256;
};

// As encode_tensor_map_2d: false when the driver has no entry point or rejects the shape (a
// stride not a multiple of 16 bytes, an unaligned base, an empty dimension).
bool encode_tensor_map_3d(const TensorMap3d& t, void* out);

}  // namespace mla::cuda::sm90
