// The one kernel chooser of the CUDA absorbed op: a pure host function of the problem's shape.
// supports() accepts exactly what it can choose for, plan() tiles rows as it says, and run()
// launches the kernel it names (AbsorbedParams::kernel). Built in every configuration, so the
// CPU unit tests cover its table (tests/unit/cuda_absorbed_choose_test.cc).
#pragma once

#include "kernels/cuda/absorbed/params.h"
#include "mla/model.h"
#include "mla/status.h"
#include "mla/types.h"

namespace mla::cuda::absorbed {

// Head counts of the absorbed op: any 1..kMaxHeads (the model's bound: two head groups of 64 rows
// at most). Rows of a tile are flat (token x head), so
// a head count that fills no tile (8 heads at q_len 1: 8 of a 16-row tile) runs the kernel's
// rows past num_rows as zeros, masked on load and store; no copy of q.
inline constexpr int kMaxHeads = ::mla::kMaxHeads;
inline bool supported_head_count(int num_heads) { return num_heads >= 1 && num_heads <= kMaxHeads; }

struct KernelChoice {
  AbsorbedKernel kernel = AbsorbedKernel::kSm90;
  // Rows (token x head) of one tile: the smallest of 16 / 32 / 64 holding num_heads x q_len
  // (q_len: the batch's longest query). The sm90 kernel runs every tile as 64 wgmma rows, so
  // a request with num_heads x q_len <= 64 is one tile and reads each key once. The same for
  // both cache dtypes: a plan serves either cache.
  int tile_rows = 64;
  // Key rows per TMA box of the sm90 kernel's key loads; 0: cp.async gathers (pages < 64:
  // boxes of 16 rows lost to cp.async on the H200, boxes of 64 beat it at page 64).
  int tma_box_rows = 0;
  const char* name = "";
};

// Rows per tile for a batch: the smallest of 16 / 32 / 64 holding heads x longest q_len
// (batch-invariant plans use kMaxRows whatever this says).
int rows_per_tile(int num_heads, int max_q_len);

// The kernel entry for a latent cache dtype (bf16, or fp8 e4m3): the one part of the choice that
// the op's run() needs, and the only one that depends on the cache, so a plan serves either
// cache and run() looks this up instead of choosing again.
inline AbsorbedKernel kernel_for_cache(DType cache_dtype) {
  return cache_dtype == DType::kFP8E4M3 ? AbsorbedKernel::kSm90Fp8 : AbsorbedKernel::kSm90;
}

// Error (kUnsupported, naming the field and value) for head counts outside 1..128,
// pages other than 1/16/32/64/128, q_len < 1 and caches other than bf16 / fp8 e4m3.
StatusOr<KernelChoice> choose_kernel(int num_heads, int q_len, int page_size, DType cache_dtype);

}  // namespace mla::cuda::absorbed
