#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace gk {
namespace {

// Independent oracle for bfloat16: the nearer of the two neighbours, ties to the even one.
uint16_t Bf16Oracle(float f) {
  const uint32_t u = F32Bits(f);
  const uint16_t down = static_cast<uint16_t>(u >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double d_down = std::fabs(static_cast<double>(F32FromBf16(down)) - f);
  const double d_up = std::fabs(static_cast<double>(F32FromBf16(up)) - f);
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1) ? up : down;
}

TEST(DType, F16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F32FromF16(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F32FromF16(F16FromF32(f)))) << h;
      continue;
    }
    EXPECT_EQ(F16FromF32(f), h) << "half bits " << h;
  }
}

// Needs the compiler's _Float16 (GCC 12; clang only from 15 on x86, so not in the tsan preset).
#if defined(__FLT16_MANT_DIG__)
TEST(DType, F16MatchesCompilerConversionOnRandomFloats) {
  std::mt19937 generator(7);
  for (int i = 0; i < 2000000; ++i) {
    const float f = F32FromBits(generator());
    if (std::isnan(f)) continue;
    const _Float16 expected = static_cast<_Float16>(f);
    uint16_t expected_bits;
    std::memcpy(&expected_bits, &expected, 2);
    ASSERT_EQ(F16FromF32(f), expected_bits) << "float " << f;
  }
}
#endif

TEST(DType, F16RoundsHalfwayToEven) {
  // 1 + 2^-11 lies halfway between 1 and the next half (1 + 2^-10): ties go to the even one, 1.
  EXPECT_EQ(F16FromF32(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(F16FromF32(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(F16FromF32(65504.0f), 0x7bff);
  EXPECT_EQ(F16FromF32(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(F16FromF32(std::ldexp(1.0f, -25)), 0x0000);  // halfway to the smallest subnormal
  EXPECT_EQ(F16FromF32(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(DType, Bf16MatchesOracleOnRandomFloats) {
  std::mt19937 generator(9);
  for (int i = 0; i < 2000000; ++i) {
    const float f = F32FromBits(generator());
    if (std::isnan(f) || std::isinf(f) || std::fabs(f) > 3.38e38f) continue;
    ASSERT_EQ(Bf16FromF32(f), Bf16Oracle(f)) << "float " << f;
  }
  EXPECT_TRUE(std::isnan(F32FromBf16(Bf16FromF32(std::nanf("")))));
  EXPECT_TRUE(std::isnan(F32FromBf16(Bf16FromF32(F32FromBits(0x7f800001u)))));  // no inf
  EXPECT_EQ(Bf16FromF32(INFINITY), 0x7f80);
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::kBF16), "bfloat16");
  EXPECT_EQ(ElementBytes(DType::kF16), 2);
  EXPECT_EQ(ElementBytes(DType::kI64), 8);
  EXPECT_FALSE(IsKnownDType(2));
}

}  // namespace
}  // namespace gk
