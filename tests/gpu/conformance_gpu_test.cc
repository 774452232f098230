// The conformance driver (tests/conformance/driver.h) on the cuda OpSet: the GPU runs exactly
// the cpu cases, outputs poisoned first, every element checked against the double-precision
// reference, and each result must be bitwise identical to a second run on the same inputs.
// Heavy cases are labelled `slow` (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include "conformance/driver.h"

namespace mla::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Full, Conformance,
                         ::testing::ValuesIn(conformance_params(DeviceType::kCuda,
                                                                CaseSelection::kFullCases)),
                         conformance_param_name);
INSTANTIATE_TEST_SUITE_P(Heavy, Conformance,
                         ::testing::ValuesIn(conformance_params(DeviceType::kCuda,
                                                                CaseSelection::kHeavyCasesOnly)),
                         conformance_param_name);

}  // namespace
}  // namespace mla::testing
