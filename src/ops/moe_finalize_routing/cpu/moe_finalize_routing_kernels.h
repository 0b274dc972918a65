// MoeFinalizeRouting CPU kernels: float32 row arithmetic and the conversions of rows between
// the float dtypes and float32. SIMD target chosen at run time (Highway), scalar tails computing
// the same roundings as the vector body (a product, then a sum: no fused multiply-add), so an
// element's value does not depend on whether it falls in a vector or in the tail.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gk {

// dst[j] = float(src[j]), src in `dtype` (exact).
void MoeFinalizeRowToF32(DType dtype, const void* src, float* dst, int64_t n);
// dst[j] = src[j] rounded once (to nearest even) to `dtype`.
void MoeFinalizeRowFromF32(DType dtype, const float* src, void* dst, int64_t n);
// acc[j] = acc[j] + a * x[j]   (the product rounded to float32, then the sum)
void MoeFinalizeAddScaled(float a, const float* x, float* acc, int64_t n);
// dst[j] = a * x[j]
void MoeFinalizeScale(float a, const float* x, float* dst, int64_t n);
// sum of a[j] * b[j] in float32: per-lane partial sums over whole vectors, reduced, then the
// tail in order. The order depends on n and the SIMD target only.
float MoeFinalizeDot(const float* a, const float* b, int64_t n);

}  // namespace gk
