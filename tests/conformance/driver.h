// The one conformance driver: every registered OpSet of a device x the conformance cases
// (tests/common), each run against the double-precision reference. Each test executable
// instantiates it for its device (tests/conformance: cpu; tests/gpu: cuda):
//   INSTANTIATE_TEST_SUITE_P(Full, Conformance,
//                            ValuesIn(conformance_params(DeviceType::kCpu,
//                                                     CaseSelection::kFullCases)),
//                            conformance_param_name);
// The test body (driver.cc) is compiled into both. Policy per device: an OpSet on the cpu
// implements every op for every supported shape, so a skip there is a failure; a cuda case
// skips when no device is present or the set does not support the shape, and is run twice to
// prove bitwise determinism (the cpu sets prove that in Determinism.*, on the quick cases).
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "conformance/conformance.h"
#include "mla/ops.h"

namespace mla::testing {

struct ConformanceParam {
  std::string set_name;
  DeviceType device = DeviceType::kCpu;
  ConformanceCase c;
};

void PrintTo(const ConformanceParam& p, std::ostream* os);

// Which cases: the full scope, or only the heavy cases the slow scope adds to it (long
// contexts, 128 heads x long q; label `slow`).
enum class CaseSelection : uint8_t { kFullCases, kHeavyCasesOnly };

// Every registered OpSet of `device` x the selected cases.
std::vector<ConformanceParam> conformance_params(DeviceType device, CaseSelection which);

// "<set>_<case name>" with every non-alphanumeric character replaced by '_'.
std::string conformance_param_name(const ::testing::TestParamInfo<ConformanceParam>& info);

class Conformance : public ::testing::TestWithParam<ConformanceParam> {};

}  // namespace mla::testing
