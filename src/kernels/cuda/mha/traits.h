// Tile constants of the MHA kernel (sm90_kernel.cuh: wgmma, a TMA producer warp and 2 consumer
// warpgroups). The host plan (plan.cc) cuts queries into tiles of kBlockM rows.
#pragma once

namespace mla::cuda::mha {

struct MhaTraits {
  static constexpr int kHeadDimQk = 192;
  static constexpr int kHeadDimV = 128;
  static constexpr int kBlockM = 128;  // query rows per tile: 2 warpgroups x 64 rows
  static constexpr int kBlockN = 128;  // keys per step (wgmma N of S, K of P V)
  static constexpr int kWarpgroups = 2;
  static constexpr int kConsumerThreads = kWarpgroups * 128;
  // + a producer warpgroup (one thread issues the TMA loads); setmaxnreg moves its registers to
  // the consumers: 128 x 24 + 256 x 240 = 384 x 168 (the launch budget of 384 threads).
  static constexpr int kThreads = kConsumerThreads + 128;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kStages = 2;  // K ring and V ring, 2 slots each

  // 128-byte swizzle: a tile is stored as column blocks of 64 bf16, each rows x 128 bytes; one
  // TMA box (64 columns x 128 rows) fills one block.
  static constexpr int kQBlockBytes = kBlockM * 128;
  static constexpr int kKBlockBytes = kBlockN * 128;
  static constexpr int kVBlockBytes = kBlockN * 128;
  static constexpr int kQBytes = kBlockM * kHeadDimQk * 2;  // 48 KiB
  static constexpr int kKBytes = kBlockN * kHeadDimQk * 2;  // 48 KiB per slot
  static constexpr int kVBytes = kBlockN * kHeadDimV * 2;   // 32 KiB per slot
  static constexpr int kKOff = kQBytes;
  static constexpr int kVOff = kKOff + kStages * kKBytes;
  static constexpr int kBarOff = kVOff + kStages * kVBytes;  // 208 KiB
  // mbarriers: q_full, q_empty, k_full[2], k_empty[2], v_full[2], v_empty[2]
  static constexpr int kNumBarriers = 2 + 4 * kStages;
  // + 1 KiB so the kernel can align the base to the 1024-byte swizzle atom.
  static constexpr int kSmemBytes = kBarOff + kNumBarriers * 8 + 1024;

  static_assert(kBlockM == kWarpgroups * 64, "one m64 row block per warpgroup");
  static_assert(kBlockM == kBlockN, "the TMA box (128 rows) serves Q, K and V");
  static_assert(kHeadDimQk % 64 == 0 && kHeadDimV % 64 == 0, "whole 128-byte swizzle blocks");
  static_assert(kBlockN == 128, "wgmma wrappers are m64n128k16");
  static_assert(kHeadDimV == 128, "P V wgmma is m64n128k16");
  static_assert(kVBlockBytes / 16 < (1 << 14), "LBO fits the descriptor field");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM");
};

}  // namespace mla::cuda::mha
