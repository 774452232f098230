// Request traces for `mla run --trace FILE.jsonl`: one JSON object per line, one request per
// object (format in docs/trace-format.md). Pure host code, unit-tested in tests/unit/cli_*.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mla/status.h"
#include "sim_workload.h"

namespace mla::sim {

// Parses trace text. Blank lines and lines starting with '#' are skipped. Every error names the
// line number (1-based) and the field: malformed JSON, a missing or mistyped required field
// (prompt_len, output_len), an unknown field, a value out of range. Requests come back sorted
// by arrival_step (stable, so lines of one step keep their order) with ids 0..n-1 in that order.
StatusOr<std::vector<RequestSpec>> parse_trace(std::string_view text);

// Reads and parses a file; a missing, unreadable or directory path, a parse error and a file
// without any request (empty, or comments only) are kInvalidArgument naming the path. A NUL
// byte inside a line is an error naming the line.
StatusOr<std::vector<RequestSpec>> load_trace(const std::string& path);

// One trace line for a request (inverse of parse_trace for one line).
std::string trace_line(const RequestSpec& r);

}  // namespace mla::sim
