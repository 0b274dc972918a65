// Element types and the scalar conversions every backend shares: 16-bit floats round once, to
// nearest even, from float32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "gradkit/base.h"

namespace gk {

enum class DType : int32_t {
  kF32 = GK_FLOAT,
  kF16 = GK_FLOAT16,
  kI32 = GK_INT32,
  kI64 = GK_INT64,
  kF64 = GK_DOUBLE,
  kBF16 = GK_BF16,
};

bool IsKnownDType(int32_t value);
int64_t ElementBytes(DType dtype);
std::string_view DTypeName(DType dtype);  // "float32", "float16", "bfloat16", ...

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16 <-> float32. NaN stays a (quiet) NaN of the same sign.
inline uint16_t Bf16FromF32(float f) {
  const uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float F32FromBf16(uint16_t h) { return F32FromBits(static_cast<uint32_t>(h) << 16); }

// float16 (IEEE binary16) <-> float32, round to nearest even, overflow to inf, subnormals kept.
inline uint16_t F16FromF32(float f) {
  uint32_t u = F32Bits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t out;
  if (u >= 0x47800000u) {                      // >= 65536, inf or NaN
    out = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {                // below the smallest normal: subnormal or zero
    const float sum = F32FromBits(u) + 0.5f;   // the FPU rounds the mantissa to nearest even
    out = F32Bits(sum) - 0x3f000000u;
  } else {
    const uint32_t mantissa_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
    out = u >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}
inline float F32FromF16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return F32FromBits(sign | 0x7f800000u | (mantissa << 13));
  return F32FromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Rounds a float32 to the value the given dtype can hold (identity for float32).
inline float RoundToDType(float f, DType dtype) {
  switch (dtype) {
    case DType::kF16: return F32FromF16(F16FromF32(f));
    case DType::kBF16: return F32FromBf16(Bf16FromF32(f));
    default: return f;
  }
}

// Loads element i of a float-family buffer as float32 / stores a float32 rounded to the dtype.
inline float LoadAsF32(const void* base, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kF16: return F32FromF16(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return F32FromBf16(static_cast<const uint16_t*>(base)[i]);
    case DType::kF64: return static_cast<float>(static_cast<const double*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}
inline void StoreFromF32(void* base, int64_t i, DType dtype, float value) {
  switch (dtype) {
    case DType::kF16: static_cast<uint16_t*>(base)[i] = F16FromF32(value); break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = Bf16FromF32(value); break;
    case DType::kF64: static_cast<double*>(base)[i] = value; break;
    default: static_cast<float*>(base)[i] = value; break;
  }
}

}  // namespace gk
