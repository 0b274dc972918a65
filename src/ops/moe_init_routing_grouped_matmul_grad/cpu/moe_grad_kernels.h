// MoeInitRoutingGroupedMatmulGrad CPU kernels around the GEMM: float16 -> float32 conversion of
// tile rows, the transposed copy of [G, N, K] weights, the tile -> gradX row add and B packed into
// oneDNN's blocked layout (MoePackB). gradkit's own tile GEMM is in moe_grad_microkernel.h.
// SIMD target chosen at run time (Highway), ending in a scalar fallback.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gk {

// dst[j] = float(src[j]) for j < n; src holds float16 bits. Exact.
void MoeConvertF16ToF32(const uint16_t* src, float* dst, int64_t n);

// dst[j] += src[j] for j < n, in float32, one rounding per add (the same on every target).
void MoeAddRowF32(float* dst, const float* src, int64_t n);

// MoeAddRowF32 of `rows` rows: dst[r][j] += src[r * ld_src + j] for r < rows, j < n (the same
// sums), in one call, asking for the next rows of dst ahead (a tile's rows scattered into gradX).
void MoeAddRowsF32(float* const* dst, const float* src, int64_t ld_src, int64_t rows, int64_t n);

// A block of a weight stored [N, K] (row stride ld_src), copied transposed into the B tile's
// layout: dst[c * ld_dst + i] = src[i * ld_src + c] for c < cols, i < reduce, float16 converted
// to float32 (exact), float32 and bfloat16 copied. Same values as the [K, N] layout's copy.
void MoeTransposeWeightBlock(DType src_dtype, const void* src, int64_t ld_src, int64_t reduce,
                             int64_t cols, void* dst, int64_t ld_dst);

// A blocked layout of a GEMM's B (oneDNN's brgemm weights, e.g. BA16a64b2a for bfloat16 and
// BA16a64b for float32), as plain data. B is logically [reduce, width]; element (k, n) sits at
//   (k / k_block) * k_stride + (n / n_block) * n_stride
//     + ((k % k_block) / pair) * n_block * pair + (n % n_block) * pair + k % pair
// so each column stores `pair` consecutive reduction elements together (a 32-bit word: one
// float32, or two bfloat16 for the VNNI dot products). Past reduce and width, up to the padded
// extents, the layout holds zeros.
struct MoeBlockedB {
  int64_t k_block, n_block, pair;
  int64_t k_stride, n_stride;  // elements
  int64_t padded_reduce, padded_width;
  int64_t Elements() const;    // the extent of the layout, in elements
};

// Writes B into `layout`, padding included (32-bit words: element bytes x pair must be 4). b is
// [width, reduce] rows of stride ldb (b[n * ldb + k]), or with `kn` its transpose, [reduce,
// width] rows of stride ldb (b[k * ldb + n]). A copy of bits: the same whatever the target.
void MoePackB(DType gemm_dtype, const MoeBlockedB& layout, int64_t width, int64_t reduce,
              const void* b, int64_t ldb, bool kn, void* dst);

}  // namespace gk
