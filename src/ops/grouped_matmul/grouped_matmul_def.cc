#include "ops/grouped_matmul/grouped_matmul_def.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/error.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"

namespace gk {

std::string_view GroupedMatmulOpName(const GroupedMatmulShape& s) {
  if (s.op == GroupedMatmulOp::kForward) return kGroupedMatmulName;
  return s.accumulate ? kGroupedMatmulWeightGradAddName : kGroupedMatmulWeightGradName;
}

std::string_view GroupedMatmulRowsOf(const GroupedMatmulShape& s) {
  if (s.op == GroupedMatmulOp::kWeightGrad) return "gradY";
  return s.gather_fused ? "y" : "x";
}

namespace {

std::string_view OutName(const GroupedMatmulArgs& a) {
  if (a.op == GroupedMatmulOp::kForward) return "y";
  return a.accumulate ? "gradWeightRef" : "gradWeight";
}

gkStatus CheckDTypes(std::string_view api, const GroupedMatmulArgs& a) {
  const gkTensor& x = *a.x;
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, x, "x", {DType::kF32, DType::kF16, DType::kBF16}));
  if (a.op == GroupedMatmulOp::kForward) {
    GK_RETURN_IF_ERROR(CheckSameDType(api, *a.weight, "weight", x, "x"));
  } else {
    GK_RETURN_IF_ERROR(CheckSameDType(api, *a.grad_y, "gradY", x, "x"));
  }
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, *a.group_list, "groupList", {DType::kI64, DType::kI32}));
  if (a.expanded_row_idx != nullptr) {
    GK_RETURN_IF_ERROR(
        CheckDTypeIn(api, *a.expanded_row_idx, "expandedRowIdx", {DType::kI64, DType::kI32}));
  }
  const gkTensor& out = *a.out;
  if (out.dtype != DType::kF32 && out.dtype != x.dtype) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "{} has dtype {}; it must be float32 or x's dtype, {}", OutName(a),
                DTypeName(out.dtype), DTypeName(x.dtype));
  }
  static_assert(std::size(kGroupedMatmulFloatDTypes) == 3 &&
                std::size(kGroupedMatmulIndexDTypes) == 2,
                "keep the check lists above in step with the tables in grouped_matmul_def.h");
  return GK_SUCCESS;
}

gkStatus CheckAttributes(std::string_view api, const GroupedMatmulArgs& a) {
  GK_RETURN_IF_ERROR(CheckGroupListType(api, a.group_list_type));
  if (a.expanded_row_idx == nullptr) return GK_SUCCESS;  // plain x: rowIdxType, topK unused
  GK_RETURN_IF_ERROR(CheckRowIdxType(api, a.row_idx_type));
  return CheckPositive(api, a.top_k, "topK");
}

gkStatus CheckDimsInRange(std::string_view api, const gkTensor& t, std::string_view name,
                          const GroupedMatmulShape& s) {
  if (s.g < 1) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "{} has shape {}: {} experts (dim 0), at least 1 is required", name,
                ShapeString(t), s.g);
  }
  if (s.k < 1 || s.n < 1) {
    return Fail(GK_ERROR_PARAM_INVALID, api, "{} has shape {}: K = {} and N = {} must both be >= 1",
                name, ShapeString(t), s.k, s.n);
  }
  if (s.k > kGroupedMatmulMaxDim || s.n > kGroupedMatmulMaxDim || s.g > kGroupedMatmulMaxDim) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "{} has shape {}: G, K and N must each be below 2^31", name, ShapeString(t));
  }
  return GK_SUCCESS;
}

