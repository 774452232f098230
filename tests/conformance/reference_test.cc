// The double reference checked against dense attention and against closed-form answers.
#include "conformance/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "conformance/case_gen.h"
#include "conformance/compare.h"

namespace mla::testing {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

TEST(Reference, DenseSingleKeyIsThatKeysValue) {
  // One query, one key: softmax weight 1, so o = v and lse = scale * q.k exactly.
  std::vector<float> q = {1.0f, 2.0f}, k = {0.5f, -1.0f}, v = {3.0f, -4.0f, 5.0f};
  RefAttention r = dense_attention(q, k, v, 1, 1, 1, 1, 2, 3, 0.5, true);
  EXPECT_DOUBLE_EQ(r.o[0], 3.0);
  EXPECT_DOUBLE_EQ(r.o[1], -4.0);
  EXPECT_DOUBLE_EQ(r.o[2], 5.0);
  EXPECT_DOUBLE_EQ(r.lse[0], 0.5 * (0.5 - 2.0));
}

TEST(Reference, DenseEqualLogitsAverageValues) {
  // Two keys with equal logits: o is the mean of the values, lse = logit + ln 2.
  std::vector<float> q = {1.0f}, k = {2.0f, 2.0f}, v = {1.0f, 3.0f};
  RefAttention r = dense_attention(q, k, v, 1, 2, 1, 1, 1, 1, 1.0, false);
  EXPECT_DOUBLE_EQ(r.o[0], 2.0);
  EXPECT_NEAR(r.lse[0], 2.0 + std::log(2.0), 1e-15);
}

TEST(Reference, DenseCausalIsBottomRightAligned) {
  // q_len 2, kv_len 3: query 0 sees keys 0..1, query 1 sees 0..2. Zero q: equal weights.
  std::vector<float> q(2, 0.0f), k(3, 1.0f), v = {1.0f, 2.0f, 6.0f};
  RefAttention r = dense_attention(q, k, v, 2, 3, 1, 1, 1, 1, 1.0, true);
  EXPECT_DOUBLE_EQ(r.o[0], 1.5);
  EXPECT_DOUBLE_EQ(r.o[1], 3.0);
  EXPECT_NEAR(r.lse[0], std::log(2.0), 1e-15);
  EXPECT_NEAR(r.lse[1], std::log(3.0), 1e-15);
}

TEST(Reference, AbsorbedPagedEqualsDenseMqa) {
  for (int page : {1, 16, 64}) {
    Rng rng(100 + page);
    const std::vector<int32_t> kv_lens = {page + 1, 3, 2 * page - 1}, q_lens = {2, 1, 3};
    PagedLayout layout = make_paged_layout(kv_lens, page, true, rng);
    for (DType dt : {DType::kBF16, DType::kFP8E4M3}) {
      const float scale = dt == DType::kFP8E4M3 ? 0.05f : 3.0f;  // bf16: must be ignored
      LatentCache cache = make_latent_cache(layout, dt, scale, rng);
      const int heads = 4;
      std::vector<float> q = to_float(random_bf16(6 * heads * 576, rng));
      AbsorbedRefProblem p;
      p.num_heads = heads;
      p.page_size = page;
      p.sm_scale = 0.135;
      p.cache_dtype = dt;
      p.k_scale = scale;
      p.row_stride = layout.max_context_len;
      p.req_to_token = layout.req_to_token;
      p.req_rows = layout.req_rows;
      p.q_lens = q_lens;
      p.kv_lens = kv_lens;
      RefAttention paged = reference_absorbed(p, q, cache.stored);
      // The block-table form of the same pages gives the same result, to the bit.
      AbsorbedRefProblem pb = p;
      pb.req_to_token = {};
      pb.block_table = layout.block_table;
      pb.row_stride = layout.max_blocks;
      RefAttention blocks = reference_absorbed(pb, q, cache.stored);
      EXPECT_EQ(blocks.o, paged.o) << "page " << page;
      EXPECT_EQ(blocks.lse, paged.lse) << "page " << page;
      int64_t q0 = 0;
      for (int b = 0; b < 3; ++b) {
        // Gather this request's rows by walking pages by hand, dequantise, run dense MQA.
        std::vector<float> kv, vv;
        for (int i = 0; i < kv_lens[b]; ++i) {
          const int32_t page_first =
              layout.req_to_token[layout.req_rows[b] * layout.max_context_len + (i / page) * page];
          const int64_t slot = page == 1 ? page_first : page_first + i % page;
          for (int d = 0; d < 576; ++d) {
            const float s = cache.stored[slot * 576 + d];
            const float x = dt == DType::kFP8E4M3 ? static_cast<float>(s * double{scale}) : s;
            kv.push_back(x);
            if (d < 512) vv.push_back(x);
          }
        }
        RefAttention dense = dense_attention(
            std::span<const float>(q).subspan(q0 * heads * 576, q_lens[b] * heads * 576), kv, vv,
            q_lens[b], kv_lens[b], heads, 1, 576, 512, 0.135, true);
        std::vector<double> po(paged.o.begin() + q0 * heads * 512,
                               paged.o.begin() + (q0 + q_lens[b]) * heads * 512);
        std::vector<double> pl(paged.lse.begin() + q0 * heads,
                               paged.lse.begin() + (q0 + q_lens[b]) * heads);
        // fp8: the dense side rounds stored * scale to float; allow that rounding.
        EXPECT_LT(max_abs_diff(po, dense.o), 1e-6) << "page " << page << " request " << b;
        EXPECT_LT(max_abs_diff(pl, dense.lse), 1e-6) << "page " << page << " request " << b;
        q0 += q_lens[b];
      }
    }
  }
}

TEST(Reference, SplitKeysMergeToSinglePass) {
  // Non-causal attention over keys [0, n) equals the merge of [0, s) and [s, n): the identity
  // the chunked-prefix path relies on, including an empty part (lse -inf).
  Rng rng(7);
  const int heads = 2, dqk = 8, dv = 4, n = 9, tq = 3;
  std::vector<float> q = to_float(random_bf16(tq * heads * dqk, rng));
  std::vector<float> k = to_float(random_bf16(n * heads * dqk, rng));
  std::vector<float> v = to_float(random_bf16(n * heads * dv, rng));
  RefAttention whole = dense_attention(q, k, v, tq, n, heads, heads, dqk, dv, 0.3, false);
  for (int s : {0, 4, 9}) {
    RefAttention a = dense_attention(q, std::span<const float>(k).first(s * heads * dqk),
                                     std::span<const float>(v).first(s * heads * dv), tq, s, heads,
                                     heads, dqk, dv, 0.3, false);
    RefAttention b = dense_attention(q, std::span<const float>(k).subspan(s * heads * dqk),
                                     std::span<const float>(v).subspan(s * heads * dv), tq, n - s,
                                     heads, heads, dqk, dv, 0.3, false);
    RefAttention m = reference_merge(a.o, a.lse, b.o, b.lse, tq * heads, dv);
    EXPECT_LT(max_abs_diff(m.o, whole.o), 1e-6) << "split " << s;
    EXPECT_LT(max_abs_diff(m.lse, whole.lse), 1e-6) << "split " << s;
  }
}

TEST(Reference, MergeOfTwoEmptyRowsIsEmpty) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> oa = {5, 6}, ob = {7, 8}, la = {-inf}, lb = {-inf};
  RefAttention m = reference_merge(oa, la, ob, lb, 1, 2);
  EXPECT_EQ(m.o[0], 0.0);
  EXPECT_EQ(m.o[1], 0.0);
  EXPECT_EQ(m.lse[0], kNegInf);
}

