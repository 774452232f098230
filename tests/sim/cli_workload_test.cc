// The embedded workload generator of `mla run` (lib/sim/sim_workload.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "sim/sim_workload.h"

namespace mla::sim {
namespace {

TEST(CliWorkload, SameSeedSameWorkloadOtherSeedDiffers) {
  WorkloadConfig c;
  c.num_requests = 64;
  auto a = generate_workload(c);
  auto b = generate_workload(c);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(a->size(), 64u);
  bool same = true;
  for (std::size_t i = 0; i < a->size(); ++i) {
    same = same && (*a)[i].prompt_len == (*b)[i].prompt_len &&
           (*a)[i].output_len == (*b)[i].output_len && (*a)[i].arrival_step == (*b)[i].arrival_step;
  }
  EXPECT_TRUE(same);
  c.seed = 2;
  auto d = generate_workload(c);
  ASSERT_TRUE(d.ok());
  int differ = 0;
  for (std::size_t i = 0; i < d->size(); ++i) differ += (*a)[i].prompt_len != (*d)[i].prompt_len;
  EXPECT_GT(differ, 32);
}

TEST(CliWorkload, RespectsDocumentedRangesAndOrder) {
  WorkloadConfig c;
  c.num_requests = 500;
  c.seed = 7;
  auto w = generate_workload(c);
  ASSERT_TRUE(w.ok());
  std::set<int> groups;
  std::vector<int32_t> own;
  int shared = 0;
  for (std::size_t i = 0; i < w->size(); ++i) {
    const RequestSpec& r = (*w)[i];
    EXPECT_EQ(r.id, static_cast<int>(i));
    if (i > 0) {
      EXPECT_LE((*w)[i - 1].arrival_step, r.arrival_step);
    }
    if (static_cast<int>(i) < c.initial_burst) {
      EXPECT_EQ(r.arrival_step, 0);
    }
    EXPECT_GE(r.output_len, c.output_min);
    EXPECT_LE(r.output_len, c.output_max);
    EXPECT_GT(r.prompt_len, r.prefix_len);
    const int32_t own_len = r.prompt_len - r.prefix_len;
    EXPECT_GE(own_len, c.prompt_min);
    EXPECT_LE(own_len, c.prompt_max);
    own.push_back(own_len);
    if (r.prefix_group > 0) {
      ++shared;
      groups.insert(r.prefix_group);
      EXPECT_LE(r.prefix_group, c.prefix_groups);
      EXPECT_GE(r.prefix_len, c.prefix_len_min);
      EXPECT_LE(r.prefix_len, c.prefix_len_max);
    } else {
      EXPECT_EQ(r.prefix_len, 0);
    }
    EXPECT_TRUE(validate_request(r, 1 << 20, 0).ok());
  }
  // Statistics with wide margins: half the requests share a prefix, the median of the
  // request's own prompt part is near prompt_median, and both groups occur.
  EXPECT_GT(shared, 180);
  EXPECT_LT(shared, 320);
  EXPECT_EQ(groups.size(), 2u);
  std::sort(own.begin(), own.end());
  EXPECT_GT(own[own.size() / 2], c.prompt_median * 0.8);
  EXPECT_LT(own[own.size() / 2], c.prompt_median * 1.25);
  // Requests of one group share one system-prompt length.
  for (const RequestSpec& r : *w) {
    for (const RequestSpec& s : *w) {
      if (r.prefix_group > 0 && r.prefix_group == s.prefix_group) {
        ASSERT_EQ(r.prefix_len, s.prefix_len);
      }
    }
  }
  // Arrivals after the burst: a Poisson stream of about arrival_rate per step.
  const double span = static_cast<double>(w->back().arrival_step);
  EXPECT_GT(span, (c.num_requests - c.initial_burst) / c.arrival_rate * 0.8);
  EXPECT_LT(span, (c.num_requests - c.initial_burst) / c.arrival_rate * 1.25);
}

TEST(CliWorkload, NoGroupsMeansNoSharedPrefix) {
  WorkloadConfig c;
  c.prefix_groups = 0;
  c.num_requests = 50;
  auto w = generate_workload(c);
  ASSERT_TRUE(w.ok());
  for (const RequestSpec& r : *w) EXPECT_EQ(r.prefix_group, 0);
}

TEST(CliWorkload, RejectsBadConfigNamingTheField) {
  WorkloadConfig c;
  c.prompt_min = 0;
  auto w = generate_workload(c);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("prompt_min"), std::string::npos);
  c = WorkloadConfig{};
  c.arrival_rate = 0.0;
  EXPECT_FALSE(generate_workload(c).ok());
}

TEST(CliWorkload, ValidateRequestChecksContextAndPrefix) {
  RequestSpec r;
  r.id = 3;
  r.prompt_len = 100;
  r.output_len = 20;
  EXPECT_TRUE(validate_request(r, 119, 0).ok());
  Status s = validate_request(r, 119, 2);  // 100 + 20 - 1 + 2 = 121 > 119
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("request 3"), std::string::npos);
  EXPECT_NE(s.message().find("121"), std::string::npos);
  r.prefix_group = 1;
  r.prefix_len = 100;
  EXPECT_FALSE(validate_request(r, 1000, 0).ok());
  r.prefix_len = 99;
  EXPECT_TRUE(validate_request(r, 1000, 0).ok());
  r.prefix_group = 0;
  EXPECT_FALSE(validate_request(r, 1000, 0).ok());
}

}  // namespace
}  // namespace mla::sim
