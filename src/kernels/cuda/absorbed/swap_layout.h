// The operand orders of the swapped fp8 kernel (sm90_swap.cuh): constexpr host functions (the CUDA
// build's --expt-relaxed-constexpr lets the kernel call them), so the CPU unit tests check the
// same code (tests/unit/cuda_absorbed_swap_layout_test.cc).
//
// The kernel computes S^T = K Q^T (M = 64 keys, N = kSwapN query rows, K = 576 dims) and
// O^T = V^T P^T (M = 64 dims, N = kSwapN rows, K = 16-key steps), with the A operands (K and V^T)
// converted from the raw fp8 tile straight into wgmma register fragments. A register fragment
// of m64nNk16 holds, for thread q = lane % 4, the k indices 2q, 2q + 1 (a[0], a[1]) and 2q + 8,
// 2q + 9 (a[2], a[3]) of a k-step. A sum over k does not care in which order its terms come, so
// each GEMM's k order is permuted (the B operand, Q or P, written in the same order), and so is
// O^T's M order (the output columns, put back when O is written), such that every thread reads
// whole 16-byte runs of the raw tile:
//   S^T, k = dims: thread q reads bytes 16 q .. 16 q + 15 of a key row's 64-dim block b; byte
//     4 s + 2 h + i of them (s: k-step 4 b + s, h: a[2] / a[3], i: the pair's element) is dim
//     qk_dim(b, s, 2 q + 8 h + i).
//   O^T, k = keys of a 16-key step: thread q's pairs a[0] / a[1] are keys q and q + 4, a[2] /
//     a[3] keys q + 8 and q + 12 (pv_key); four consecutive rows per warp-wide load.
//   O^T, M = dims: warp w's thread g (lane / 4) holds rows 16 w + g and 16 w + g + 8 of each of
//     the kSwapMTiles 64-row m-tiles: the 16 consecutive dims 16 (8 w + g) + 2 mt + hi (pv_dim),
//     one 16-byte load per key.
#pragma once

#include <cstdint>

namespace mla::cuda::absorbed::swap {

inline constexpr int kSwapN = 32;                   // query rows of a unit (heads x q_len <= 32)
inline constexpr int kSwapKeys = 128;               // keys per tile: two 64-key M-tiles of S^T
inline constexpr int kSwapMTiles = 8;               // 64-dim M-tiles of O^T (512 dims)
inline constexpr int kSwapKSteps = kSwapKeys / 16;  // 16-key k-steps of O^T per tile

// S^T: the dim (0..575) at k index kk (0..15) of k-step 4 b + s, b the 64-dim block.
constexpr int qk_dim(int b, int s, int kk) {
  const int q = (kk & 7) >> 1, h = kk >> 3, i = kk & 1;
  return 64 * b + 16 * q + 4 * s + 2 * h + i;
}
// Its inverse: the k index slot (16 k-step + kk, 0..575) where dim d sits in Q's B operand.
constexpr int qk_slot(int d) {
  const int b = d >> 6, r = d & 63, q = r >> 4, s = (r >> 2) & 3, h = (r >> 1) & 1, i = r & 1;
  return 64 * b + 16 * s + 2 * q + 8 * h + i;
}

// O^T: the key (0..15 inside its 16-key step) at k index kk (0..15).
constexpr int pv_key(int kk) {
  const int q = (kk & 7) >> 1, h = kk >> 3, i = kk & 1;
  return 4 * (2 * h + i) + q;
}
// Its inverse: the k index of key k (0..15) inside its step, i.e. where P^T holds it.
constexpr int pv_slot(int k) {
  const int j = k >> 2, q = k & 3;
  return 2 * q + 8 * (j >> 1) + (j & 1);
}

// O^T: the dim (0..511) at row r (0..63) of m-tile mt (0..7).
constexpr int pv_dim(int mt, int r) {
  const int w = r >> 4, g = r & 7, hi = (r >> 3) & 1;
  return 16 * (8 * w + g) + 2 * mt + hi;
}

}  // namespace mla::cuda::absorbed::swap
