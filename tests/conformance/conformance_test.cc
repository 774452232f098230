// The conformance driver (driver.h) on every registered cpu OpSet, and checks of the case lists.
#include "conformance/conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "conformance/driver.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

// The conformance driver (driver.h) over every cpu OpSet: the full cases, and the heavy ones
// the slow scope adds (labelled `slow` in tests/CMakeLists.txt).
INSTANTIATE_TEST_SUITE_P(Full, Conformance,
                         ::testing::ValuesIn(conformance_params(DeviceType::kCpu,
                                                                CaseSelection::kFullCases)),
                         conformance_param_name);
INSTANTIATE_TEST_SUITE_P(Heavy, Conformance,
                         ::testing::ValuesIn(conformance_params(DeviceType::kCpu,
                                                                CaseSelection::kHeavyCasesOnly)),
                         conformance_param_name);

TEST(ConformanceCases, NamesAreUniqueAndCarryTheSeed) {
  for (ConformanceScope scope :
       {ConformanceScope::kQuick, ConformanceScope::kFull, ConformanceScope::kSlow}) {
    std::set<std::string> names;
    for (const auto& c : conformance_cases(scope)) {
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate case " << c.name;
      EXPECT_NE(c.name.find("seed" + std::to_string(base_seed())), std::string::npos) << c.name;
    }
  }
}

TEST(ConformanceCases, QuickScopeCoversEveryOpAndBothCacheTypes) {
  std::set<OpKind> ops;
  std::set<DType> cache_types;
  for (const auto& c : conformance_cases(ConformanceScope::kQuick)) {
    ops.insert(c.op);
    if (c.op == OpKind::kAbsorbed) cache_types.insert(c.cache_dtype);
  }
  EXPECT_EQ(ops.size(), 6u);
  EXPECT_EQ(cache_types.size(), 2u);
}

TEST(ConformanceCases, FullScopeCoversPageSizesHeadsAndEdges) {
  std::set<int> pages, heads;
  bool kv0 = false, q0 = false, batch64 = false, verify = false, fp8 = false, bf16_scaled = false;
  for (const auto& c : conformance_cases(ConformanceScope::kFull)) {
    if (c.op != OpKind::kAbsorbed) continue;
    pages.insert(c.page_size);
    heads.insert(c.num_heads);
    for (int32_t k : c.kv_lens) kv0 |= k == 0;
    for (int32_t q : c.q_lens) q0 |= q == 0;
    batch64 |= c.q_lens.size() >= 64;
    verify |= c.mode == "verify";
    fp8 |= c.cache_dtype == DType::kFP8E4M3;
    bf16_scaled |= c.cache_dtype == DType::kBF16 && c.k_scale != 1.0f;
  }
  EXPECT_EQ(pages, (std::set<int>{1, 16, 32, 64, 128}));
  EXPECT_EQ(heads, (std::set<int>{1, 8, 9, 16, 32, 63, 64, 127, 128}));
  EXPECT_TRUE(kv0 && q0 && batch64 && verify && fp8 && bf16_scaled);
}

TEST(ConformanceCases, SeedComesFromTheEnvironment) {
  const char* old = std::getenv("MLA_TEST_SEED");
  const std::string saved = old ? old : "";
  ASSERT_EQ(setenv("MLA_TEST_SEED", "777", 1), 0);
  const auto cases = conformance_cases(ConformanceScope::kQuick);
  EXPECT_EQ(base_seed(), 777u);
  if (old) {
    setenv("MLA_TEST_SEED", saved.c_str(), 1);
  } else {
    unsetenv("MLA_TEST_SEED");
  }
  const auto defaults = conformance_cases(ConformanceScope::kQuick);
  ASSERT_EQ(cases.size(), defaults.size());
  EXPECT_NE(cases[0].seed, defaults[0].seed);
  EXPECT_NE(cases[0].name.find("seed777"), std::string::npos);
}

TEST(Determinism, RepeatedRunsAreBitwiseIdentical) {
  const OpSet* set = OpRegistry::global().default_for(DeviceType::kCpu);
  ASSERT_NE(set, nullptr);
  for (const auto& c : conformance_cases(ConformanceScope::kQuick)) {
    StatusOr<bool> same = run_twice_bitwise_equal(*set, c, Device::cpu());
    ASSERT_TRUE(same.ok()) << c.name << ": " << same.status().to_string();
    EXPECT_TRUE(*same) << c.name;
  }
}

}  // namespace
}  // namespace mla::testing
