#include "sim/run_report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace mla::cli {

bool built_with_cuda() {
#ifdef MLA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<AllocationRecord> new_allocations(const std::vector<AllocationRecord>& before) {
  std::set<uint64_t> old;
  for (const AllocationRecord& r : before) old.insert(r.id);
  std::vector<AllocationRecord> out;
  for (const AllocationRecord& r : MemoryLedger::global().snapshot()) {
    if (!old.count(r.id)) out.push_back(r);
  }
  return out;
}

nlohmann::json ledger_json(const std::vector<AllocationRecord>& records, bool skip_kv_pool) {
  nlohmann::json out = nlohmann::json::array();
  for (const AllocationRecord& r : records) {
    if (skip_kv_pool && r.owner.rfind("kv_pool", 0) == 0) continue;
    out.push_back({{"name", r.name},
                   {"owner", r.owner},
                   {"device", r.device.to_string()},
                   {"bytes", r.bytes},
                   {"zeroed", r.zeroed}});
  }
  return out;
}

void print_ledger_table(const nlohmann::json& records, std::string_view indent) {
  if (records.empty()) {
    fmt::print("{}(no allocations)\n", indent);
    return;
  }
  fmt::print("{}{:<36} {:<24} {:<7} {:>12} {:>6}\n", indent, "name", "owner", "device", "bytes",
             "zeroed");
  for (const auto& r : records) {
    fmt::print("{}{:<36} {:<24} {:<7} {:>12} {:>6}\n", indent, r["name"].get<std::string>(),
               r["owner"].get<std::string>(), r["device"].get<std::string>(),
               r["bytes"].get<std::size_t>(), r["zeroed"].get<bool>() ? "yes" : "no");
  }
}

std::string human_bytes(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (1u << 30)) return fmt::format("{:.2f} GiB", b / (1u << 30));
  if (bytes >= (1u << 20)) return fmt::format("{:.2f} MiB", b / (1u << 20));
  if (bytes >= (1u << 10)) return fmt::format("{:.1f} KiB", b / (1u << 10));
  return fmt::format("{} B", bytes);
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled),
      tty_(isatty(fileno(stderr)) != 0) {}

void Progress::update(int64_t done, std::string_view detail) {
  if (!enabled_) return;
  const int64_t clamped = std::clamp<int64_t>(done, 0, total_);
  if (tty_) {
    const int64_t t = now_ns();
    if (t - last_draw_ns_ < 100'000'000 && clamped < total_) return;  // redraw at most 10/s
    last_draw_ns_ = t;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(clamped * kWidth / total_);
    std::fprintf(stderr, "\r%s [%s%s] %3d%% %.*s\033[K", label_.c_str(),
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(),
                 static_cast<int>(clamped * 100 / total_), static_cast<int>(detail.size()),
                 detail.data());
    std::fflush(stderr);
    return;
  }
  const int decile = static_cast<int>(clamped * 10 / total_);
  if (decile == last_decile_) return;
  last_decile_ = decile;
  std::fprintf(stderr, "%s %3d%% %.*s\n", label_.c_str(), decile * 10,
               static_cast<int>(detail.size()), detail.data());
}

void Progress::finish() {
  if (enabled_ && tty_) std::fprintf(stderr, "\n");
}

}  // namespace mla::cli
