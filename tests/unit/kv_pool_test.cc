// LatentKvPool: configuration errors, ledger records, k scales, request rows, copy-on-write of a
// shared tail page, and error messages. The random-sequence property tests are in
// kv_pool_property_test.cc.
#include "mla/kv_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "unit_util.h"

namespace mla {
namespace {

KvPoolConfig small_config(int page_size, int64_t num_pages = 8) {
  KvPoolConfig c;
  c.num_layers = 2;
  c.num_pages = num_pages;
  c.page_size = page_size;
  c.max_requests = 4;
  c.max_context_len = 4 * page_size + 5;
  return c;
}

std::unique_ptr<LatentKvPool> make_pool(const KvPoolConfig& c) {
  auto pool = LatentKvPool::create(c);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return pool.ok() ? std::move(pool).value() : nullptr;
}

TEST(LatentKvPool, RejectsBadConfigNamingTheField) {
  struct Bad {
    void (*mutate)(KvPoolConfig&);
    const char* text;
  };
  const Bad cases[] = {
      {[](KvPoolConfig& c) { c.page_size = 8; }, "kv_pool.page_size = 8"},
      {[](KvPoolConfig& c) { c.num_layers = 0; }, "kv_pool.num_layers = 0"},
      {[](KvPoolConfig& c) { c.num_pages = -1; }, "kv_pool.num_pages = -1"},
      {[](KvPoolConfig& c) { c.max_requests = 0; }, "kv_pool.max_requests = 0"},
      {[](KvPoolConfig& c) { c.max_context_len = 0; }, "kv_pool.max_context_len = 0"},
      {[](KvPoolConfig& c) { c.latent_dim = 0; }, "kv_pool.latent_dim = 0"},
      {[](KvPoolConfig& c) { c.dtype = DType::kF32; }, "kv_pool.dtype = f32"},
      {[](KvPoolConfig& c) { c.num_pages = int64_t{1} << 40; }, "int32 slot range"},
  };
  for (const Bad& b : cases) {
    KvPoolConfig c = small_config(16);
    b.mutate(c);
    auto pool = LatentKvPool::create(c);
    ASSERT_FALSE(pool.ok()) << b.text;
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
    MLA_EXPECT_CONTAINS(pool.status().message(), b.text);
  }
  KvPoolConfig c = small_config(16);
  c.device = Device::cuda(99);
  auto pool = LatentKvPool::create(c);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kUnsupported);
}

TEST(LatentKvPool, BuffersAreRecordedInTheLedger) {
  const std::size_t before = MemoryLedger::global().total_bytes(Device::cpu());
  KvPoolConfig c = small_config(16, 5);
  auto pool = make_pool(c);
  ASSERT_TRUE(pool);
  const std::size_t layer_bytes = 6 * 16 * 576 * 2;           // (num_pages + 1) * P rows of bf16
  const std::size_t table_bytes = 5 * c.max_context_len * 4;  // (max_requests + 1) rows of i32
  EXPECT_EQ(MemoryLedger::global().total_bytes(Device::cpu()),
            before + 2 * layer_bytes + table_bytes);
  int layers = 0, tables = 0;
  for (const AllocationRecord& r : MemoryLedger::global().snapshot()) {
    if (r.owner != "kv_pool") continue;
    if (r.name == "kv_pool.layer0" || r.name == "kv_pool.layer1") {
      ++layers;
      EXPECT_EQ(r.bytes, layer_bytes);
    }
    if (r.name == "kv_pool.req_to_token") {
      ++tables;
      EXPECT_EQ(r.bytes, table_bytes);
    }
  }
  EXPECT_EQ(layers, 2);
  EXPECT_EQ(tables, 1);
  EXPECT_EQ(pool->num_slots(), 96);
  const TensorView cache = pool->layer_cache(1);
  EXPECT_EQ(cache.dtype, DType::kBF16);
  EXPECT_EQ(cache.shape[0], 96);
  EXPECT_EQ(cache.shape[1], 576);
  EXPECT_EQ(cache.bytes(), layer_bytes);
  EXPECT_TRUE(pool->layer_cache(2).empty());
  const TensorView table = pool->req_to_token();
  EXPECT_EQ(table.dtype, DType::kI32);
  EXPECT_EQ(table.shape[0], 5);
  EXPECT_EQ(table.shape[1], c.max_context_len);
  // The dummy page and every table entry start at zero.
  const auto* rows = static_cast<const uint16_t*>(cache.data);
  EXPECT_TRUE(std::all_of(rows, rows + 16 * 576, [](uint16_t v) { return v == 0; }));
  const auto* t = table.ptr<const int32_t>();
  EXPECT_TRUE(std::all_of(t, t + table.numel(), [](int32_t v) { return v == 0; }));
  pool.reset();
  EXPECT_EQ(MemoryLedger::global().total_bytes(Device::cpu()), before);
}

TEST(LatentKvPool, KScaleAppliesOnlyToFp8) {
  KvPoolConfig c = small_config(1);
  auto bf16_pool = make_pool(c);
  ASSERT_TRUE(bf16_pool);
  EXPECT_TRUE(bf16_pool->set_k_scale(0, 0.25f).ok());
  EXPECT_EQ(bf16_pool->k_scale(0), 1.0f);  // a bf16 cache is never scaled

  c.dtype = DType::kFP8E4M3;
  auto fp8_pool = make_pool(c);
  ASSERT_TRUE(fp8_pool);
  EXPECT_EQ(fp8_pool->layer_cache(0).dtype, DType::kFP8E4M3);
  EXPECT_EQ(fp8_pool->layer_cache(0).bytes(), static_cast<std::size_t>(9 * 576));
  EXPECT_EQ(fp8_pool->k_scale(0), 1.0f);
  EXPECT_EQ(fp8_pool->k_scale(1), 1.0f);
  ASSERT_TRUE(fp8_pool->set_k_scale(1, 0.5f).ok());
  EXPECT_EQ(fp8_pool->k_scale(1), 0.5f);
  EXPECT_EQ(fp8_pool->k_scale(0), 1.0f);
  // Bad input: an error naming the field and value, and the scale stays what it was.
  for (float bad : {-2.0f, 0.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    const Status s = fp8_pool->set_k_scale(1, bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("scale = "), std::string::npos) << s.message();
  }
  const Status no_layer = fp8_pool->set_k_scale(7, 3.0f);
  EXPECT_EQ(no_layer.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_layer.message().find("layer = 7"), std::string::npos) << no_layer.message();
  EXPECT_EQ(fp8_pool->k_scale(1), 0.5f);
}

TEST(LatentKvPool, RequestRowsRunOutWithOutOfMemory) {
  auto pool = make_pool(small_config(16));
  ASSERT_TRUE(pool);
  std::vector<int> rows;
  for (int i = 0; i < 4; ++i) {
    auto r = pool->alloc_request();
    ASSERT_TRUE(r.ok());
    EXPECT_GE(*r, 1);
    EXPECT_LE(*r, 4);
    rows.push_back(*r);
  }
  auto none = pool->alloc_request();
  EXPECT_EQ(none.status().code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(pool->free_request(rows[2]).ok());
  auto again = pool->alloc_request();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, rows[2]);
}

TEST(LatentKvPool, SlotsFollowPages) {
  auto pool = make_pool(small_config(16));
  ASSERT_TRUE(pool);
  auto row = pool->alloc_request();
  ASSERT_TRUE(row.ok());
  std::vector<int32_t> slots;
  ASSERT_TRUE(pool->extend_request(*row, 20, &slots).ok());
  ASSERT_EQ(slots.size(), 20u);
  EXPECT_EQ(pool->request_len(*row), 20);
  EXPECT_EQ(pool->free_pages(), 6);
  for (int i = 0; i < 20; ++i) {
    const int32_t page_first = slots[static_cast<std::size_t>(i / 16 * 16)];
    EXPECT_EQ(page_first % 16, 0);
    EXPECT_GE(page_first, 16);  // never the dummy page
    EXPECT_EQ(slots[static_cast<std::size_t>(i)], page_first + i % 16);
    EXPECT_EQ(pool->slot(*row, i), slots[static_cast<std::size_t>(i)]);
  }
  EXPECT_EQ(pool->slot(*row, 20), 0);  // unused entries point at the dummy slot
  std::vector<int32_t> more;
  ASSERT_TRUE(pool->extend_request(*row, 33, &more).ok());  // fills page 2, starts page 3
  ASSERT_EQ(more.size(), 13u);
  EXPECT_EQ(more[0], slots[16] + 4);
  EXPECT_EQ(pool->free_pages(), 5);
  ASSERT_TRUE(pool->truncate_request(*row, 16).ok());
  EXPECT_EQ(pool->free_pages(), 7);
  EXPECT_EQ(pool->slot(*row, 16), 0);
  const BatchLimits limits = pool->batch_limits(3);
  EXPECT_EQ(limits.max_requests, 4);
  EXPECT_EQ(limits.num_slots, pool->num_slots());
  EXPECT_EQ(limits.page_size, 16);
  EXPECT_EQ(limits.max_draft_tokens, 3);
  EXPECT_EQ(limits.max_context_len, 69);
}

// A prefix shared mid-page and then extended must not write into the other request's page:
// the tail page is copied (all layers) and the request moves to its own copy.
TEST(LatentKvPool, ExtendingIntoASharedTailPageCopiesIt) {
  auto pool = make_pool(small_config(16));
  ASSERT_TRUE(pool);
  const int a = *pool->alloc_request();
  const int b = *pool->alloc_request();
  std::vector<int32_t> a_slots;
  ASSERT_TRUE(pool->extend_request(a, 32, &a_slots).ok());
  for (int layer = 0; layer < 2; ++layer) {
    auto* rows = pool->layer_cache(layer).ptr<uint16_t>();
    for (int i = 0; i < 32; ++i) {
      for (int d = 0; d < 576; ++d) {
        rows[static_cast<std::size_t>(a_slots[static_cast<std::size_t>(i)]) * 576 + d] =
            static_cast<uint16_t>(layer * 1000 + i * 7 + d % 5);
      }
    }
  }
  ASSERT_TRUE(pool->share_prefix(a, b, 32).ok());
  const int32_t shared_page = a_slots[16] / 16;
  EXPECT_EQ(pool->allocator().ref_count(shared_page), 2);
  EXPECT_EQ(pool->free_pages(), 6);
  ASSERT_TRUE(pool->truncate_request(b, 20).ok());
  EXPECT_EQ(pool->allocator().ref_count(shared_page), 2);  // b still reads tokens 16..19 there

  std::vector<int32_t> b_new;
  ASSERT_TRUE(pool->extend_request(b, 30, &b_new).ok());
  ASSERT_EQ(b_new.size(), 10u);
  const int32_t b_page = pool->slot(b, 16) / 16;
  EXPECT_NE(b_page, shared_page);
  EXPECT_EQ(pool->allocator().ref_count(shared_page), 1);
  EXPECT_EQ(pool->allocator().ref_count(b_page), 1);
  EXPECT_EQ(pool->free_pages(), 5);
  EXPECT_EQ(b_new[0], b_page * 16 + 4);
  EXPECT_EQ(pool->slot(b, 0), a_slots[0]);  // the full first page stays shared
  for (int i = 0; i < 32; ++i) EXPECT_EQ(pool->slot(a, i), a_slots[static_cast<std::size_t>(i)]);
  for (int layer = 0; layer < 2; ++layer) {
    const auto* rows = pool->layer_cache(layer).ptr<const uint16_t>();
    for (int i = 16; i < 20; ++i) {
      const std::size_t src = static_cast<std::size_t>(a_slots[static_cast<std::size_t>(i)]);
      const std::size_t dst = static_cast<std::size_t>(pool->slot(b, i));
      EXPECT_EQ(std::memcmp(rows + dst * 576, rows + src * 576, 576 * 2), 0)
          << "layer " << layer << " token " << i;
    }
  }
  const int32_t* dev = pool->req_to_token().ptr<const int32_t>();
  EXPECT_EQ(
      std::memcmp(dev, pool->req_to_token_host().data(), pool->req_to_token_host().size() * 4), 0);
}

TEST(LatentKvPool, OutOfPagesChangesNothing) {
  auto pool = make_pool(small_config(16, 3));
  ASSERT_TRUE(pool);
  const int a = *pool->alloc_request();
  ASSERT_TRUE(pool->extend_request(a, 40, nullptr).ok());
  const std::vector<int32_t> table = pool->req_to_token_host();
  std::vector<int32_t> slots = {-5};
  const Status s = pool->extend_request(a, 49, &slots);
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  MLA_EXPECT_CONTAINS(s.message(), "need 1 pages, 0 of 3 free");
  EXPECT_EQ(pool->request_len(a), 40);
  EXPECT_EQ(pool->req_to_token_host(), table);
  EXPECT_EQ(slots, std::vector<int32_t>{-5});
  EXPECT_TRUE(pool->extend_request(a, 48, nullptr).ok());  // fits the last page
}

TEST(LatentKvPool, ErrorsNameTheFieldAndValue) {
  auto pool = make_pool(small_config(16));
  ASSERT_TRUE(pool);
  const int a = *pool->alloc_request();
  const int b = *pool->alloc_request();
  ASSERT_TRUE(pool->extend_request(a, 24, nullptr).ok());
  struct Bad {
    Status status;
    const char* text;
  };
  const Bad cases[] = {
      {pool->extend_request(0, 4, nullptr), "row = 0 is outside 1..4"},
      {pool->extend_request(5, 4, nullptr), "row = 5 is outside 1..4"},
      {pool->extend_request(3, 4, nullptr), "row = 3 is not an allocated request row"},
      {pool->extend_request(a, 70, nullptr), "new_len = 70 of row 1 exceeds max_context_len = 69"},
      {pool->extend_request(a, 10, nullptr), "new_len = 10 is below the current length 24"},
      {pool->truncate_request(a, 25), "new_len = 25 of row 1 is outside 0..24"},
      {pool->truncate_request(a, -1), "new_len = -1"},
      {pool->share_prefix(a, b, 8), "len = 8 is not a multiple of page_size = 16"},
      {pool->share_prefix(a, b, 32), "len = 32 is outside 0..24"},
      {pool->share_prefix(a, a, 16), "src = dst = 1"},
      {pool->share_prefix(b, a, 0), "dst = 1 must be empty, it holds 24 tokens"},
      {pool->free_request(9), "row = 9 is outside 1..4"},
  };
  for (const Bad& c : cases) {
    EXPECT_EQ(c.status.code(), StatusCode::kInvalidArgument) << c.text;
    MLA_EXPECT_CONTAINS(c.status.message(), c.text);
  }
  EXPECT_EQ(pool->request_len(a), 24);
  EXPECT_EQ(pool->free_pages(), 6);
  ASSERT_TRUE(pool->free_request(b).ok());
  EXPECT_EQ(pool->free_request(b).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mla
