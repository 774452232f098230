// Status, StatusOr and the MLA_* check/propagation macros.
#include "mla/status.h"

#include <gtest/gtest.h>

#include <string>

#include "unit_util.h"

namespace mla {
namespace {

Status fails_with(StatusCode code) { return Status(code, "inner failure"); }

Status propagate(StatusCode code, bool* reached_end) {
  MLA_RETURN_IF_ERROR(fails_with(code));
  *reached_end = true;
  return Status::Ok();
}

StatusOr<int> maybe_int(bool ok) {
  if (!ok) return invalid_argument("value = {} rejected", 7);
  return 41;
}

StatusOr<int> add_one(bool ok) {
  MLA_ASSIGN_OR_RETURN(int v, maybe_int(ok));
  return v + 1;
}

Status check_seq(int b, int seq, int prefix) {
  MLA_CHECK_ARG(seq >= prefix, "seq_lens[{}] = {} is below extend_prefix_lens[{}] = {}", b, seq, b,
                prefix);
  return Status::Ok();
}

Status check_workspace(std::size_t have, std::size_t need) {
  MLA_CHECK_CODE(StatusCode::kOutOfWorkspace, have >= need, "workspace has {} bytes, needs {}",
                 have, need);
  return Status::Ok();
}

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "Ok");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(Status, ToStringHasCodeNameAndMessage) {
  const Status s = invalid_argument("seq_lens[{}] = {}", 2, 3);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "seq_lens[2] = 3");
  EXPECT_EQ(s.to_string(), "InvalidArgument: seq_lens[2] = 3");
}

TEST(Status, EveryCodeHasADistinctName) {
  const StatusCode codes[] = {
      StatusCode::kOk,          StatusCode::kInvalidArgument, StatusCode::kUnsupported,
      StatusCode::kOutOfMemory, StatusCode::kOutOfWorkspace,  StatusCode::kCudaError,
      StatusCode::kInternal};
  for (StatusCode a : codes) {
    EXPECT_FALSE(status_code_name(a).empty());
    for (StatusCode b : codes) {
      if (a != b) {
        EXPECT_NE(status_code_name(a), status_code_name(b));
      }
    }
  }
  EXPECT_EQ(unsupported("x").code(), StatusCode::kUnsupported);
  EXPECT_EQ(internal_error("x").code(), StatusCode::kInternal);
  EXPECT_EQ(make_status(StatusCode::kCudaError, "e {}", 1).to_string(), "CudaError: e 1");
}

TEST(StatusOr, HoldsValue) {
  StatusOr<std::string> v(std::string("abc"));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "abc");
  EXPECT_EQ(v->size(), 3u);
  EXPECT_EQ(std::move(v).value(), "abc");
}

TEST(StatusOr, HoldsError) {
  StatusOr<int> v = maybe_int(false);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(), "value = 7 rejected");
}

TEST(StatusOr, BuiltFromOkStatusIsAnInternalError) {
  StatusOr<int> v(Status::Ok());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

TEST(StatusMacros, ReturnIfErrorPropagatesAndStops) {
  bool reached = false;
  const Status s = propagate(StatusCode::kOutOfMemory, &reached);
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(s.message(), "inner failure");
  EXPECT_FALSE(reached);
}

TEST(StatusMacros, AssignOrReturnUnwrapsOrPropagates) {
  StatusOr<int> good = add_one(true);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 42);
  StatusOr<int> bad = add_one(false);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "value = 7 rejected");
}

TEST(StatusMacros, CheckArgMessageCarriesValuesAndKeepsTheCondition) {
  EXPECT_TRUE(check_seq(0, 5, 5).ok());
  const Status s = check_seq(2, 3, 5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  MLA_EXPECT_CONTAINS(s.message(), "seq_lens[2] = 3 is below extend_prefix_lens[2] = 5");
  // The message is a sentence; the condition's text is kept apart, not appended.
  EXPECT_EQ(s.message().find("seq >= prefix"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("check failed"), std::string::npos) << s.message();
  EXPECT_EQ(s.failed_check(), "seq >= prefix");
}

TEST(StatusMacros, CheckCodeUsesTheGivenCode) {
  EXPECT_TRUE(check_workspace(10, 10).ok());
  const Status s = check_workspace(10, 11);
  EXPECT_EQ(s.code(), StatusCode::kOutOfWorkspace);
  MLA_EXPECT_CONTAINS(s.message(), "workspace has 10 bytes, needs 11");
}

}  // namespace
}  // namespace mla
