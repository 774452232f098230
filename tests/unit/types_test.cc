// bf16 and fp8 e4m3 conversions, checked against references built independently from the
// format definitions (candidate search in double precision, not bit tricks).
#include "mla/types.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace mla {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// bf16 reference: the two bf16 neighbours of f (truncation toward zero and one step away),
// nearest wins, ties go to the even mantissa.
uint16_t bf16_reference(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double v = f;
  const double dlo = std::fabs(v - static_cast<double>(bits_to_float(uint32_t{lo} << 16)));
  const float fhi = bits_to_float(uint32_t{hi} << 16);
  const double dhi = std::isinf(fhi)
                         ? std::fabs(v - std::copysign(std::ldexp(1.0, 128), v))  // as 2^128
                         : std::fabs(v - static_cast<double>(fhi));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Bf16, EveryBf16ValueRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    bf16 x;
    x.bits = static_cast<uint16_t>(b);
    const float f = x.to_float();
    const bf16 y = bf16::from_float(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(y.to_float())) << std::hex << b;
    } else {
      EXPECT_EQ(y.bits, x.bits) << std::hex << b;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1.0).
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(round_to_bf16(-1.0f - std::ldexp(1.0f, -8)), -1.0f);
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  // The largest float is past the midpoint to 2^128, so it rounds to infinity.
  EXPECT_TRUE(std::isinf(round_to_bf16(std::numeric_limits<float>::max())));
}

TEST(Bf16, NaNStaysNaN) {
  // Signalling NaN with only low payload bits would become infinity under plain truncation.
  for (uint32_t u : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0x7f80ffffu}) {
    EXPECT_TRUE(std::isnan(bf16::from_float(bits_to_float(u)).to_float())) << std::hex << u;
  }
}

TEST(Bf16, MatchesReferenceOnRandomFloats) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_to_float(any(rng));
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(bf16::from_float(f).bits, bf16_reference(f)) << "f = " << f;
  }
}

// All non-negative finite e4m3fn values, ascending, built from the format definition: code c
// (0..0x7e) is the c-th smallest value.
std::vector<double> e4m3_values() {
  std::vector<double> v;
  for (int m = 0; m < 8; ++m) v.push_back(m * std::ldexp(1.0, -9));  // subnormals
  for (int e = 1; e <= 15; ++e) {
    for (int m = 0; m < 8; ++m) {
      if (e == 15 && m == 7) break;  // NaN
      v.push_back((1.0 + m / 8.0) * std::ldexp(1.0, e - 7));
    }
  }
  return v;
}

TEST(Fp8E4m3, DecodesEveryCode) {
  const std::vector<double> values = e4m3_values();
  ASSERT_EQ(values.size(), 127u);
  EXPECT_EQ(values.back(), 448.0);
  for (int c = 0; c < 256; ++c) {
    fp8_e4m3 x;
    x.bits = static_cast<uint8_t>(c);
    const float f = x.to_float();
    const int mag = c & 0x7f;
    if (mag == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    const double want =
        (c & 0x80) ? -values[static_cast<std::size_t>(mag)] : values[static_cast<std::size_t>(mag)];
    EXPECT_EQ(static_cast<double>(f), want) << "code " << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << "code " << c;
  }
}

TEST(Fp8E4m3, AllCodesRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    fp8_e4m3 x;
    x.bits = static_cast<uint8_t>(c);
    const fp8_e4m3 y = fp8_e4m3::from_float(x.to_float());
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(y.to_float())) << c;
    } else {
      EXPECT_EQ(y.bits, x.bits) << "code " << c;
    }
  }
}

TEST(Fp8E4m3, Saturates) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {448.0f, 449.0f, 464.0f, 480.0f, 1e4f, 1e30f, inf}) {
    EXPECT_EQ(fp8_e4m3::from_float(f).to_float(), 448.0f) << f;
    EXPECT_EQ(fp8_e4m3::from_float(-f).to_float(), -448.0f) << f;
  }
  EXPECT_TRUE(std::isnan(fp8_e4m3::from_float(std::nanf("")).to_float()));
}

TEST(Fp8E4m3, RoundsToNearestEvenBetweenNeighbours) {
  const std::vector<double> values = e4m3_values();
  for (std::size_t c = 0; c + 1 < values.size(); ++c) {
    const double lo = values[c], hi = values[c + 1];
    const double mid = (lo + hi) / 2;  // exact in float: one more mantissa bit
    const uint8_t even = static_cast<uint8_t>((c % 2 == 0) ? c : c + 1);
    EXPECT_EQ(fp8_e4m3::from_float(static_cast<float>(mid)).bits, even) << "mid " << mid;
    EXPECT_EQ(fp8_e4m3::from_float(static_cast<float>(-mid)).bits, even | 0x80) << mid;
    const double quarter = (hi - lo) / 4;
    EXPECT_EQ(fp8_e4m3::from_float(static_cast<float>(lo + quarter)).bits, c) << lo;
    EXPECT_EQ(fp8_e4m3::from_float(static_cast<float>(hi - quarter)).bits, c + 1) << hi;
  }
  // Below half the smallest subnormal rounds to zero; exactly half ties to zero (even).
  EXPECT_EQ(fp8_e4m3::from_float(std::ldexp(1.0f, -11)).bits, 0);
  EXPECT_EQ(fp8_e4m3::from_float(std::ldexp(1.0f, -10)).bits, 0);
}

}  // namespace
}  // namespace mla
