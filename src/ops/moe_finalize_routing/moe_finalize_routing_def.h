// MoeFinalizeRouting and MoeFinalizeRoutingGrad: arguments, dtype tables and every check phase 1
// makes, including the values of expandedRowIdx (with the fused op's index checks,
// moe_grad_routing.h, so that every MoE operator accepts exactly the same indices).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"
#include "gradkit/moe_finalize_routing.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"  // RowIdxType, MoeGradShape

namespace gk {

// batch * topK bound: the slot tables in the workspace (8 bytes a slot) keep 64-bit sizes.
inline constexpr int64_t kMoeRoutingMaxSlots = int64_t{1} << 59;

inline constexpr std::string_view kMoeFinalizeRoutingName = "MoeFinalizeRouting";
inline constexpr std::string_view kMoeFinalizeRoutingGradName = "MoeFinalizeRoutingGrad";

inline constexpr DType kMoeFinalizeFloatDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
inline constexpr DType kMoeFinalizeIndexDTypes[] = {DType::kI64, DType::kI32};

// Forward: grad_out is null, out is set. Backward: grad_out, grad_expanded_y, grad_probs set.
struct MoeFinalizeArgs {
  bool backward;
  const gkTensor* grad_out;          // [batch, N] (backward)
  const gkTensor* expanded_y;        // [M, N]
  const gkTensor* probs;             // [batch, topK]
  const gkTensor* expanded_row_idx;  // [L]
  int64_t row_idx_type;
  const gkTensor* out;               // [batch, N] (forward)
  const gkTensor* grad_expanded_y;   // [M, N] (backward)
  const gkTensor* grad_probs;        // [batch, topK] (backward)
};

struct MoeFinalizeShape {
  int64_t m;
  int64_t n;
  int64_t batch;
  int64_t top_k;
  int64_t l;  // expandedRowIdx.shape[0]
  bool backward;
  DType dtype;             // expandedY
  DType probs_dtype;
  DType token_dtype;       // out (forward) or gradOut (backward)
  DType grad_y_dtype;      // gradExpandedY (backward; else = dtype)
  DType grad_probs_dtype;  // gradProbs (backward; else = probs_dtype)
  DType index_dtype;
  RowIdxType row_idx_type;
  int64_t slots() const { return batch * top_k; }  // checked not to overflow
  // The same routing in the fused op's terms, for its index checks.
  MoeGradShape Routing() const;
  bool operator==(const MoeFinalizeShape&) const = default;
};

// Checks every argument, descriptors first, then expandedRowIdx's values; on failure records
// the message (argument, value, rule) and returns its status.
gkStatus CheckMoeFinalize(std::string_view api, const MoeFinalizeArgs& args,
                          MoeFinalizeShape* shape);

// Validates expandedRowIdx and fills slot_row[p] = the expanded row of slot p, or -1 when the
// slot is dropped (batch * topK entries); row_token (M entries) is scratch. Phase 2 uses it;
// phase 1 passes slot_row = NULL (checks only): its memory then stays within what it reads of
// expandedRowIdx, whatever batch * topK probs' descriptor claims.
gkStatus BuildMoeFinalizeSlotRows(std::string_view api, const gkTensor& expanded_row_idx,
                                  const MoeFinalizeShape& shape, int64_t* slot_row,
                                  int64_t* row_token);

}  // namespace gk
