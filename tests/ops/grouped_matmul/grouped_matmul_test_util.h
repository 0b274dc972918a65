// Shared by the GroupedMatmul(WeightGrad) tests: routings as MoeInitRouting produces them, inputs
// in any dtype (small integers or random values), both operators through their C API in every
// input form, and the comparison with the float64 reference under grouped_matmul_ref.h's contract.
#pragma once

#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "ops/grouped_matmul/grouped_matmul_ref.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_ref.h"
#include "tests/ops/op_test_support.h"

namespace gk::testing {

struct GmmCase {
  std::string name;
  int64_t batch, top_k, g, k, n;
  double keep = 1.0;  // fraction of slots routed
  double skew = 0.0;  // fraction of slots on expert 0
  std::vector<int64_t> forced_empty = {};
  uint64_t seed = 1;
  std::vector<int64_t> counts = {};  // exact rows per expert (MoeGradRoutingSpec::counts)
};

enum class GmmValues { kSmallIntegers, kRandom };

// One case's inputs in one dtype. x exists twice: the token matrix [batch, K] (gather-fused
// input) and the expanded [M, K] rows built from it (plain input), so both forms must agree.
struct GmmInputs {
  GmmCase c;
  DType dtype;
  MoeGradRouting routing;
  std::vector<uint8_t> tokens, expanded, w, gy;
  std::vector<float> token_values, w_values, gy_values;
  int64_t m() const { return routing.m; }
};

inline GmmInputs MakeGmmInputs(const GmmCase& c, DType dtype, GmmValues kind) {
  MoeGradRoutingSpec spec;
  spec.batch = c.batch;
  spec.top_k = c.top_k;
  spec.g = c.g;
  spec.keep = c.keep;
  spec.skew = c.skew;
  spec.forced_empty = c.forced_empty;
  spec.seed = c.seed;
  spec.counts = c.counts;
  GmmInputs in{c, dtype, MakeMoeGradRouting(spec), {}, {}, {}, {}, {}, {}, {}};
  std::mt19937 generator(static_cast<uint32_t>(c.seed * 7919 + static_cast<int>(dtype)));
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  const auto fill = [&](int64_t elems, std::vector<uint8_t>& bytes, std::vector<float>& values) {
    bytes.resize(static_cast<size_t>(elems * ElementBytes(dtype)));
    values.resize(static_cast<size_t>(elems));
    for (int64_t i = 0; i < elems; ++i) {
      const float v = kind == GmmValues::kSmallIntegers ? static_cast<float>(small(generator))
                                                        : real(generator);
      StoreFromF32(bytes.data(), i, dtype, v);
      values[i] = LoadAsF32(bytes.data(), i, dtype);
    }
  };
  fill(c.batch * c.k, in.tokens, in.token_values);
  fill(c.g * c.k * c.n, in.w, in.w_values);
  fill(in.m() * c.n, in.gy, in.gy_values);
  const size_t row_bytes = static_cast<size_t>(c.k * ElementBytes(dtype));
  in.expanded.resize(static_cast<size_t>(in.m()) * row_bytes);
  for (int64_t i = 0; i < in.m(); ++i) {
    std::memcpy(in.expanded.data() + i * row_bytes,
                in.tokens.data() + in.routing.row_token[i] * row_bytes, row_bytes);
  }
  return in;
}

// The weight forms GroupedMatmul accepts; all give the same bits.
enum class WeightForm {
  kGkn,             // [G, K, N] C-contiguous, transposeWeight false
  kGknViewOfGnk,    // [G, K, N] view of [G, N, K] storage, transposeWeight false
  kGnk,             // [G, N, K] C-contiguous, transposeWeight true (nn.Linear)
  kGnkViewOfGkn,    // [G, N, K] view of [G, K, N] storage, transposeWeight true
};

struct GmmOptions {
  int64_t row_idx_type = -1;  // -1: plain x [M, K]; 0 / 1: gather-fused x [batch, K]
  gkGroupListType group_list_type = GK_GROUP_LIST_COUNT;
  DType index_dtype = DType::kI64;
  DType group_list_dtype = DType::kI64;
  bool out_f32 = true;  // else x's dtype
  WeightForm weight_form = WeightForm::kGkn;
  int32_t threads = 0;  // 0: the configured default
  // Weight grad: gradWeight placed this many bytes past a 64-byte boundary (a multiple of its
  // element size); -1: where its vector puts it.
  int64_t out_offset = -1;
  // Forward: the weights (in the form's storage) placed this many bytes past a 64-byte boundary
  // (a multiple of their element size); -1: where their vector puts them.
  int64_t w_offset = -1;
};

// `bytes` of src copied `offset` bytes past a 64-byte boundary inside `storage` (resized, its
// other bytes `fill`): where the copy starts.
inline uint8_t* PlacePastLine(std::vector<uint8_t>& storage, const void* src, size_t bytes,
                              int64_t offset, uint8_t fill) {
  storage.assign(bytes + 256, fill);
  const auto base = reinterpret_cast<uintptr_t>(storage.data());
  uint8_t* at = storage.data() + (64 - base % 64) % 64 + offset;
  std::memcpy(at, src, bytes);
  return at;
}

// [G, A, B] -> [G, B, A] of elem-byte elements.
inline std::vector<uint8_t> SwapLastTwo(const std::vector<uint8_t>& src, int64_t g, int64_t a,
                                        int64_t b, int64_t elem) {
  std::vector<uint8_t> out(src.size());
  for (int64_t e = 0; e < g; ++e) {
    for (int64_t i = 0; i < a; ++i) {
      for (int64_t j = 0; j < b; ++j) {
        std::memcpy(out.data() + ((e * b + j) * a + i) * elem,
                    src.data() + ((e * a + i) * b + j) * elem, static_cast<size_t>(elem));
      }
    }
  }
  return out;
}

struct GmmOutput {
  DType dtype;
  std::vector<uint8_t> bytes;
  double At(int64_t i) const { return LoadAsF32(bytes.data(), i, dtype); }
  int64_t elems() const { return static_cast<int64_t>(bytes.size()) / ElementBytes(dtype); }
};

// The index arguments of a run: expandedRowIdx (or none) and groupList.
struct RoutingArgs {
  std::vector<uint8_t> idx, groups;
  std::unique_ptr<TensorGuard> idx_t, groups_t;
  RoutingArgs(const GmmInputs& in, const GmmOptions& o) {
    groups = IndexBytes(o.group_list_type == GK_GROUP_LIST_CUMSUM ? in.routing.group_cumsum
                                                                  : in.routing.group_counts,
                        o.group_list_dtype);
    groups_t = std::make_unique<TensorGuard>(std::vector<int64_t>{in.c.g}, o.group_list_dtype,
                                             groups.data());
    if (o.row_idx_type >= 0) {
      const auto& values = o.row_idx_type == 1 ? in.routing.scatter_idx : in.routing.gather_idx;
      idx = IndexBytes(values, o.index_dtype);
      idx_t = std::make_unique<TensorGuard>(
          std::vector<int64_t>{static_cast<int64_t>(values.size())}, o.index_dtype, idx.data());
    }
  }
  const gkTensor* expanded_row_idx() const { return idx_t ? idx_t->t : nullptr; }
};

inline const void* XData(const GmmInputs& in, const GmmOptions& o) {
  return o.row_idx_type >= 0 ? in.tokens.data() : in.expanded.data();
}
inline std::vector<int64_t> XDims(const GmmInputs& in, const GmmOptions& o) {
  return {o.row_idx_type >= 0 ? in.c.batch : in.m(), in.c.k};
}

// Runs GroupedMatmul; y starts filled with 0xFF bytes (NaN) so that unwritten elements show.
inline GmmOutput RunGroupedMatmul(const GmmInputs& in, const GmmOptions& o = {}) {
  const GmmCase& c = in.c;
  const int64_t elem = ElementBytes(in.dtype);
  GmmOutput y{o.out_f32 ? DType::kF32 : in.dtype, {}};
  y.bytes.assign(static_cast<size_t>(in.m() * c.n * ElementBytes(y.dtype)), 0xFF);
  std::vector<uint8_t> w_gnk;
  const void* w_data = in.w.data();
  std::vector<int64_t> w_dims{c.g, c.k, c.n}, w_strides;
  bool transpose = false;
  switch (o.weight_form) {
    case WeightForm::kGkn: break;
    case WeightForm::kGknViewOfGnk:
      w_gnk = SwapLastTwo(in.w, c.g, c.k, c.n, elem);
      w_data = w_gnk.data();
      w_strides = {c.k * c.n, 1, c.k};
      break;
    case WeightForm::kGnk:
      w_gnk = SwapLastTwo(in.w, c.g, c.k, c.n, elem);
      w_data = w_gnk.data();
      w_dims = {c.g, c.n, c.k};
      transpose = true;
      break;
    case WeightForm::kGnkViewOfGkn:
      w_dims = {c.g, c.n, c.k};
      w_strides = {c.k * c.n, 1, c.n};
      transpose = true;
      break;
  }
  std::vector<uint8_t> w_placed;
  if (o.w_offset >= 0) w_data = PlacePastLine(w_placed, w_data, in.w.size(), o.w_offset, 0);
  TensorGuard x_t(XDims(in, o), in.dtype, XData(in, o));
  TensorGuard w_t(w_dims, in.dtype, w_data, w_strides);
  const RoutingArgs routing(in, o);
  TensorGuard y_t({in.m(), c.n}, y.dtype, y.bytes.data());
  EXPECT_EQ(gkSetNumThreads(o.threads), GK_SUCCESS);
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  const gkStatus planned = gkGroupedMatmulGetWorkspaceSize(
      x_t.t, w_t.t, routing.groups_t->t, o.group_list_type, transpose, routing.expanded_row_idx(),
      static_cast<gkRowIdxType>(std::max<int64_t>(o.row_idx_type, 0)), c.top_k, y_t.t,
      &workspace_size, &executor);
  EXPECT_EQ(planned, GK_SUCCESS) << gkGetRecentErrMsg();
  if (planned == GK_SUCCESS) {
    std::vector<uint8_t> workspace(workspace_size);
    EXPECT_EQ(gkGroupedMatmul(workspace.data(), workspace_size, executor, nullptr), GK_SUCCESS)
        << gkGetRecentErrMsg();
  }
  gkDestroyExecutor(executor);
  gkSetNumThreads(0);
  return y;
}

// Runs GroupedMatmulWeightGrad; gradWeight starts as NaN bytes. With add_to, runs
// GroupedMatmulWeightGradAdd on a copy of add_to's bytes instead (their dtype is the output's).
inline GmmOutput RunWeightGrad(const GmmInputs& in, const GmmOptions& o = {},
                               const GmmOutput* add_to = nullptr) {
  const GmmCase& c = in.c;
  GmmOutput dw{o.out_f32 ? DType::kF32 : in.dtype, {}};
  dw.bytes.assign(static_cast<size_t>(c.g * c.k * c.n * ElementBytes(dw.dtype)), 0xFF);
  if (add_to != nullptr) dw = *add_to;
  TensorGuard x_t(XDims(in, o), in.dtype, XData(in, o));
  TensorGuard gy_t({in.m(), c.n}, in.dtype, in.gy.data());
  const RoutingArgs routing(in, o);
  // With out_offset: gradWeight inside a larger buffer of 0xA5 guard bytes, copied out after.
  std::vector<uint8_t> placed;
  uint8_t* out = dw.bytes.data();
  if (o.out_offset >= 0) out = PlacePastLine(placed, dw.bytes.data(), dw.bytes.size(), o.out_offset, 0xA5);
  TensorGuard dw_t({c.g, c.k, c.n}, dw.dtype, out);
  EXPECT_EQ(gkSetNumThreads(o.threads), GK_SUCCESS);
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  const auto plan = add_to != nullptr ? gkGroupedMatmulWeightGradAddGetWorkspaceSize
                                      : gkGroupedMatmulWeightGradGetWorkspaceSize;
  const gkStatus planned =
      plan(x_t.t, gy_t.t, routing.groups_t->t, o.group_list_type, routing.expanded_row_idx(),
           static_cast<gkRowIdxType>(std::max<int64_t>(o.row_idx_type, 0)), c.top_k, dw_t.t,
           &workspace_size, &executor);
  EXPECT_EQ(planned, GK_SUCCESS) << gkGetRecentErrMsg();
  if (planned == GK_SUCCESS) {
    std::vector<uint8_t> workspace(workspace_size);
    const auto run = add_to != nullptr ? gkGroupedMatmulWeightGradAdd : gkGroupedMatmulWeightGrad;
    EXPECT_EQ(run(workspace.data(), workspace_size, executor, nullptr), GK_SUCCESS)
        << gkGetRecentErrMsg();
  }
  gkDestroyExecutor(executor);
  gkSetNumThreads(0);
  if (o.out_offset >= 0) {
    std::memcpy(dw.bytes.data(), out, dw.bytes.size());
    for (const uint8_t* b = placed.data(); b < placed.data() + placed.size(); ++b) {
      if (b < out || b >= out + dw.bytes.size()) {
        EXPECT_EQ(*b, 0xA5) << "a byte outside gradWeight was written, " << (b - out) << " from it";
        break;
      }
    }
  }
  return dw;
}

// Compares every element (or every `stride`-th) with the reference: exact (small integers: the
// reference rounded once to the output dtype) or within the contract.
inline ::testing::AssertionResult MatchesRef(const GroupedMatmulRef& ref, const GmmOutput& out,
                                             bool exact, const std::string& what,
                                             int64_t stride = 1) {
  if (out.elems() != static_cast<int64_t>(ref.value.size())) {
    return ::testing::AssertionFailure() << what << ": " << out.elems() << " elements, reference "
                                         << ref.value.size();
  }
  int64_t failures = 0;
  ::testing::AssertionResult result = ::testing::AssertionFailure();
  for (int64_t i = 0; i < out.elems(); i += stride) {
    const double got = out.At(i);
    const double want = ref.value[i];
    const bool ok = exact ? got == RoundToDType(static_cast<float>(want), out.dtype)
                          : GroupedMatmulWithinContract(got, want, ref.magnitude[i], out.dtype);
    if (!ok && failures++ < 5) {
      result << "\n  element " << i << " = " << got << ", reference " << want << " (magnitude "
             << ref.magnitude[i] << ", " << (exact ? "exact" : "contract") << ")";
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return result << "\n  " << failures << " elements outside (" << what << ", "
                << DTypeName(out.dtype) << ")";
}

inline GroupedMatmulRef ForwardRef(const GmmInputs& in) {
  return GroupedMatmulReference(in.token_values.data(), in.w_values.data(), in.c.k, in.c.n,
                                in.routing.row_token, in.routing.row_expert);
}
inline GroupedMatmulRef WeightGradRef(const GmmInputs& in) {
  return GroupedMatmulWeightGradReference(in.token_values.data(), in.gy_values.data(), in.c.g,
                                          in.c.k, in.c.n, in.routing.row_token,
                                          in.routing.row_expert);
}

}  // namespace gk::testing
