// Forward batch validation: valid batches of every mode pass; every malformed field of every
// mode is rejected with kInvalidArgument and a message naming the field, index and value.
// Derived lengths (q_len, kv_len, num_tokens, has_prefix) and finalize_batch.
#include "mla/batch.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "mla/kv_pool.h"
#include "unit_util.h"

namespace mla {
namespace {

BatchLimits test_limits() {
  BatchLimits l;
  l.max_requests = 8;
  l.max_context_len = 64;
  l.page_size = 16;
  l.num_slots = 20 * 16;  // slots 0..319
  l.max_draft_tokens = 4;
  return l;
}

std::vector<int32_t> slots(int n, int32_t first) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// One valid batch per mode (request b = index 1 is the one the rejection cases break).
ForwardBatch valid_batch(ForwardMode mode) {
  ForwardBatch b;
  b.mode = mode;
  switch (mode) {
    case ForwardMode::kDecode:
      b.batch_size = 3;
      b.req_pool_indices = {1, 2, 0};
      b.seq_lens = {5, 1, 64};
      b.out_cache_loc = {20, 33, 0};
      break;
    case ForwardMode::kExtend:
      b.batch_size = 3;
      b.req_pool_indices = {1, 2, 3};
      b.extend_prefix_lens = {0, 16, 3};
      b.extend_seq_lens = {4, 6, 0};
      b.seq_lens = {4, 22, 3};
      b.out_cache_loc = slots(10, 100);
      break;
    case ForwardMode::kMixed:
      b.batch_size = 3;
      b.req_pool_indices = {4, 5, 6};
      b.extend_prefix_lens = {10, 20, 0};
      b.extend_seq_lens = {5, 1, 7};
      b.seq_lens = {15, 21, 7};
      b.out_cache_loc = slots(13, 50);
      break;
    case ForwardMode::kTargetVerify:
      b.batch_size = 2;
      b.req_pool_indices = {7, 8};
      b.seq_lens = {10, 61};
      b.num_draft_tokens = 3;
      b.out_cache_loc = slots(6, 200);
      break;
    case ForwardMode::kDraftExtend:
      b.batch_size = 2;
      b.req_pool_indices = {2, 3};
      b.extend_prefix_lens = {10, 7};
      b.extend_seq_lens = {2, 3};
      b.seq_lens = {12, 10};
      b.out_cache_loc = slots(5, 300);
      break;
    case ForwardMode::kIdle:
      break;
  }
  finalize_batch(b);
  return b;
}

const ForwardMode kAllModes[] = {ForwardMode::kDecode,      ForwardMode::kExtend,
                                 ForwardMode::kMixed,       ForwardMode::kTargetVerify,
                                 ForwardMode::kDraftExtend, ForwardMode::kIdle};

TEST(ValidateBatch, ValidBatchOfEveryModePasses) {
  for (ForwardMode m : kAllModes) {
    const ForwardBatch b = valid_batch(m);
    const Status s = validate_batch(b, test_limits());
    EXPECT_TRUE(s.ok()) << forward_mode_name(m) << ": " << s.to_string();
  }
}

TEST(ValidateBatch, DecodeAndVerifyAcceptEmptyExtendVectors) {
  for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kTargetVerify}) {
    ForwardBatch b = valid_batch(m);
    b.extend_prefix_lens.clear();
    b.extend_seq_lens.clear();
    EXPECT_TRUE(validate_batch(b, test_limits()).ok()) << forward_mode_name(m);
  }
}

TEST(ValidateBatch, EmptyBatchesPass) {
  for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kTargetVerify}) {
    ForwardBatch b;
    b.mode = m;
    b.num_draft_tokens = m == ForwardMode::kTargetVerify ? 2 : 0;
    EXPECT_TRUE(validate_batch(b, test_limits()).ok()) << forward_mode_name(m);
  }
}

TEST(ValidateBatch, ZeroLengthExtendAndPaddingRowPass) {
  ForwardBatch b;
  b.mode = ForwardMode::kExtend;
  b.batch_size = 2;
  b.req_pool_indices = {0, 1};
  b.extend_prefix_lens = {0, 5};
  b.extend_seq_lens = {0, 0};
  b.seq_lens = {0, 5};
  finalize_batch(b);
  EXPECT_TRUE(validate_batch(b, test_limits()).ok());
  EXPECT_EQ(b.num_tokens(), 0);
  EXPECT_EQ(b.kv_len(0), 0);
}

