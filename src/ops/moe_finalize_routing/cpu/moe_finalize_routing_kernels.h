// MoeFinalizeRouting CPU kernels: one token's rows at a time, each element converted from its
// dtype to float32 as it is loaded and rounded once to the output dtype as it is stored (no
// float32 copies of rows). SIMD target chosen at run time (Highway); the scalar tails compute
// the same roundings as the vector body (a product, then a sum: no fused multiply-add), so an
// element's value does not depend on whether it falls in a vector or in the tail.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gk {

// Slots a forward call sums: a token with more kept slots is summed in several calls, through
// a float32 accumulator row (the same additions in the same order).
inline constexpr int64_t kMoeFinalizeForwardSlots = 16;
// Slots a backward call handles: each keeps a vector of partial dot products in a register.
inline constexpr int64_t kMoeFinalizeBackwardSlots = 4;

// acc[c] = ((start[c] + probs[0] * rows[0][c]) + probs[1] * rows[1][c]) + ... over `count`
// (<= kMoeFinalizeForwardSlots) rows of `n` elements of `y_dtype`; start = 0 when `acc_in` is
// null, else acc_in. Each product is rounded to float32, then the sum. The result goes to `out`
// rounded once to `out_dtype` when `out` is given, else to acc_out in float32.
struct MoeFinalizeSumArgs {
  DType y_dtype;
  const void* const* rows;
  const float* probs;
  int64_t count;
  int64_t n;
  const float* acc_in;
  float* acc_out;
  DType out_dtype;
  void* out;
  // Rows (of y_dtype, n elements) the next call will read: prefetched in step with these
  // (memory is then fetched ahead instead of the next rows' first lines waiting).
  const void* const* next_rows = nullptr;
  int64_t next_count = 0;
  // Write `out` with non-temporal stores when it starts on a cache line (same bytes; the caller
  // ends its share with FlushStreamingStores()).
  bool stream = false;
};
void MoeFinalizeWeightedSum(const MoeFinalizeSumArgs& args);

// For `count` (<= kMoeFinalizeBackwardSlots) slots s of one token, g = gradOut's row (of
// `grad_dtype`, converted exactly):
//   grad_y_rows[s][c] = probs[s] * g[c], rounded once to grad_y_dtype;
//   grad_probs[s]     = g . y_rows[s] in float32: per-lane partial sums over whole vectors,
//                       reduced, then the tail in order (an order that depends on n and the
//                       SIMD target only).
struct MoeFinalizeGradArgs {
  DType grad_dtype;
  const void* grad_out;
  DType y_dtype;
  const void* const* y_rows;
  const float* probs;
  int64_t count;
  int64_t n;
  DType grad_y_dtype;
  void* const* grad_y_rows;
  float* grad_probs;
  // As MoeFinalizeSumArgs: y rows (and gradOut's row, when it changes) the next call reads.
  const void* const* next_rows = nullptr;
  int64_t next_count = 0;
  const void* next_grad_out = nullptr;
  // As MoeFinalizeSumArgs: the grad_y rows streamed when every one starts on a cache line (each
  // row in turn, after the dot products).
  bool stream = false;
};
void MoeFinalizeGradSlots(const MoeFinalizeGradArgs& args);

}  // namespace gk
