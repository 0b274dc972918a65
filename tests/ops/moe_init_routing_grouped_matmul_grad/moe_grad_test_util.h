// Shared by the MoeInitRoutingGroupedMatmulGrad tests: cases in the seed's terms, inputs in any
// dtype (small integers or random values), the operator through its C API, and the comparison
// with the float64 reference under the contract of moe_grad_ref.h.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_ref.h"
#include "tests/ops/op_test_support.h"

namespace gk::testing {

// bfloat16 values from a hash: small (|v| <= 2, three decimals rounded), of both signs, never
// NaN; their products are exact in float32 (8 significant bits each). The tile kernels' tests.
inline std::vector<uint16_t> Bf16Values(int64_t elems, uint32_t seed) {
  std::vector<uint16_t> out(static_cast<size_t>(elems));
  for (int64_t i = 0; i < elems; ++i) {
    const uint32_t h = (static_cast<uint32_t>(i) + seed) * 2654435761u;
    StoreFromF32(out.data(), i, DType::kBF16, static_cast<float>(h % 4001) / 1000.0f - 2.0f);
  }
  return out;
}

struct MoeCase {
  std::string name;
  int64_t batch, top_k, g, k, n;
  double keep = 1.0;   // fraction of slots routed
  double skew = 0.0;   // fraction of slots on expert 0
  std::vector<int64_t> forced_empty = {};
  uint64_t seed = 1;
};

enum class MoeValues { kSmallIntegers, kRandom };

// One case's inputs in one dtype, plus the values the operator sees (rounded) as float.
struct MoeInputs {
  MoeCase c;
  DType dtype;
  MoeGradRouting routing;
  std::vector<uint8_t> dy, w;
  std::vector<float> dy_values, w_values;
};

inline MoeInputs MakeMoeInputs(const MoeCase& c, DType dtype, MoeValues kind) {
  MoeGradRoutingSpec spec;
  spec.batch = c.batch;
  spec.top_k = c.top_k;
  spec.g = c.g;
  spec.keep = c.keep;
  spec.skew = c.skew;
  spec.forced_empty = c.forced_empty;
  spec.seed = c.seed;
  MoeInputs in{c, dtype, MakeMoeGradRouting(spec), {}, {}, {}, {}};
  std::mt19937 generator(static_cast<uint32_t>(c.seed * 7919 + static_cast<int>(dtype)));
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  const auto fill = [&](int64_t elems, std::vector<uint8_t>& bytes, std::vector<float>& values) {
    bytes.resize(static_cast<size_t>(elems * ElementBytes(dtype)));
    values.resize(static_cast<size_t>(elems));
    for (int64_t i = 0; i < elems; ++i) {
      const float v = kind == MoeValues::kSmallIntegers ? static_cast<float>(small(generator))
                                                        : real(generator);
      StoreFromF32(bytes.data(), i, dtype, v);
      values[i] = LoadAsF32(bytes.data(), i, dtype);
    }
  };
  fill(in.routing.m * c.n, in.dy, in.dy_values);
  fill(c.g * c.k * c.n, in.w, in.w_values);
  return in;
}

struct MoeRunOptions {
  int64_t row_idx_type = 0;
  gkGroupListType group_list_type = GK_GROUP_LIST_COUNT;
  DType index_dtype = DType::kI64;       // expandedRowIdx
  DType group_list_dtype = DType::kI64;
  int64_t extra_gather_entries = 0;  // rowIdxType 0: junk entries past M (ignored by the op)
  int32_t threads = 0;               // 0: the configured default
  bool weight_nk = false;            // weight stored [G, N, K], passed as its transposed view
};

inline std::vector<int64_t> ExpandedRowIdx(const MoeInputs& in, const MoeRunOptions& o) {
  if (o.row_idx_type == 1) return in.routing.scatter_idx;
  std::vector<int64_t> idx = in.routing.gather_idx;
  for (int64_t j = 0; j < o.extra_gather_entries; ++j) idx.push_back(j % 2 ? -5 : 1 << 30);
  return idx;
}

// Runs the operator; gradX starts filled with NaN so that unwritten elements show.
inline std::vector<float> RunMoeGrad(const MoeInputs& in, const MoeRunOptions& o = {}) {
  const MoeCase& c = in.c;
  const int64_t m = in.routing.m;
  const auto idx_values = ExpandedRowIdx(in, o);
  const auto idx = IndexBytes(idx_values, o.index_dtype);
  const auto groups = IndexBytes(o.group_list_type == GK_GROUP_LIST_CUMSUM
                                     ? in.routing.group_cumsum
                                     : in.routing.group_counts,
                                 o.group_list_dtype);
  std::vector<float> dx(static_cast<size_t>(c.batch * c.k), std::nanf(""));
  TensorGuard dy_t({m, c.n}, in.dtype, in.dy.data());
  // [G, N, K] storage: the same weights, nn.Linear's layout, seen through a transposed view.
  std::vector<uint8_t> w_nk;
  if (o.weight_nk) {
    const int64_t elem = ElementBytes(in.dtype);
    w_nk.resize(in.w.size());
    for (int64_t e = 0; e < c.g; ++e) {
      for (int64_t k = 0; k < c.k; ++k) {
        for (int64_t n = 0; n < c.n; ++n) {
          std::memcpy(w_nk.data() + ((e * c.n + n) * c.k + k) * elem,
                      in.w.data() + ((e * c.k + k) * c.n + n) * elem, static_cast<size_t>(elem));
        }
      }
    }
  }
  TensorGuard w_t({c.g, c.k, c.n}, in.dtype, o.weight_nk ? w_nk.data() : in.w.data(),
                  o.weight_nk ? std::vector<int64_t>{c.k * c.n, 1, c.k} : std::vector<int64_t>{});
  TensorGuard idx_t({static_cast<int64_t>(idx_values.size())}, o.index_dtype, idx.data());
  TensorGuard groups_t({c.g}, o.group_list_dtype, groups.data());
  TensorGuard dx_t({c.batch, c.k}, DType::kF32, dx.data());
  EXPECT_EQ(gkSetNumThreads(o.threads), GK_SUCCESS);
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  const gkStatus planned = gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
      dy_t.t, w_t.t, idx_t.t, groups_t.t, c.batch, c.top_k,
      static_cast<gkRowIdxType>(o.row_idx_type), o.group_list_type,
      dx_t.t, &workspace_size, &executor);
  EXPECT_EQ(planned, GK_SUCCESS) << gkGetRecentErrMsg();
  if (planned == GK_SUCCESS) {
    std::vector<uint8_t> workspace(workspace_size);
    const gkStatus ran =
        gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), workspace_size, executor, nullptr);
    EXPECT_EQ(ran, GK_SUCCESS) << gkGetRecentErrMsg();
  }
  gkDestroyExecutor(executor);
  gkSetNumThreads(0);
  return dx;
}

