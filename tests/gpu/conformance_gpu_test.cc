// Every conformance case (lib/conformance) on the "cuda" OpSet: the GPU runs exactly the CPU cases,
// outputs poisoned first, every element checked against the double-precision reference, and
// each result must be bitwise identical to a second run on the same inputs.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "conformance/conformance.h"
#include "mla/memory.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

std::vector<ConformanceCase> gpu_cases() {
  std::vector<ConformanceCase> cases = conformance_cases(ConformanceScope::kFull);
  // Heavy cases run under a "Slow" test name (label slow).
  for (ConformanceCase& c : conformance_cases(ConformanceScope::kSlow)) {
    bool dup = false;
    for (const ConformanceCase& f : cases) dup = dup || f.name == c.name;
    if (!dup) {
      c.name = "Slow/" + c.name;
      cases.push_back(c);
    }
  }
  return cases;
}

const std::vector<ConformanceCase>& all_cases() {
  static const std::vector<ConformanceCase> cases = gpu_cases();
  return cases;
}

std::string gtest_name(const std::string& name) {
  std::string out;
  for (char ch : name) out += (std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_');
  return out;
}

class CudaConformance : public ::testing::TestWithParam<int> {};

TEST_P(CudaConformance, MatchesReference) {
  if (!device_available(Device::cuda())) GTEST_SKIP() << "no CUDA device: device_count is 0";
  const OpSet* ops = OpRegistry::global().find("cuda");
  ASSERT_NE(ops, nullptr) << "the cuda OpSet is not registered";
  const ConformanceCase& c = all_cases()[GetParam()];
  ConformanceCase run_case = c;
  if (run_case.name.rfind("Slow/", 0) == 0) run_case.name = run_case.name.substr(5);
  RunOptions opt;
  opt.check_determinism = true;
  const CaseResult r = run_conformance_case(*ops, run_case, Device::cuda(), opt);
  if (r.skipped) GTEST_SKIP() << c.name << ": " << r.skip_reason;
  EXPECT_TRUE(r.passed) << describe_result(r) << "\n" << r.message;
  EXPECT_TRUE(r.deterministic) << c.name << ": two runs on the same inputs differ bitwise";
}

INSTANTIATE_TEST_SUITE_P(All, CudaConformance,
                         ::testing::Range(0, static_cast<int>(all_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return gtest_name(all_cases()[info.param].name);
                         });

}  // namespace
}  // namespace mla::testing
