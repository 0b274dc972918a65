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

// Where the values of a streamed run come from: rows * row_cols values, value c of row r at
//   src + (r / rows_per_block) * block_stride + (r % rows_per_block) * row_stride
//       + (col / piece_cols) * piece_stride + col % piece_cols
// (a weight-grad unit's C tiles: K blocks of base_m rows, each row across the unit's column
// blocks of base_n; one row of n: {1, n, 1, 0, 0, n, 0}).
struct GroupedMatmulTileRun {
  int64_t rows, row_cols;
  int64_t rows_per_block, block_stride, row_stride;
  int64_t piece_cols, piece_stride;
};

// GroupedMatmulStoreRow's bytes of the run's values, in order, to dst, by non-temporal stores
// (x86, AVX2 and later) from dst's first 64-byte line on, for outputs written once and read only
// later by others: no read-for-ownership of their lines. One stream for the whole run: whatever
// dst's alignment, only its first and last lines may take plain stores (tile by tile, a
// gradWeight from malloc, 16 bytes past a page, began and ended every piece in a partial line,
// each a read for ownership). The calling thread ends with FlushStreamingStores()
// (core/cpu/stream_copy.h) before another thread reads them.
void GroupedMatmulStreamTiles(const float* src, const GroupedMatmulTileRun& run, void* dst,
                              DType dtype);

// dst[j] = (dst[j] as float32 + src[j]) rounded once to `dtype`, j < n: the accumulating store of
// GroupedMatmulWeightGradAdd (one float32 addition per element; no fused multiply-add).
void GroupedMatmulAddRow(const float* src, void* dst, DType dtype, int64_t n);

// A block of a weight stored [K, N] (row stride ld_src) copied transposed into the B tile:
// dst[c * ld_dst + i] = src[i * ld_src + c] for c < cols, i < reduce; float16 converted to float32
// (exact), float32 and bfloat16 copied. The values of MoeTransposeWeightBlock (moe_grad_kernels.h),
// faster where the destination rows are a power-of-two apart: float32 moves in 4 x 4 register
// transposes, 8 destination rows at a time, so the rows being written never crowd one cache set.
void GroupedMatmulTransposeBlock(DType src_dtype, const void* src, int64_t ld_src, int64_t reduce,
                                 int64_t cols, void* dst, int64_t ld_dst);

// The transposed gather of a weight-grad operand: for r < rows and c < cols,
//   dst[c * ld_dst + r] = rows_src[r][c]       (float16 converted to float32; others copied)
// and dst[c * ld_dst + r] = 0 for rows <= r < ld_dst (the zero padding of a short chunk).
// rows_src[r] points at the first of the row's cols elements.
void GroupedMatmulTransposeRows(DType src_dtype, const void* const* rows_src, int64_t rows,
                                int64_t cols, void* dst, int64_t ld_dst);

}  // namespace gk
