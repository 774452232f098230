// The request checks of an absorbed problem (check_absorbed_problem, include/mla/ops.h): one rule
// that the cpu op's plan() and the cuda planner (build_plan, whose branch-free pass sends a bad
// batch to the shared checks for the message) both apply. Every bad problem is refused by all
// three with kInvalidArgument and the same message, naming the field and the value, and no plan
// byte is written. (tests/python/test_torch_integration.py checks the same through Python.)
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/absorbed/plan.h"
#include "mla/ops.h"
#include "unit_util.h"

namespace mla::testing {
namespace {

constexpr int kCtas = 8;
constexpr std::byte kPoison{0xA5};

struct Problem {
  int num_heads = 16;
  int page_size = 16;
  std::vector<int32_t> req_rows{1, 2};
  std::vector<int32_t> q_lens{1, 1};
  std::vector<int32_t> kv_lens{5, 0};  // causal kv_len < q_len is allowed
  AttnCapacity cap{4, 8, 0, 2, 16};
  AbsorbedProblem view() const {
    return AbsorbedProblem{num_heads, page_size, true, req_rows, q_lens, kv_lens};
  }
};

struct BadCase {
  std::string what;
  std::function<void(Problem&)> spoil;
  std::string message;  // the start of the message every path gives
};

std::vector<BadCase> bad_cases() {
  return {
      {"sizes differ", [](Problem& p) { p.q_lens = {1}; },
       "req_rows has 2 entries, q_lens 1, kv_lens 2 (one per request)"},
      {"batch over capacity", [](Problem& p) { p.cap.max_batch = 1; },
       "batch size 2 exceeds capacity max_batch = 1"},
      {"no heads", [](Problem& p) { p.num_heads = 0; }, "num_heads = 0 must be at least 1"},
      {"heads differ from the capacity's", [](Problem& p) { p.cap.num_heads = 32; },
       "num_heads = 16 differs from the capacity's num_heads = 32"},
      {"page size not served", [](Problem& p) { p.page_size = 24; },
       "page_size = 24 is not served (mla serves page sizes 1, 16, 32, 64, 128 tokens)"},
      {"negative q_len", [](Problem& p) { p.q_lens[1] = -1; }, "q_lens[1] = -1 is negative"},
      {"negative kv_len", [](Problem& p) { p.kv_lens[0] = -3; }, "kv_lens[0] = -3 is negative"},
      {"negative req_row", [](Problem& p) { p.req_rows[1] = -2; }, "req_rows[1] = -2 is negative"},
      {"q_len over max_q_len", [](Problem& p) { p.q_lens[0] = 3; },
       "q_lens[0] = 3 exceeds capacity max_q_len = 2"},
      {"tokens over max_q_tokens", [](Problem& p) { p.cap.max_q_tokens = 1; },
       "sum(q_lens) = 2 exceeds capacity max_q_tokens = 1"},
  };
}

const AbsorbedAttentionOp& cpu_absorbed() { return *OpRegistry::global().find("cpu")->absorbed; }

// The cpu op's plan and the cuda planner, each into a poisoned buffer: the status and whether
// any byte changed.
struct Planned {
  Status status;
  bool wrote = false;
};

Planned plan_cpu(const Problem& p) {
  std::vector<std::byte> bytes(cpu_absorbed().plan_bytes(p.cap), kPoison);
  const std::vector<std::byte> before = bytes;
  auto r = cpu_absorbed().plan(p.view(), p.cap, bytes);
  return {r.ok() ? Status::Ok() : r.status(), bytes != before};
}

Planned plan_cuda(const Problem& p) {
  std::vector<std::byte> bytes(cuda::absorbed::plan_layout(p.cap, kCtas).bytes, kPoison);
  const std::vector<std::byte> before = bytes;
  auto r = cuda::absorbed::build_plan(p.view(), p.cap, kCtas, bytes);
  return {r.ok() ? Status::Ok() : r.status(), bytes != before};
}

TEST(AbsorbedProblem, AValidProblemIsAcceptedByTheRuleAndBothPlanners) {
  const Problem p;
  EXPECT_TRUE(check_absorbed_problem(p.view(), p.cap).ok());
  const Planned cpu = plan_cpu(p), cuda = plan_cuda(p);
  EXPECT_TRUE(cpu.status.ok()) << cpu.status.to_string();
  EXPECT_TRUE(cuda.status.ok()) << cuda.status.to_string();
  // num_heads 0 in a capacity: any head count (plan_layout sizes for the most).
  Problem any = p;
  any.cap.num_heads = 0;
  EXPECT_TRUE(check_absorbed_problem(any.view(), any.cap).ok());
  EXPECT_TRUE(plan_cpu(any).status.ok());
  EXPECT_TRUE(plan_cuda(any).status.ok());
}

TEST(AbsorbedProblem, EveryPathRefusesABadProblemWithOneMessageAndWritesNothing) {
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.what);
    Problem p;
    c.spoil(p);
    const Status rule = check_absorbed_problem(p.view(), p.cap);
    ASSERT_FALSE(rule.ok());
    EXPECT_EQ(rule.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(rule.message().rfind(c.message, 0), 0u) << rule.message();
    for (const auto& [name, planned] : {std::pair{"cpu", plan_cpu(p)}, {"cuda", plan_cuda(p)}}) {
      SCOPED_TRACE(name);
      ASSERT_FALSE(planned.status.ok());
      EXPECT_EQ(planned.status.code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(planned.status.message(), rule.message());
      EXPECT_FALSE(planned.wrote) << "a refused plan wrote plan bytes";
    }
  }
}

TEST(AbsorbedProblem, TheRequestChecksNameTheFirstBadRequestInOrder) {
  Problem p;
  p.req_rows = {0, 1, 2, 3};
  p.q_lens = {1, 1, -4, -5};
  p.kv_lens = {3, -1, 2, 2};
  const Status st = check_absorbed_requests(p.view(), p.cap);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "kv_lens[1] = -1 is negative");
  // The cuda planner's fast pass finds the batch bad and asks the same checks.
  EXPECT_EQ(plan_cuda(p).status.message(), st.message());
}

}  // namespace
}  // namespace mla::testing