// Forward: G, K, N from weight (its layout named by transposeWeight); x's columns are K. When
// they match N instead, the layout flag is most likely the wrong one: the error says so.
gkStatus CheckForwardShapes(std::string_view api, const GroupedMatmulArgs& a,
                            GroupedMatmulShape* s) {
  const gkTensor& x = *a.x;
  const gkTensor& w = *a.weight;
  const gkTensor& y = *a.out;
  GK_RETURN_IF_ERROR(CheckRank(api, w, "weight", 3));
  GK_RETURN_IF_ERROR(CheckRank(api, y, "y", 2));
  s->g = w.dims[0];
  s->k = a.transpose_weight ? w.dims[2] : w.dims[1];
  s->n = a.transpose_weight ? w.dims[1] : w.dims[2];
  GK_RETURN_IF_ERROR(CheckDimsInRange(api, w, "weight", *s));
  if (x.dims[1] != s->k) {
    if (x.dims[1] == s->n) {
      return Fail(GK_ERROR_PARAM_INVALID, api,
                  "x has {} columns, which is N and not K = {}, with weight of shape {} and "
                  "transposeWeight {}: K and N look swapped; {}",
                  x.dims[1], s->k, ShapeString(w), a.transpose_weight ? "true" : "false",
                  a.transpose_weight
                      ? "with transposeWeight the weight is [G, N, K]; a [G, K, N] weight is "
                        "passed with transposeWeight false"
                      : "the weight must be [G, K, N]; a weight stored [G, N, K] (nn.Linear's "
                        "layout) is passed with transposeWeight true");
    }
    return CheckDimIs(api, x, "x", 1, s->k,
                      a.transpose_weight ? "K, weight.shape[2] (transposeWeight)"
                                         : "K, weight.shape[1]");
  }
  s->m = s->gather_fused ? y.dims[0] : x.dims[0];
  if (!s->gather_fused) GK_RETURN_IF_ERROR(CheckDimIs(api, y, "y", 0, s->m, "M, x.shape[0]"));
  return CheckDimIs(api, y, "y", 1, s->n,
                    a.transpose_weight ? "N, weight.shape[1] (transposeWeight)"
                                       : "N, weight.shape[2]");
}

// Weight grad: K from x, M and N from gradY, G from gradWeight ([G, K, N]).
gkStatus CheckWeightGradShapes(std::string_view api, const GroupedMatmulArgs& a,
                               GroupedMatmulShape* s) {
  const gkTensor& x = *a.x;
  const gkTensor& dy = *a.grad_y;
  const gkTensor& dw = *a.out;
  const std::string_view dw_name = OutName(a);
  GK_RETURN_IF_ERROR(CheckRank(api, dy, "gradY", 2));
  GK_RETURN_IF_ERROR(CheckRank(api, dw, dw_name, 3));
  s->m = dy.dims[0];
  s->n = dy.dims[1];
  s->k = x.dims[1];
  s->g = dw.dims[0];
  GK_RETURN_IF_ERROR(CheckDimsInRange(api, dw, dw_name, *s));
  if (!s->gather_fused) {
    GK_RETURN_IF_ERROR(CheckDimIs(api, dy, "gradY", 0, x.dims[0], "M, x.shape[0]"));
  }
  if (dw.dims[1] != s->k && dw.dims[1] == s->n && dw.dims[2] == s->k) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "{} has shape {}, which is [G, N, K] with K = {} (x.shape[1]) and N = {} "
                "(gradY.shape[1]): K and N look swapped; {} must be [G, K, N]",
                dw_name, ShapeString(dw), s->k, s->n, dw_name);
  }
  GK_RETURN_IF_ERROR(CheckDimIs(api, dw, dw_name, 1, s->k, "K, x.shape[1]"));
  return CheckDimIs(api, dw, dw_name, 2, s->n, "N, gradY.shape[1]");
}

