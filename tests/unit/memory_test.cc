// DeviceBuffer on the cpu and the MemoryLedger's accounting. The ledger is process-wide, so
// every check is a difference against a snapshot taken at the start of the test.
#include "mla/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "unit_util.h"

namespace mla {
namespace {

const AllocationRecord* find_record(const std::vector<AllocationRecord>& recs, uint64_t id) {
  auto it = std::find_if(recs.begin(), recs.end(),
                         [id](const AllocationRecord& r) { return r.id == id; });
  return it == recs.end() ? nullptr : &*it;
}

TEST(MemoryLedger, AllocationIsRecordedAndRemoved) {
  MemoryLedger& ledger = MemoryLedger::global();
  const Device cpu = Device::cpu();
  const std::size_t before = ledger.total_bytes(cpu);
  const uint64_t count_before = ledger.allocation_count();
  uint64_t id = 0;
  {
    auto buf = DeviceBuffer::allocate(cpu, 1000, "unit.buffer", "test", /*zeroed=*/false);
    ASSERT_TRUE(buf.ok()) << buf.status().to_string();
    EXPECT_NE(buf->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 256, 0u);
    EXPECT_EQ(buf->bytes(), 1000u);
    EXPECT_TRUE(buf->device() == cpu);
    id = buf->ledger_id();
    EXPECT_NE(id, 0u);
    EXPECT_EQ(ledger.total_bytes(cpu), before + 1000);
    EXPECT_EQ(ledger.allocation_count(), count_before + 1);
    const auto recs = ledger.snapshot();
    const AllocationRecord* rec = find_record(recs, id);
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->name, "unit.buffer");
    EXPECT_EQ(rec->owner, "test");
    EXPECT_EQ(rec->bytes, 1000u);
    EXPECT_FALSE(rec->zeroed);
  }
  EXPECT_EQ(ledger.total_bytes(cpu), before);
  EXPECT_EQ(find_record(ledger.snapshot(), id), nullptr);
  EXPECT_EQ(ledger.allocation_count(), count_before + 1);  // counts every allocation ever made
}

TEST(MemoryLedger, ZeroedBufferIsZero) {
  auto buf = DeviceBuffer::allocate(Device::cpu(), 4096, "unit.zeroed", "test", true);
  ASSERT_TRUE(buf.ok());
  const auto* p = buf->as<uint8_t>();
  EXPECT_TRUE(std::all_of(p, p + 4096, [](uint8_t b) { return b == 0; }));
  const auto recs = MemoryLedger::global().snapshot();
  const AllocationRecord* rec = find_record(recs, buf->ledger_id());
  ASSERT_NE(rec, nullptr);
  EXPECT_TRUE(rec->zeroed);
}

TEST(MemoryLedger, MoveKeepsOneRecordAndResetFrees) {
  MemoryLedger& ledger = MemoryLedger::global();
  const std::size_t before = ledger.total_bytes(Device::cpu());
  auto buf = DeviceBuffer::allocate(Device::cpu(), 512, "unit.move", "test", false);
  ASSERT_TRUE(buf.ok());
  DeviceBuffer a = std::move(buf).value();
  DeviceBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(ledger.total_bytes(Device::cpu()), before + 512);
  DeviceBuffer c;
  c = std::move(b);
  EXPECT_EQ(ledger.total_bytes(Device::cpu()), before + 512);
  c.reset();
  EXPECT_EQ(c.data(), nullptr);
  EXPECT_EQ(ledger.total_bytes(Device::cpu()), before);
}

TEST(MemoryLedger, KvPoolOwnerIsExcludedFromWorkspaceTotal) {
  MemoryLedger& ledger = MemoryLedger::global();
  const Device cpu = Device::cpu();
  const std::size_t all = ledger.total_bytes(cpu);
  const std::size_t ws = ledger.total_bytes_excluding_kv_pool(cpu);
  auto pool = DeviceBuffer::allocate(cpu, 3000, "kv_pool.layer0", "kv_pool", false);
  auto work = DeviceBuffer::allocate(cpu, 700, "paged_mla.workspace", "paged_mla", false);
  ASSERT_TRUE(pool.ok() && work.ok());
  EXPECT_EQ(ledger.total_bytes(cpu), all + 3700);
  EXPECT_EQ(ledger.total_bytes_excluding_kv_pool(cpu), ws + 700);
}

TEST(MemoryLedger, ZeroBytesIsValid) {
  auto buf = DeviceBuffer::allocate(Device::cpu(), 0, "unit.empty", "test", true);
  ASSERT_TRUE(buf.ok());
  EXPECT_TRUE(buf->valid());
  EXPECT_EQ(buf->bytes(), 0u);
}

TEST(MemoryLedger, UnavailableDeviceIsAnErrorNotACrash) {
  const Device missing = Device::cuda(99);
  ASSERT_FALSE(device_available(missing));
  const std::size_t before = MemoryLedger::global().total_bytes(missing);
  auto buf = DeviceBuffer::allocate(missing, 64, "unit.gpu", "test", false);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), StatusCode::kUnsupported);
  MLA_EXPECT_CONTAINS(buf.status().message(), "unit.gpu");
  MLA_EXPECT_CONTAINS(buf.status().message(), "cuda:99");
  EXPECT_EQ(MemoryLedger::global().total_bytes(missing), before);
}

TEST(DeviceRuntime, CpuRuntimeCopies) {
  DeviceRuntime* rt = device_runtime(DeviceType::kCpu);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->type(), DeviceType::kCpu);
  EXPECT_GE(rt->device_count(), 1);
  EXPECT_GE(rt->multiprocessor_count(0), 1);
  auto buf = DeviceBuffer::allocate(Device::cpu(), 16, "unit.copy", "test", false);
  ASSERT_TRUE(buf.ok());
  const int32_t src[4] = {1, -2, 3, -4};
  int32_t back[4] = {};
  ASSERT_TRUE(rt->copy_to_device(buf->data(), src, sizeof(src), nullptr).ok());
  ASSERT_TRUE(rt->copy_to_host(back, buf->data(), sizeof(back), nullptr).ok());
  EXPECT_TRUE(std::equal(src, src + 4, back));
  ASSERT_TRUE(rt->memset(buf->data(), 0, 16, nullptr).ok());
  ASSERT_TRUE(rt->synchronize(nullptr).ok());
  EXPECT_EQ(buf->as<int32_t>()[2], 0);
}

}  // namespace
}  // namespace mla
