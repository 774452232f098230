// The workspace registry, growable buffers, carving and the size sources.
#include "mla/workspace.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "backends/backend_fixture.h"

namespace mla {
namespace {

class WorkspaceTest : public ::testing::Test {
 protected:
  void SetUp() override { WorkspaceRegistry::global().release_all_for_testing(); }
  void TearDown() override { WorkspaceRegistry::global().release_all_for_testing(); }
};

TEST_F(WorkspaceTest, SharedWorkspaceIsCreatedOnceAndAccounted) {
  WorkspaceSpec spec{"test.shared", Device::cpu(), 4096, WorkspacePolicy::kSharedLazy, "X"};
  auto a = WorkspaceRegistry::global().acquire(spec, "a");
  auto b = WorkspaceRegistry::global().acquire(spec, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->data(), (*b)->data());
  EXPECT_EQ(testing::ledger_bytes("test.shared"), 4096u);
  int records = 0;
  for (const auto& r : MemoryLedger::global().snapshot()) {
    if (r.name == "test.shared") {
      ++records;
      EXPECT_EQ(r.owner, "shared:a");
      EXPECT_FALSE(r.zeroed);
    }
  }
  EXPECT_EQ(records, 1);
  const auto list = WorkspaceRegistry::global().list();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].users, 2);
}

TEST_F(WorkspaceTest, ZeroedWorkspaceIsZeroAndNeverSharedAcrossPolicies) {
  WorkspaceSpec z{"test.zeroed", Device::cpu(), 1024, WorkspacePolicy::kSharedZeroed, "X"};
  auto a = WorkspaceRegistry::global().acquire(z, "chunked");
  ASSERT_TRUE(a.ok());
  const auto* p = static_cast<const unsigned char*>((*a)->data());
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(p[i], 0) << i;
  WorkspaceSpec scribbler = z;
  scribbler.policy = WorkspacePolicy::kSharedLazy;
  auto b = WorkspaceRegistry::global().acquire(scribbler, "paged");
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("test.zeroed"), std::string::npos);
}

TEST_F(WorkspaceTest, LargerRequestThanCreatedIsOutOfWorkspace) {
  WorkspaceSpec spec{"test.small", Device::cpu(), 1000, WorkspacePolicy::kSharedLazy,
                     "MLA_TEST_BYTES"};
  ASSERT_TRUE(WorkspaceRegistry::global().acquire(spec, "first").ok());
  spec.bytes = 3000;
  auto r = WorkspaceRegistry::global().acquire(spec, "second");
  ASSERT_EQ(r.status().code(), StatusCode::kOutOfWorkspace);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("test.small"), std::string::npos) << m;
  EXPECT_NE(m.find("1000"), std::string::npos) << m;
  EXPECT_NE(m.find("3000"), std::string::npos) << m;
  EXPECT_NE(m.find("2000 more"), std::string::npos) << m;
  EXPECT_NE(m.find("MLA_TEST_BYTES"), std::string::npos) << m;
}

TEST_F(WorkspaceTest, ReleaseForTestingFreesOnceUnused) {
  WorkspaceSpec spec{"test.release", Device::cpu(), 512, WorkspacePolicy::kSharedLazy, "X"};
  {
    auto a = WorkspaceRegistry::global().acquire(spec, "a");
    ASSERT_TRUE(a.ok());
    WorkspaceRegistry::global().release_all_for_testing();
    EXPECT_EQ(testing::ledger_bytes("test.release"), 512u);  // still held by `a`
  }
  EXPECT_EQ(testing::ledger_bytes("test.release"), 0u);
  EXPECT_FALSE(WorkspaceRegistry::global().contains("test.release", Device::cpu()));
}

TEST(GrowableBufferTest, GrowsOnlyWhenMoreIsNeeded) {
  GrowableBuffer buf("test.grow", "test", Device::cpu());
  EXPECT_EQ(buf.capacity(), 0u);
  EXPECT_EQ(testing::ledger_bytes("test.grow"), 0u);
  ASSERT_TRUE(buf.reserve(1000).ok());
  EXPECT_EQ(buf.grow_count(), 1u);
  const void* first = buf.data();
  ASSERT_TRUE(buf.reserve(500).ok());
  ASSERT_TRUE(buf.reserve(1000).ok());
  EXPECT_EQ(buf.grow_count(), 1u);
  EXPECT_EQ(buf.data(), first);
  ASSERT_TRUE(buf.reserve(5000).ok());
  EXPECT_EQ(buf.grow_count(), 2u);
  EXPECT_GE(buf.capacity(), 5000u);
  EXPECT_EQ(testing::ledger_bytes("test.grow"), buf.capacity());
}

TEST(WorkspaceCarverTest, MeasureAndCarveAgreeAndAlign) {
  auto layout = [](WorkspaceCarver& c, void** a, void** b) {
    *a = c.carve("a", 10);
    *b = c.carve("b", 300);
  };
  WorkspaceCarver measure("ws");
  void *a = nullptr, *b = nullptr;
  layout(measure, &a, &b);
  EXPECT_EQ(measure.required_bytes(), 256u + 300u);
  EXPECT_TRUE(measure.status().ok());
  alignas(256) static std::byte storage[1024];
  WorkspaceCarver real("ws", storage, sizeof(storage));
  layout(real, &a, &b);
  ASSERT_TRUE(real.status().ok());
  EXPECT_EQ(a, storage);
  EXPECT_EQ(b, storage + 256);
}

TEST(WorkspaceCarverTest, TooSmallNamesBufferCarveAndShortfall) {
  alignas(256) static std::byte storage[512];
  WorkspaceCarver c("paged_mla.workspace", storage, sizeof(storage), kPagedWorkspaceEnv);
  EXPECT_NE(c.carve("first", 256), nullptr);
  EXPECT_EQ(c.carve("split_kv", 1000), nullptr);
  const Status s = c.status();
  ASSERT_EQ(s.code(), StatusCode::kOutOfWorkspace);
  EXPECT_NE(s.message().find("paged_mla.workspace"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("split_kv"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1256"), std::string::npos) << s.message();  // needed in total
  EXPECT_NE(s.message().find("744 more"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(kPagedWorkspaceEnv), std::string::npos) << s.message();
}

TEST(WorkspaceSizeTest, OptionThenEnvironmentThenDefault) {
  ::unsetenv("MLA_TEST_WS_BYTES");
  EXPECT_EQ(*resolve_workspace_bytes(0, "MLA_TEST_WS_BYTES", 77), 77u);
  EXPECT_EQ(*resolve_workspace_bytes(5, "MLA_TEST_WS_BYTES", 77), 5u);
  ::setenv("MLA_TEST_WS_BYTES", "3M", 1);
  EXPECT_EQ(*resolve_workspace_bytes(0, "MLA_TEST_WS_BYTES", 77), 3u << 20);
  ::setenv("MLA_TEST_WS_BYTES", "12345", 1);
  EXPECT_EQ(*resolve_workspace_bytes(0, "MLA_TEST_WS_BYTES", 77), 12345u);
  ::setenv("MLA_TEST_WS_BYTES", "lots", 1);
  auto bad = resolve_workspace_bytes(0, "MLA_TEST_WS_BYTES", 77);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("MLA_TEST_WS_BYTES"), std::string::npos);
  ::unsetenv("MLA_TEST_WS_BYTES");
}

}  // namespace
}  // namespace mla
