// The GPU check (issue 33, part 4) and the construction checks (part 3), on the cpu: the rule
// against a given compute capability, the capability query's test seam, an op set that lists the
// GPUs it has code for refusing every other one before its op runs, and check_backend_config
// naming the field, the value and what is served.
#include "mla/gpu_support.h"

#include <gtest/gtest.h>

#include <atomic>
#include <iterator>
#include <utility>
#include <vector>

#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/ops.h"
#include "unit_util.h"

namespace mla {
namespace {

constexpr ComputeCapability kHopper{9, 0};
constexpr ComputeCapability kAmpere{8, 0};
constexpr ComputeCapability kBlackwell{10, 0};

// Installs a fake capability query for the test's lifetime (the seam), then restores the
// runtime's.
class FakeCapability {
 public:
  explicit FakeCapability(ComputeCapability c) {
    previous_ = set_compute_capability_query([c](Device d) -> StatusOr<ComputeCapability> {
      if (!d.is_cuda()) return unsupported("{} has no compute capability", d.to_string());
      return c;
    });
  }
  ~FakeCapability() { set_compute_capability_query(std::move(previous_)); }
  FakeCapability(const FakeCapability&) = delete;
  FakeCapability& operator=(const FakeCapability&) = delete;

 private:
  ComputeCapabilityQuery previous_;
};

TEST(GpuSupport, TheRuleAcceptsOnlyTheCapabilitiesBuiltFor) {
  const std::vector<ComputeCapability> sm90{kHopper};
  EXPECT_TRUE(check_compute_capability("cuda", sm90, kHopper, "cuda:0").ok());
  for (ComputeCapability found : {kAmpere, kBlackwell, ComputeCapability{9, 1}}) {
    const Status st = check_compute_capability("cuda", sm90, found, "cuda:1 (NVIDIA X)");
    ASSERT_FALSE(st.ok()) << found.to_string();
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
    // What it needs and what it found, and on which device.
    MLA_EXPECT_CONTAINS(st.message(), "op set 'cuda' has device code for compute capability 9.0");
    MLA_EXPECT_CONTAINS(st.message(),
                        "cuda:1 (NVIDIA X) has compute capability " + found.to_string());
  }
  // No GPU code (the cpu set): nothing to check.
  EXPECT_TRUE(check_compute_capability("cpu", {}, kAmpere, "cpu").ok());
  // Several capabilities are listed in the message.
  const std::vector<ComputeCapability> two{kHopper, kBlackwell};
  MLA_EXPECT_CONTAINS(check_compute_capability("x", two, kAmpere, "cuda:0").message(),
                      "9.0 or 10.0");
}

TEST(GpuSupport, TheCudaKernelsAreBuiltForComputeCapability90Only) {
  ASSERT_EQ(std::size(kCudaKernelCapabilities), 1u);
  EXPECT_EQ(kCudaKernelCapabilities[0], kHopper);
}

TEST(GpuSupport, TheCapabilityQueryCanBeFaked) {
  {
    FakeCapability fake(kAmpere);
    auto c = compute_capability(Device::cuda(3));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(*c, kAmpere);
  }
  // Restored: a cpu device has none, whatever the build.
  auto cpu = compute_capability(Device::cpu());
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().code(), StatusCode::kUnsupported);
}

// A merge op and an absorbed op that count their calls, as a GPU op set's would launch.
struct Calls {
  std::atomic<int> runs{0};
  std::atomic<int> plans{0};
};

class CountingMerge final : public MergeOp {
 public:
  explicit CountingMerge(Calls* c) : c_(c) {}
  Status run(const MergeArgs&, const ExecContext&) const override {
    ++c_->runs;
    return Status::Ok();
  }

 private:
  Calls* c_;
};

class CountingAbsorbed final : public AbsorbedAttentionOp {
 public:
  explicit CountingAbsorbed(Calls* c) : c_(c) {}
  Status supports(int, int, DType) const override { return Status::Ok(); }
  std::size_t plan_bytes(const AttnCapacity&) const override { return 64; }
  std::size_t workspace_bytes(const AttnCapacity&) const override { return 128; }
  StatusOr<std::size_t> plan(const AbsorbedProblem&, const AttnCapacity&,
                             std::span<std::byte>) const override {
    ++c_->plans;
    return std::size_t{0};
  }
  Status run(const AbsorbedArgs&, const ExecContext&) const override {
    ++c_->runs;
    return Status::Ok();
  }