// Gather-fused: the routing's sizes (the values come later).
gkStatus CheckRoutingShapes(std::string_view api, const GroupedMatmulArgs& a,
                            GroupedMatmulShape* s) {
  MoeGradShape& r = s->routing;
  r.m = s->m;
  r.g = s->g;
  r.k = s->k;
  r.n = s->n;
  r.dtype = s->dtype;
  r.group_list_type = static_cast<GroupListType>(a.group_list_type);
  if (!s->gather_fused) {
    r.batch = std::max<int64_t>(s->m, 1);
    r.top_k = 1;
    r.l = 0;
    r.index_dtype = DType::kI64;
    r.row_idx_type = RowIdxType::kGather;
    return GK_SUCCESS;
  }
  const gkTensor& idx = *a.expanded_row_idx;
  GK_RETURN_IF_ERROR(CheckRank(api, idx, "expandedRowIdx", 1));
  r.batch = a.x->dims[0];
  r.top_k = a.top_k;
  r.l = idx.dims[0];
  r.index_dtype = idx.dtype;
  r.row_idx_type = static_cast<RowIdxType>(a.row_idx_type);
  if (r.batch < 1) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "x has shape {}: with expandedRowIdx, x is the token matrix [batch, K] and needs "
                "batch >= 1 rows",
                ShapeString(*a.x));
  }
  int64_t slots;
  if (__builtin_mul_overflow(r.batch, r.top_k, &slots)) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "batch {} (x.shape[0]) * topK {} overflows int64; the original slots must be "
                "countable",
                r.batch, r.top_k);
  }
  const std::string_view rows_of = GroupedMatmulRowsOf(*s);
  if (s->m > slots) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "{} has {} rows (M), more than batch {} (x.shape[0]) * topK {} = {} original slots",
                rows_of, s->m, r.batch, r.top_k, slots);
  }
  if (r.row_idx_type == RowIdxType::kGather && r.l < s->m) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx has {} entries, fewer than M = {} rows of {} (rowIdxType 0 needs "
                "L >= M)",
                r.l, s->m, rows_of);
  }
  if (r.row_idx_type == RowIdxType::kScatter && r.l != slots) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx has {} entries; rowIdxType 1 needs one per original slot, batch "
                "{} (x.shape[0]) * topK {} = {}{}",
                r.l, r.batch, r.top_k, slots,
                r.l == s->m ? " (M entries, the length of a gather index: is it rowIdxType 0?)"
                            : "");
  }
  return GK_SUCCESS;
}

// Forward weight: C-contiguous in the layout transposeWeight names, or the transposed view of
// the other layout's C-contiguous storage. Sets weight_nk (W[g][k][n] at n*K + k).
gkStatus CheckWeightLayout(std::string_view api, const gkTensor& w, bool transpose_weight,
                           GroupedMatmulShape* s) {
  gkTensor storage = w;  // the tensor the view was taken from, when it is a transposed view
  std::swap(storage.dims[1], storage.dims[2]);
  std::swap(storage.strides[1], storage.strides[2]);
  if (IsContiguous(w)) {
    s->weight_nk = transpose_weight;
  } else if (IsContiguous(storage)) {
    s->weight_nk = !transpose_weight;
  } else {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "weight with shape {} has strides {}; it must be C-contiguous (strides ({}, {}, "
                "1)) or the transposed view of a C-contiguous buffer of the other layout "
                "(strides ({}, 1, {}))",
                ShapeString(w), StridesString(w), w.dims[1] * w.dims[2], w.dims[2],
                w.dims[1] * w.dims[2], w.dims[1]);
  }
  return GK_SUCCESS;
}

}  // namespace

