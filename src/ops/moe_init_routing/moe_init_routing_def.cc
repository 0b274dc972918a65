#include "ops/moe_init_routing/moe_init_routing_def.h"

#include <vector>

#include "core/check.h"
#include "core/error.h"
#include "ops/moe_init_routing/moe_init_routing_table.h"

namespace gk {
namespace {

gkStatus CheckAttributes(std::string_view api, const MoeInitRoutingArgs& a) {
  if (a.expert_num < 1 || a.expert_num > kMoeInitRoutingMaxExperts) {
    return Fail(GK_ERROR_PARAM_INVALID, api, "expertNum is {}, it must be in [1, 2^31)",
                a.expert_num);
  }
  if (a.expert_capacity < 0) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expertCapacity is {}, it must be >= 0 (0 keeps every slot)", a.expert_capacity);
  }
  GK_RETURN_IF_ERROR(CheckRowIdxType(api, a.row_idx_type));
  return CheckGroupListType(api, a.group_list_type);
}

gkStatus CheckShapes(std::string_view api, const MoeInitRoutingArgs& a, MoeInitRoutingShape* s) {
  const gkTensor& x = *a.x;
  const gkTensor& experts = *a.expert_idx;
  const gkTensor* ex = a.expanded_x;  // NULL: index-only routing
  const gkTensor& idx = *a.expanded_row_idx;
  const gkTensor& groups = *a.group_list;
  GK_RETURN_IF_ERROR(CheckRank(api, x, "x", 2));
  GK_RETURN_IF_ERROR(CheckRank(api, experts, "expertIdx", 2));
  if (ex != nullptr) GK_RETURN_IF_ERROR(CheckRank(api, *ex, "expandedX", 2));
  GK_RETURN_IF_ERROR(CheckRank(api, idx, "expandedRowIdx", 1));
  GK_RETURN_IF_ERROR(CheckRank(api, groups, "groupList", 1));
  s->batch = x.dims[0];
  s->h = x.dims[1];
  s->top_k = experts.dims[1];
  GK_RETURN_IF_ERROR(CheckPositive(api, s->batch, "batch (x.shape[0])"));
  GK_RETURN_IF_ERROR(CheckPositive(api, s->h, "H (x.shape[1])"));
  GK_RETURN_IF_ERROR(CheckDimIs(api, experts, "expertIdx", 0, s->batch, "batch, x.shape[0]"));
  GK_RETURN_IF_ERROR(CheckPositive(api, s->top_k, "topK (expertIdx.shape[1])"));
  int64_t slots;
  if (__builtin_mul_overflow(s->batch, s->top_k, &slots)) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "batch {} * topK {} overflows int64; the slots must be countable", s->batch,
                s->top_k);
  }
  if (slots > kMoeInitRoutingMaxSlots) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "batch {} * topK {} = {} slots, more than 2^59: the workspace's routing table "
                "(8 bytes a row) would overflow 64-bit sizes",
                s->batch, s->top_k, slots);
  }
  // R: expandedX's rows; index-only, the gather index's length (scatter: the worst case).
  s->rows = ex != nullptr                            ? ex->dims[0]
            : s->row_idx_type == RowIdxType::kGather ? idx.dims[0]
                                                     : s->max_rows();
  if (ex != nullptr) GK_RETURN_IF_ERROR(CheckDimIs(api, *ex, "expandedX", 1, s->h, "H, x.shape[1]"));
  GK_RETURN_IF_ERROR(CheckDimIs(api, groups, "groupList", 0, s->g, "expertNum"));
  if (s->rows > s->max_rows()) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "{} has {} rows, more than any routing can fill: at most {} (batch {} * "
                "topK {}{})",
                ex != nullptr ? "expandedX" : "expandedRowIdx (rowIdxType 0, no expandedX)",
                s->rows, s->max_rows(), s->batch, s->top_k,
                s->capacity > 0 ? fmt::format(", or expertNum {} * expertCapacity {}", s->g,
                                              s->capacity)
                                : std::string());
  }
  const int64_t idx_len = s->row_idx_type == RowIdxType::kGather ? s->rows : slots;
  GK_RETURN_IF_ERROR(CheckDimIs(api, idx, "expandedRowIdx", 0, idx_len,
                                s->row_idx_type == RowIdxType::kGather
                                    ? "expandedX.shape[0], for rowIdxType 0"
                                    : "batch * topK, for rowIdxType 1"));
  if (idx.dtype == DType::kI32 && slots > INT32_MAX) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx is int32 but batch * topK = {} slots do not fit it; use int64",
                slots);
  }
  if (x.dims[1] > 1 && x.strides[1] != 1) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "x with shape {} has strides {}; its last dim must be contiguous (stride 1)",
                ShapeString(x), StridesString(x));
  }
  s->x_row_stride = x.strides[0];
  return GK_SUCCESS;
}

}  // namespace

