// GroupedMatmul(WeightGrad) CPU kernels around the tile GEMM: the rounding store of a float32
// tile row into the output dtype, and the transposed gather of rows into a weight-grad operand
// tile. The row copies and float16 conversions are the fused op's (moe_grad_kernels.h).
// SIMD target chosen at run time (Highway), ending in a scalar fallback.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gk {

// dst[j] = src[j] rounded once (to nearest even) to `dtype` (float32, float16, bfloat16), j < n.
void GroupedMatmulStoreRow(const float* src, void* dst, DType dtype, int64_t n);

// The transposed gather of a weight-grad operand: for r < rows and c < cols,
//   dst[c * ld_dst + r] = rows_src[r][c]       (float16 converted to float32; others copied)
// and dst[c * ld_dst + r] = 0 for rows <= r < ld_dst (the zero padding of a short chunk).
// rows_src[r] points at the first of the row's cols elements.
void GroupedMatmulTransposeRows(DType src_dtype, const void* const* rows_src, int64_t rows,
                                int64_t cols, void* dst, int64_t ld_dst);

}  // namespace gk