// Checks gradX rows against the float64 reference: every token, or every `stride`-th one.
// exact: equality (small-integer inputs); else the 1e-5 x magnitude contract.
inline ::testing::AssertionResult MatchesReference(const MoeInputs& in,
                                                   const std::vector<float>& dx, bool exact,
                                                   int64_t stride = 1) {
  const MoeCase& c = in.c;
  std::vector<std::vector<int64_t>> rows_of_token(static_cast<size_t>(c.batch));
  for (int64_t i = 0; i < in.routing.m; ++i) rows_of_token[in.routing.row_token[i]].push_back(i);
  int64_t failures = 0;
  ::testing::AssertionResult result = ::testing::AssertionFailure();
  for (int64_t b = 0; b < c.batch; b += stride) {
    const auto ref = MoeGradReferenceRow(in.dy_values.data(), in.w_values.data(), c.n, c.k,
                                         rows_of_token[b], in.routing.row_expert);
    for (int64_t k = 0; k < c.k; ++k) {
      const double got = dx[b * c.k + k];
      const bool ok = exact ? got == ref.value[k]
                            : MoeGradWithinContract(got, ref.value[k], ref.magnitude[k]);
      if (!ok && failures++ < 5) {
        result << "\n  gradX[" << b << ", " << k << "] = " << got << ", reference "
               << ref.value[k] << " (magnitude " << ref.magnitude[k] << ", "
               << (exact ? "exact" : "1e-5 x magnitude") << ")";
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return result << "\n  " << failures << " elements outside the contract (" << c.name << ", "
                << DTypeName(in.dtype) << ")";
}

}  // namespace gk::testing
