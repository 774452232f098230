// Tile constants of the MHA kernel (sm90_kernel.cuh: wgmma, 2 consumer warpgroups). The host
// plan (plan.cc) cuts queries into tiles of kBlockM rows.
#pragma once

namespace mla::cuda::mha {

struct MhaTraits {
  static constexpr int kHeadDimQk = 192;
  static constexpr int kHeadDimV = 128;
  static constexpr int kBlockM = 128;  // query rows per tile: 2 warpgroups x 64 rows
  static constexpr int kBlockN = 128;  // keys per step (wgmma N of S, K of P V)
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kStages = 2;  // K/V double buffer (cp.async)

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

  static_assert(kBlockM == kWarpgroups * 64, "one m64 row block per warpgroup");
  static_assert(kHeadDimQk % 64 == 0 && kHeadDimV % 64 == 0, "whole 128-byte swizzle blocks");
  static_assert(kBlockN == 128, "wgmma wrappers are m64n128k16");
  static_assert(kHeadDimV == 128, "P V wgmma is m64n128k16");
  static_assert(kVBlockBytes / 16 < (1 << 14), "LBO fits the descriptor field");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM");
};

}  // namespace mla::cuda::mha
