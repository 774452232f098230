// Helpers shared by the `mla` subcommands: device parsing, error printing, ledger tables,
// human-readable sizes, a progress bar.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "mla/memory.h"
#include "mla/ops.h"
#include "mla/status.h"
#include "mla/types.h"
#include "sim/run_report.h"

namespace mla::cli {

inline constexpr const char* kVersion = "0.1.0";
// The git commit the build was configured at ("unknown" outside a git checkout).
const char* git_commit();
// "mla 0.1.0 (commit abc1234)"
std::string version_string();

std::string compiler_string();  // "g++ 12.2.0"

// "cpu", "cuda", "cuda:1".
StatusOr<Device> parse_device(std::string_view text);
// The devices `mla check` / `mla run` consider: "" = every device type, else the one named.
std::vector<Device> all_devices();

// Flag validators. CLI11 runs them on the text the user wrote, before converting it, so every
// value is checked as written (no wrap-around, no octal "010", no silent clamp) and rewritten to
// its canonical decimal form (attach the integer ones with ->transform(), which keeps the
// rewrite; ->check() would discard it); an error names the flag (CLI11 prefixes it) and quotes
// the text.
CLI::Validator integer_in(int64_t lo, int64_t hi);  // a base-10 integer in lo..hi
CLI::Validator unsigned_integer();                  // a base-10 integer in 0..2^64-1
CLI::Validator integer_one_of(std::vector<int64_t> allowed);
CLI::Validator positive_finite();                           // a finite number > 0
CLI::Validator device_name();                               // cpu, cuda, cuda:N
CLI::Validator word_in(std::vector<std::string> allowed);   // one of these words
CLI::Validator words_in(std::vector<std::string> allowed);  // comma list of these words

// Prints "mla: <status>" on stderr and returns 1.
int fail(const Status& status);

// Names of the ops an op set provides ("absorbed", "mha", ...).
std::vector<std::string> op_set_members(const OpSet& set);

}  // namespace mla::cli
