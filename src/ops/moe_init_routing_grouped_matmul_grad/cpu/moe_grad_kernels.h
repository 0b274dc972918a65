// MoeInitRoutingGroupedMatmulGrad CPU kernels around the GEMM: float16 -> float32 conversion of
// tile rows, the transposed copy of [G, N, K] weights, the tile -> gradX row add, and gradkit's
// own tile GEMM (used without oneDNN).
// SIMD target chosen at run time (Highway), ending in a scalar fallback.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gk {

// dst[j] = float(src[j]) for j < n; src holds float16 bits. Exact.
void MoeConvertF16ToF32(const uint16_t* src, float* dst, int64_t n);

// dst[j] += src[j] for j < n, in float32, one rounding per add (the same on every target).
void MoeAddRowF32(float* dst, const float* src, int64_t n);

// A block of a weight stored [N, K] (row stride ld_src), copied transposed into the B tile's
// layout: dst[c * ld_dst + i] = src[i * ld_src + c] for c < cols, i < reduce, float16 converted
// to float32 (exact), float32 and bfloat16 copied. Same values as the [K, N] layout's copy.
void MoeTransposeWeightBlock(DType src_dtype, const void* src, int64_t ld_src, int64_t reduce,
                             int64_t cols, void* dst, int64_t ld_dst);

// C[rows, width] (row stride ldc) (+)= A[rows, reduce] (row stride lda) * B[width, reduce]^T
// (row stride ldb), A and B float32 or bfloat16 (gemm_dtype), float32 accumulation in a fixed
// order; with `accumulate` the sum is added to C (one rounding), else it replaces C.
void MoeGemmTileOwn(DType gemm_dtype, int64_t rows, int64_t width, int64_t reduce, const void* a,
                    int64_t lda, const void* b, int64_t ldb, float* c, int64_t ldc,
                    bool accumulate);

}  // namespace gk
