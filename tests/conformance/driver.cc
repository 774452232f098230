// The conformance driver's test body and parameters (driver.h).
#include "conformance/driver.h"

#include <cctype>
#include <set>

#include "mla/memory.h"

namespace mla::testing {

void PrintTo(const ConformanceParam& p, std::ostream* os) {
  *os << p.set_name << ": ";
  PrintTo(p.c, os);
}

std::vector<ConformanceParam> conformance_params(DeviceType device, CaseSelection which) {
  std::vector<ConformanceCase> cases;
  if (which == CaseSelection::kFullCases) {
    cases = conformance_cases(ConformanceScope::kFull);
  } else {
    std::set<std::string> full_names;
    for (const auto& c : conformance_cases(ConformanceScope::kFull)) full_names.insert(c.name);
    for (auto& c : conformance_cases(ConformanceScope::kSlow)) {
      if (full_names.count(c.name) == 0) cases.push_back(std::move(c));
    }
  }
  std::vector<ConformanceParam> out;
  for (const OpSet* set : OpRegistry::global().list()) {
    if (set->device != device) continue;
    for (const auto& c : cases) out.push_back({set->name, device, c});
  }
  return out;
}

std::string conformance_param_name(const ::testing::TestParamInfo<ConformanceParam>& info) {
  std::string s = info.param.set_name + "_" + info.param.c.name;
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

// The cuda instantiation (tests/gpu) yields no cases in a build without CUDA.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);

TEST_P(Conformance, MatchesReference) {
  const ConformanceParam& p = GetParam();
  const bool on_cpu = p.device == DeviceType::kCpu;
  const Device device = on_cpu ? Device::cpu() : Device::cuda();
  if (!on_cpu && !device_available(device)) {
    GTEST_SKIP() << "no " << device.to_string() << " device: device_count is 0";
  }
  const OpSet* set = OpRegistry::global().find(p.set_name);
  ASSERT_NE(set, nullptr) << "OpSet " << p.set_name << " is not registered";
  RunOptions opt;
  opt.check_determinism = !on_cpu;
  const CaseResult r = run_conformance_case(*set, p.c, device, opt);
  if (r.skipped) {
    // The cpu sets implement every op for every supported shape: a skip is a failure there.
    ASSERT_FALSE(on_cpu) << r.name << " skipped: " << r.skip_reason;
    GTEST_SKIP() << r.name << ": " << r.skip_reason;
  }
  EXPECT_TRUE(r.passed) << describe_result(r) << "\n" << r.message;
  if (opt.check_determinism) {
    EXPECT_TRUE(r.deterministic) << r.name << ": two runs on the same inputs differ bitwise";
  }
}

}  // namespace mla::testing
