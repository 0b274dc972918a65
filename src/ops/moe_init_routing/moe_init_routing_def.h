// MoeInitRouting: arguments, the dtype support tables and every check phase 1 makes, including
// the values of expertIdx (through the routing table builder, moe_init_routing_table.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"
#include "gradkit/moe_init_routing.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"  // RowIdxType, GroupListType

namespace gk {

inline constexpr std::string_view kMoeInitRoutingName = "MoeInitRouting";
inline constexpr int64_t kMoeInitRoutingMaxExperts = (int64_t{1} << 31) - 1;
// batch * topK bound: the routing table (8 bytes a row, R <= batch * topK) keeps 64-bit sizes.
inline constexpr int64_t kMoeInitRoutingMaxSlots = int64_t{1} << 59;

struct MoeInitRoutingArgs {
  const gkTensor* x;            // [batch, H]
  const gkTensor* expert_idx;   // [batch, topK]
  int64_t expert_capacity;      // C >= 0, 0: keep all
  int64_t expert_num;           // G
  int64_t group_list_type;
  int64_t row_idx_type;
  const gkTensor* expanded_x;        // [R, H], or NULL: index-only routing
  const gkTensor* expanded_row_idx;  // [R] (gather) or [batch * topK] (scatter)
  const gkTensor* group_list;        // [G] int64
};

inline constexpr DType kMoeInitRoutingFloatDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
inline constexpr DType kMoeInitRoutingIndexDTypes[] = {DType::kI64, DType::kI32};
inline constexpr DType kMoeInitRoutingGroupListDType = DType::kI64;

struct MoeInitRoutingShape {
  int64_t batch;
  int64_t top_k;
  int64_t h;
  int64_t g;
  int64_t capacity;  // 0: none
  int64_t rows;      // R: expandedX.shape[0] (index-only: see CheckShapes)
  bool expand_x;     // false: no expandedX, only the indices and groupList
  int64_t x_row_stride;  // elements between rows of x
  DType dtype;             // x, expandedX
  DType expert_idx_dtype;
  DType row_idx_dtype;     // expandedRowIdx
  RowIdxType row_idx_type;
  GroupListType group_list_type;
  int64_t slots() const { return batch * top_k; }  // checked not to overflow
  // Rmax: the rows the worst routing of this shape needs.
  // (capacity <= slots / g keeps g * capacity from overflowing.)
  int64_t max_rows() const {
    return capacity > 0 && capacity <= slots() / g ? g * capacity : slots();
  }
  bool operator==(const MoeInitRoutingShape&) const = default;
};

// Checks every argument, descriptors first, then expertIdx's values and M <= R; on failure
// records the message (argument, value, rule) and returns its status.
gkStatus CheckMoeInitRouting(std::string_view api, const MoeInitRoutingArgs& args,
                             MoeInitRoutingShape* shape);

}  // namespace gk
