// MoeInitRoutingGroupedMatmulGrad CPU kernels around the GEMM: float16 -> float32 conversion of
// tile rows, the tile -> gradX row add, and gradkit's own tile GEMM (used without oneDNN).
// SIMD target chosen at run time (Highway), ending in a scalar fallback.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gk {

// dst[j] = float(src[j]) for j < n; src holds float16 bits. Exact.
void MoeConvertF16ToF32(const uint16_t* src, float* dst, int64_t n);

// dst[j] += src[j] for j < n, in float32, one rounding per add (the same on every target).
void MoeAddRowF32(float* dst, const float* src, int64_t n);

// C[rows, width] (row stride ldc) = A[rows, reduce] * B[width, reduce]^T, A and B float32 or
// bfloat16 (gemm_dtype), float32 accumulation in a fixed order.
void MoeGemmTileOwn(DType gemm_dtype, int64_t rows, int64_t width, int64_t reduce, const void* a,
                    const void* b, float* c, int64_t ldc);

}  // namespace gk
