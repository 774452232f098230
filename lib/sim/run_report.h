// What a run reports besides its timings: ledger records as JSON and as a table, human-readable
// sizes, and a progress bar (the `mla` subcommands use them too, through cli_util.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "mla/memory.h"

namespace mla::cli {

bool built_with_cuda();  // the library was built with MLA_WITH_CUDA

// Ledger records added since `before` (by id).
std::vector<AllocationRecord> new_allocations(const std::vector<AllocationRecord>& before);
// [{"name","owner","device","bytes","zeroed"}], optionally without the kv pool's records.
nlohmann::json ledger_json(const std::vector<AllocationRecord>& records, bool skip_kv_pool);
void print_ledger_table(const nlohmann::json& records, std::string_view indent);

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
