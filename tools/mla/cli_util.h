// Helpers shared by the `mla` subcommands: device parsing, error printing, ledger tables,
// human-readable sizes, a progress bar.
#pragma once

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

std::string compiler_string();  // "g++ 12.2.0"
bool built_with_cuda();

// "cpu", "cuda", "cuda:1".
StatusOr<Device> parse_device(std::string_view text);
// The devices `mla check` / `mla run` consider: "" = every device type, else the one named.
std::vector<Device> all_devices();

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
