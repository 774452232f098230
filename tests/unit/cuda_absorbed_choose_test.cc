// The CUDA absorbed op's kernel chooser (a host function, built without CUDA too): its whole
// table, its errors, and the properties the op relies on (the kernel depends on neither q_len
// nor the page, so a captured graph replays the same kernel after a re-plan; the tile rows and
// the load path do not depend on the cache dtype, so one plan serves either cache).
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/absorbed/choose.h"

namespace mla {
namespace {

using cuda::absorbed::AbsorbedKernel;
using cuda::absorbed::choose_kernel;
using cuda::absorbed::KernelChoice;

// Every head count 1..128 runs (FlashMLA's test covers 1, 3, 9, 63, 126; TP16 gives 8).
constexpr int kHeads[] = {1, 3, 8, 9, 16, 32, 63, 64, 126, 128};
constexpr int kPages[] = {1, 16, 32, 64, 128};
constexpr int kQLens[] = {1, 2, 3, 4, 5, 8, 16, 64};

TEST(CudaAbsorbedChoose, Table) {
  for (int heads : kHeads) {
    for (int page : kPages) {
      for (int q_len : kQLens) {
        const std::string at = "heads " + std::to_string(heads) + " page " + std::to_string(page) +
                               " q_len " + std::to_string(q_len);
        const auto bf = choose_kernel(heads, q_len, page, DType::kBF16);
        const auto f8 = choose_kernel(heads, q_len, page, DType::kFP8E4M3);
        ASSERT_TRUE(bf.ok()) << at << ": " << bf.status().to_string();
        ASSERT_TRUE(f8.ok()) << at << ": " << f8.status().to_string();
        EXPECT_EQ(bf->kernel, AbsorbedKernel::kSm90) << at;
        EXPECT_EQ(f8->kernel, AbsorbedKernel::kSm90Fp8) << at;
        // Tile rows: the smallest of 16 / 32 / 64 holding heads x q_len; at most 64 rows, so a
        // request of heads x q_len <= 64 is one tile (its keys are read once).
        const int rows = heads * q_len;
        const int want = rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
        EXPECT_EQ(bf->tile_rows, want) << at;
        EXPECT_EQ(f8->tile_rows, bf->tile_rows) << at;
        // TMA boxes of 64 key rows for pages of 64 and more, cp.async below.
        EXPECT_EQ(bf->tma_box_rows, page >= 64 ? 64 : 0) << at;
        EXPECT_EQ(f8->tma_box_rows, bf->tma_box_rows) << at;
        EXPECT_NE(std::string(bf->name), "") << at;
      }
    }
  }
}

TEST(CudaAbsorbedChoose, KernelDependsOnlyOnTheCacheDtype) {
  for (DType dt : {DType::kBF16, DType::kFP8E4M3}) {
    const auto first = choose_kernel(16, 1, 1, dt);
    ASSERT_TRUE(first.ok());
    for (int heads : kHeads) {
      for (int page : kPages) {
        for (int q_len : kQLens) {
          const auto c = choose_kernel(heads, q_len, page, dt);
          ASSERT_TRUE(c.ok());
          EXPECT_EQ(c->kernel, first->kernel) << heads << " " << page << " " << q_len;
          // run() looks the entry up from the cache dtype instead of choosing again.
          EXPECT_EQ(c->kernel, cuda::absorbed::kernel_for_cache(dt));
        }
      }
    }
  }
}

TEST(CudaAbsorbedChoose, RejectsWhatNoKernelRunsNamingTheField) {
  struct Bad {
    int heads, q_len, page;
    DType dt;
    const char* field;
  };
  const Bad bad[] = {
      {0, 1, 64, DType::kBF16, "num_heads = 0"},
      {-3, 1, 64, DType::kBF16, "num_heads = -3"},
      {129, 1, 64, DType::kBF16, "num_heads = 129"},
      {256, 1, 64, DType::kBF16, "num_heads = 256"},
      {16, 1, 8, DType::kBF16, "page_size = 8"},
      {16, 1, 256, DType::kBF16, "page_size = 256"},
      {16, 0, 64, DType::kBF16, "q_len = 0"},
      {16, 1, 64, DType::kF32, "f32"},
      {16, 1, 64, DType::kI32, "i32"},
  };
  for (const Bad& b : bad) {
    const auto c = choose_kernel(b.heads, b.q_len, b.page, b.dt);
    ASSERT_FALSE(c.ok()) << b.field;
    EXPECT_EQ(c.status().code(), StatusCode::kUnsupported) << b.field;
    EXPECT_NE(c.status().message().find(b.field), std::string::npos)
        << c.status().to_string() << " should name " << b.field;
  }
}

}  // namespace
}  // namespace mla