 private:
  Calls* c_;
};

TEST(GpuSupport, AnOpSetRefusesAGpuItHasNoCodeForBeforeItsOpRuns) {
  Calls merge_calls, absorbed_calls;
  OpRegistry registry;  // a registry of the test's own (the global one is left alone)
  OpSet set;
  set.name = "sm90_only";
  set.device = DeviceType::kCuda;
  set.merge = std::make_shared<CountingMerge>(&merge_calls);
  set.absorbed = std::make_shared<CountingAbsorbed>(&absorbed_calls);
  set.compute_capabilities = {kHopper};
  registry.add(std::move(set));
  const OpSet* s = registry.find("sm90_only");
  ASSERT_NE(s, nullptr);
  const ExecContext ctx{Device::cuda(0), nullptr};

  for (ComputeCapability wrong : {kAmpere, kBlackwell}) {
    FakeCapability fake(wrong);
    const Status picked = check_op_set_device(*s, Device::cuda(0));
    ASSERT_FALSE(picked.ok());
    EXPECT_EQ(picked.code(), StatusCode::kUnsupported);
    MLA_EXPECT_CONTAINS(picked.message(), "compute capability 9.0 only");
    MLA_EXPECT_CONTAINS(picked.message(), "has compute capability " + wrong.to_string());
    const Status merged = s->merge->run(MergeArgs{}, ctx);
    EXPECT_EQ(merged.code(), StatusCode::kUnsupported);
    MLA_EXPECT_CONTAINS(merged.message(), "has compute capability " + wrong.to_string());
    EXPECT_EQ(s->absorbed->run(AbsorbedArgs{}, ctx).code(), StatusCode::kUnsupported);
    // Host work (sizes, plans) launches nothing and is still answered.
    EXPECT_EQ(s->absorbed->plan_bytes(AttnCapacity{}), 64u);
    EXPECT_TRUE(s->absorbed->plan(AbsorbedProblem{}, AttnCapacity{}, {}).ok());
  }
  EXPECT_EQ(merge_calls.runs.load(), 0);  // nothing ran on the wrong GPUs
  EXPECT_EQ(absorbed_calls.runs.load(), 0);
  EXPECT_EQ(absorbed_calls.plans.load(), 2);

  {
    FakeCapability fake(kHopper);
    EXPECT_TRUE(check_op_set_device(*s, Device::cuda(0)).ok());
    EXPECT_TRUE(s->merge->run(MergeArgs{}, ctx).ok());
    EXPECT_TRUE(s->absorbed->run(AbsorbedArgs{}, ctx).ok());
  }
  EXPECT_EQ(merge_calls.runs.load(), 1);
  EXPECT_EQ(absorbed_calls.runs.load(), 1);

  // A capability that cannot be read is a refusal too, never a launch.
  {
    const ComputeCapabilityQuery previous =
        set_compute_capability_query([](Device) -> StatusOr<ComputeCapability> {
          return make_status(StatusCode::kCudaError, "driver gone");
        });
    const Status st = s->merge->run(MergeArgs{}, ctx);
    set_compute_capability_query(previous);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
    MLA_EXPECT_CONTAINS(st.message(), "driver gone");
  }
  EXPECT_EQ(merge_calls.runs.load(), 1);

  // A set is checked against devices of its own type only.
  EXPECT_EQ(check_op_set_device(*s, Device::cpu()).code(), StatusCode::kInvalidArgument);
  // The cpu set lists no capability: its ops are not wrapped and run on any cpu.
  const OpSet* cpu = OpRegistry::global().find("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_TRUE(cpu->compute_capabilities.empty());
  EXPECT_TRUE(check_op_set_device(*cpu, Device::cpu()).ok());
}

TEST(GpuSupport, TheCudaOpSetDeclaresItsCapabilitiesAndBackendsCheckThem) {
  const OpSet* cuda = OpRegistry::global().default_for(DeviceType::kCuda);
  BackendOptions o;
  o.model.num_heads = 16;
  o.device = Device::cuda(0);
  if (cuda == nullptr) {  // a build without CUDA: the backend says so at construction
    auto r = check_backend_config(o, 64, DType::kBF16, "paged_mla");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    MLA_EXPECT_CONTAINS(r.status().message(), "no CUDA ops");
    return;
  }
  EXPECT_EQ(cuda->compute_capabilities,
            std::vector<ComputeCapability>(std::begin(kCudaKernelCapabilities),
                                           std::end(kCudaKernelCapabilities)));
  {
    FakeCapability fake(kAmpere);
    auto r = check_backend_config(o, 64, DType::kBF16, "paged_mla");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    MLA_EXPECT_CONTAINS(r.status().message(),
                        "paged_mla: op set 'cuda' has device code for "
                        "compute capability 9.0 only");
    MLA_EXPECT_CONTAINS(r.status().message(), "has compute capability 8.0");
  }
  {
    FakeCapability fake(kHopper);
    auto r = check_backend_config(o, 64, DType::kBF16, "paged_mla");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, cuda);
  }
}

// ---- part 3: one page-size list, checked when a backend is built ----
TEST(PageSizes, OneListServesTheRuleAndTheMessages) {
  for (int p : kPageSizes) EXPECT_TRUE(is_supported_page_size(p)) << p;
  EXPECT_EQ(page_sizes_text(), "1, 16, 32, 64, 128");
  for (int p : {0, 2, 8, 24, 48, 96, 256, 1024}) {
    EXPECT_FALSE(is_supported_page_size(p)) << p;
    const Status st = check_page_size(p, "page_size");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    MLA_EXPECT_CONTAINS(st.message(), "page_size = " + std::to_string(p) +
                                          " is not served (mla serves page sizes 1, 16, 32, 64, "
                                          "128 tokens)");
  }
}

TEST(BackendConfig, ConstructionRefusesWhatTheFirstDecodeWouldRefuse) {
  BackendOptions o;
  o.model.num_heads = 16;
  o.device = Device::cpu();
  auto ok = check_backend_config(o, 64, DType::kBF16, "chunked_mla");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)->name, "cpu");
  for (int p : kPageSizes) EXPECT_TRUE(check_backend_config(o, p, DType::kFP8E4M3, "x").ok()) << p;

  struct Bad {
    int page_size;
    DType dtype;
    int heads;
    const char* message;
  };
  for (const Bad& b : {Bad{8, DType::kBF16, 16,
                           "chunked_mla: page_size = 8 is not served (mla serves page sizes 1, "
                           "16, 32, 64, 128 tokens)"},
                       Bad{256, DType::kBF16, 16, "chunked_mla: page_size = 256 is not served"},
                       Bad{64, DType::kF32, 16,
                           "chunked_mla: kv_cache_dtype = f32 is not served (mla stores the "
                           "latent cache in bf16 or fp8e4m3)"},
                       Bad{64, DType::kBF16, 0, "chunked_mla: model.num_heads = 0"},
                       Bad{64, DType::kBF16, 129, "chunked_mla: model.num_heads = 129"}}) {
    BackendOptions bo = o;
    bo.model.num_heads = b.heads;
    auto r = check_backend_config(bo, b.page_size, b.dtype, "chunked_mla");
    ASSERT_FALSE(r.ok()) << b.message;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    MLA_EXPECT_CONTAINS(r.status().message(), b.message);
  }
  BackendOptions other = o;
  other.op_set = "no_such_set";
  auto missing = check_backend_config(other, 64, DType::kBF16, "paged_mla");
  EXPECT_EQ(missing.status().code(), StatusCode::kUnsupported);
  MLA_EXPECT_CONTAINS(missing.status().message(), "paged_mla: no op set 'no_such_set'");
}

TEST(BackendConfig, APoolOfAnUnservedPageSizeOrDtypeIsRefusedWhenBuilt) {
  for (int p : {8, 256}) {
    KvPoolConfig c;
    c.num_pages = 4;
    c.page_size = p;
    c.max_requests = 1;
    c.max_context_len = 64;
    auto pool = LatentKvPool::create(c);
    ASSERT_FALSE(pool.ok());
    MLA_EXPECT_CONTAINS(pool.status().message(),
                        "kv_pool.page_size = " + std::to_string(p) +
                            " is not served (mla serves page sizes 1, 16, 32, 64, 128 tokens)");
  }
  KvPoolConfig c;
  c.num_pages = 4;
  c.page_size = 16;
  c.max_requests = 1;
  c.max_context_len = 64;
  c.dtype = DType::kF32;
  auto pool = LatentKvPool::create(c);
  ASSERT_FALSE(pool.ok());
  MLA_EXPECT_CONTAINS(pool.status().message(), "kv_pool.dtype = f32 is not served");
}

}  // namespace
}  // namespace mla
