#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"

#include <utility>
#include <vector>

#include "core/check.h"
#include "core/error.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"

namespace gk {

std::string_view RowIdxTypeName(RowIdxType type) {
  return type == RowIdxType::kGather ? "gather" : "scatter";
}
std::string_view GroupListTypeName(GroupListType type) {
  return type == GroupListType::kCount ? "count" : "cumsum";
}

MoeGradShape MoeGradGatherCountShape(int64_t batch, int64_t top_k, int64_t m, int64_t g, int64_t k,
                                     int64_t n, DType dtype) {
  MoeGradShape s{};
  s.m = m, s.n = n, s.k = k, s.g = g, s.l = m, s.batch = batch, s.top_k = top_k;
  s.dtype = dtype, s.index_dtype = DType::kI64;
  s.row_idx_type = RowIdxType::kGather, s.group_list_type = GroupListType::kCount;
  return s;
}

gkStatus CheckRowIdxType(std::string_view api, int64_t row_idx_type) {
  if (row_idx_type == GK_ROW_IDX_GATHER || row_idx_type == GK_ROW_IDX_SCATTER) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "rowIdxType is {}, it must be GK_ROW_IDX_GATHER (0: expanded -> original) or "
              "GK_ROW_IDX_SCATTER (1: original -> expanded)",
              row_idx_type);
}

gkStatus CheckGroupListType(std::string_view api, int64_t group_list_type) {
  if (group_list_type == GK_GROUP_LIST_COUNT || group_list_type == GK_GROUP_LIST_CUMSUM) {
    return GK_SUCCESS;
  }
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "groupListType is {}, it must be GK_GROUP_LIST_COUNT (0) or GK_GROUP_LIST_CUMSUM (1)",
              group_list_type);
}

namespace {

gkStatus CheckAttributes(std::string_view api, const MoeGradArgs& a) {
  GK_RETURN_IF_ERROR(CheckPositive(api, a.batch, "batch"));
  GK_RETURN_IF_ERROR(CheckPositive(api, a.top_k, "topK"));
  int64_t slots;
  if (__builtin_mul_overflow(a.batch, a.top_k, &slots)) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "batch {} * topK {} overflows int64; the original slots must be countable",
                a.batch, a.top_k);
  }
  GK_RETURN_IF_ERROR(CheckRowIdxType(api, a.row_idx_type));
  return CheckGroupListType(api, a.group_list_type);
}

// gradY's columns are weight's N. When they match K instead, weight is most likely nn.Linear's
// [G, N, K] passed as it is stored; the error says how to pass it.
gkStatus CheckGradYColumns(std::string_view api, const gkTensor& dy, const gkTensor& w,
                           const MoeGradShape& s) {
  if (dy.dims[1] == s.n || dy.dims[1] != s.k) {
    return CheckDimIs(api, dy, "gradY", 1, s.n, "N, weight.shape[2]");
  }
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "gradY has {} columns, which is K (weight.shape[1]) and not N = {} "
              "(weight.shape[2]), with weight of shape {}: K and N look swapped; weight must be "
              "[G, K, N]. A weight stored [G, N, K] (nn.Linear's layout) is passed as its "
              "transposed view: shape [G, K, N], strides (K*N, 1, K), no copy",
              dy.dims[1], s.n, ShapeString(w));
}

// weight is read either C-contiguous [G, K, N] or as the transposed view of a C-contiguous
// [G, N, K] (what torch's weight.transpose(1, 2) of nn.Linear weights gives). Sets weight_nk.
gkStatus CheckWeightLayout(std::string_view api, const gkTensor& w, MoeGradShape* s) {
  s->weight_nk = false;
  if (IsContiguous(w)) return GK_SUCCESS;
  gkTensor storage = w;  // the [G, N, K] tensor the view was taken from
  std::swap(storage.dims[1], storage.dims[2]);
  std::swap(storage.strides[1], storage.strides[2]);
  if (IsContiguous(storage)) {
    s->weight_nk = true;
    return GK_SUCCESS;
  }
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "weight with shape {} has strides {}; it must be C-contiguous [G, K, N] (strides "
              "({}, {}, 1)) or the transposed view of a C-contiguous [G, N, K] (strides ({}, 1, "
              "{}))",
              ShapeString(w), StridesString(w), s->k * s->n, s->n, s->k * s->n, s->k);
}

// Appends RowIdxTypeHint to the recent error of a failed index check.
gkStatus WithRowIdxTypeHint(gkStatus status, const gkTensor& idx, const MoeGradShape& s) {
  if (status == GK_SUCCESS) return status;
  const std::string hint = RowIdxTypeHint(idx, s);
  if (!hint.empty()) SetRecentError(std::string(gkGetRecentErrMsg()) + hint);
  return status;
}

