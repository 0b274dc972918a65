// EluGradV2: the one formula every backend follows, its float64 reference, and the accuracy
// contract the tests hold every backend to. Coefficient names follow PyTorch's ELU kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"

namespace gk {

struct EluGradV2Coefficients {
  float negcoef;     // alpha * scale
  float poscoef;     // scale
  float negiptcoef;  // input_scale
  bool operator==(const EluGradV2Coefficients&) const = default;
};

// Folded once in float32, as PyTorch does: negcoef = float(alpha) * float(scale).
inline EluGradV2Coefficients FoldEluGradV2Coefficients(double alpha, double scale,
                                                       double input_scale) {
  const float a = static_cast<float>(alpha), s = static_cast<float>(scale);
  return {a * s, s, static_cast<float>(input_scale)};
}

// Arguments of exp() beyond this are clamped: float32 exp() is already +inf there, and the SIMD
// exp is only specified up to +104.
inline constexpr float kEluGradV2MaxExpArg = 89.0f;

// The formula in float32, in the operation order of PyTorch's CPU kernel. The SIMD kernels
// follow this order lane by lane with their own exp (src/core/cpu/math-inl.h: the full
// polynomial for float32 outputs, a shorter one for 16-bit outputs), so they meet the contract
// below (EluGradV2Tolerance), not this function's bits. Their bits are the same across runs and
// thread counts on one SIMD target; across targets (FMA or not, AVX-512's vscalefps against
// exponent-bit scaling, native or integer 16-bit rounding) they may differ within the contract.
// Policy: x NaN gives NaN; the branch not taken never leaks into the result (select, not blend).
inline float EluGradV2Formula(float dy, float x, const EluGradV2Coefficients& c, bool is_result) {
  if (x > 0.0f) return dy * c.poscoef;
  if (is_result) return dy * c.negiptcoef * (x + c.negcoef);
  const float arg = x * c.negiptcoef;
  if (std::isnan(arg)) return arg;
  return dy * c.negiptcoef * c.negcoef * std::exp(std::fmin(arg, kEluGradV2MaxExpArg));
}

// The formula in float64, on the same float32 coefficients: the reference for accuracy tests.
inline double EluGradV2ReferenceF64(double dy, double x, const EluGradV2Coefficients& c,
                                    bool is_result) {
  if (x > 0.0) return dy * c.poscoef;
  if (is_result) return dy * c.negiptcoef * (x + c.negcoef);
  return dy * c.negiptcoef * c.negcoef * std::exp(x * c.negiptcoef);
}

// How far a float32 evaluation may be from the float64 reference `ref` (both then compared in
// the output dtype):
//   4 ulp of the result; plus what the inputs' own rounding forces on any float32 evaluation:
//   exp(arg) amplifies the rounding of arg = x * negiptcoef by |arg| (relative), and in isResult
//   mode x + negcoef carries one rounding of half an ulp, scaled by |dy * negiptcoef|.
//   A 16-bit output adds one ulp of its own (absolute among its subnormals). Magnitudes below
//   1e-30 compare absolutely.
inline double EluGradV2Tolerance(double ref, float dy, float x, const EluGradV2Coefficients& c,
                                 bool is_result, DType out_dtype) {
  constexpr double kF32Ulp = 1.0 / (1 << 23);  // ulp of 1.0 in float32
  const double magnitude = std::fabs(ref);
  double tolerance = 4.0 * kF32Ulp * magnitude;
  if (x <= 0.0f) {
    if (is_result) {
      const double sum = std::fabs(static_cast<double>(x) + c.negcoef);
      tolerance += std::fabs(static_cast<double>(dy) * c.negiptcoef) * 0.5 * kF32Ulp * sum;
    } else {
      tolerance += magnitude * std::fabs(static_cast<double>(x) * c.negiptcoef) * 0.5 * kF32Ulp;
    }
  }
  // One ulp of a 16-bit output: relative in the normal range, absolute among its subnormals.
  if (out_dtype == DType::kF16) tolerance += std::fmax(magnitude * 0x1p-10, 0x1p-24);
  if (out_dtype == DType::kBF16) tolerance += std::fmax(magnitude * 0x1p-7, 0x1p-133);
  return std::fmax(tolerance, 1e-30);
}

}  // namespace gk
