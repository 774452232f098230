// Tile constants of the absorbed kernels (sm90_ws.cuh: 64-row wgmma tiles, 64-key tiles; the
// combine kernel; the host planner).
#pragma once

namespace mla::cuda::absorbed {

inline constexpr int kDimQk = 576;         // c_kv (512) + k_pe (64)
inline constexpr int kDimV = 512;          // c_kv
inline constexpr int kBlockN = 64;         // keys per shared-memory tile
inline constexpr int kMaxRows = 64;        // rows (token x head) per tile, the wgmma M
inline constexpr int kThreads = 256;       // two warpgroups
inline constexpr int kSmemLimit = 232448;  // opt-in maximum of one block

// Split partials: contiguous cutting of the work list at num_ctas - 1 boundaries splits at most
// num_ctas - 1 tiles into at most 2 * (num_ctas - 1) pieces.
inline constexpr int kPartialsPerCta = 2;

static_assert(kDimV % 64 == 0);

}  // namespace mla::cuda::absorbed