// Padded CUDA-graph requests share request row 0 (and the dummy page's slots); repeating them is
// not a duplicate. A rejected duplicate leaves the next batch unaffected.
TEST(ValidateBatch, PaddingRowMayRepeat) {
  ForwardBatch b;
  b.mode = ForwardMode::kDecode;
  b.batch_size = 4;
  b.req_pool_indices = {3, 0, 0, 0};
  b.seq_lens = {7, 1, 1, 1};
  b.out_cache_loc = {40, 0, 0, 15};
  finalize_batch(b);
  EXPECT_TRUE(validate_batch(b, test_limits()).ok());
  ForwardBatch dup = b;
  dup.req_pool_indices = {3, 0, 3, 0};
  EXPECT_FALSE(validate_batch(dup, test_limits()).ok());
  EXPECT_TRUE(validate_batch(b, test_limits()).ok());  // nothing left over from the rejection
}

struct RejectCase {
  std::string name;
  ForwardMode mode;
  std::function<void(ForwardBatch&, BatchLimits&)> mutate;
  std::vector<std::string> must_contain;  // the field with its index, and the values
};

void PrintTo(const RejectCase& c, std::ostream* os) { *os << c.name; }

// Rejections every non-idle mode shares (applied to request 1).
void add_common_cases(ForwardMode m, std::vector<RejectCase>& out) {
  const std::string mode(forward_mode_name(m));
  auto add = [&](std::string name, std::function<void(ForwardBatch&, BatchLimits&)> f,
                 std::vector<std::string> texts) {
    out.push_back({mode + "_" + name, m, std::move(f), std::move(texts)});
  };
  add("BatchSizeNegative", [](ForwardBatch& b, BatchLimits&) { b.batch_size = -1; },
      {"batch_size = -1"});
  add("ReqPoolIndicesSize", [](ForwardBatch& b, BatchLimits&) { b.req_pool_indices.pop_back(); },
      {"req_pool_indices has", "batch_size ="});
  add("ReqPoolIndicesNegative", [](ForwardBatch& b, BatchLimits&) { b.req_pool_indices[1] = -1; },
      {"req_pool_indices[1] = -1", "0..8"});
  add("ReqPoolIndicesTooLarge", [](ForwardBatch& b, BatchLimits&) { b.req_pool_indices[1] = 9; },
      {"req_pool_indices[1] = 9", "0..8"});
  add("SeqLensSize", [](ForwardBatch& b, BatchLimits&) { b.seq_lens.push_back(3); },
      {"seq_lens has", "batch_size ="});
  add("SeqLensNegative",
      [](ForwardBatch& b, BatchLimits&) {
        b.seq_lens[1] = -4;
        if (!b.extend_prefix_lens.empty()) b.extend_prefix_lens[1] = 0;
      },
      {"seq_lens[1] = -4"});
  add("OutCacheLocSize", [](ForwardBatch& b, BatchLimits&) { b.out_cache_loc.push_back(1); },
      {"out_cache_loc has", "expected"});
  add("OutCacheLocNegative", [](ForwardBatch& b, BatchLimits&) { b.out_cache_loc[1] = -1; },
      {"out_cache_loc[1] = -1", "num_slots = 320"});
  add("OutCacheLocBeyondSlots", [](ForwardBatch& b, BatchLimits&) { b.out_cache_loc[1] = 320; },
      {"out_cache_loc[1] = 320", "num_slots = 320"});
  add("SeqLensSum", [](ForwardBatch& b, BatchLimits&) { b.seq_lens_sum += 1; },
      {"seq_lens_sum =", "sum(seq_lens)"});
  add("PageSize", [](ForwardBatch&, BatchLimits& l) { l.page_size = 8; }, {"page_size = 8"});
  add("ExtendPrefixLensSize",
      [](ForwardBatch& b, BatchLimits&) { b.extend_prefix_lens.push_back(0); },
      {"extend_prefix_lens has", "batch_size ="});
  add("ExtendSeqLensSize", [](ForwardBatch& b, BatchLimits&) { b.extend_seq_lens.pop_back(); },
      {"extend_seq_lens has", "batch_size ="});
  if (m != ForwardMode::kTargetVerify) {
    add("NumDraftTokensOutsideVerify",
        [](ForwardBatch& b, BatchLimits&) { b.num_draft_tokens = 2; },
        {"num_draft_tokens = 2", mode});
  }
}