TEST(Reference, KvWriteScalesOnlyFp8) {
  std::vector<float> c_kv(512, 2.0f), k_pe(64, -1.0f);
  auto bf = reference_kv_write(c_kv, k_pe, 1, DType::kBF16, 4.0f);
  auto f8 = reference_kv_write(c_kv, k_pe, 1, DType::kFP8E4M3, 4.0f);
  EXPECT_EQ(bf[0], 2.0);
  EXPECT_EQ(bf[575], -1.0);
  EXPECT_EQ(f8[0], 0.5);
  EXPECT_EQ(f8[575], -0.25);
}

TEST(ComparePolicy, FlagsMismatchedNonFiniteAndReportsWorstIndex) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> ref = {1.0, kNegInf, nan, 2.0};
  std::vector<float> same = {1.0f, -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(), 2.0f};
  EXPECT_TRUE(compare_values("x", same, ref, default_tolerance(DType::kBF16)).ok);
  std::vector<float> finite_for_inf = same;
  finite_for_inf[1] = -100.0f;
  Comparison c = compare_values("x", finite_for_inf, ref, default_tolerance(DType::kBF16));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.worst_index, 1);
  std::vector<float> off = same;
  off[3] = 2.5f;
  c = compare_values("lse", off, ref, lse_tolerance());
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.worst_index, 3);
  EXPECT_NE(c.message.find("lse"), std::string::npos);
}

TEST(ComparePolicy, GlobalBoundCatchesSmallSystematicError) {
  // Every element is within abs 1e-2, but all are off by 2 %: the global bound catches it.
  std::vector<double> ref(100, 0.4);
  std::vector<float> out(100, 0.4f * 1.019f);
  Comparison c = compare_values("o", out, ref, default_tolerance(DType::kBF16));
  EXPECT_FALSE(c.ok);
  EXPECT_GT(c.global_rel_err, 1e-2);
}

}  // namespace
}  // namespace mla::testing
