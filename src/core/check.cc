#include "core/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/live_handles.h"

namespace gk {

gkStatus CheckNotNull(std::string_view api, const void* pointer, std::string_view name) {
  if (pointer == nullptr) return Fail(GK_ERROR_NULLPTR, api, "{} is NULL", name);
  return GK_SUCCESS;
}

gkStatus CheckTensor(std::string_view api, const gkTensor* t, std::string_view name) {
  GK_RETURN_IF_ERROR(CheckNotNull(api, t, name));
  if (!LiveHandles<gkTensor>::Get().Contains(t)) {
    return Fail(GK_ERROR_PARAM_INVALID, api, "{} is not a live descriptor from gkCreateTensor",
                name);
  }
  return GK_SUCCESS;
}

gkStatus CheckDTypeIn(std::string_view api, const gkTensor& t, std::string_view name,
                      std::initializer_list<DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), t.dtype) != allowed.end()) return GK_SUCCESS;
  std::vector<std::string_view> names;
  for (DType d : allowed) names.push_back(DTypeName(d));
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} has dtype {}, supported: {}", name,
              DTypeName(t.dtype), fmt::join(names, ", "));
}

gkStatus CheckSameDType(std::string_view api, const gkTensor& t, std::string_view name,
                        const gkTensor& like, std::string_view like_name) {
  if (t.dtype == like.dtype) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} has dtype {} but {} has dtype {}; they must match",
              name, DTypeName(t.dtype), like_name, DTypeName(like.dtype));
}

gkStatus CheckMaxRank(std::string_view api, const gkTensor& t, std::string_view name,
                      int max_rank) {
  if (t.ndims <= max_rank) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} has {} dims (shape {}), at most {} are supported",
              name, t.ndims, ShapeString(t), max_rank);
}

gkStatus CheckRank(std::string_view api, const gkTensor& t, std::string_view name, int rank) {
  if (t.ndims == rank) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} has {} dims (shape {}), it must have {}", name,
              t.ndims, ShapeString(t), rank);
}

gkStatus CheckSameShape(std::string_view api, const gkTensor& t, std::string_view name,
                        const gkTensor& like, std::string_view like_name) {
  if (SameShape(t, like)) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} has shape {} but {} has shape {}; they must match",
              name, ShapeString(t), like_name, ShapeString(like));
}

gkStatus CheckAddressable(std::string_view api, const gkTensor& t, std::string_view name) {
  const auto elems = NumElements(t);
  if (!elems) {
    return Fail(GK_ERROR_PARAM_INVALID, api, "{} shape {} has more than 2^63 elements", name,
                ShapeString(t));
  }
  if (*elems == 0) return GK_SUCCESS;
  if (t.data == nullptr) {
    return Fail(GK_ERROR_NULLPTR, api, "{} data is NULL but it has {} elements", name, *elems);
  }
  if (!TouchedBytes(t)) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "{} with shape {}, strides {} and offset {} addresses bytes outside the 64-bit "
                "address space", name, ShapeString(t), StridesString(t), t.offset);
  }
  return GK_SUCCESS;
}

gkStatus CheckNoSelfOverlap(std::string_view api, const gkTensor& t, std::string_view name) {
  if (!MayOverlapItself(t)) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "{} with shape {} and strides {} addresses some elements twice; an output must not",
              name, ShapeString(t), StridesString(t));
}

namespace {
bool SameView(const gkTensor& a, const gkTensor& b) {
  if (a.ndims != b.ndims || ElementBytes(a.dtype) != ElementBytes(b.dtype)) return false;
  if (TensorBase(a) != TensorBase(b)) {
    return false;
  }
  for (int d = 0; d < a.ndims; ++d) {
    if (a.dims[d] != b.dims[d] || (a.dims[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}
bool Intersect(const gkTensor& a, const gkTensor& b) {
  const auto ra = TouchedBytes(a), rb = TouchedBytes(b);
  return ra && rb && ra->first < rb->last && rb->first < ra->last;
}
}  // namespace

gkStatus CheckAliasOrDisjoint(std::string_view api, const gkTensor& out, std::string_view out_name,
                              const gkTensor& in, std::string_view in_name) {
  if (!Intersect(out, in) || SameView(out, in)) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "{} overlaps {} without being the same view (same address, element size and "
              "strides); in-place use must alias exactly",
              out_name, in_name);
}

gkStatus CheckDisjoint(std::string_view api, const gkTensor& out, std::string_view out_name,
                       const gkTensor& in, std::string_view in_name) {
  if (!Intersect(out, in)) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} overlaps {} in memory; it must not", out_name,
              in_name);
}

gkStatus CheckPositive(std::string_view api, int64_t value, std::string_view name) {
  if (value > 0) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} is {}, it must be > 0", name, value);
}

gkStatus CheckContiguous(std::string_view api, const gkTensor& t, std::string_view name) {
  if (IsContiguous(t)) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "{} with shape {} has strides {}; it must be contiguous (C order)", name,
              ShapeString(t), StridesString(t));
}

gkStatus CheckDimIs(std::string_view api, const gkTensor& t, std::string_view name, int dim,
                    int64_t expected, std::string_view rule) {
  if (t.dims[dim] == expected) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} has shape {}: dim {} is {}, it must be {} ({})",
              name, ShapeString(t), dim, t.dims[dim], expected, rule);
}

gkStatus CheckFiniteF32(std::string_view api, double value, std::string_view name) {
  if (std::isfinite(static_cast<float>(value))) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api, "{} is {}, it must be finite in float32", name, value);
}

}  // namespace gk