gkStatus CheckShapes(std::string_view api, const MoeGradArgs& a, MoeGradShape* s) {
  const gkTensor& dy = *a.grad_y;
  const gkTensor& w = *a.weight;
  const gkTensor& idx = *a.expanded_row_idx;
  const gkTensor& groups = *a.group_list;
  const gkTensor& dx = *a.grad_x;
  GK_RETURN_IF_ERROR(CheckRank(api, dy, "gradY", 2));
  GK_RETURN_IF_ERROR(CheckRank(api, w, "weight", 3));
  GK_RETURN_IF_ERROR(CheckRank(api, idx, "expandedRowIdx", 1));
  GK_RETURN_IF_ERROR(CheckRank(api, groups, "groupList", 1));
  GK_RETURN_IF_ERROR(CheckRank(api, dx, "gradX", 2));
  s->m = dy.dims[0];
  s->n = w.dims[2];
  s->g = w.dims[0];
  s->k = w.dims[1];
  s->l = idx.dims[0];
  s->batch = a.batch;
  s->top_k = a.top_k;
  if (s->g < 1) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "weight has shape {}: {} experts (dim 0), at least 1 is required",
                ShapeString(w), s->g);
  }
  if (s->k < 1 || s->n < 1) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "weight has shape {}: K (dim 1) and N (dim 2) must both be >= 1", ShapeString(w));
  }
  // The seed bounds every dim by 2^31 (uint32 tiling fields); the plan's tile and workspace
  // arithmetic (threads x base_m x N, ...) relies on it to stay inside 64 bits.
  if (s->k > kMoeGradMaxDim || s->n > kMoeGradMaxDim || s->g > kMoeGradMaxDim) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "weight has shape {}: G, K and N must each be below 2^31", ShapeString(w));
  }
  GK_RETURN_IF_ERROR(CheckGradYColumns(api, dy, w, *s));
  GK_RETURN_IF_ERROR(CheckDimIs(api, groups, "groupList", 0, s->g, "G, weight.shape[0]"));
  GK_RETURN_IF_ERROR(CheckDimIs(api, dx, "gradX", 0, s->batch, "batch"));
  GK_RETURN_IF_ERROR(CheckDimIs(api, dx, "gradX", 1, s->k, "K, weight.shape[1]"));
  if (s->m > s->slots()) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "gradY has {} rows (M), more than batch {} * topK {} = {} original slots", s->m,
                s->batch, s->top_k, s->slots());
  }
  if (s->row_idx_type == RowIdxType::kGather && s->l < s->m) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx has {} entries, fewer than M = {} rows of gradY (rowIdxType 0 "
                "needs L >= M)",
                s->l, s->m);
  }
  if (s->row_idx_type == RowIdxType::kScatter && s->l != s->slots()) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx has {} entries; rowIdxType 1 needs one per original slot, "
                "batch {} * topK {} = {}{}",
                s->l, s->batch, s->top_k, s->slots(),
                s->l == s->m ? " (M entries, the length of a gather index: is it rowIdxType 0?)"
                             : "");
  }
  return GK_SUCCESS;
}

}  // namespace

gkStatus CheckMoeGrad(std::string_view api, const MoeGradArgs& a, MoeGradShape* s) {
  GK_RETURN_IF_ERROR(CheckTensor(api, a.grad_y, "gradY"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.weight, "weight"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.expanded_row_idx, "expandedRowIdx"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.group_list, "groupList"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.grad_x, "gradX"));
  const gkTensor& dy = *a.grad_y;
  const gkTensor& w = *a.weight;
  const gkTensor& idx = *a.expanded_row_idx;
  const gkTensor& groups = *a.group_list;
  const gkTensor& dx = *a.grad_x;

  GK_RETURN_IF_ERROR(CheckDTypeIn(api, dy, "gradY", {DType::kF32, DType::kF16, DType::kBF16}));
  GK_RETURN_IF_ERROR(CheckSameDType(api, w, "weight", dy, "gradY"));
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, idx, "expandedRowIdx", {DType::kI64, DType::kI32}));
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, groups, "groupList", {DType::kI64, DType::kI32}));
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, dx, "gradX", {kMoeGradOutputDType}));
  static_assert(std::size(kMoeGradFloatDTypes) == 3 && std::size(kMoeGradRowIdxDTypes) == 2 &&
                std::size(kMoeGradGroupListDTypes) == 2,
                "keep the check lists above in step with the tables in moe_grad_def.h");

  GK_RETURN_IF_ERROR(CheckAttributes(api, a));
  s->dtype = dy.dtype;
  s->index_dtype = idx.dtype;
  s->row_idx_type = static_cast<RowIdxType>(a.row_idx_type);
  s->group_list_type = static_cast<GroupListType>(a.group_list_type);
  GK_RETURN_IF_ERROR(CheckShapes(api, a, s));

  const struct {
    const gkTensor& t;
    std::string_view name;
  } tensors[] = {{dy, "gradY"}, {w, "weight"}, {idx, "expandedRowIdx"}, {groups, "groupList"},
                 {dx, "gradX"}};
  for (const auto& [t, name] : tensors) {
    GK_RETURN_IF_ERROR(CheckAddressable(api, t, name));
    if (&t == &w) {
      GK_RETURN_IF_ERROR(CheckWeightLayout(api, w, s));
    } else {
      GK_RETURN_IF_ERROR(CheckContiguous(api, t, name));
    }
  }
  for (const auto& [t, name] : tensors) {
    if (&t != &dx) GK_RETURN_IF_ERROR(CheckDisjoint(api, dx, "gradX", t, name));
  }

  // Index values: phase 1 reads the two small index arrays (G and L entries), never the floats.
  std::vector<int64_t> group_offsets(static_cast<size_t>(s->g + 1));
  GK_RETURN_IF_ERROR(BuildGroupOffsets(api, groups, *s, group_offsets.data()));
  std::vector<int64_t> row_token(static_cast<size_t>(s->m));
  GK_RETURN_IF_ERROR(WithRowIdxTypeHint(BuildRowTokens(api, idx, *s, row_token.data()), idx, *s));
  if (s->row_idx_type == RowIdxType::kGather) {
    GK_RETURN_IF_ERROR(WithRowIdxTypeHint(CheckDistinctSlots(api, idx, *s), idx, *s));
  }
  return GK_SUCCESS;
}

}  // namespace gk
