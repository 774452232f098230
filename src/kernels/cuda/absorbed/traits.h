// Tile constants of the absorbed kernel (mma.sync m16n8k16 bf16, cp.async double buffering).
#pragma once

namespace mla::cuda::absorbed {

inline constexpr int kDimQk = 576;       // c_kv (512) + k_pe (64)
inline constexpr int kDimV = 512;        // c_kv
inline constexpr int kBlockN = 64;       // keys per shared-memory tile
inline constexpr int kMaxRows = 64;      // rows (token x head) per tile, largest variant
inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kStages = 2;        // key tiles in shared memory
inline constexpr int kChunksPerRow = kDimQk * 2 / 16;  // 16-byte chunks per 576-wide row: 72
inline constexpr int kRowBytes = kDimQk * 2;           // 1152
inline constexpr int kTileBytes = kBlockN * kRowBytes;  // 73728
inline constexpr int kQBytes = kMaxRows * kRowBytes;    // 73728
inline constexpr int kPBytes = kMaxRows * kBlockN * 2;  // 8192: softmax probabilities, bf16
inline constexpr int kRedFloats = 128;                  // DC x rows, the same for every variant
inline constexpr int kSmemBytes =
    kQBytes + kStages * kTileBytes + kPBytes + kRedFloats * 4 + kStages * kBlockN * 4;
// Split partials: contiguous cutting of the work list at num_ctas - 1 boundaries splits at most
// num_ctas - 1 tiles into at most 2 * (num_ctas - 1) pieces.
inline constexpr int kPartialsPerCta = 2;

static_assert(kChunksPerRow % 8 == 0, "the 8-chunk swizzle needs whole groups of 8 chunks");
static_assert(kRowBytes % 128 == 0, "rows must start on 128-byte boundaries for the swizzle");
static_assert(kBlockN % 16 == 0 && kBlockN == 64, "P tile rows are one 128-byte swizzle group");
static_assert(kSmemBytes <= 232448, "exceeds the 227 KiB shared memory of one Hopper SM");
static_assert(kDimV % 64 == 0);

}  // namespace mla::cuda::absorbed