std::vector<RejectCase> reject_cases() {
  std::vector<RejectCase> out;
  using F = ForwardBatch;
  using L = BatchLimits;
  for (ForwardMode m : kAllModes) {
    if (m != ForwardMode::kIdle) add_common_cases(m, out);
  }
  // Decode.
  const ForwardMode D = ForwardMode::kDecode;
  out.push_back({"decode_SeqLensZero",
                 D,
                 [](F& b, L&) {
                   b.seq_lens[1] = 0;
                   b.extend_prefix_lens[1] = -1;
                 },
                 {"seq_lens[1] = 0", "must be >= 1"}});
  out.push_back({"decode_SeqLensBeyondContext",
                 D,
                 [](F& b, L&) {
                   b.seq_lens[1] = 65;
                   b.extend_prefix_lens[1] = 64;
                 },
                 {"seq_lens[1] = 65", "max_context_len = 64"}});
  out.push_back({"decode_ExtendSeqLensNotOne",
                 D,
                 [](F& b, L&) { b.extend_seq_lens[1] = 2; },
                 {"extend_seq_lens[1] = 2", "must be 1"}});
  out.push_back({"decode_ExtendPrefixLensNotSeqMinusOne",
                 D,
                 [](F& b, L&) { b.extend_prefix_lens[1] = 1; },
                 {"extend_prefix_lens[1] = 1", "seq_lens[1] - 1 = 0"}});
  out.push_back({"decode_ExtendVectorsHalfGiven",
                 D,
                 [](F& b, L&) { b.extend_seq_lens.clear(); },
                 {"extend_seq_lens has 0 entries", "batch_size = 3"}});
  // Extend-like modes with explicit extend vectors.
  for (ForwardMode m : {ForwardMode::kExtend, ForwardMode::kMixed, ForwardMode::kDraftExtend}) {
    const std::string mode(forward_mode_name(m));
    out.push_back({mode + "_ExtendPrefixLensNegative",
                   m,
                   [](F& b, L&) { b.extend_prefix_lens[1] = -2; },
                   {"extend_prefix_lens[1] = -2"}});
    out.push_back({mode + "_ExtendSeqLensNegative",
                   m,
                   [](F& b, L&) { b.extend_seq_lens[1] = -3; },
                   {"extend_seq_lens[1] = -3"}});
    out.push_back({mode + "_SeqLensBelowPrefix",
                   m,
                   [](F& b, L&) {
                     b.seq_lens[1] = 3;
                     b.extend_prefix_lens[1] = 5;
                   },
                   {"seq_lens[1] = 3 is below extend_prefix_lens[1] = 5"}});
    out.push_back({mode + "_SeqLensNotPrefixPlusExtend",
                   m,
                   [](F& b, L&) { b.seq_lens[1] += 1; },
                   {fmt::format("seq_lens[1] = {}", valid_batch(m).seq_lens[1] + 1),
                    "extend_prefix_lens[1] + extend_seq_lens[1]"}});
    out.push_back({mode + "_SeqLensBeyondContext",
                   m,
                   [](F& b, L&) {
                     b.seq_lens[1] = 66;
                     b.extend_prefix_lens[1] = 66 - b.extend_seq_lens[1];
                   },
                   {"seq_lens[1] = 66", "max_context_len = 64"}});
    out.push_back({mode + "_ExtendVectorsMissing",
                   m,
                   [](F& b, L&) {
                     b.extend_prefix_lens.clear();
                     b.extend_seq_lens.clear();
                   },
                   {"extend_prefix_lens has 0 entries"}});
  }
  // Target verify.
  const ForwardMode V = ForwardMode::kTargetVerify;
  out.push_back({"target_verify_NumDraftTokensZero",
                 V,
                 [](F& b, L&) { b.num_draft_tokens = 0; },
                 {"num_draft_tokens = 0", "1..4"}});
  out.push_back({"target_verify_NumDraftTokensAboveMax",
                 V,
                 [](F& b, L&) { b.num_draft_tokens = 5; },
                 {"num_draft_tokens = 5", "1..4"}});
  out.push_back({"target_verify_KvLenBeyondContext",
                 V,
                 [](F& b, L&) {
                   b.seq_lens[1] = 62;
                   b.extend_prefix_lens[1] = 62;
                 },
                 {"seq_lens[1] + num_draft_tokens = 62 + 3 = 65", "max_context_len = 64"}});
  out.push_back({"target_verify_ExtendSeqLensNotDrafts",
                 V,
                 [](F& b, L&) { b.extend_seq_lens[1] = 2; },
                 {"extend_seq_lens[1] = 2", "num_draft_tokens = 3"}});
  out.push_back({"target_verify_ExtendPrefixLensNotSeqLens",
                 V,
                 [](F& b, L&) { b.extend_prefix_lens[1] = 64; },
                 {"extend_prefix_lens[1] = 64", "seq_lens[1] = 61"}});
  // Idle.
  const ForwardMode I = ForwardMode::kIdle;
  out.push_back(
      {"idle_BatchSizeNonZero", I, [](F& b, L&) { b.batch_size = 1; }, {"batch_size = 1", "idle"}});
  out.push_back(
      {"idle_SeqLensNonEmpty", I, [](F& b, L&) { b.seq_lens = {3}; }, {"seq_lens has 1 entries"}});
  out.push_back({"idle_OutCacheLocNonEmpty",
                 I,
                 [](F& b, L&) { b.out_cache_loc = {3}; },
                 {"out_cache_loc has 1 entries"}});
  out.push_back({"idle_ExtendSeqLensNonEmpty",
                 I,
                 [](F& b, L&) { b.extend_seq_lens = {1}; },
                 {"extend_seq_lens has 1 entries"}});
  out.push_back({"idle_NumDraftTokens",
                 I,
                 [](F& b, L&) { b.num_draft_tokens = 1; },
                 {"num_draft_tokens = 1", "idle"}});
  out.push_back({"idle_SeqLensSum", I, [](F& b, L&) { b.seq_lens_sum = 4; }, {"seq_lens_sum = 4"}});
  // Duplicates outside the padding row and the dummy page.
  out.push_back({"decode_RequestRowTwice",
                 ForwardMode::kDecode,
                 [](F& b, L&) {
                   b.req_pool_indices = {1, 1, 0};
                 },
                 {"req_pool_indices[1] = 1 repeats req_pool_indices[0]"}});
  return out;
}

