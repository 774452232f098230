// PageAllocator: all-or-nothing allocation, reference counts, error paths that change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "mla/kv_pool.h"
#include "unit_util.h"

namespace mla {
namespace {

TEST(PageSize, SupportedSizes) {
  for (int p : {1, 16, 32, 64, 128}) EXPECT_TRUE(is_supported_page_size(p)) << p;
  for (int p : {-16, 0, 2, 8, 24, 48, 256}) EXPECT_FALSE(is_supported_page_size(p)) << p;
}

TEST(PageAllocator, HandsOutDistinctPagesOneToN) {
  PageAllocator a(10);
  EXPECT_EQ(a.num_pages(), 10);
  EXPECT_EQ(a.free_pages(), 10);
  auto pages = a.alloc(10);
  ASSERT_TRUE(pages.ok());
  std::set<int32_t> distinct(pages->begin(), pages->end());
  EXPECT_EQ(distinct.size(), 10u);
  EXPECT_EQ(*distinct.begin(), 1);
  EXPECT_EQ(*distinct.rbegin(), 10);
  EXPECT_EQ(a.free_pages(), 0);
  for (int32_t p : *pages) EXPECT_EQ(a.ref_count(p), 1);
  EXPECT_EQ(a.ref_count(0), 0);  // the dummy page is never handed out
}

TEST(PageAllocator, OutOfMemoryIsAllOrNothing) {
  PageAllocator a(5);
  ASSERT_TRUE(a.alloc(3).ok());
  auto more = a.alloc(3);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::kOutOfMemory);
  MLA_EXPECT_CONTAINS(more.status().message(), "need 3 pages, 2 of 5 free");
  EXPECT_EQ(a.free_pages(), 2);
  EXPECT_TRUE(a.alloc(2).ok());
  EXPECT_TRUE(a.alloc(0).ok());
  EXPECT_EQ(a.alloc(-1).status().code(), StatusCode::kInvalidArgument);
}

TEST(PageAllocator, RetainAndReleaseCountReferences) {
  PageAllocator a(4);
  auto pages = a.alloc(2);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(a.retain(*pages).ok());
  EXPECT_EQ(a.ref_count((*pages)[0]), 2);
  ASSERT_TRUE(a.release(*pages).ok());
  EXPECT_EQ(a.free_pages(), 2);  // still held once
  EXPECT_EQ(a.ref_count((*pages)[1]), 1);
  ASSERT_TRUE(a.release(*pages).ok());
  EXPECT_EQ(a.free_pages(), 4);
  EXPECT_EQ(a.ref_count((*pages)[0]), 0);
}

TEST(PageAllocator, FreedPagesAreReusedFirst) {
  PageAllocator a(8);
  auto first = a.alloc(3);
  auto second = a.alloc(2);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(a.release(*first).ok());
  auto again = a.alloc(3);
  ASSERT_TRUE(again.ok());
  std::vector<int32_t> x = *first, y = *again;
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  EXPECT_EQ(x, y);
}

TEST(PageAllocator, BadReleaseChangesNothing) {
  PageAllocator a(6);
  auto pages = a.alloc(3);
  ASSERT_TRUE(pages.ok());
  const int32_t p0 = (*pages)[0], p1 = (*pages)[1];
  // Out of range, after valid entries: the valid ones must be undone.
  Status s = a.release({p0, p1, 7});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  MLA_EXPECT_CONTAINS(s.message(), "pages[2] = 7 is outside 1..6");
  EXPECT_EQ(a.ref_count(p0), 1);
  EXPECT_EQ(a.ref_count(p1), 1);
  EXPECT_EQ(a.free_pages(), 3);
  // The same page twice with one reference.
  s = a.release({p0, p1, p0});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  MLA_EXPECT_CONTAINS(s.message(), fmt::format("pages[2] = {}", p0));
  EXPECT_EQ(a.ref_count(p0), 1);
  EXPECT_EQ(a.ref_count(p1), 1);
  EXPECT_EQ(a.free_pages(), 3);
  // Page 0 (dummy) and a free page.
  EXPECT_EQ(a.release({0}).code(), StatusCode::kInvalidArgument);
  auto free_page = a.alloc(1);
  ASSERT_TRUE(free_page.ok());
  ASSERT_TRUE(a.release(*free_page).ok());
  s = a.release(*free_page);
  MLA_EXPECT_CONTAINS(s.message(), "is not allocated");
  EXPECT_EQ(a.free_pages(), 3);
  // Retain of a free page is rejected too.
  s = a.retain({p0, (*free_page)[0]});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.ref_count(p0), 1);
}

}  // namespace
}  // namespace mla
