// Element types and devices. Host-only header (no CUDA types); bf16 and fp8 are bit-compatible
// with __nv_bfloat16 and __nv_fp8_e4m3.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mla {

enum class DType : uint8_t { kBF16, kF32, kFP8E4M3, kI32, kU8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kFP8E4M3:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kU8:
      return 1;
  }
  return 0;
}
std::string_view dtype_name(DType t);

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::kCuda, i}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string to_string() const;  // "cpu", "cuda:0"
};

// bfloat16 storage: round-to-nearest-even on conversion from float; NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;

  static bf16 from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep quiet NaN
      r.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
      return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.bits = static_cast<uint16_t>(u >> 16);
    return r;
  }
  float to_float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
static_assert(sizeof(bf16) == 2);

inline float round_to_bf16(float f) { return bf16::from_float(f).to_float(); }

// fp8 e4m3 (OCP "fn" variant: no infinities, max 448, one NaN encoding per sign).
struct fp8_e4m3 {
  uint8_t bits = 0;
  static fp8_e4m3 from_float(float f);  // saturating, round-to-nearest-even
  float to_float() const;
};
static_assert(sizeof(fp8_e4m3) == 1);

}  // namespace mla