gkStatus CheckMoeInitRouting(std::string_view api, const MoeInitRoutingArgs& a,
                             MoeInitRoutingShape* s) {
  GK_RETURN_IF_ERROR(CheckTensor(api, a.x, "x"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.expert_idx, "expertIdx"));
  if (a.expanded_x != nullptr) GK_RETURN_IF_ERROR(CheckTensor(api, a.expanded_x, "expandedX"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.expanded_row_idx, "expandedRowIdx"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.group_list, "groupList"));
  const gkTensor& x = *a.x;
  const gkTensor& experts = *a.expert_idx;
  const gkTensor* ex = a.expanded_x;
  const gkTensor& idx = *a.expanded_row_idx;
  const gkTensor& groups = *a.group_list;

  GK_RETURN_IF_ERROR(CheckDTypeIn(api, x, "x", {DType::kF32, DType::kF16, DType::kBF16}));
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, experts, "expertIdx", {DType::kI64, DType::kI32}));
  if (ex != nullptr) GK_RETURN_IF_ERROR(CheckSameDType(api, *ex, "expandedX", x, "x"));
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, idx, "expandedRowIdx", {DType::kI64, DType::kI32}));
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, groups, "groupList", {kMoeInitRoutingGroupListDType}));
  static_assert(std::size(kMoeInitRoutingFloatDTypes) == 3 &&
                std::size(kMoeInitRoutingIndexDTypes) == 2,
                "keep the check lists above in step with the tables in moe_init_routing_def.h");

  GK_RETURN_IF_ERROR(CheckAttributes(api, a));
  s->g = a.expert_num;
  s->capacity = a.expert_capacity;
  s->dtype = x.dtype;
  s->expand_x = ex != nullptr;
  s->expert_idx_dtype = experts.dtype;
  s->row_idx_dtype = idx.dtype;
  s->row_idx_type = static_cast<RowIdxType>(a.row_idx_type);
  s->group_list_type = static_cast<GroupListType>(a.group_list_type);
  GK_RETURN_IF_ERROR(CheckShapes(api, a, s));

  GK_RETURN_IF_ERROR(CheckAddressable(api, x, "x"));
  const struct {
    const gkTensor* t;
    std::string_view name;
  } contiguous[] = {{&experts, "expertIdx"}, {ex, "expandedX"}, {&idx, "expandedRowIdx"},
                    {&groups, "groupList"}};
  for (const auto& [t, name] : contiguous) {
    if (t == nullptr) continue;
    GK_RETURN_IF_ERROR(CheckAddressable(api, *t, name));
    GK_RETURN_IF_ERROR(CheckContiguous(api, *t, name));
  }
  const struct {
    const gkTensor* t;
    std::string_view name;
  } outputs[] = {{ex, "expandedX"}, {&idx, "expandedRowIdx"}, {&groups, "groupList"}};
  for (const auto& [out, out_name] : outputs) {
    if (out == nullptr) continue;
    GK_RETURN_IF_ERROR(CheckDisjoint(api, *out, out_name, x, "x"));
    GK_RETURN_IF_ERROR(CheckDisjoint(api, *out, out_name, experts, "expertIdx"));
  }
  if (ex != nullptr) {
    GK_RETURN_IF_ERROR(CheckDisjoint(api, idx, "expandedRowIdx", *ex, "expandedX"));
    GK_RETURN_IF_ERROR(CheckDisjoint(api, groups, "groupList", *ex, "expandedX"));
  }
  GK_RETURN_IF_ERROR(CheckDisjoint(api, groups, "groupList", idx, "expandedRowIdx"));

  // Values: phase 1 reads expertIdx (batch * topK entries, never x) and counts M.
  std::vector<int64_t> group_offsets(static_cast<size_t>(s->g + 1));
  MoeInitRoutingTable table{group_offsets.data(), nullptr, nullptr};
  return BuildMoeInitRoutingTable(api, experts, *s, &table);
}

}  // namespace gk
