// Fuzz target `trace`: the `mla run --trace` parser (lib/sim/sim_trace.cc) on arbitrary text.
// Invariants: no crash, no exception, no sanitizer report; a rejected trace is kInvalidArgument
// naming the line ("trace line N: ..."); an accepted trace has every field in range, ids
// 0..n-1 in arrival order, and survives a round trip through trace_line.
#include "fuzz/fuzz_target.h"
#include "sim/sim_trace.h"

MLA_FUZZ_TARGET(trace) {
  using namespace mla;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = sim::parse_trace(text);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == StatusCode::kInvalidArgument, "code of {}",
               parsed.status().to_string());
    FUZZ_CHECK(parsed.status().message().rfind("trace line ", 0) == 0,
               "the error does not name the line: {}", parsed.status().message());
    return "";
  }
  const auto& reqs = *parsed;
  std::string again;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const sim::RequestSpec& r = reqs[i];
    FUZZ_CHECK(r.id == static_cast<int>(i), "id {} at {}", r.id, i);
    FUZZ_CHECK(i == 0 || reqs[i - 1].arrival_step <= r.arrival_step, "not sorted at {}", i);
    FUZZ_CHECK(r.arrival_step >= 0 && r.prompt_len >= 1 && r.output_len >= 1 &&
                   r.prefix_group >= 0 && r.prefix_len >= 0 && r.prefix_len < r.prompt_len &&
                   (r.prefix_group > 0 || r.prefix_len == 0),
               "request {} out of range", i);
    again += sim::trace_line(r) + "\n";
  }
  auto reparsed = sim::parse_trace(again);
  FUZZ_CHECK(reparsed.ok(), "round trip rejected: {}", reparsed.status().to_string());
  FUZZ_CHECK(reparsed->size() == reqs.size(), "round trip has {} of {} requests", reparsed->size(),
             reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const auto &a = reqs[i], &b = (*reparsed)[i];
    FUZZ_CHECK(a.arrival_step == b.arrival_step && a.prompt_len == b.prompt_len &&
                   a.output_len == b.output_len && a.prefix_group == b.prefix_group &&
                   a.prefix_len == b.prefix_len,
               "request {} changed in the round trip", i);
  }
  return "";
}
