// The CUDA MHA op's host planner (src/kernels/cuda/mha/plan.cc): a pure host function, built and
// tested in every configuration, GPU or not. Every query row is covered by exactly one tile, tiles
// never cross a request, carry the causal diagonal and come heaviest first; capacity and malformed
// indptr errors name the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "conformance/case_gen.h"
#include "conformance/conformance.h"
#include "kernels/cuda/mha/params.h"
#include "kernels/cuda/mha/plan.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

using cuda::mha::MhaPlanHeader;
using cuda::mha::MhaTile;

std::vector<MhaTile> decode_tiles(const std::vector<std::byte>& plan, MhaPlanHeader* header) {
  std::memcpy(header, plan.data(), sizeof(*header));
  std::vector<MhaTile> tiles(static_cast<std::size_t>(header->num_tiles));
  if (!tiles.empty()) {
    std::memcpy(tiles.data(), plan.data() + sizeof(*header), tiles.size() * sizeof(MhaTile));
  }
  return tiles;
}

TEST(CudaMhaPlan, EveryQueryRowCoveredOnceHeaviestFirst) {
  Rng rng(mix_seed(base_seed(), 0x3a11));
  for (int trial = 0; trial < 50; ++trial) {
    const bool causal = trial % 2 == 0;
    const int bs = static_cast<int>(rng.uniform_int(1, 9));
    std::vector<int32_t> qo{0}, kv{0};
    for (int b = 0; b < bs; ++b) {
      const auto q = static_cast<int32_t>(rng.uniform_int(0, 400));
      const auto k =
          static_cast<int32_t>(causal ? q + rng.uniform_int(0, 300) : rng.uniform_int(0, 700));
      qo.push_back(qo.back() + q);
      kv.push_back(kv.back() + k);
    }
    const AttnCapacity cap{bs + 2, qo.back() + 5, kv.back(), 1, 16};
    std::vector<std::byte> plan(cuda::mha::plan_bytes(cap));
    const MhaProblem problem{16, causal, qo, kv};
    auto used = cuda::mha::build_plan(problem, cap, plan);
    ASSERT_TRUE(used.ok()) << used.status().to_string();
    MhaPlanHeader header{};
    const std::vector<MhaTile> tiles = decode_tiles(plan, &header);
    EXPECT_EQ(*used, sizeof(MhaPlanHeader) + tiles.size() * sizeof(MhaTile));
    EXPECT_EQ(header.num_heads, 16);
    EXPECT_EQ(header.batch_size, bs);
    EXPECT_GE(header.head_group, 1);
    EXPECT_LE(header.head_group, 16);
    const int64_t budget = causal ? 65536 : 32768;
    EXPECT_EQ(header.head_group, std::clamp<int64_t>(budget / std::max(kv.back(), 1), 1, 16));
    std::vector<int> covered(static_cast<std::size_t>(qo.back()), 0);
    int prev_keys = 1 << 30;
    for (const MhaTile& t : tiles) {
      ASSERT_GE(t.q_rows, 1);
      ASSERT_LE(t.q_rows, 128);
      const auto b =
          static_cast<int>(std::upper_bound(qo.begin(), qo.end(), t.q_start) - qo.begin() - 1);
      ASSERT_LE(t.q_start + t.q_rows, qo[b + 1]) << "tile crosses a request boundary";
      EXPECT_EQ(t.kv_start, kv[b]);
      EXPECT_EQ(t.kv_len, kv[b + 1] - kv[b]);
      const int32_t q_len = qo[b + 1] - qo[b];
      const int32_t expect_diag =
          causal ? t.kv_len - q_len + (t.q_start - qo[b]) : cuda::mha::kNoDiag;
      EXPECT_EQ(t.diag, expect_diag);
      for (int i = 0; i < t.q_rows; ++i) ++covered[static_cast<std::size_t>(t.q_start + i)];
      const int keys = causal ? std::clamp(t.diag + t.q_rows, 0, t.kv_len) : t.kv_len;
      EXPECT_LE(keys, prev_keys) << "tiles must be sorted by descending key count";
      prev_keys = keys;
    }
    for (std::size_t r = 0; r < covered.size(); ++r) {
      ASSERT_EQ(covered[r], 1) << "query row " << r << " trial " << trial;
    }
  }
}

// head_group: about 64K (causal) or 32K (non-causal) keys x heads in flight, 1 .. 16 heads.
TEST(CudaMhaPlan, HeadGroupFollowsTheKeysInFlight) {
  struct Case {
    bool causal;
    std::vector<int32_t> q_lens, kv_lens;
    int32_t expect;
  };
  const std::vector<Case> cases{
      {true, {4096}, {4096}, 16},  // the prefill shapes of mla bench
      {true, {2048, 2048, 2048, 2048}, {2048, 2048, 2048, 2048}, 8},
      {true, {16384}, {16384}, 4},
      {false, {4096}, {16384}, 2},  // a prefix chunk
      {false, {4096}, {32768}, 1},
      {true, {100}, {70000}, 1},  // never below one head
      {false, {5}, {0}, 16},      // no keys at all
  };
  for (const Case& c : cases) {
    std::vector<int32_t> qo{0}, kv{0};
    for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
      qo.push_back(qo.back() + c.q_lens[b]);
      kv.push_back(kv.back() + c.kv_lens[b]);
    }
    const auto bs = static_cast<int>(c.q_lens.size());
    const AttnCapacity cap{bs, qo.back(), kv.back(), 1, 128};
    std::vector<std::byte> plan(cuda::mha::plan_bytes(cap));
    auto used = cuda::mha::build_plan(MhaProblem{128, c.causal, qo, kv}, cap, plan);
    ASSERT_TRUE(used.ok()) << used.status().to_string();
    MhaPlanHeader header{};
    decode_tiles(plan, &header);
    EXPECT_EQ(header.head_group, c.expect) << "causal " << c.causal << ", " << kv.back() << " keys";
  }
}

TEST(CudaMhaPlan, RejectsProblemsBeyondCapacity) {
  const std::vector<int32_t> qo{0, 100, 300};
  const std::vector<int32_t> kv{0, 100, 300};
  const MhaProblem problem{16, true, qo, kv};
  std::vector<std::byte> plan(1 << 16);
  auto too_many_tokens = cuda::mha::build_plan(problem, AttnCapacity{4, 299, 1000, 1, 16}, plan);
  ASSERT_FALSE(too_many_tokens.ok());
  EXPECT_EQ(too_many_tokens.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many_tokens.status().message().find("max_q_tokens"), std::string::npos);
  auto too_many_requests = cuda::mha::build_plan(problem, AttnCapacity{1, 300, 1000, 1, 16}, plan);
  ASSERT_FALSE(too_many_requests.ok());
  EXPECT_NE(too_many_requests.status().message().find("max_batch"), std::string::npos);
  std::vector<std::byte> small(sizeof(MhaPlanHeader) + sizeof(MhaTile));
  auto short_buffer = cuda::mha::build_plan(problem, AttnCapacity{4, 300, 1000, 1, 16}, small);
  ASSERT_FALSE(short_buffer.ok());
  EXPECT_EQ(short_buffer.status().code(), StatusCode::kOutOfWorkspace);
  const std::vector<int32_t> bad_qo{0, 100, 50};
  auto decreasing = cuda::mha::build_plan(MhaProblem{16, true, bad_qo, kv},
                                          AttnCapacity{4, 300, 1000, 1, 16}, plan);
  ASSERT_FALSE(decreasing.ok());
  EXPECT_NE(decreasing.status().message().find("qo_indptr[2]"), std::string::npos);
}

}  // namespace
}  // namespace mla::testing