gkStatus CheckGroupedMatmul(std::string_view api, const GroupedMatmulArgs& a,
                            GroupedMatmulShape* s) {
  const bool forward = a.op == GroupedMatmulOp::kForward;
  GK_RETURN_IF_ERROR(CheckTensor(api, a.x, "x"));
  if (forward) {
    GK_RETURN_IF_ERROR(CheckTensor(api, a.weight, "weight"));
  } else {
    GK_RETURN_IF_ERROR(CheckTensor(api, a.grad_y, "gradY"));
  }
  GK_RETURN_IF_ERROR(CheckTensor(api, a.group_list, "groupList"));
  if (a.expanded_row_idx != nullptr) {
    GK_RETURN_IF_ERROR(CheckTensor(api, a.expanded_row_idx, "expandedRowIdx"));
  }
  GK_RETURN_IF_ERROR(CheckTensor(api, a.out, OutName(a)));
  GK_RETURN_IF_ERROR(CheckDTypes(api, a));
  GK_RETURN_IF_ERROR(CheckAttributes(api, a));

  *s = GroupedMatmulShape{};
  s->op = a.op;
  s->gather_fused = a.expanded_row_idx != nullptr;
  s->dtype = a.x->dtype;
  s->out_dtype = a.out->dtype;
  s->accumulate = !forward && a.accumulate;
  GK_RETURN_IF_ERROR(CheckRank(api, *a.x, "x", 2));
  GK_RETURN_IF_ERROR(CheckRank(api, *a.group_list, "groupList", 1));
  GK_RETURN_IF_ERROR(forward ? CheckForwardShapes(api, a, s) : CheckWeightGradShapes(api, a, s));
  s->x_rows = a.x->dims[0];
  GK_RETURN_IF_ERROR(CheckDimIs(api, *a.group_list, "groupList", 0, s->g,
                                forward ? "G, weight.shape[0]"
                                : (a.accumulate ? "G, gradWeightRef.shape[0]"
                                                : "G, gradWeight.shape[0]")));
  GK_RETURN_IF_ERROR(CheckRoutingShapes(api, a, s));

  struct Named {
    const gkTensor* t;
    std::string_view name;
  };
  const Named inputs[] = {{a.x, "x"},
                          {forward ? a.weight : a.grad_y, forward ? "weight" : "gradY"},
                          {a.group_list, "groupList"},
                          {a.expanded_row_idx, "expandedRowIdx"}};
  const Named out{a.out, OutName(a)};
  for (const auto& [t, name] : inputs) {
    if (t == nullptr) continue;
    GK_RETURN_IF_ERROR(CheckAddressable(api, *t, name));
    if (t == a.weight) {
      GK_RETURN_IF_ERROR(CheckWeightLayout(api, *t, a.transpose_weight, s));
    } else {
      GK_RETURN_IF_ERROR(CheckContiguous(api, *t, name));
    }
  }
  GK_RETURN_IF_ERROR(CheckAddressable(api, *out.t, out.name));
  GK_RETURN_IF_ERROR(CheckContiguous(api, *out.t, out.name));
  for (const auto& [t, name] : inputs) {
    if (t != nullptr) GK_RETURN_IF_ERROR(CheckDisjoint(api, *out.t, out.name, *t, name));
  }

  // Index values: phase 1 reads the two small index arrays (G and L entries), never the floats.
  std::vector<int64_t> group_offsets(static_cast<size_t>(s->g + 1));
  GK_RETURN_IF_ERROR(BuildGroupOffsets(api, *a.group_list, s->routing, group_offsets.data(),
                                       GroupedMatmulRowsOf(*s)));
  if (s->gather_fused) {
    const gkTensor& idx = *a.expanded_row_idx;
    std::vector<int64_t> row_token(static_cast<size_t>(s->m));
    const auto with_hint = [&](gkStatus status) {
      if (status == GK_SUCCESS) return status;
      const std::string hint = RowIdxTypeHint(idx, s->routing);
      if (!hint.empty()) SetRecentError(std::string(gkGetRecentErrMsg()) + hint);
      return status;
    };
    GK_RETURN_IF_ERROR(with_hint(BuildRowTokens(api, idx, s->routing, row_token.data())));
    if (s->routing.row_idx_type == RowIdxType::kGather) {
      GK_RETURN_IF_ERROR(with_hint(CheckDistinctSlots(api, idx, s->routing)));
    }
  }
  return GK_SUCCESS;
}

}  // namespace gk
