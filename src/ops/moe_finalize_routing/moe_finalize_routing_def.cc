#include "ops/moe_finalize_routing/moe_finalize_routing_def.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/error.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"

namespace gk {

MoeGradShape MoeFinalizeShape::Routing() const {
  MoeGradShape r{};
  r.m = m;
  r.n = n;
  r.k = 1;
  r.g = 1;
  r.l = l;
  r.batch = batch;
  r.top_k = top_k;
  r.dtype = dtype;
  r.index_dtype = index_dtype;
  r.row_idx_type = row_idx_type;
  r.group_list_type = GroupListType::kCount;
  return r;
}

namespace {

// A float tensor whose dtype is `like`'s or float32.
gkStatus CheckDTypeOrF32(std::string_view api, const gkTensor& t, std::string_view name,
                         DType like, std::string_view like_name) {
  if (t.dtype == like || t.dtype == DType::kF32) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "{} has dtype {}; it must be float32 or {}'s dtype, {}", name, DTypeName(t.dtype),
              like_name, DTypeName(like));
}

// Appends the fused op's rowIdxType mix-up hint to the recent error of a failed index check.
gkStatus WithRowIdxTypeHint(gkStatus status, const gkTensor& idx, const MoeFinalizeShape& s) {
  if (status == GK_SUCCESS) return status;
  const std::string hint = RowIdxTypeHint(idx, s.Routing());
  if (!hint.empty()) SetRecentError(std::string(gkGetRecentErrMsg()) + hint);
  return status;
}

gkStatus CheckShapes(std::string_view api, const MoeFinalizeArgs& a, MoeFinalizeShape* s) {
  const gkTensor& y = *a.expanded_y;
  const gkTensor& probs = *a.probs;
  const gkTensor& idx = *a.expanded_row_idx;
  GK_RETURN_IF_ERROR(CheckRank(api, y, "expandedY", 2));
  GK_RETURN_IF_ERROR(CheckRank(api, probs, "probs", 2));
  GK_RETURN_IF_ERROR(CheckRank(api, idx, "expandedRowIdx", 1));
  s->m = y.dims[0];
  s->n = y.dims[1];
  s->batch = probs.dims[0];
  s->top_k = probs.dims[1];
  s->l = idx.dims[0];
  GK_RETURN_IF_ERROR(CheckPositive(api, s->n, "N (expandedY.shape[1])"));
  GK_RETURN_IF_ERROR(CheckPositive(api, s->batch, "batch (probs.shape[0])"));
  GK_RETURN_IF_ERROR(CheckPositive(api, s->top_k, "topK (probs.shape[1])"));
  int64_t slots;
  if (__builtin_mul_overflow(s->batch, s->top_k, &slots)) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "batch {} * topK {} overflows int64; the slots must be countable", s->batch,
                s->top_k);
  }
  if (slots > kMoeRoutingMaxSlots) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "batch {} * topK {} = {} slots, more than 2^59: the workspace's slot table "
                "(8 bytes a slot) would overflow 64-bit sizes",
                s->batch, s->top_k, slots);
  }
  if (s->n > kMoeGradMaxDim) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedY has shape {}: N (dim 1) must be below 2^31", ShapeString(y));
  }
  if (s->m > slots) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedY has {} rows (M), more than batch {} * topK {} = {} slots (probs' shape)",
                s->m, s->batch, s->top_k, slots);
  }
  const auto token_rows = [&](const gkTensor* t, std::string_view name) -> gkStatus {
    GK_RETURN_IF_ERROR(CheckRank(api, *t, name, 2));
    GK_RETURN_IF_ERROR(CheckDimIs(api, *t, name, 0, s->batch, "batch, probs.shape[0]"));
    return CheckDimIs(api, *t, name, 1, s->n, "N, expandedY.shape[1]");
  };
  if (s->backward) {
    GK_RETURN_IF_ERROR(token_rows(a.grad_out, "gradOut"));
    GK_RETURN_IF_ERROR(CheckRank(api, *a.grad_expanded_y, "gradExpandedY", 2));
    GK_RETURN_IF_ERROR(CheckSameShape(api, *a.grad_expanded_y, "gradExpandedY", y, "expandedY"));
    GK_RETURN_IF_ERROR(CheckSameShape(api, *a.grad_probs, "gradProbs", probs, "probs"));
  } else {
    GK_RETURN_IF_ERROR(token_rows(a.out, "out"));
  }
  if (s->row_idx_type == RowIdxType::kGather && s->l < s->m) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx has {} entries, fewer than M = {} rows of expandedY (rowIdxType "
                "0 needs L >= M)",
                s->l, s->m);
  }
  if (s->row_idx_type == RowIdxType::kScatter && s->l != slots) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx has {} entries; rowIdxType 1 needs one per slot, batch {} * "
                "topK {} = {}{}",
                s->l, s->batch, s->top_k, slots,
                s->l == s->m ? " (M entries, the length of a gather index: is it rowIdxType 0?)"
                             : "");
  }
  return GK_SUCCESS;
}

}  // namespace

