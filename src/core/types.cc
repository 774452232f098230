#include "mla/types.h"

#include <fmt/format.h>

#include <cmath>

namespace mla {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kFP8E4M3:
      return "fp8e4m3";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

std::string Device::to_string() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; max finite 448; 0x7f/0xff are NaN.
fp8_e4m3 fp8_e4m3::from_float(float f) {
  fp8_e4m3 r;
  if (std::isnan(f)) {
    r.bits = 0x7f;
    return r;
  }
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a == 0.0f) {  // frexp(0) reports exponent 0, which the normal path would misread
    r.bits = sign;
    return r;
  }
  if (a >= 448.0f) {
    r.bits = sign | 0x7e;  // saturate to 448
    return r;
  }
  // Smallest subnormal is 2^-9; subnormals have exponent field 0 and value m * 2^-9.
  int exp;
  std::frexp(a, &exp);  // a = frac * 2^exp, frac in [0.5, 1)
  int e = exp - 1;      // a = 1.x * 2^e
  if (e < -6) {
    // subnormal: quantum 2^-9
    float q = std::nearbyint(a * 512.0f);  // round half to even (default rounding mode)
    int m = static_cast<int>(q);
    if (m >= 8) {  // rounded up into the normal range
      r.bits = sign | (1 << 3);
      return r;
    }
    r.bits = sign | static_cast<uint8_t>(m);
    return r;
  }
  float quantum = std::ldexp(1.0f, e - 3);
  float q = std::nearbyint(a / quantum);  // in [8, 16]
  int m = static_cast<int>(q);
  if (m == 16) {
    m = 8;
    e += 1;
  }
  int biased = e + 7;
  if (biased > 15 || (biased == 15 && m - 8 == 7)) {
    r.bits = sign | 0x7e;
    return r;
  }
  r.bits = sign | static_cast<uint8_t>((biased << 3) | (m - 8));
  return r;
}

float fp8_e4m3::to_float() const {
  const bool neg = bits & 0x80;
  const int e = (bits >> 3) & 0xf;
  const int m = bits & 0x7;
  float v;
  if (e == 15 && m == 7) {
    v = std::nanf("");
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -9);
  } else {
    v = std::ldexp(1.0f + m / 8.0f, e - 7);
  }
  return neg ? -v : v;
}

}  // namespace mla
