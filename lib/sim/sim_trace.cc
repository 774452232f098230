#include "sim_trace.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace mla::sim {
namespace {

using nlohmann::json;

constexpr std::string_view kFields[] = {"arrival_step", "prompt_len", "output_len", "prefix_group",
                                        "prefix_len"};

// Reads an integer field into *out; absent optional fields keep *out.
Status read_int(const json& obj, std::string_view field, bool required, int line, int64_t lo,
                int64_t hi, int64_t* out) {
  auto it = obj.find(std::string(field));
  if (it == obj.end()) {
    MLA_CHECK_ARG(!required, "trace line {}: required field \"{}\" is missing", line, field);
    return Status::Ok();
  }
  MLA_CHECK_ARG(it->is_number_integer(), "trace line {}: \"{}\" = {} is not an integer", line,
                field, it->dump());
  const int64_t v = it->get<int64_t>();
  MLA_CHECK_ARG(v >= lo && v <= hi, "trace line {}: \"{}\" = {} is outside {}..{}", line, field, v,
                lo, hi);
  *out = v;
  return Status::Ok();
}

Status parse_line(std::string_view text, int line, RequestSpec* r) {
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return invalid_argument("trace line {}: a NUL byte at column {} (a trace is JSON text)", line,
                            nul + 1);
  }
  json obj = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  MLA_CHECK_ARG(!obj.is_discarded(), "trace line {}: not valid JSON: {}", line, text.substr(0, 80));
  MLA_CHECK_ARG(obj.is_object(), "trace line {}: expected a JSON object, got {}", line,
                obj.type_name());
  for (const auto& item : obj.items()) {
    const bool known =
        std::find(std::begin(kFields), std::end(kFields), item.key()) != std::end(kFields);
    MLA_CHECK_ARG(known,
                  "trace line {}: unknown field \"{}\" (known: arrival_step, prompt_len, "
                  "output_len, prefix_group, prefix_len)",
                  line, item.key());
  }
  constexpr int64_t kMaxLen = std::numeric_limits<int32_t>::max();
  int64_t arrival = 0, prompt = 0, output = 0, group = 0, prefix = 0;
  MLA_RETURN_IF_ERROR(
      read_int(obj, "arrival_step", false, line, 0, std::numeric_limits<int64_t>::max(), &arrival));
  MLA_RETURN_IF_ERROR(read_int(obj, "prompt_len", true, line, 1, kMaxLen, &prompt));
  MLA_RETURN_IF_ERROR(read_int(obj, "output_len", true, line, 1, kMaxLen, &output));
  MLA_RETURN_IF_ERROR(read_int(obj, "prefix_group", false, line, 0, kMaxLen, &group));
  MLA_RETURN_IF_ERROR(read_int(obj, "prefix_len", false, line, 0, prompt - 1, &prefix));
  MLA_CHECK_ARG(group > 0 || prefix == 0,
                "trace line {}: \"prefix_len\" = {} needs \"prefix_group\" > 0", line, prefix);
  r->arrival_step = arrival;
  r->prompt_len = static_cast<int32_t>(prompt);
  r->output_len = static_cast<int32_t>(output);
  r->prefix_group = static_cast<int>(group);
  r->prefix_len = static_cast<int32_t>(prefix);
  r->line = line;
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<RequestSpec>> parse_trace(std::string_view text) {
  std::vector<RequestSpec> out;
  int line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    const std::size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line[first] == '#') continue;
    RequestSpec r;
    MLA_RETURN_IF_ERROR(parse_line(line, line_no, &r));
    out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(), [](const RequestSpec& a, const RequestSpec& b) {
    return a.arrival_step < b.arrival_step;
  });
  for (std::size_t i = 0; i < out.size(); ++i) out[i].id = static_cast<int>(i);
  return out;
}

StatusOr<std::vector<RequestSpec>> load_trace(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return invalid_argument("trace file \"{}\" is a directory, not a JSONL file", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return invalid_argument("trace file \"{}\" cannot be opened", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return invalid_argument("trace file \"{}\" cannot be read", path);
  auto parsed = parse_trace(ss.str());
  if (!parsed.ok()) {
    return Status(parsed.status().code(), path + ": " + parsed.status().message());
  }
  if (parsed->empty()) {
    return invalid_argument("trace file \"{}\" holds no request ({}); nothing to run", path,
                            ss.str().empty() ? "it is empty" : "only blank lines and comments");
  }
  return parsed;
}

std::string trace_line(const RequestSpec& r) {
  json obj;
  obj["arrival_step"] = r.arrival_step;
  obj["prompt_len"] = r.prompt_len;
  obj["output_len"] = r.output_len;
  if (r.prefix_group > 0) {
    obj["prefix_group"] = r.prefix_group;
    obj["prefix_len"] = r.prefix_len;
  }
  return obj.dump();
}

}  // namespace mla::sim
