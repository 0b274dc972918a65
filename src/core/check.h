// Named argument checks shared by every operator. Each returns GK_SUCCESS or records a message
// naming the argument, its value and the rule, and returns the failing status.
#pragma once

#include <cmath>
#include <initializer_list>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"

namespace gk {

gkStatus CheckNotNull(std::string_view api, const void* pointer, std::string_view name);
// Not NULL, and a live descriptor from gkCreateTensor.
gkStatus CheckTensor(std::string_view api, const gkTensor* t, std::string_view name);
gkStatus CheckDTypeIn(std::string_view api, const gkTensor& t, std::string_view name,
                      std::initializer_list<DType> allowed);
gkStatus CheckSameDType(std::string_view api, const gkTensor& t, std::string_view name,
                        const gkTensor& like, std::string_view like_name);
gkStatus CheckMaxRank(std::string_view api, const gkTensor& t, std::string_view name, int max_rank);
gkStatus CheckRank(std::string_view api, const gkTensor& t, std::string_view name, int rank);
gkStatus CheckSameShape(std::string_view api, const gkTensor& t, std::string_view name,
                        const gkTensor& like, std::string_view like_name);
// The view's element count and byte extent fit in 64 bits, and its data is not NULL unless empty.
gkStatus CheckAddressable(std::string_view api, const gkTensor& t, std::string_view name);
// An output: no two of its indices address the same element.
gkStatus CheckNoSelfOverlap(std::string_view api, const gkTensor& t, std::string_view name);
// An output either is exactly the same view as an input (in place) or shares no byte with it.
gkStatus CheckAliasOrDisjoint(std::string_view api, const gkTensor& out, std::string_view out_name,
                              const gkTensor& in, std::string_view in_name);
gkStatus CheckDisjoint(std::string_view api, const gkTensor& out, std::string_view out_name,
                       const gkTensor& in, std::string_view in_name);
gkStatus CheckPositive(std::string_view api, int64_t value, std::string_view name);
gkStatus CheckContiguous(std::string_view api, const gkTensor& t, std::string_view name);
// Dim `dim` of t equals `expected`; `rule` says why (e.g. "weight.shape[2] = N").
gkStatus CheckDimIs(std::string_view api, const gkTensor& t, std::string_view name, int dim,
                    int64_t expected, std::string_view rule);
// An attribute converts to a finite float32.
gkStatus CheckFiniteF32(std::string_view api, double value, std::string_view name);

}  // namespace gk
