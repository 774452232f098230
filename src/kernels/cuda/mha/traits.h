// Tile constants of the first MHA kernel (FlashAttention-2 style, mma.sync m16n8k16 bf16).
#pragma once

namespace mla::cuda::mha {

struct MhaTraits {
  static constexpr int kHeadDimQk = 192;
  static constexpr int kHeadDimV = 128;
  static constexpr int kBlockM = 128;  // query rows per tile: 8 warps x 16 rows
  static constexpr int kBlockN = 64;   // keys per step
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;    // K/V double buffer (cp.async)

  // 16-byte chunks per smem row (the XOR swizzle works on groups of 8 chunks).
  static constexpr int kQkChunks = kHeadDimQk * 2 / 16;  // 24
  static constexpr int kVChunks = kHeadDimV * 2 / 16;    // 16

  static constexpr int kQBytes = kBlockM * kHeadDimQk * 2;  // 48 KiB
  static constexpr int kKBytes = kBlockN * kHeadDimQk * 2;  // 24 KiB per stage
  static constexpr int kVBytes = kBlockN * kHeadDimV * 2;   // 16 KiB per stage
  static constexpr int kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes);  // 128 KiB

  static_assert(kBlockM == kWarps * 16, "one m16 row block per warp");
  static_assert(kQkChunks % 8 == 0 && kVChunks % 8 == 0, "swizzle needs multiples of 8 chunks");
  static_assert(kBlockN % 16 == 0 && kHeadDimQk % 16 == 0 && kHeadDimV % 16 == 0);
  static_assert((kBlockM * kQkChunks) % kThreads == 0);
  static_assert((kBlockN * kQkChunks) % kThreads == 0);
  static_assert((kBlockN * kVChunks) % kThreads == 0);
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM");
};

// Tile constants of the Hopper kernel (sm90_kernel.cuh: wgmma, 2 consumer warpgroups).
struct MhaSm90Traits {
  static constexpr int kHeadDimQk = 192;
  static constexpr int kHeadDimV = 128;
  static constexpr int kBlockM = 128;  // query rows per tile: 2 warpgroups x 64 rows
  static constexpr int kBlockN = 128;  // keys per step (wgmma N of S, K of P V)
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kStages = 2;      // K/V double buffer (cp.async)

  static constexpr int kQkChunks = kHeadDimQk * 2 / 16;  // 16-byte chunks per row: 24
  static constexpr int kVChunks = kHeadDimV * 2 / 16;    // 16
  // 128-byte swizzle: a tile is stored as column blocks of 64 bf16, each rows x 128 bytes.
  static constexpr int kQBlockBytes = kBlockM * 128;
  static constexpr int kKBlockBytes = kBlockN * 128;
  static constexpr int kVBlockBytes = kBlockN * 128;
  static constexpr int kQBytes = kBlockM * kHeadDimQk * 2;  // 48 KiB
  static constexpr int kKBytes = kBlockN * kHeadDimQk * 2;  // 48 KiB per stage
  static constexpr int kVBytes = kBlockN * kHeadDimV * 2;   // 32 KiB per stage
  // + 1 KiB so the kernel can align the base to the 1024-byte swizzle atom.
  static constexpr int kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes) + 1024;  // 209 KiB

  static_assert(kBlockM == MhaTraits::kBlockM, "the plan's tiles are shared by both kernels");
  static_assert(kBlockM == kWarpgroups * 64, "one m64 row block per warpgroup");
  static_assert(kHeadDimQk % 64 == 0 && kHeadDimV % 64 == 0, "whole 128-byte swizzle blocks");
  static_assert(kBlockN == 128, "wgmma wrappers are m64n128k16");
  static_assert(kHeadDimV == 128, "P V wgmma is m64n128k16");
  static_assert(kVBlockBytes / 16 < (1 << 14), "LBO fits the descriptor field");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM");
};

}  // namespace mla::cuda::mha