gkStatus BuildMoeFinalizeSlotRows(std::string_view api, const gkTensor& idx,
                                  const MoeFinalizeShape& s, int64_t* slot_row,
                                  int64_t* row_token) {
  // The fused op's builder checks the range of every index and, for rowIdxType 1, that each row
  // is named exactly once; its table (the token of each row) is not needed here.
  const MoeGradShape routing = s.Routing();
  GK_RETURN_IF_ERROR(WithRowIdxTypeHint(BuildRowTokens(api, idx, routing, row_token), idx, s));
  if (s.row_idx_type == RowIdxType::kScatter) {
    if (slot_row == nullptr) return GK_SUCCESS;
    for (int64_t p = 0; p < s.slots(); ++p) slot_row[p] = IndexAt(idx, p);
    return GK_SUCCESS;
  }
  GK_RETURN_IF_ERROR(WithRowIdxTypeHint(CheckDistinctSlots(api, idx, routing), idx, s));
  if (slot_row == nullptr) return GK_SUCCESS;
  std::fill(slot_row, slot_row + s.slots(), int64_t{-1});
  for (int64_t i = 0; i < s.m; ++i) slot_row[IndexAt(idx, i)] = i;
  return GK_SUCCESS;
}

gkStatus CheckMoeFinalize(std::string_view api, const MoeFinalizeArgs& a, MoeFinalizeShape* s) {
  s->backward = a.backward;
  if (s->backward) GK_RETURN_IF_ERROR(CheckTensor(api, a.grad_out, "gradOut"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.expanded_y, "expandedY"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.probs, "probs"));
  GK_RETURN_IF_ERROR(CheckTensor(api, a.expanded_row_idx, "expandedRowIdx"));
  if (s->backward) {
    GK_RETURN_IF_ERROR(CheckTensor(api, a.grad_expanded_y, "gradExpandedY"));
    GK_RETURN_IF_ERROR(CheckTensor(api, a.grad_probs, "gradProbs"));
  } else {
    GK_RETURN_IF_ERROR(CheckTensor(api, a.out, "out"));
  }
  const gkTensor& y = *a.expanded_y;
  const gkTensor& probs = *a.probs;
  const gkTensor& idx = *a.expanded_row_idx;

  GK_RETURN_IF_ERROR(CheckDTypeIn(api, y, "expandedY", {DType::kF32, DType::kF16, DType::kBF16}));
  GK_RETURN_IF_ERROR(CheckDTypeOrF32(api, probs, "probs", y.dtype, "expandedY"));
  GK_RETURN_IF_ERROR(CheckDTypeIn(api, idx, "expandedRowIdx", {DType::kI64, DType::kI32}));
  static_assert(std::size(kMoeFinalizeFloatDTypes) == 3 && std::size(kMoeFinalizeIndexDTypes) == 2,
                "keep the check lists above in step with the tables in moe_finalize_routing_def.h");
  s->dtype = y.dtype;
  s->probs_dtype = probs.dtype;
  s->index_dtype = idx.dtype;
  s->grad_y_dtype = y.dtype;
  s->grad_probs_dtype = probs.dtype;
  if (s->backward) {
    GK_RETURN_IF_ERROR(CheckDTypeOrF32(api, *a.grad_out, "gradOut", y.dtype, "expandedY"));
    GK_RETURN_IF_ERROR(
        CheckDTypeOrF32(api, *a.grad_expanded_y, "gradExpandedY", y.dtype, "expandedY"));
    GK_RETURN_IF_ERROR(CheckDTypeOrF32(api, *a.grad_probs, "gradProbs", probs.dtype, "probs"));
    s->token_dtype = a.grad_out->dtype;
    s->grad_y_dtype = a.grad_expanded_y->dtype;
    s->grad_probs_dtype = a.grad_probs->dtype;
  } else {
    GK_RETURN_IF_ERROR(CheckDTypeOrF32(api, *a.out, "out", y.dtype, "expandedY"));
    s->token_dtype = a.out->dtype;
  }
  GK_RETURN_IF_ERROR(CheckRowIdxType(api, a.row_idx_type));
  s->row_idx_type = static_cast<RowIdxType>(a.row_idx_type);
  GK_RETURN_IF_ERROR(CheckShapes(api, a, s));

  struct Named {
    const gkTensor* t;
    std::string_view name;
  };
  std::vector<Named> inputs = {{&y, "expandedY"}, {&probs, "probs"}, {&idx, "expandedRowIdx"}};
  std::vector<Named> outputs;
  if (s->backward) {
    inputs.push_back({a.grad_out, "gradOut"});
    outputs = {{a.grad_expanded_y, "gradExpandedY"}, {a.grad_probs, "gradProbs"}};
  } else {
    outputs = {{a.out, "out"}};
  }
  for (const auto* list : {&inputs, &outputs}) {
    for (const auto& [t, name] : *list) {
      GK_RETURN_IF_ERROR(CheckAddressable(api, *t, name));
      GK_RETURN_IF_ERROR(CheckContiguous(api, *t, name));
    }
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    for (const auto& [t, name] : inputs) {
      GK_RETURN_IF_ERROR(CheckDisjoint(api, *outputs[o].t, outputs[o].name, *t, name));
    }
    for (size_t other = o + 1; other < outputs.size(); ++other) {
      GK_RETURN_IF_ERROR(CheckDisjoint(api, *outputs[o].t, outputs[o].name, *outputs[other].t,
                                       outputs[other].name));
    }
  }

  // Values: phase 1 reads expandedRowIdx (never the float data), with scratch of M entries (M
  // <= the entries it reads; a table of batch * topK slots would follow probs' claimed shape,
  // which phase 1 never reads: a hostile one made it allocate 48 GiB, found by the fuzzer).
  std::vector<int64_t> row_token(static_cast<size_t>(s->m));
  return BuildMoeFinalizeSlotRows(api, idx, *s, /*slot_row=*/nullptr, row_token.data());
}

}  // namespace gk
