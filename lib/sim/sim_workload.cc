#include "sim_workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace mla::sim {
namespace {

int32_t lognormal_clamped(std::mt19937_64& rng, double median, double sigma, int32_t lo,
                          int32_t hi) {
  std::lognormal_distribution<double> dist(std::log(median), sigma);
  const double v = std::round(dist(rng));
  return static_cast<int32_t>(std::clamp<double>(v, lo, hi));
}

}  // namespace

Status WorkloadConfig::validate() const {
  MLA_CHECK_ARG(num_requests >= 0, "workload.num_requests = {} is negative", num_requests);
  MLA_CHECK_ARG(arrival_rate > 0.0, "workload.arrival_rate = {} must be > 0", arrival_rate);
  MLA_CHECK_ARG(initial_burst >= 0, "workload.initial_burst = {} is negative", initial_burst);
  MLA_CHECK_ARG(prompt_median >= 1.0 && prompt_sigma >= 0.0,
                "workload.prompt_median = {} must be >= 1 and prompt_sigma = {} >= 0",
                prompt_median, prompt_sigma);
  MLA_CHECK_ARG(prompt_min >= 1 && prompt_min <= prompt_max,
                "workload.prompt_min = {} must be in 1..prompt_max = {}", prompt_min, prompt_max);
  MLA_CHECK_ARG(prefix_hit_prob >= 0.0 && prefix_hit_prob <= 1.0,
                "workload.prefix_hit_prob = {} is outside [0, 1]", prefix_hit_prob);
  MLA_CHECK_ARG(prefix_groups >= 0, "workload.prefix_groups = {} is negative", prefix_groups);
  MLA_CHECK_ARG(prefix_len_min >= 1 && prefix_len_min <= prefix_len_max,
                "workload.prefix_len_min = {} must be in 1..prefix_len_max = {}", prefix_len_min,
                prefix_len_max);
  MLA_CHECK_ARG(output_median >= 1.0 && output_sigma >= 0.0,
                "workload.output_median = {} must be >= 1 and output_sigma = {} >= 0",
                output_median, output_sigma);
  MLA_CHECK_ARG(output_min >= 1 && output_min <= output_max,
                "workload.output_min = {} must be in 1..output_max = {}", output_min, output_max);
  return Status::Ok();
}

StatusOr<std::vector<RequestSpec>> generate_workload(const WorkloadConfig& c) {
  MLA_RETURN_IF_ERROR(c.validate());
  std::mt19937_64 rng(c.seed);
  std::uniform_int_distribution<int32_t> prefix_len_dist(c.prefix_len_min, c.prefix_len_max);
  std::vector<int32_t> group_len(static_cast<std::size_t>(c.prefix_groups) + 1, 0);
  for (int g = 1; g <= c.prefix_groups; ++g) group_len[g] = prefix_len_dist(rng);

  std::exponential_distribution<double> gap(c.arrival_rate);
  std::bernoulli_distribution hit(c.prefix_groups > 0 ? c.prefix_hit_prob : 0.0);
  std::uniform_int_distribution<int> pick_group(1, std::max(c.prefix_groups, 1));

  std::vector<RequestSpec> out;
  out.reserve(static_cast<std::size_t>(c.num_requests));
  double clock = 0.0;
  for (int i = 0; i < c.num_requests; ++i) {
    RequestSpec r;
    r.id = i;
    if (i >= c.initial_burst) clock += gap(rng);
    r.arrival_step = static_cast<int64_t>(clock);
    const int32_t own =
        lognormal_clamped(rng, c.prompt_median, c.prompt_sigma, c.prompt_min, c.prompt_max);
    if (hit(rng)) {
      r.prefix_group = pick_group(rng);
      r.prefix_len = group_len[static_cast<std::size_t>(r.prefix_group)];
    }
    r.prompt_len = r.prefix_len + own;
    r.output_len =
        lognormal_clamped(rng, c.output_median, c.output_sigma, c.output_min, c.output_max);
    out.push_back(r);
  }
  return out;
}

std::string request_name(const RequestSpec& r) {
  return r.line > 0 ? fmt::format("trace line {}", r.line) : fmt::format("request {}", r.id);
}

Status validate_request(const RequestSpec& r, int32_t max_context_len, int32_t extra_tokens) {
  MLA_CHECK_ARG(r.arrival_step >= 0, "{}: arrival_step = {} is negative", request_name(r),
                r.arrival_step);
  MLA_CHECK_ARG(r.prompt_len >= 1, "{}: prompt_len = {} must be >= 1", request_name(r),
                r.prompt_len);
  MLA_CHECK_ARG(r.output_len >= 1, "{}: output_len = {} must be >= 1", request_name(r),
                r.output_len);
  MLA_CHECK_ARG(r.prefix_group >= 0, "{}: prefix_group = {} is negative", request_name(r),
                r.prefix_group);
  MLA_CHECK_ARG(r.prefix_len >= 0 && r.prefix_len < r.prompt_len,
                "{}: prefix_len = {} must be in 0..prompt_len - 1 = {}", request_name(r),
                r.prefix_len, r.prompt_len - 1);
  MLA_CHECK_ARG(r.prefix_group != 0 || r.prefix_len == 0,
                "{}: prefix_len = {} needs a prefix_group > 0", request_name(r), r.prefix_len);
  const int64_t peak = static_cast<int64_t>(r.prompt_len) + r.output_len - 1 + extra_tokens;
  MLA_CHECK_ARG(
      peak <= max_context_len,
      "{}: prompt_len + output_len - 1 + {} = {} exceeds max_context_len = {} (--max-context-len)",
      request_name(r), extra_tokens, peak, max_context_len);
  return Status::Ok();
}

std::string describe_workload(const std::vector<RequestSpec>& requests) {
  if (requests.empty()) return "0 requests";
  std::vector<int32_t> prompts;
  int64_t outputs = 0;
  int shared = 0;
  for (const RequestSpec& r : requests) {
    prompts.push_back(r.prompt_len);
    outputs += r.output_len;
    if (r.prefix_group > 0) ++shared;
  }
  std::sort(prompts.begin(), prompts.end());
  return fmt::format(
      "{} requests over {} steps, prompts {}..{} (median {}), {} output tokens, {} with a shared "
      "prefix",
      requests.size(), requests.back().arrival_step + 1, prompts.front(), prompts.back(),
      prompts[prompts.size() / 2], outputs, shared);
}

}  // namespace mla::sim