class RejectBatch : public ::testing::TestWithParam<RejectCase> {};

TEST_P(RejectBatch, NamesFieldAndValue) {
  const RejectCase& c = GetParam();
  ForwardBatch b = valid_batch(c.mode);
  BatchLimits limits = test_limits();
  ASSERT_TRUE(validate_batch(b, limits).ok()) << "the base batch must be valid";
  c.mutate(b, limits);
  const ForwardBatch copy = b;
  const Status s = validate_batch(b, limits);
  ASSERT_FALSE(s.ok()) << c.name << " was accepted";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  for (const std::string& text : c.must_contain) MLA_EXPECT_CONTAINS(s.message(), text);
  EXPECT_EQ(b.seq_lens, copy.seq_lens);  // validation writes nothing
  EXPECT_EQ(b.seq_lens_sum, copy.seq_lens_sum);
}

INSTANTIATE_TEST_SUITE_P(Batch, RejectBatch, ::testing::ValuesIn(reject_cases()),
                         [](const ::testing::TestParamInfo<RejectCase>& info) {
                           return info.param.name;
                         });

TEST(ForwardBatch, DerivedLengthsPerMode) {
  const ForwardBatch d = valid_batch(ForwardMode::kDecode);
  EXPECT_EQ(d.q_len(0), 1);
  EXPECT_EQ(d.kv_len(2), 64);
  EXPECT_EQ(d.num_tokens(), 3);
  EXPECT_FALSE(d.has_prefix());

  const ForwardBatch e = valid_batch(ForwardMode::kExtend);
  EXPECT_EQ(e.q_len(1), 6);
  EXPECT_EQ(e.kv_len(1), 22);
  EXPECT_EQ(e.q_len(2), 0);
  EXPECT_EQ(e.num_tokens(), 10);
  EXPECT_TRUE(e.has_prefix());

  ForwardBatch no_prefix = e;
  no_prefix.extend_prefix_lens = {0, 0, 0};
  EXPECT_FALSE(no_prefix.has_prefix());

  const ForwardBatch v = valid_batch(ForwardMode::kTargetVerify);
  EXPECT_EQ(v.q_len(0), 3);
  EXPECT_EQ(v.kv_len(0), 13);
  EXPECT_EQ(v.kv_len(1), 64);
  EXPECT_EQ(v.num_tokens(), 6);
  EXPECT_TRUE(v.has_prefix());

  const ForwardBatch x = valid_batch(ForwardMode::kDraftExtend);
  EXPECT_EQ(x.q_len(1), 3);
  EXPECT_EQ(x.kv_len(1), 10);
  EXPECT_EQ(x.num_tokens(), 5);

  const ForwardBatch i = valid_batch(ForwardMode::kIdle);
  EXPECT_EQ(i.num_tokens(), 0);
  EXPECT_FALSE(i.has_prefix());
}

