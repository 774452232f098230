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

namespace mla::cli {

inline constexpr const char* kVersion = "0.1.0";
// The git commit the build was configured at ("unknown" outside a git checkout).
const char* git_commit();
// "mla 0.1.0 (commit abc1234)"
std::string version_string();

std::string compiler_string();  // "g++ 12.2.0"
bool built_with_cuda();

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

// Ledger records added since `before` (by id).
std::vector<AllocationRecord> new_allocations(const std::vector<AllocationRecord>& before);
// [{"name","owner","device","bytes","zeroed"}], optionally without the kv pool's records.
nlohmann::json ledger_json(const std::vector<AllocationRecord>& records, bool skip_kv_pool);
void print_ledger_table(const nlohmann::json& records, std::string_view indent);

// Names of the ops an op set provides ("absorbed", "mha", ...).
std::vector<std::string> op_set_members(const OpSet& set);

std::string human_bytes(std::size_t bytes);  // "1.5 MiB"

// A one-line progress bar on stderr, redrawn in place when stderr is a terminal and printed
// every ~10% as plain lines otherwise; silent when disabled.
class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled);
  void update(int64_t done, std::string_view detail);
  void finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool tty_;
  int last_decile_ = -1;
  int64_t last_draw_ns_ = 0;
};

}  // namespace mla::cli
