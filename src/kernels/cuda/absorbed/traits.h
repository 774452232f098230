// Tile constants of the absorbed kernel (mma.sync m16n8k16 bf16, cp.async ring of half tiles).
#pragma once

namespace mla::cuda::absorbed {

inline constexpr int kDimQk = 576;       // c_kv (512) + k_pe (64)
inline constexpr int kDimV = 512;        // c_kv
inline constexpr int kBlockN = 64;       // keys per shared-memory tile
inline constexpr int kMaxRows = 64;      // rows (token x head) per tile, largest variant
inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kStages = 2;        // (v1 double buffer; the ring below replaced it)
inline constexpr int kChunksPerRow = kDimQk * 2 / 16;  // 16-byte chunks per 576-wide row: 72
inline constexpr int kRowBytes = kDimQk * 2;           // 1152
inline constexpr int kTileBytes = kBlockN * kRowBytes;  // 73728
inline constexpr int kQBytes = kMaxRows * kRowBytes;    // 73728
inline constexpr int kPBytes = kMaxRows * kBlockN * 2;  // 8192: softmax probabilities, bf16
inline constexpr int kRedFloats = 128;                  // DC x rows, the same for every variant
// Key tiles are loaded in halves of 32 keys through a ring of half-tile slots sized per variant:
// the Q tile takes 16 * RG rows only, so 16/32-row tiles keep more keys in flight. bf16: the
// ring holds swizzled bf16 rows the tensor cores read directly. fp8: the ring holds raw 576-byte
// fp8 rows, converted into one bf16 tile (two halves) before each step.
inline constexpr int kHalfN = 32;                              // keys per ring slot
inline constexpr int kHalfBytes = kHalfN * kRowBytes;          // 36864: bf16 half tile
inline constexpr int kHalfFp8Bytes = kHalfN * kDimQk;          // 18432: fp8 half tile
inline constexpr int kSlotEntries = 8;                         // ring of slot-index lists
inline constexpr int kSmemLimit = 232448;                      // opt-in maximum of one block

template <int RG, bool kFp8>
struct VariantLayout {
  static constexpr int kRows = 16 * RG;
  static constexpr int kPOff = kRows * kRowBytes;  // Q at 0
  static constexpr int kRedOff = kPOff + kPBytes;
  static constexpr int kSlotsOff = kRedOff + kRedFloats * 4;
  static constexpr int kTileOff = kSlotsOff + kSlotEntries * kHalfN * 4;  // fp8: bf16 tile
  static constexpr int kRingOff = kFp8 ? kTileOff + kTileBytes : kTileOff;
  static constexpr int kSlotBytes = kFp8 ? kHalfFp8Bytes : kHalfBytes;
  static constexpr int kMaxRing = kFp8 ? 7 : 5;  // <= kSlotEntries - 1 (slot-list reuse)
  static constexpr int kFit = (kSmemLimit - kRingOff) / kSlotBytes;
  static constexpr int kRing = kFit < kMaxRing ? kFit : kMaxRing;
  static constexpr int kBytes = kRingOff + kRing * kSlotBytes;
  // cp.async groups (one per half) that may stay pending when a step's two halves must be in.
  static constexpr int kPending = kFp8 ? kRing - 2 : kRing - 4;
  static_assert(kRing >= (kFp8 ? 2 : 4) && kPending >= 0);
  static_assert(kBytes <= kSmemLimit);
};

constexpr int max_int(int a, int b) { return a > b ? a : b; }
inline constexpr int kSmemBytes = max_int(
    max_int(max_int(VariantLayout<1, false>::kBytes, VariantLayout<2, false>::kBytes),
            max_int(VariantLayout<4, false>::kBytes, VariantLayout<1, true>::kBytes)),
    max_int(VariantLayout<2, true>::kBytes, VariantLayout<4, true>::kBytes));

// Split partials: contiguous cutting of the work list at num_ctas - 1 boundaries splits at most
// num_ctas - 1 tiles into at most 2 * (num_ctas - 1) pieces.
inline constexpr int kPartialsPerCta = 2;

static_assert(kChunksPerRow % 8 == 0, "the 8-chunk swizzle needs whole groups of 8 chunks");
static_assert(kRowBytes % 128 == 0, "rows must start on 128-byte boundaries for the swizzle");
static_assert(kBlockN % 16 == 0 && kBlockN == 64, "P tile rows are one 128-byte swizzle group");
static_assert(kSmemBytes <= kSmemLimit, "exceeds the 227 KiB shared memory of one Hopper SM");
static_assert(kDimV % 64 == 0);

}  // namespace mla::cuda::absorbed