TEST(ForwardBatch, FinalizeFillsImpliedVectors) {
  ForwardBatch d;
  d.mode = ForwardMode::kDecode;
  d.batch_size = 2;
  d.seq_lens = {4, 9};
  finalize_batch(d);
  EXPECT_EQ(d.seq_lens_sum, 13);
  EXPECT_EQ(d.extend_prefix_lens, (std::vector<int32_t>{3, 8}));
  EXPECT_EQ(d.extend_seq_lens, (std::vector<int32_t>{1, 1}));

  ForwardBatch v;
  v.mode = ForwardMode::kTargetVerify;
  v.batch_size = 2;
  v.num_draft_tokens = 4;
  v.seq_lens = {4, 9};
  finalize_batch(v);
  EXPECT_EQ(v.seq_lens_sum, 13);
  EXPECT_EQ(v.extend_prefix_lens, (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(v.extend_seq_lens, (std::vector<int32_t>{4, 4}));

  ForwardBatch e;  // extend vectors are the caller's for extend modes
  e.mode = ForwardMode::kExtend;
  e.seq_lens = {7};
  e.extend_prefix_lens = {2};
  e.extend_seq_lens = {5};
  finalize_batch(e);
  EXPECT_EQ(e.seq_lens_sum, 7);
  EXPECT_EQ(e.extend_prefix_lens, std::vector<int32_t>{2});
}

TEST(ForwardMode, NamesRoundTrip) {
  for (ForwardMode m : kAllModes) {
    ForwardMode parsed = ForwardMode::kIdle;
    ASSERT_TRUE(parse_forward_mode(forward_mode_name(m), &parsed)) << forward_mode_name(m);
    EXPECT_EQ(parsed, m);
  }
  ForwardMode parsed = ForwardMode::kIdle;
  EXPECT_TRUE(parse_forward_mode("verify", &parsed));
  EXPECT_EQ(parsed, ForwardMode::kTargetVerify);
  EXPECT_FALSE(parse_forward_mode("Decode", &parsed));
  EXPECT_FALSE(parse_forward_mode("", &parsed));
  EXPECT_TRUE(is_extend_like(ForwardMode::kTargetVerify));
  EXPECT_FALSE(is_extend_like(ForwardMode::kDecode));
}

// A batch built from real pool slots passes against the pool's own limits.
TEST(ValidateBatch, BatchFromPoolPasses) {
  KvPoolConfig c;
  c.num_pages = 8;
  c.page_size = 16;
  c.max_requests = 2;
  c.max_context_len = 64;
  auto pool = LatentKvPool::create(c);
  ASSERT_TRUE(pool.ok());
  const int row = *(*pool)->alloc_request();
  std::vector<int32_t> fresh;
  ASSERT_TRUE((*pool)->extend_request(row, 20, &fresh).ok());
  ForwardBatch b;
  b.mode = ForwardMode::kExtend;
  b.batch_size = 1;
  b.req_pool_indices = {row};
  b.extend_prefix_lens = {0};
  b.extend_seq_lens = {20};
  b.seq_lens = {20};
  b.out_cache_loc = fresh;
  finalize_batch(b);
  EXPECT_TRUE(validate_batch(b, (*pool)->batch_limits()).ok());
  b.out_cache_loc[0] = static_cast<int32_t>((*pool)->num_slots());
  EXPECT_FALSE(validate_batch(b, (*pool)->batch_limits()).ok());
}

}  // namespace
}  // namespace mla
