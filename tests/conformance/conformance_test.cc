// Every registered cpu op set x the conformance cases, against the double reference.
#include "conformance/conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "mla/ops.h"

namespace mla::testing {
namespace {

struct Param {
  std::string set_name;
  ConformanceCase c;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.set_name << ": ";
  PrintTo(p.c, os);
}

std::vector<Param> params(ConformanceScope scope, bool only_extra_over_full) {
  std::set<std::string> full_names;
  if (only_extra_over_full) {
    for (const auto& c : conformance_cases(ConformanceScope::kFull)) full_names.insert(c.name);
  }
  std::vector<Param> out;
  for (const OpSet* set : OpRegistry::global().list()) {
    if (set->device != DeviceType::kCpu) continue;
    for (auto& c : conformance_cases(scope)) {
      if (only_extra_over_full && full_names.count(c.name)) continue;
      out.push_back({set->name, c});
    }
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::string s = info.param.set_name + "_" + info.param.c.name;
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

void run_and_check(const Param& p) {
  const OpSet* set = OpRegistry::global().find(p.set_name);
  ASSERT_NE(set, nullptr);
  CaseResult r = run_conformance_case(*set, p.c, Device::cpu());
  // The cpu set implements every op for every supported shape: a skip is a failure here.
  ASSERT_FALSE(r.skipped) << r.name << " skipped: " << r.skip_reason;
  EXPECT_TRUE(r.passed) << r.message;
}

class Conformance : public ::testing::TestWithParam<Param> {};
TEST_P(Conformance, MatchesReference) { run_and_check(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Full, Conformance,
                         ::testing::ValuesIn(params(ConformanceScope::kFull, false)), param_name);

// Heavy cases (long contexts, long q with many heads): label `slow`.
class ConformanceSlow : public ::testing::TestWithParam<Param> {};
TEST_P(ConformanceSlow, MatchesReference) { run_and_check(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Heavy, ConformanceSlow,
                         ::testing::ValuesIn(params(ConformanceScope::kSlow, true)), param_name);

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
  EXPECT_EQ(heads, (std::set<int>{16, 32, 64, 128}));
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
