// MoeInitRoutingGroupedMatmulGrad: arguments, the dtype support tables and every check phase 1
// makes, including the values of groupList and expandedRowIdx.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"
#include "gradkit/moe_init_routing_grouped_matmul_grad.h"

namespace gk {

inline constexpr int64_t kMoeGradMaxDim = (int64_t{1} << 31) - 1;  // G, K, N

inline constexpr std::string_view kMoeGradName = "MoeInitRoutingGroupedMatmulGrad";

// How expandedRowIdx maps rows (see the public header).
enum class RowIdxType : int32_t { kGather = GK_ROW_IDX_GATHER, kScatter = GK_ROW_IDX_SCATTER };
enum class GroupListType : int32_t { kCount = GK_GROUP_LIST_COUNT, kCumsum = GK_GROUP_LIST_CUMSUM };
std::string_view RowIdxTypeName(RowIdxType type);        // "gather" | "scatter"
std::string_view GroupListTypeName(GroupListType type);  // "count" | "cumsum"

// The value a C caller passed for an enum argument: its bits (any int may arrive, and loading an
// enum outside its range is undefined in C++), for the checks below to name. Every MoE operator
// reads gkRowIdxType and gkGroupListType this way.
template <class Enum>
int32_t EnumBits(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int32_t));
  int32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
gkStatus CheckRowIdxType(std::string_view api, int64_t row_idx_type);
gkStatus CheckGroupListType(std::string_view api, int64_t group_list_type);

struct MoeGradArgs {
  const gkTensor* grad_y;            // dy [M, N]
  const gkTensor* weight;            // [G, K, N], or a transposed view of [G, N, K] storage
  const gkTensor* expanded_row_idx;  // [L]
  const gkTensor* group_list;        // [G]
  int64_t batch;
  int64_t top_k;
  int64_t row_idx_type;
  int64_t group_list_type;
  const gkTensor* grad_x;            // dx [batch, K], float32
};

// Supported dtypes, as tables: gradY and weight share one of the float dtypes.
inline constexpr DType kMoeGradFloatDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
inline constexpr DType kMoeGradRowIdxDTypes[] = {DType::kI64, DType::kI32};
inline constexpr DType kMoeGradGroupListDTypes[] = {DType::kI64, DType::kI32};
inline constexpr DType kMoeGradOutputDType = DType::kF32;

// Everything the plan and the kernels need from the arguments, once they passed the checks.
struct MoeGradShape {
  int64_t m;      // expanded rows: gradY.shape[0] = total of groupList
  int64_t n;      // gradY.shape[1] = weight.shape[2]
  int64_t k;      // weight.shape[1] = gradX.shape[1]
  int64_t g;      // experts: weight.shape[0] = groupList.shape[0]
  int64_t l;      // expandedRowIdx.shape[0]
  int64_t batch;  // tokens: gradX.shape[0]
  int64_t top_k;
  DType dtype;        // gradY and weight
  DType index_dtype;  // expandedRowIdx
  RowIdxType row_idx_type;
  GroupListType group_list_type;
  // weight is a [G, K, N] view of [G, N, K] storage (nn.Linear's layout; strides (K*N, 1, K)):
  // the kernels transpose its blocks while copying them into the B tile.
  bool weight_nk = false;
  int64_t slots() const { return batch * top_k; }  // checked not to overflow
  bool operator==(const MoeGradShape&) const = default;
};

// The shape of a problem described by its sizes alone, as the benchmarks and the CLI's reports
// plan it: m expanded rows (at most batch * topK) of `dtype`, gather rows (L = m), a count
// groupList, int64 indices, [G, K, N] weights.
MoeGradShape MoeGradGatherCountShape(int64_t batch, int64_t top_k, int64_t m, int64_t g, int64_t k,
                                     int64_t n, DType dtype);

// Checks every argument, descriptors first, then the index values; on failure records the
// message (argument, value, rule) and returns its status. Reads groupList and expandedRowIdx.
gkStatus CheckMoeGrad(std::string_view api, const MoeGradArgs& args, MoeGradShape* shape);

}  // namespace gk
