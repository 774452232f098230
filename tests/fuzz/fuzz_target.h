// Fuzz targets (libFuzzer) and their checks. Each target is a function of arbitrary bytes that
// returns "" when every invariant held, else a description of the broken one. The same
// functions run in two places:
//   - under libFuzzer (preset `fuzz`, scripts/fuzz.sh): tests/fuzz/fuzz_main.cc aborts on a
//     non-empty result, so a broken invariant is a crash with its input saved;
//   - in the normal gtest suite (tests/unit/fuzz_corpus_test.cc): every file of
//     tests/fuzz/corpus/<target>/ (the seeds and every crash input found) is replayed.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace mla::fuzz {

using FuzzFn = std::string (*)(const uint8_t* data, std::size_t size);
struct Target {
  const char* name;
  FuzzFn fn;
};
inline std::vector<Target>& targets() {
  static std::vector<Target> t;
  return t;
}
struct Register {
  Register(const char* name, FuzzFn fn) { targets().push_back({name, fn}); }
};

// Reads typed values from the fuzzer's bytes; past the end every read returns 0.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::size_t remaining() const { return size_ - pos_; }
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | (static_cast<uint32_t>(u16()) << 16); }
  bool boolean() { return (u8() & 1) != 0; }
  // A value in [lo, hi] (hi - lo < 2^32).
  int64_t range(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t v = span <= 256 ? u8() : span <= 65536 ? u16() : u32();
    return lo + static_cast<int64_t>(v % span);
  }
  // Mostly a value in [lo, hi]; one read in `odds` is an arbitrary int32 (negative, huge,
  // INT32_MIN/MAX), so out-of-range values reach the checks too.
  int32_t mostly(int64_t lo, int64_t hi, int odds = 16) {
    if (u8() % odds == 0) {
      switch (u8() % 4) {
        case 0:
          return std::numeric_limits<int32_t>::min();
        case 1:
          return std::numeric_limits<int32_t>::max();
        case 2:
          return -static_cast<int32_t>(u8()) - 1;
        default:
          return static_cast<int32_t>(u32());
      }
    }
    return static_cast<int32_t>(range(lo, hi));
  }
  std::string_view rest() {
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// Whether `message` names one of `fields`.
inline bool names_a_field(std::string_view message,
                          std::initializer_list<std::string_view> fields) {
  for (std::string_view f : fields) {
    if (message.find(f) != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace mla::fuzz

// Defines target `name` and registers it.
#define MLA_FUZZ_TARGET(name)                                                     \
  std::string mla_fuzz_##name(const uint8_t* data, std::size_t size);             \
  static ::mla::fuzz::Register mla_fuzz_register_##name(#name, &mla_fuzz_##name); \
  std::string mla_fuzz_##name(const uint8_t* data, std::size_t size)

// Inside a target or check: returns the formatted failure when `cond` does not hold.
#define FUZZ_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) return fmt::format("{}: ", #cond) + fmt::format(__VA_ARGS__); \
  } while (0)
#define FUZZ_RETURN_IF_FAILED(expr)                   \
  do {                                                \
    std::string fuzz_failure_ = (expr);               \
    if (!fuzz_failure_.empty()) return fuzz_failure_; \
  } while (0)
