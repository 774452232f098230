#include "kernels/cuda/sm90/tensor_map.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <array>
#include <cstdint>
#include <cstring>

namespace mla::cuda::sm90 {
namespace {

static_assert(sizeof(CUtensorMap) == kTensorMapBytes);

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

bool encode_bf16_tensor_map_sw128(const void* base, int64_t rows, int64_t cols,
                                  int64_t row_stride_elems, int box_rows, int box_cols,
                                  int l2_promotion_bytes, void* out) {
  const auto fn = encode_fn();
  if (fn == nullptr || base == nullptr || rows <= 0 || cols <= 0 || box_cols * 2 > 128 ||
      (reinterpret_cast<std::uintptr_t>(base) % 16) != 0 ||
      (reinterpret_cast<std::uintptr_t>(out) % 64) != 0 || rows > (int64_t{1} << 32)) {
    return false;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride_elems) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUtensorMapL2promotion l2 = l2_promotion_bytes >= 256   ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                    : l2_promotion_bytes >= 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                    : l2_promotion_bytes >= 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                                                : CU_TENSOR_MAP_L2_PROMOTION_NONE;
  const CUresult r =
      fn(static_cast<CUtensorMap*>(out), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
         const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
         CU_TENSOR_MAP_SWIZZLE_128B, l2,
         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

bool cached_bf16_tensor_map_sw128(const void* base, int64_t rows, int64_t cols,
                                  int64_t row_stride_elems, int box_rows, int box_cols,
                                  int l2_promotion_bytes, void* out) {
  struct Entry {
    const void* base = nullptr;
    int64_t rows = 0, cols = 0, stride = 0;
    int box_rows = 0, box_cols = 0, l2 = 0;
    alignas(64) unsigned char map[kTensorMapBytes];
  };
  // Direct-mapped by a multiplicative hash of the address (layer caches are large power-of-two
  // strided allocations, whose low address bits alone would collide): the caches of a 61-layer
  // model mostly find their own entries.
  constexpr int kEntryBits = 8;
  thread_local std::array<Entry, std::size_t{1} << kEntryBits> cache{};
  const uint64_t h = static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(base)) *
                     0x9E3779B97F4A7C15ull;
  Entry& e = cache[h >> (64 - kEntryBits)];
  if (e.base == base && e.base != nullptr && e.rows == rows && e.cols == cols &&
      e.stride == row_stride_elems && e.box_rows == box_rows && e.box_cols == box_cols &&
      e.l2 == l2_promotion_bytes) {
    std::memcpy(out, e.map, kTensorMapBytes);
    return true;
  }
  if (!encode_bf16_tensor_map_sw128(base, rows, cols, row_stride_elems, box_rows, box_cols,
                                    l2_promotion_bytes, e.map)) {
    e.base = nullptr;
    return false;
  }
  e.base = base;
  e.rows = rows;
  e.cols = cols;
  e.stride = row_stride_elems;
  e.box_rows = box_rows;
  e.box_cols = box_cols;
  e.l2 = l2_promotion_bytes;
  std::memcpy(out, e.map, kTensorMapBytes);
  return true;
}

}  // namespace mla::cuda::sm90
