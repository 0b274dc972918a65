// One whole MoE layer through the C API, forward and backward, against one float64 reference of
// the layer written out plainly below (no autograd, no operator's own reference):
//
//   forward:  MoeInitRouting -> GroupedMatmul (W1) -> [GroupedMatmul (W2), optional] ->
//             MoeFinalizeRouting
//   backward: MoeFinalizeRoutingGrad -> [GroupedMatmulWeightGrad (dW2) and GroupedMatmul with
//             transposeWeight (dh), when W2 is there] -> MoeInitRoutingGroupedMatmulGrad (dx) and
//             GroupedMatmulWeightGrad (dW1)
//
// The activation between the two expert matmuls is the identity. Intermediates stay in the
// dtype, as a model keeps them; probs, gradProbs, dx and the weight gradients are float32.
// Also checked: the gather-fused GroupedMatmul and weight gradient (the token matrix read through
// expandedRowIdx) give the plain path's bits on MoeInitRouting's expandedX, and every result is
// the same bytes for 1 to 4 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "tests/ops/op_test_support.h"

namespace gk::testing {
namespace {

struct LayerCase {
  std::string name;
  int64_t batch, top_k, g, h, f, n;  // n = 0: one expert matmul (the layer's output is [batch, F])
  int64_t capacity = 0;
  double skew = 0.0;                 // fraction of slots sent to expert 0
  std::vector<int64_t> empty = {};   // experts no slot chooses
  int64_t only_expert = -1;          // >= 0: every slot chooses it
  uint64_t seed = 1;
};

struct LayerOptions {
  DType dtype = DType::kF32;
  gkRowIdxType row_idx_type = GK_ROW_IDX_GATHER;
  gkGroupListType group_list_type = GK_GROUP_LIST_COUNT;
  DType row_idx_dtype = DType::kI64;
  bool small_integers = false;  // exact arithmetic: results must equal the reference exactly
  int32_t threads = 0;
};

// The layer's inputs, as the operators see them (rounded to their dtypes) and as bytes.
struct LayerInputs {
  LayerCase c;
  LayerOptions o;
  std::vector<int64_t> experts;                          // [batch, topK]
  std::vector<float> x, w1, w2, probs, grad_out;         // dtype-rounded values
  std::vector<uint8_t> x_bytes, w1_bytes, w2_bytes, grad_out_bytes;
  int64_t out_cols() const { return c.n > 0 ? c.n : c.f; }
};

LayerInputs MakeInputs(const LayerCase& c, const LayerOptions& o) {
  LayerInputs in{c, o, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 generator(c.seed);
  std::uniform_int_distribution<int64_t> expert(0, c.g - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  in.experts.resize(static_cast<size_t>(c.batch * c.top_k));
  for (auto& e : in.experts) {
    if (c.only_expert >= 0) {
      e = c.only_expert;
    } else if (unit(generator) < c.skew) {
      e = 0;
    } else {
      do e = expert(generator);
      while (std::find(c.empty.begin(), c.empty.end(), e) != c.empty.end());
    }
  }
  const auto fill = [&](int64_t elems, DType dtype, std::vector<float>& values,
                        std::vector<uint8_t>* bytes, bool probabilities) {
    values.resize(static_cast<size_t>(elems));
    std::vector<uint8_t> local(static_cast<size_t>(elems * ElementBytes(dtype)));
    for (int64_t i = 0; i < elems; ++i) {
      float v = static_cast<float>(unit(generator) * 2.0 - 1.0);
      if (o.small_integers) {
        v = probabilities ? static_cast<float>(static_cast<int>(unit(generator) * 5)) * 0.25f
                          : static_cast<float>(static_cast<int>(unit(generator) * 7) - 3);
      }
      StoreFromF32(local.data(), i, dtype, v);
      values[i] = LoadAsF32(local.data(), i, dtype);
    }
    if (bytes != nullptr) *bytes = std::move(local);
  };
  fill(c.batch * c.h, o.dtype, in.x, &in.x_bytes, false);
  fill(c.g * c.h * c.f, o.dtype, in.w1, &in.w1_bytes, false);
  if (c.n > 0) fill(c.g * c.f * c.n, o.dtype, in.w2, &in.w2_bytes, false);
  fill(c.batch * c.top_k, DType::kF32, in.probs, nullptr, true);
  fill(c.batch * in.out_cols(), o.dtype, in.grad_out, &in.grad_out_bytes, false);
  return in;
}

// ---- The float64 reference of the whole layer ----------------------------------------------

// Every result with the same formula over absolute values beside it (the error bound's scale).
struct Ref {
  std::vector<double> out, grad_probs, dx, dw1, dw2;
  std::vector<double> out_mag, grad_probs_mag, dx_mag, dw1_mag, dw2_mag;
  int64_t m = 0;  // kept slots
};

Ref LayerReference(const LayerInputs& in) {
  const LayerCase& c = in.c;
  const int64_t slots = c.batch * c.top_k, cols = in.out_cols();
  Ref r;
  r.out.assign(static_cast<size_t>(c.batch * cols), 0.0);
  r.grad_probs.assign(static_cast<size_t>(slots), 0.0);
  r.dx.assign(static_cast<size_t>(c.batch * c.h), 0.0);
  r.dw1.assign(static_cast<size_t>(c.g * c.h * c.f), 0.0);
  r.dw2.assign(static_cast<size_t>(c.g * c.f * c.n), 0.0);
  r.out_mag = r.out, r.grad_probs_mag = r.grad_probs, r.dx_mag = r.dx;
  r.dw1_mag = r.dw1, r.dw2_mag = r.dw2;
  // Capacity: each expert keeps its first C slots in slot order.
  std::vector<int64_t> taken(static_cast<size_t>(c.g), 0);
  for (int64_t p = 0; p < slots; ++p) {
    const int64_t e = in.experts[p], b = p / c.top_k;
    if (c.capacity > 0 && taken[e] == c.capacity) continue;
    ++taken[e];
    ++r.m;
    const double prob = in.probs[p];
    // Forward: h = x[b] @ W1[e], y = h @ W2[e] (or h), out[b] += prob * y.
    std::vector<double> h(static_cast<size_t>(c.f)), h_mag(h.size());
    for (int64_t j = 0; j < c.f; ++j) {
      for (int64_t k = 0; k < c.h; ++k) {
        const double term = static_cast<double>(in.x[b * c.h + k]) * in.w1[(e * c.h + k) * c.f + j];
        h[j] += term;
        h_mag[j] += std::fabs(term);
      }
    }
    std::vector<double> y = h, y_mag = h_mag;
    if (c.n > 0) {
      y.assign(static_cast<size_t>(c.n), 0.0);
      y_mag = y;
      for (int64_t j = 0; j < c.n; ++j) {
        for (int64_t q = 0; q < c.f; ++q) {
          const double w = in.w2[(e * c.f + q) * c.n + j];
          y[j] += h[q] * w;
          y_mag[j] += h_mag[q] * std::fabs(w);
        }
      }
    }
    // Backward: d_probs = gradOut[b] . y; d_y = prob * gradOut[b].
    std::vector<double> dy(static_cast<size_t>(cols)), dy_mag(dy.size());
    for (int64_t j = 0; j < cols; ++j) {
      const double go = in.grad_out[b * cols + j];
      r.out[b * cols + j] += prob * y[j];
      r.out_mag[b * cols + j] += std::fabs(prob) * y_mag[j];
      r.grad_probs[p] += go * y[j];
      r.grad_probs_mag[p] += std::fabs(go) * y_mag[j];
      dy[j] = prob * go;
      dy_mag[j] = std::fabs(dy[j]);
    }
    // Through W2: d_W2[e] += h^T d_y, d_h = d_y @ W2[e]^T.
    std::vector<double> dh = dy, dh_mag = dy_mag;
    if (c.n > 0) {
      dh.assign(static_cast<size_t>(c.f), 0.0);
      dh_mag = dh;
      for (int64_t q = 0; q < c.f; ++q) {
        for (int64_t j = 0; j < c.n; ++j) {
          const double w = in.w2[(e * c.f + q) * c.n + j];
          r.dw2[(e * c.f + q) * c.n + j] += h[q] * dy[j];
          r.dw2_mag[(e * c.f + q) * c.n + j] += h_mag[q] * dy_mag[j];
          dh[q] += dy[j] * w;
          dh_mag[q] += dy_mag[j] * std::fabs(w);
        }
      }
    }
    // Through W1: d_W1[e] += x[b]^T d_h, d_x[b] += d_h @ W1[e]^T.
    for (int64_t k = 0; k < c.h; ++k) {
      const double xv = in.x[b * c.h + k];
      for (int64_t q = 0; q < c.f; ++q) {
        const double w = in.w1[(e * c.h + k) * c.f + q];
        r.dw1[(e * c.h + k) * c.f + q] += xv * dh[q];
        r.dw1_mag[(e * c.h + k) * c.f + q] += std::fabs(xv) * dh_mag[q];
        r.dx[b * c.h + k] += dh[q] * w;
        r.dx_mag[b * c.h + k] += dh_mag[q] * std::fabs(w);
      }
    }
  }
  return r;
}

// ---- The layer through the C API ---------------------------------------------------------

struct LayerResult {
  int64_t m = 0;
  std::vector<uint8_t> out, grad_probs, dx, dw1, dw2;  // out in the dtype, the rest float32
  std::vector<uint8_t> h_plain, h_gather, dw1_gather;  // the two ways of reading x
};

// Phase 2 after phase 1 (called in the argument list: executor and ws are read after it, hence
// by reference); failures are test failures.
template <typename Run>
void Complete(const char* what, gkStatus planned, gkOpExecutor*& executor, const uint64_t& ws,
              Run run) {
  EXPECT_EQ(planned, GK_SUCCESS) << what << ": " << gkGetRecentErrMsg();
  if (planned == GK_SUCCESS) {
    EXPECT_EQ(RunPlanned(executor, ws, run), GK_SUCCESS) << what << ": " << gkGetRecentErrMsg();
  }
  gkDestroyExecutor(executor);
  executor = nullptr;
}

std::vector<uint8_t> Filled(int64_t elems, DType dtype) {
  return std::vector<uint8_t>(static_cast<size_t>(elems * ElementBytes(dtype)), 0xFF);  // NaN
}

LayerResult RunLayer(const LayerInputs& in) {
  const LayerCase& c = in.c;
  const LayerOptions& o = in.o;
  const DType dt = o.dtype;
  const int64_t slots = c.batch * c.top_k, cols = in.out_cols();
  const int64_t rows = c.capacity > 0 ? std::min(slots, c.g * c.capacity) : slots;  // Rmax
  const int64_t idx_len = o.row_idx_type == GK_ROW_IDX_GATHER ? rows : slots;
  ThreadsScope threads(o.threads);
  LayerResult r;
  uint64_t ws = 0;
  gkOpExecutor* ex = nullptr;

  // Routing.
  const auto experts = IndexBytes(in.experts, DType::kI64);
  auto expanded_x = Filled(rows * c.h, dt);
  auto row_idx = Filled(idx_len, o.row_idx_dtype);
  auto groups = Filled(c.g, DType::kI64);
  TensorGuard x_t({c.batch, c.h}, dt, in.x_bytes.data());
  TensorGuard experts_t({c.batch, c.top_k}, DType::kI64, experts.data());
  TensorGuard ex_t({rows, c.h}, dt, expanded_x.data());
  TensorGuard idx_t({idx_len}, o.row_idx_dtype, row_idx.data());
  TensorGuard groups_t({c.g}, DType::kI64, groups.data());
  Complete("MoeInitRouting",
           gkMoeInitRoutingGetWorkspaceSize(x_t.t, experts_t.t, c.capacity, c.g,
                                            o.group_list_type, o.row_idx_type, ex_t.t, idx_t.t,
                                            groups_t.t, &ws, &ex),
           ex, ws, gkMoeInitRouting);
  const auto counts = IndexValues(groups, DType::kI64);
  r.m = o.group_list_type == GK_GROUP_LIST_CUMSUM ? counts.back() : 0;
  if (o.group_list_type == GK_GROUP_LIST_COUNT) {
    for (int64_t n : counts) r.m += n;
  }
  const int64_t m = r.m;

  // Expert matmul 1, both ways: expandedX's first M rows, and the token matrix gathered.
  TensorGuard w1_t({c.g, c.h, c.f}, dt, in.w1_bytes.data());
  TensorGuard xm_t({m, c.h}, dt, expanded_x.data());
  r.h_plain = Filled(m * c.f, dt);
  r.h_gather = Filled(m * c.f, dt);
  TensorGuard h_t({m, c.f}, dt, r.h_plain.data());
  TensorGuard hg_t({m, c.f}, dt, r.h_gather.data());
  Complete("GroupedMatmul W1",
           gkGroupedMatmulGetWorkspaceSize(xm_t.t, w1_t.t, groups_t.t, o.group_list_type, false,
                                           nullptr, o.row_idx_type, c.top_k, h_t.t, &ws, &ex),
           ex, ws, gkGroupedMatmul);
  Complete("GroupedMatmul W1 gather-fused",
           gkGroupedMatmulGetWorkspaceSize(x_t.t, w1_t.t, groups_t.t, o.group_list_type, false,
                                           idx_t.t, o.row_idx_type, c.top_k, hg_t.t, &ws, &ex),
           ex, ws, gkGroupedMatmul);

  // Expert matmul 2 (identity activation in between).
  std::vector<uint8_t> y = r.h_plain;
  TensorGuard w2_t({c.g, c.f, std::max<int64_t>(c.n, 1)}, dt, in.w2_bytes.data());
  if (c.n > 0) {
    y = Filled(m * c.n, dt);
    TensorGuard y_t({m, c.n}, dt, y.data());
    Complete("GroupedMatmul W2",
             gkGroupedMatmulGetWorkspaceSize(h_t.t, w2_t.t, groups_t.t, o.group_list_type, false,
                                             nullptr, o.row_idx_type, c.top_k, y_t.t, &ws, &ex),
             ex, ws, gkGroupedMatmul);
  }
  TensorGuard y_t({m, cols}, dt, y.data());

  // Finalize and its gradient.
  TensorGuard probs_t({c.batch, c.top_k}, DType::kF32, in.probs.data());
  r.out = Filled(c.batch * cols, dt);
  TensorGuard out_t({c.batch, cols}, dt, r.out.data());
  Complete("MoeFinalizeRouting",
           gkMoeFinalizeRoutingGetWorkspaceSize(y_t.t, probs_t.t, idx_t.t, o.row_idx_type,
                                                out_t.t, &ws, &ex),
           ex, ws, gkMoeFinalizeRouting);
  TensorGuard grad_out_t({c.batch, cols}, dt, in.grad_out_bytes.data());
  auto dy = Filled(m * cols, dt);
  r.grad_probs = Filled(slots, DType::kF32);
  TensorGuard dy_t({m, cols}, dt, dy.data());
  TensorGuard dp_t({c.batch, c.top_k}, DType::kF32, r.grad_probs.data());
  Complete("MoeFinalizeRoutingGrad",
           gkMoeFinalizeRoutingGradGetWorkspaceSize(grad_out_t.t, y_t.t, probs_t.t, idx_t.t,
                                                    o.row_idx_type, dy_t.t, dp_t.t, &ws, &ex),
           ex, ws, gkMoeFinalizeRoutingGrad);

  // Through W2: dW2 = h^T dy per expert; dh = dy @ W2^T (W2 [G, F, N] read as [G, N', K']).
  std::vector<uint8_t> dh = dy;
  if (c.n > 0) {
    r.dw2 = Filled(c.g * c.f * c.n, DType::kF32);
    TensorGuard dw2_t({c.g, c.f, c.n}, DType::kF32, r.dw2.data());
    Complete("GroupedMatmulWeightGrad W2",
             gkGroupedMatmulWeightGradGetWorkspaceSize(h_t.t, dy_t.t, groups_t.t,
                                                       o.group_list_type, nullptr,
                                                       o.row_idx_type, c.top_k, dw2_t.t, &ws, &ex),
             ex, ws, gkGroupedMatmulWeightGrad);
    dh = Filled(m * c.f, dt);
    TensorGuard dh_t({m, c.f}, dt, dh.data());
    Complete("GroupedMatmul dh (transposeWeight)",
             gkGroupedMatmulGetWorkspaceSize(dy_t.t, w2_t.t, groups_t.t, o.group_list_type, true,
                                             nullptr, o.row_idx_type, c.top_k, dh_t.t, &ws, &ex),
             ex, ws, gkGroupedMatmul);
  }
  TensorGuard dh_t({m, c.f}, dt, dh.data());

  // Through W1: dx by the fused operator; dW1 both ways.
  r.dx = Filled(c.batch * c.h, DType::kF32);
  TensorGuard dx_t({c.batch, c.h}, DType::kF32, r.dx.data());
  Complete("MoeInitRoutingGroupedMatmulGrad",
           gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(dh_t.t, w1_t.t, idx_t.t, groups_t.t,
                                                             c.batch, c.top_k, o.row_idx_type,
                                                             o.group_list_type, dx_t.t, &ws, &ex),
           ex, ws, gkMoeInitRoutingGroupedMatmulGrad);
  r.dw1 = Filled(c.g * c.h * c.f, DType::kF32);
  r.dw1_gather = r.dw1;
  TensorGuard dw1_t({c.g, c.h, c.f}, DType::kF32, r.dw1.data());
  TensorGuard dw1g_t({c.g, c.h, c.f}, DType::kF32, r.dw1_gather.data());
  Complete("GroupedMatmulWeightGrad W1",
           gkGroupedMatmulWeightGradGetWorkspaceSize(xm_t.t, dh_t.t, groups_t.t,
                                                     o.group_list_type, nullptr, o.row_idx_type,
                                                     c.top_k, dw1_t.t, &ws, &ex),
           ex, ws, gkGroupedMatmulWeightGrad);
  Complete("GroupedMatmulWeightGrad W1 gather-fused",
           gkGroupedMatmulWeightGradGetWorkspaceSize(x_t.t, dh_t.t, groups_t.t,
                                                     o.group_list_type, idx_t.t, o.row_idx_type,
                                                     c.top_k, dw1g_t.t, &ws, &ex),
           ex, ws, gkGroupedMatmulWeightGrad);
  return r;
}

// ---- Comparison --------------------------------------------------------------------------

// Unit roundoff of a dtype (half its epsilon).
double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// A first-order forward error bound of the chain, relative to the magnitude (the formula over
// absolute values): each intermediate rounded to the dtype (h, y, dy, dh, the dtype outputs: at
// most 5 roundings on any path) and the float32 sums, whose lengths add up to at most
// H + F + N + topK + the kept slots (the weight gradients sum over rows). Twice that, for
// the second-order terms.
double RelativeBound(const LayerInputs& in, int64_t m) {
  const LayerCase& c = in.c;
  const double sums = static_cast<double>(c.h + c.f + c.n + c.top_k + m);
  return 2.0 * (5.0 * UnitRoundoff(in.o.dtype) + sums * std::ldexp(1.0, -24));
}

::testing::AssertionResult Matches(const char* what, const std::vector<uint8_t>& got_bytes,
                                   DType dtype, const std::vector<double>& want,
                                   const std::vector<double>& magnitude, double relative,
                                   bool exact) {
  const int64_t elems = static_cast<int64_t>(got_bytes.size()) / ElementBytes(dtype);
  if (elems != static_cast<int64_t>(want.size())) {
    return ::testing::AssertionFailure() << what << ": " << elems << " elements, reference "
                                         << want.size();
  }
  int64_t failures = 0;
  ::testing::AssertionResult result = ::testing::AssertionFailure();
  for (int64_t i = 0; i < elems; ++i) {
    const double got = LoadAsF32(got_bytes.data(), i, dtype);
    const double bound = exact ? 0.0 : relative * magnitude[i];
    if (!(std::fabs(got - want[i]) <= bound) && failures++ < 5) {
      result << "\n  " << what << "[" << i << "] = " << got << ", reference " << want[i]
             << " (magnitude " << magnitude[i] << ", bound " << bound << ")";
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return result << "\n  " << failures << " of " << elems << " elements of " << what
                << " outside the bound";
}

std::string Describe(const LayerCase& c, const LayerOptions& o) {
  return c.name + " " + std::string(DTypeName(o.dtype)) + " rowIdxType " +
         std::to_string(static_cast<int>(o.row_idx_type)) + " (" +
         std::string(DTypeName(o.row_idx_dtype)) + ") groupListType " +
         std::to_string(static_cast<int>(o.group_list_type)) +
         (o.small_integers ? " small integers" : " random");
}

void CheckLayer(const LayerCase& c, const LayerOptions& o) {
  SCOPED_TRACE(Describe(c, o));
  const LayerInputs in = MakeInputs(c, o);
  const Ref ref = LayerReference(in);
  const LayerResult r = RunLayer(in);
  ASSERT_EQ(r.m, ref.m) << "kept slots (the routing's M)";
  EXPECT_EQ(r.h_gather, r.h_plain) << "gather-fused GroupedMatmul differs from the plain one";
  EXPECT_EQ(r.dw1_gather, r.dw1) << "gather-fused weight gradient differs from the plain one";
  const double rel = RelativeBound(in, r.m);
  const bool exact = o.small_integers;
  EXPECT_TRUE(Matches("out", r.out, o.dtype, ref.out, ref.out_mag, rel, exact));
  EXPECT_TRUE(Matches("gradProbs", r.grad_probs, DType::kF32, ref.grad_probs,
                      ref.grad_probs_mag, rel, exact));
  EXPECT_TRUE(Matches("dx", r.dx, DType::kF32, ref.dx, ref.dx_mag, rel, exact));
  EXPECT_TRUE(Matches("dW1", r.dw1, DType::kF32, ref.dw1, ref.dw1_mag, rel, exact));
  if (c.n > 0) {
    EXPECT_TRUE(Matches("dW2", r.dw2, DType::kF32, ref.dw2, ref.dw2_mag, rel, exact));
  }
}

const std::vector<LayerCase>& Cases() {
  static const std::vector<LayerCase> cases = {
      {"uniform", 12, 2, 4, 8, 16, 8},
      {"one matmul", 9, 2, 3, 8, 8, 0},
      {"empty experts", 10, 2, 6, 8, 8, 6, 0, 0.0, {1, 4, 5}},
      {"one expert holds every row", 7, 3, 4, 8, 12, 4, 0, 0.0, {}, 2},
      {"skewed", 16, 2, 5, 8, 8, 8, 0, 0.8},
      {"topK 1", 11, 1, 4, 8, 8, 8},
      {"topK 3", 6, 3, 4, 12, 8, 4},
      {"topK 5", 5, 5, 8, 8, 8, 8},
      {"topK 8", 4, 8, 8, 8, 16, 8},
      {"capacity drops", 16, 2, 4, 8, 8, 8, 3, 0.5},
      {"capacity drops, one matmul", 12, 4, 3, 8, 8, 0, 2},
      {"capacity above every count", 6, 2, 4, 8, 8, 8, 100},
      {"odd sizes", 13, 3, 5, 17, 19, 23, 5, 0.3, {3}},
      {"tile-sized", 40, 2, 4, 64, 48, 32, 0, 0.4, {}, -1, 7},
  };
  return cases;
}

TEST(moe_layer, chain_matches_float64_reference_fp32_exact) {
  // Small integers and quarter probabilities: every operation is exact in float32, so each
  // result equals the reference exactly, for every index and group-list form.
  for (const LayerCase& c : Cases()) {
    for (const gkRowIdxType rit : {GK_ROW_IDX_GATHER, GK_ROW_IDX_SCATTER}) {
      for (const gkGroupListType glt : {GK_GROUP_LIST_COUNT, GK_GROUP_LIST_CUMSUM}) {
        LayerOptions o;
        o.row_idx_type = rit;
        o.group_list_type = glt;
        o.row_idx_dtype = glt == GK_GROUP_LIST_COUNT ? DType::kI64 : DType::kI32;
        o.small_integers = true;
        CheckLayer(c, o);
      }
    }
  }
}

TEST(moe_layer, chain_matches_float64_reference_every_dtype) {
  int variant = 0;
  for (const LayerCase& c : Cases()) {
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      LayerOptions o;
      o.dtype = dtype;
      o.row_idx_type = variant % 2 ? GK_ROW_IDX_SCATTER : GK_ROW_IDX_GATHER;
      o.group_list_type = (variant / 2) % 2 ? GK_GROUP_LIST_CUMSUM : GK_GROUP_LIST_COUNT;
      o.row_idx_dtype = (variant / 3) % 2 ? DType::kI32 : DType::kI64;
      ++variant;
      CheckLayer(c, o);
    }
  }
}

TEST(moe_layer, same_bytes_for_one_to_four_threads) {
  for (const LayerCase& c : {Cases()[4], Cases()[9], Cases().back()}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      LayerOptions o;
      o.dtype = dtype;
      o.row_idx_type = GK_ROW_IDX_SCATTER;
      o.threads = 1;
      const LayerInputs in = MakeInputs(c, o);
      const LayerResult one = RunLayer(in);
      for (int32_t threads = 2; threads <= 4; ++threads) {
        LayerInputs again = in;
        again.o.threads = threads;
        const LayerResult r = RunLayer(again);
        SCOPED_TRACE(Describe(c, o) + ", " + std::to_string(threads) + " threads");
        EXPECT_EQ(r.out, one.out);
        EXPECT_EQ(r.grad_probs, one.grad_probs);
        EXPECT_EQ(r.dx, one.dx);
        EXPECT_EQ(r.dw1, one.dw1);
        EXPECT_EQ(r.dw2, one.dw2);
        EXPECT_EQ(r.h_gather, one.h_gather);
        EXPECT_EQ(r.dw1_gather, one.dw1_gather);
      }
    }
  }
}

}  // namespace
}  // namespace gk::testing
