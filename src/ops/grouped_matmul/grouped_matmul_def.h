// GroupedMatmul and GroupedMatmulWeightGrad: arguments, dtype tables and every check phase 1
// makes, including the values of groupList and expandedRowIdx (validated by the MoE routing
// builders of moe_grad_routing.h, shared with the fused backward).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"
#include "gradkit/grouped_matmul.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"

namespace gk {

inline constexpr std::string_view kGroupedMatmulName = "GroupedMatmul";
inline constexpr std::string_view kGroupedMatmulWeightGradName = "GroupedMatmulWeightGrad";
inline constexpr std::string_view kGroupedMatmulWeightGradAddName = "GroupedMatmulWeightGradAdd";

inline constexpr int64_t kGroupedMatmulMaxDim = (int64_t{1} << 31) - 1;  // G, K, N

// Supported dtypes, as tables.
inline constexpr DType kGroupedMatmulFloatDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
inline constexpr DType kGroupedMatmulIndexDTypes[] = {DType::kI64, DType::kI32};

enum class GroupedMatmulOp { kForward, kWeightGrad };

struct GroupedMatmulArgs {
  GroupedMatmulOp op;
  const gkTensor* x;                 // [M, K], or [batch, K] gather-fused
  const gkTensor* weight;            // forward: [G, K, N] ([G, N, K] with transpose_weight)
  const gkTensor* grad_y;            // weight grad: [M, N]
  const gkTensor* group_list;        // [G]
  int64_t group_list_type;
  bool transpose_weight;             // forward only
  const gkTensor* expanded_row_idx;  // NULL: plain x
  int64_t row_idx_type;
  int64_t top_k;
  const gkTensor* out;               // forward: y [M, N]; weight grad: gradWeight [G, K, N]
  bool accumulate = false;           // weight grad only: out is gradWeightRef, added to
};

// Everything the plan and the kernels need, once the arguments passed the checks.
struct GroupedMatmulShape {
  GroupedMatmulOp op;
  int64_t m;  // expanded rows
  int64_t k;
  int64_t n;
  int64_t g;
  int64_t x_rows;     // M plain, batch gather-fused
  bool gather_fused;  // x is the token matrix, read through expandedRowIdx
  DType dtype;        // x, weight / gradY
  DType out_dtype;    // float32 or dtype
  // Forward: W[g][k][n] is stored at g*K*N + n*K + k ([G, N, K] storage) rather than k*N + n.
  bool weight_nk = false;
  // Weight grad: gradWeightRef = its own value + the float32 sum, rounded once (WeightGradAdd).
  bool accumulate = false;
  // The routing in the fused backward's terms: m, g, l, batch, top_k, index_dtype, row_idx_type,
  // group_list_type (batch = M and top_k = 1 for plain x), for the shared index builders.
  MoeGradShape routing{};
  bool operator==(const GroupedMatmulShape&) const = default;
};

std::string_view GroupedMatmulOpName(const GroupedMatmulShape& shape);

// Checks every argument, descriptors first, then the index values; on failure records the
// message (argument, value, rule) and returns its status. Reads groupList and expandedRowIdx.
gkStatus CheckGroupedMatmul(std::string_view api, const GroupedMatmulArgs& args,
                            GroupedMatmulShape* shape);

// What the group list's messages call the tensor whose rows M counts.
std::string_view GroupedMatmulRowsOf(const GroupedMatmulShape& shape);

}  // namespace gk
