#include "cli_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "mla_version.h"

namespace mla::cli {

std::string compiler_string() {
#if defined(__clang__)
  return fmt::format("clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  return fmt::format("g++ {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

const char* git_commit() { return MLA_GIT_COMMIT; }

std::string version_string() { return fmt::format("mla {} (commit {})", kVersion, git_commit()); }

namespace {

// A whole base-10 integer (optional '-' for signed T), no spaces, no '+', no overflow.
template <typename T>
bool parse_integer(std::string_view text, T* out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *out, 10);
  return ec == std::errc() && ptr == end;
}

std::string quote_text(std::string_view text) {
  std::string out = "\"";
  for (char c : text.substr(0, 64)) {
    out += (static_cast<unsigned char>(c) < 0x20) ? '?' : c;
  }
  return out + (text.size() > 64 ? "...\"" : "\"");
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        if (!parse_integer(text, &v) || v < lo || v > hi) {
          return fmt::format("{} is not an integer in {}..{}", quote_text(text), lo, hi);
        }
        text = std::to_string(v);
        return {};
      },
      fmt::format("INT in [{} - {}]", lo, hi));
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        if (!parse_integer(text, &v)) {
          return fmt::format("{} is not an integer in 0..{}", quote_text(text),
                             std::numeric_limits<uint64_t>::max());
        }
        text = std::to_string(v);
        return {};
      },
      "UINT64");
}

CLI::Validator integer_one_of(std::vector<int64_t> allowed) {
  const std::string list = fmt::format("{}", fmt::join(allowed, ", "));
  return CLI::Validator(
      [allowed, list](std::string& text) -> std::string {
        int64_t v = 0;
        if (!parse_integer(text, &v) ||
            std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
          return fmt::format("{} is not one of {}", quote_text(text), list);
        }
        text = std::to_string(v);
        return {};
      },
      fmt::format("one of {}", list));
}

CLI::Validator positive_finite() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0.0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(v) || !(v > 0.0)) {
          return fmt::format("{} is not a finite number > 0", quote_text(text));
        }
        return {};
      },
      "FLOAT > 0");
}

CLI::Validator device_name() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        auto d = parse_device(text);
        if (d.ok()) return {};
        return fmt::format("{} is not a device (cpu, cuda, cuda:N with N in 0..1023)",
                           quote_text(text));
      },
      "cpu|cuda|cuda:N");
}

CLI::Validator word_in(std::vector<std::string> allowed) {
  const std::string list = fmt::format("{}", fmt::join(allowed, ", "));
  return CLI::Validator(
      [allowed, list](std::string& text) -> std::string {
        if (std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
          return fmt::format("{} is not one of {}", quote_text(text), list);
        }
        return {};
      },
      "");
}

CLI::Validator words_in(std::vector<std::string> allowed) {
  const std::string list = fmt::format("{}", fmt::join(allowed, ", "));
  return CLI::Validator(
      [allowed, list](std::string& text) -> std::string {
        std::size_t pos = 0;
        bool any = false;
        while (pos <= text.size()) {
          std::size_t end = text.find(',', pos);
          if (end == std::string::npos) end = text.size();
          const std::string word = text.substr(pos, end - pos);
          if (std::find(allowed.begin(), allowed.end(), word) == allowed.end()) {
            return fmt::format("{} is not a comma-separated list of {}", quote_text(text), list);
          }
          any = true;
          pos = end + 1;
        }
        return any ? std::string()
                   : fmt::format("{} names nothing (use {})", quote_text(text), list);
      },
      "");
}

StatusOr<Device> parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.substr(0, 5) == "cuda:" && text.size() > 5) {
    int index = 0;
    if (!parse_integer(text.substr(5), &index) || index < 0 || index > 1023) {
      return invalid_argument("--device \"{}\": the cuda index must be an integer in 0..1023",
                              text);
    }
    return Device::cuda(index);
  }
  return invalid_argument("--device \"{}\" is not a device (cpu, cuda, cuda:N)", text);
}

std::vector<Device> all_devices() { return {Device::cpu(), Device::cuda(0)}; }

int fail(const Status& status) {
  std::fprintf(stderr, "mla: %s\n", status.to_string().c_str());
  return 1;
}

std::vector<std::string> op_set_members(const OpSet& s) {
  std::vector<std::string> out;
  if (s.absorbed) out.push_back("absorbed");
  if (s.mha) out.push_back("mha");
  if (s.merge) out.push_back("merge");
  if (s.kv_write) out.push_back("kv_write");
  if (s.up_project) out.push_back("up_project");
  if (s.head_gemm) out.push_back("head_gemm");
  return out;
}

}  // namespace mla::cli
