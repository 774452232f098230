// Workload of `mla run`: the requests a serving simulation replays. Either generated from a
// seeded model of a chat-serving stream (generate_workload) or read from a JSONL trace
// (sim_trace.h). Pure host code, no backend involved, unit-tested in tests/unit/cli_*.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mla/status.h"

namespace mla::sim {

// One request as it arrives. Lengths are in tokens.
struct RequestSpec {
  int id = 0;                // position in the workload (0-based)
  int64_t arrival_step = 0;  // scheduler step at which the request becomes visible
  int32_t prompt_len = 1;    // >= 1
  int32_t output_len = 1;    // tokens to generate, >= 1 (the first comes from the prefill)
  int prefix_group = 0;      // 0 = no shared prefix; requests of one group share a system prompt
  int32_t prefix_len = 0;    // tokens of the shared system prompt (< prompt_len), 0 if group 0
  int line = 0;              // trace line it came from (1-based); 0 = generated
};

// How errors name a request: "trace line 7" for a traced one, else "request 3".
std::string request_name(const RequestSpec& r);

// The embedded default workload. Distributions (all seeded from `seed`):
//  - arrivals: a Poisson process, exponential gaps of mean 1 / arrival_rate steps; the first
//    `initial_burst` requests arrive at step 0 (a queue that is already waiting);
//  - prompt_len: log-normal, median prompt_median, sigma prompt_sigma, clamped to
//    [prompt_min, prompt_max];
//  - shared prefix: with probability prefix_hit_prob a request belongs to one of prefix_groups
//    system prompts (group chosen uniformly); group g's prompt has a fixed length drawn once,
//    uniform in [prefix_len_min, prefix_len_max]; the request's prompt is the system prompt
//    plus its own log-normal part, so prompt_len > prefix_len;
//  - output_len: log-normal, median output_median, sigma output_sigma, clamped to
//    [output_min, output_max].
struct WorkloadConfig {
  int num_requests = 24;
  uint64_t seed = 1;
  double arrival_rate = 0.5;  // requests per step after the burst
  int initial_burst = 8;
  double prompt_median = 128.0;
  double prompt_sigma = 0.7;
  int32_t prompt_min = 8;
  int32_t prompt_max = 2048;
  double prefix_hit_prob = 0.5;
  int prefix_groups = 2;
  int32_t prefix_len_min = 64;
  int32_t prefix_len_max = 256;
  double output_median = 24.0;
  double output_sigma = 0.5;
  int32_t output_min = 4;
  int32_t output_max = 96;

  Status validate() const;
};

// Requests sorted by arrival_step, ids 0..n-1 in that order. Deterministic for a given config.
StatusOr<std::vector<RequestSpec>> generate_workload(const WorkloadConfig& config);

// Checks one request against the limits of the run (names the request id and the field):
// prompt_len >= 1, output_len >= 1, 0 <= prefix_len < prompt_len, prefix_group >= 0 (and
// prefix_len 0 when the group is 0), arrival_step >= 0, and that the request's largest KV length
// prompt_len + output_len - 1 + extra_tokens fits max_context_len.
Status validate_request(const RequestSpec& r, int32_t max_context_len, int32_t extra_tokens);

// Short human summary: "32 requests, prompts 12..1024 (median 201), 15 with a shared prefix".
std::string describe_workload(const std::vector<RequestSpec>& requests);

}  // namespace mla::sim
