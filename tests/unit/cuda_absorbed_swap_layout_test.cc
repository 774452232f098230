// The operand orders of the swapped fp8 kernel (src/kernels/cuda/absorbed/swap_layout.h): each is
// a bijection with the inverse the kernel writes its B operands by, and each thread's register
// fragments come from whole 16-byte runs of a raw key row, as the kernel's loads assume.
#include <gtest/gtest.h>

#include <set>

#include "kernels/cuda/absorbed/swap_layout.h"

namespace mla::cuda::absorbed::swap {
namespace {

TEST(SwapLayout, QkDimsAreAPermutationWithItsSlotInverse) {
  std::set<int> dims;
  for (int b = 0; b < 9; ++b)
    for (int s = 0; s < 4; ++s)
      for (int kk = 0; kk < 16; ++kk) {
        const int d = qk_dim(b, s, kk);
        ASSERT_GE(d, 64 * b);
        ASSERT_LT(d, 64 * b + 64);  // a k-step's dims stay inside its 64-dim block
        EXPECT_EQ(qk_slot(d), 64 * b + 16 * s + kk) << b << " " << s << " " << kk;
        dims.insert(d);
      }
  EXPECT_EQ(dims.size(), 576u);
  // An even dim and the next sit in adjacent slots (Q is copied in 4-byte pairs).
  for (int d = 0; d < 576; d += 2) EXPECT_EQ(qk_slot(d + 1), qk_slot(d) + 1) << d;
}

TEST(SwapLayout, QkFragmentsOfAThreadAreItsSixteenBytes) {
  // Thread q of the fragment layout holds k indices 2q, 2q + 1 (a[0] / a[1]) and 2q + 8, 2q + 9
  // (a[2] / a[3]) of each k-step; over the 4 k-steps of a block they are bytes 16 q .. 16 q + 15
  // of the block, byte 4 s + 2 h + i for k-step s, pair h, element i.
  for (int b = 0; b < 9; ++b)
    for (int q = 0; q < 4; ++q)
      for (int s = 0; s < 4; ++s)
        for (int h = 0; h < 2; ++h)
          for (int i = 0; i < 2; ++i) {
            EXPECT_EQ(qk_dim(b, s, 2 * q + 8 * h + i), 64 * b + 16 * q + 4 * s + 2 * h + i);
          }
}

TEST(SwapLayout, PvKeysAreAPermutationWithItsSlotInverse) {
  std::set<int> keys;
  for (int kk = 0; kk < 16; ++kk) {
    keys.insert(pv_key(kk));
    EXPECT_EQ(pv_slot(pv_key(kk)), kk) << kk;
  }
  EXPECT_EQ(keys.size(), 16u);
  // Thread q's keys are q, q + 4, q + 8, q + 12: one warp-wide load reads 4 consecutive rows.
  for (int q = 0; q < 4; ++q) {
    EXPECT_EQ(pv_key(2 * q), q);
    EXPECT_EQ(pv_key(2 * q + 1), q + 4);
    EXPECT_EQ(pv_key(2 * q + 8), q + 8);
    EXPECT_EQ(pv_key(2 * q + 9), q + 12);
  }
}

TEST(SwapLayout, PvDimsAreAPermutationAndAThreadsSixteenAreContiguous) {
  std::set<int> dims;
  for (int mt = 0; mt < kSwapMTiles; ++mt)
    for (int r = 0; r < 64; ++r) dims.insert(pv_dim(mt, r));
  EXPECT_EQ(dims.size(), 512u);
  EXPECT_EQ(*dims.rbegin(), 511);
  // Warp w's thread g holds rows 16 w + g (lo) and + 8 (hi) of each m-tile: dims 16 (8 w + g)
  // + 2 mt + hi, i.e. the 16 bytes of one aligned 16-byte run of a key row.
  for (int w = 0; w < 4; ++w)
    for (int g = 0; g < 8; ++g) {
      std::set<int> mine;
      for (int mt = 0; mt < kSwapMTiles; ++mt) {
        EXPECT_EQ(pv_dim(mt, 16 * w + g), 16 * (8 * w + g) + 2 * mt);
        EXPECT_EQ(pv_dim(mt, 16 * w + g + 8), 16 * (8 * w + g) + 2 * mt + 1);
        mine.insert(pv_dim(mt, 16 * w + g));
        mine.insert(pv_dim(mt, 16 * w + g + 8));
      }
      EXPECT_EQ(*mine.begin(), 16 * (8 * w + g));
      EXPECT_EQ(*mine.rbegin(), 16 * (8 * w + g) + 15);
    }
}

}  // namespace
}  // namespace mla::cuda::absorbed::swap
