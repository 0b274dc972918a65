// MoeFinalizeRouting and MoeFinalizeRoutingGrad through their C API: against the float64
// reference over routings (capacity drops, empty experts, every slot dropped), dtypes, index
// types; every error (outputs untouched); thread counts; and the chain from MoeInitRouting.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ops/moe_finalize_routing/moe_finalize_routing_ref.h"
#include "ops/moe_init_routing/moe_init_routing_ref.h"
#include "tests/ops/moe_init_routing/moe_routing_test_util.h"

namespace gk::testing {
namespace {

constexpr uint8_t kSentinel = 0xAB;

struct FinOptions {
  DType dtype = DType::kF32;        // expandedY
  DType probs_dtype = DType::kF32;
  DType token_dtype = DType::kF32;  // out / gradOut
  DType grad_y_dtype = DType::kF32;
  DType grad_probs_dtype = DType::kF32;
  DType index_dtype = DType::kI64;
  int32_t row_idx_type = 0;
  int64_t extra_gather = 0;  // rowIdxType 0: -1 entries past M (MoeInitRouting's padding)
  int32_t threads = 0;
};

struct FinProblem {
  RoutingSpec spec;
  int64_t n;
  MoeInitRoutingRef routing;
  FloatData y, probs, grad_out;
};

FinProblem MakeFinProblem(const RoutingSpec& spec, int64_t capacity, int64_t n,
                          const FinOptions& o, Values values) {
  const auto routing = MoeInitRoutingReference(MakeExpertIdx(spec), spec.g, capacity);
  const Values probs_values = values == Values::kRandom ? Values::kRandom : Values::kQuarters;
  return {spec,
          n,
          routing,
          MakeFloatData(routing.m * n, o.dtype, values, spec.seed),
          MakeFloatData(spec.batch * spec.top_k, o.probs_dtype, probs_values, spec.seed + 1),
          MakeFloatData(spec.batch * n, o.token_dtype, values, spec.seed + 2)};
}

std::vector<int64_t> RowIdx(const FinProblem& pb, const FinOptions& o) {
  if (o.row_idx_type == 1) return pb.routing.slot_row;
  std::vector<int64_t> idx = pb.routing.row_slot;
  idx.insert(idx.end(), static_cast<size_t>(o.extra_gather), -1);
  return idx;
}

gkRowIdxType RowIdxTypeBits(int32_t value) {
  gkRowIdxType type;
  std::memcpy(&type, &value, sizeof type);
  return type;
}

struct FinResult {
  gkStatus planned = GK_SUCCESS, ran = GK_SUCCESS;
  std::string message;
  std::vector<uint8_t> out, grad_y, grad_probs;
};

FinResult RunForward(const FinProblem& pb, const FinOptions& o,
                     std::vector<int64_t> idx_values = {}) {
  const RoutingSpec& s = pb.spec;
  if (idx_values.empty()) idx_values = RowIdx(pb, o);
  const auto idx = IndexBytes(idx_values, o.index_dtype);
  FinResult r;
  r.out.assign(static_cast<size_t>(s.batch * pb.n * ElementBytes(o.token_dtype)), kSentinel);
  TensorGuard y_t({pb.routing.m, pb.n}, o.dtype, pb.y.bytes.data());
  TensorGuard p_t({s.batch, s.top_k}, o.probs_dtype, pb.probs.bytes.data());
  TensorGuard i_t({static_cast<int64_t>(idx_values.size())}, o.index_dtype, idx.data());
  TensorGuard out_t({s.batch, pb.n}, o.token_dtype, r.out.data());
  ThreadsScope threads(o.threads);
  uint64_t ws = 0;
  gkOpExecutor* executor = nullptr;
  r.planned = gkMoeFinalizeRoutingGetWorkspaceSize(y_t.t, p_t.t, i_t.t,
                                                   RowIdxTypeBits(o.row_idx_type), out_t.t, &ws,
                                                   &executor);
  r.message = gkGetRecentErrMsg();
  if (r.planned == GK_SUCCESS) {
    r.ran = RunPlanned(executor, ws, gkMoeFinalizeRouting);
    if (r.ran != GK_SUCCESS) r.message = gkGetRecentErrMsg();
  }
  gkDestroyExecutor(executor);
  return r;
}

FinResult RunBackward(const FinProblem& pb, const FinOptions& o,
                      std::vector<int64_t> idx_values = {}) {
  const RoutingSpec& s = pb.spec;
  if (idx_values.empty()) idx_values = RowIdx(pb, o);
  const auto idx = IndexBytes(idx_values, o.index_dtype);
  FinResult r;
  r.grad_y.assign(static_cast<size_t>(pb.routing.m * pb.n * ElementBytes(o.grad_y_dtype)),
                  kSentinel);
  r.grad_probs.assign(static_cast<size_t>(s.batch * s.top_k * ElementBytes(o.grad_probs_dtype)),
                      kSentinel);
  TensorGuard go_t({s.batch, pb.n}, o.token_dtype, pb.grad_out.bytes.data());
  TensorGuard y_t({pb.routing.m, pb.n}, o.dtype, pb.y.bytes.data());
  TensorGuard p_t({s.batch, s.top_k}, o.probs_dtype, pb.probs.bytes.data());
  TensorGuard i_t({static_cast<int64_t>(idx_values.size())}, o.index_dtype, idx.data());
  TensorGuard gy_t({pb.routing.m, pb.n}, o.grad_y_dtype, r.grad_y.data());
  TensorGuard gp_t({s.batch, s.top_k}, o.grad_probs_dtype, r.grad_probs.data());
  ThreadsScope threads(o.threads);
  uint64_t ws = 0;
  gkOpExecutor* executor = nullptr;
  r.planned = gkMoeFinalizeRoutingGradGetWorkspaceSize(go_t.t, y_t.t, p_t.t, i_t.t,
                                                       RowIdxTypeBits(o.row_idx_type), gy_t.t,
                                                       gp_t.t, &ws, &executor);
  r.message = gkGetRecentErrMsg();
  if (r.planned == GK_SUCCESS) {
    r.ran = RunPlanned(executor, ws, gkMoeFinalizeRoutingGrad);
    if (r.ran != GK_SUCCESS) r.message = gkGetRecentErrMsg();
  }
  gkDestroyExecutor(executor);
  return r;
}

// exact: the reference (exact in float32) rounded once to the output dtype; else the contract
// of moe_finalize_routing_ref.h plus, for 16-bit outputs, their one rounding.
::testing::AssertionResult Matches(const std::vector<uint8_t>& bytes, DType dtype,
                                   const std::vector<MoeFinalizeRefValue>& ref, bool exact,
                                   const std::string& what) {
  // The 16-bit output's rounding: half an ulp relative, or absolute below float16's normals.
  const double dtype_eps = dtype == DType::kBF16 ? 0x1p-8 : dtype == DType::kF16 ? 0x1p-11 : 0.0;
  const double dtype_floor = dtype == DType::kF16 ? 0x1p-25 : 0.0;
  int64_t failures = 0;
  auto result = ::testing::AssertionFailure();
  for (size_t e = 0; e < ref.size(); ++e) {
    const double got = LoadAsF32(bytes.data(), static_cast<int64_t>(e), dtype);
    const bool ok =
        exact ? got == RoundToDType(static_cast<float>(ref[e].value), dtype)
              : std::fabs(got - ref[e].value) <= kMoeFinalizeRelativeTolerance * ref[e].magnitude +
                                                      dtype_eps * std::fabs(ref[e].value) +
                                                      dtype_floor;
    if (!ok && failures++ < 5) {
      result << "\n  " << what << "[" << e << "] = " << got << ", reference " << ref[e].value
             << " (magnitude " << ref[e].magnitude << ")";
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return result << "\n  " << failures << " of " << ref.size() << " " << what << " elements off";
}

::testing::AssertionResult ForwardMatches(const FinProblem& pb, const FinOptions& o,
                                          const FinResult& r, bool exact) {
  if (r.planned != GK_SUCCESS || r.ran != GK_SUCCESS) {
    return ::testing::AssertionFailure() << "failed: " << r.message;
  }
  const auto ref = MoeFinalizeReference(pb.y.values, pb.probs.values, pb.routing.slot_row,
                                        pb.spec.batch, pb.spec.top_k, pb.n);
  return Matches(r.out, o.token_dtype, ref, exact, "out");
}

::testing::AssertionResult BackwardMatches(const FinProblem& pb, const FinOptions& o,
                                           const FinResult& r, bool exact) {
  if (r.planned != GK_SUCCESS || r.ran != GK_SUCCESS) {
    return ::testing::AssertionFailure() << "failed: " << r.message;
  }
  const auto ref = MoeFinalizeGradReference(pb.grad_out.values, pb.y.values, pb.probs.values,
                                            pb.routing.slot_row, pb.routing.m, pb.spec.batch,
                                            pb.spec.top_k, pb.n);
  auto y = Matches(r.grad_y, o.grad_y_dtype, ref.grad_y, exact, "gradExpandedY");
  if (!y) return y;
  return Matches(r.grad_probs, o.grad_probs_dtype, ref.grad_probs, exact, "gradProbs");
}

struct NamedSpec {
  std::string name;
  RoutingSpec spec;
  int64_t n;
};

std::vector<NamedSpec> Specs() {
  std::vector<NamedSpec> specs = {
      {"tiny", {1, 1, 1, 0.0, {}, 1}, 1},
      {"uniform_topk2", {37, 2, 5, 0.0, {}, 3}, 19},
      {"skewed_topk4", {64, 4, 8, 0.7, {}, 4}, 33},
      {"one_expert_all", {40, 3, 6, 1.0, {}, 5}, 8},
      {"empty_experts", {50, 2, 9, 0.0, {0, 3, 8}, 6}, 16},
      {"topk8_wide", {23, 8, 16, 0.2, {5}, 7}, 130},
  };
  for (int64_t k = 1; k <= 8; ++k) {
    specs.push_back({"topk" + std::to_string(k), {19, k, 7, 0.3, {2}, static_cast<uint64_t>(10 + k)}, 21});
  }
  return specs;
}

TEST(moe_finalize_routing, MatchesReferenceExactly) {
  for (const auto& [name, spec, n] : Specs()) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (bool f32_side : {false, true}) {  // probs and outputs in float32, or in the dtype
        for (int32_t row_idx_type : {0, 1}) {
          for (int64_t capacity : {int64_t{0}, int64_t{2}}) {
            FinOptions o;
            o.dtype = dtype;
            const DType side = f32_side ? DType::kF32 : dtype;
            o.probs_dtype = o.token_dtype = o.grad_y_dtype = o.grad_probs_dtype = side;
            o.index_dtype = row_idx_type == 0 ? DType::kI32 : DType::kI64;
            o.row_idx_type = row_idx_type;
            o.extra_gather = capacity;
            const FinProblem pb = MakeFinProblem(spec, capacity, n, o, Values::kSmallIntegers);
            const std::string where = name + " " + std::string(DTypeName(dtype)) + " side " +
                                      std::string(DTypeName(side)) + " rowIdxType " +
                                      std::to_string(row_idx_type) + " capacity " +
                                      std::to_string(capacity);
            EXPECT_TRUE(ForwardMatches(pb, o, RunForward(pb, o), true)) << where;
            EXPECT_TRUE(BackwardMatches(pb, o, RunBackward(pb, o), true)) << where;
          }
        }
      }
    }
  }
}

TEST(moe_finalize_routing, RandomValuesWithinTheContract) {
  for (const auto& [name, spec, n] : Specs()) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (DType side : {DType::kF32, dtype}) {
        FinOptions o;
        o.dtype = dtype;
        o.probs_dtype = o.token_dtype = o.grad_y_dtype = o.grad_probs_dtype = side;
        o.row_idx_type = 1;
        const FinProblem pb = MakeFinProblem(spec, 3, n, o, Values::kRandom);
        EXPECT_TRUE(ForwardMatches(pb, o, RunForward(pb, o), false)) << name;
        EXPECT_TRUE(BackwardMatches(pb, o, RunBackward(pb, o), false)) << name;
      }
    }
  }
}

TEST(moe_finalize_routing, MixedOutputDTypes) {
  FinOptions o;
  o.dtype = DType::kBF16;
  o.probs_dtype = DType::kF32;
  o.token_dtype = DType::kBF16;
  o.grad_y_dtype = DType::kF32;
  o.grad_probs_dtype = DType::kF32;
  const FinProblem pb = MakeFinProblem({33, 3, 4, 0.1, {}, 81}, 0, 17, o, Values::kSmallIntegers);
  EXPECT_TRUE(ForwardMatches(pb, o, RunForward(pb, o), true));
  EXPECT_TRUE(BackwardMatches(pb, o, RunBackward(pb, o), true));
}

TEST(moe_finalize_routing, EverySlotDroppedGivesZeros) {
  // M = 0: a [0, N] expandedY, a scatter index of -1 only.
  FinOptions o;
  o.row_idx_type = 1;
  FinProblem pb = MakeFinProblem({5, 2, 3, 0.0, {}, 91}, 0, 4, o, Values::kSmallIntegers);
  pb.routing.m = 0;
  pb.routing.row_slot.clear();
  std::fill(pb.routing.slot_row.begin(), pb.routing.slot_row.end(), -1);
  pb.y.bytes.clear();
  pb.y.values.clear();
  const FinResult f = RunForward(pb, o);
  ASSERT_EQ(f.ran, GK_SUCCESS) << f.message;
  for (float v : ToFloats(f.out, DType::kF32)) EXPECT_EQ(v, 0.0f);
  const FinResult b = RunBackward(pb, o);
  ASSERT_EQ(b.ran, GK_SUCCESS) << b.message;
  for (float v : ToFloats(b.grad_probs, DType::kF32)) EXPECT_EQ(v, 0.0f);
}

TEST(moe_finalize_routing, SameBytesForOneToFourThreads) {
  FinOptions o;
  o.dtype = DType::kBF16;
  o.token_dtype = o.grad_y_dtype = DType::kBF16;
  o.row_idx_type = 0;
  const FinProblem pb = MakeFinProblem({1500, 4, 16, 0.3, {3}, 101}, 500, 200, o, Values::kRandom);
  o.threads = 1;
  const FinResult f1 = RunForward(pb, o), b1 = RunBackward(pb, o);
  ASSERT_TRUE(ForwardMatches(pb, o, f1, false));
  ASSERT_TRUE(BackwardMatches(pb, o, b1, false));
  for (int32_t threads : {2, 3, 4}) {
    o.threads = threads;
    EXPECT_EQ(RunForward(pb, o).out, f1.out) << threads << " threads";
    const FinResult b = RunBackward(pb, o);
    EXPECT_EQ(b.grad_y, b1.grad_y) << threads << " threads";
    EXPECT_EQ(b.grad_probs, b1.grad_probs) << threads << " threads";
  }
}

// ---- errors: status, message, and outputs untouched ----------------------------------------

struct ErrorCase {
  std::string name;
  std::string expected;
  std::function<void(FinOptions&)> options;           // before the problem is made
  std::function<void(std::vector<int64_t>&)> index;  // on the valid index of those options
};

void ExpectUntouched(const std::vector<uint8_t>& bytes, const std::string& name) {
  for (uint8_t byte : bytes) {
    if (byte != kSentinel) {
      ADD_FAILURE() << name << ": an output was written";
      return;
    }
  }
}

TEST(moe_finalize_routing, IndexErrorsNameArgumentValueAndRule) {
  // 4 tokens x topK 2 over 3 experts, no drops: M = 8.
  const auto gather = [](FinOptions&) {};
  const auto scatter = [](FinOptions& o) { o.row_idx_type = 1; };
  const auto keep = [](std::vector<int64_t>&) {};
  const std::vector<ErrorCase> cases = {
      {"gather slot out of range", "expandedRowIdx[3] is 8, it must be an original slot in [0, 8)",
       gather, [](auto& idx) { idx[3] = 8; }},
      {"gather duplicate slot", "a slot already named by an earlier row", gather,
       [](auto& idx) { idx[5] = idx[2]; }},
      {"scatter row out of range", "expandedRowIdx[1] is 8, it must be an expanded row in [0, 8)",
       scatter, [](auto& idx) { idx[1] = 8; }},
      {"scatter duplicate row", "a row already named by an earlier slot", scatter,
       [](auto& idx) { idx[4] = idx[0]; }},
      {"scatter row missing", "expandedRowIdx names 7 of the M = 8 expanded rows", scatter,
       [](auto& idx) { idx[2] = -1; }},
      {"rowIdxType", "rowIdxType is 7", [](FinOptions& o) { o.row_idx_type = 7; }, keep},
      {"short gather", "expandedRowIdx has 7 entries, fewer than M = 8", gather,
       [](auto& idx) { idx.pop_back(); }},
      {"long scatter", "rowIdxType 1 needs one per slot", scatter,
       [](auto& idx) { idx.push_back(-1); }},
      {"probs dtype", "probs has dtype bfloat16; it must be float32 or expandedY's dtype, float16",
       [](FinOptions& o) {
         o.dtype = DType::kF16;
         o.probs_dtype = DType::kBF16;
       },
       keep},
      {"out dtype", "dtype float16; it must be float32 or expandedY's dtype, bfloat16",
       [](FinOptions& o) {
         o.dtype = DType::kBF16;
         o.token_dtype = o.grad_y_dtype = DType::kF16;
       },
       keep},
  };
  for (const auto& c : cases) {
    FinOptions o;
    c.options(o);
    const FinProblem pb = MakeFinProblem({4, 2, 3, 0.0, {}, 111}, 0, 5, o, Values::kSmallIntegers);
    std::vector<int64_t> idx = o.row_idx_type == 1 ? pb.routing.slot_row : pb.routing.row_slot;
    c.index(idx);
    const FinResult f = RunForward(pb, o, idx);
    EXPECT_EQ(f.planned, GK_ERROR_PARAM_INVALID) << c.name;
    EXPECT_NE(f.message.find(c.expected), std::string::npos) << c.name << ": " << f.message;
    EXPECT_NE(f.message.find("gkMoeFinalizeRoutingGetWorkspaceSize: "), std::string::npos);
    ExpectUntouched(f.out, c.name);
    const FinResult b = RunBackward(pb, o, idx);
    EXPECT_EQ(b.planned, GK_ERROR_PARAM_INVALID) << c.name;
    EXPECT_NE(b.message.find(c.expected), std::string::npos) << c.name << ": " << b.message;
    ExpectUntouched(b.grad_y, c.name);
    ExpectUntouched(b.grad_probs, c.name);
  }
}

TEST(moe_finalize_routing, RowIdxTypeMixUpGetsTheFusedOpsHint) {
  // 2 tokens x topK 2, slots 1 and 3 dropped: M = 2. The scatter index [0, -1, 1, -1] declared
  // as gather fits the sizes (L = 4 >= M) but not the values.
  std::vector<float> y(2 * 3, 1.0f), probs(4, 1.0f), out(2 * 3, 7.0f);
  std::vector<int64_t> idx = {0, -1, 1, -1};
  TensorGuard y_t({2, 3}, DType::kF32, y.data());
  TensorGuard p_t({2, 2}, DType::kF32, probs.data());
  TensorGuard i_t({4}, DType::kI64, idx.data());
  TensorGuard out_t({2, 3}, DType::kF32, out.data());
  uint64_t ws = 0;
  gkOpExecutor* executor = nullptr;
  EXPECT_EQ(gkMoeFinalizeRoutingGetWorkspaceSize(y_t.t, p_t.t, i_t.t, GK_ROW_IDX_GATHER, out_t.t,
                                                 &ws, &executor),
            GK_ERROR_PARAM_INVALID);
  const std::string message = gkGetRecentErrMsg();
  EXPECT_NE(message.find("expandedRowIdx[1] is -1, it must be an original slot in [0, 4)"),
            std::string::npos) << message;
  EXPECT_NE(message.find("(the values form a valid scatter index: is it rowIdxType 1?)"),
            std::string::npos) << message;
  for (float v : out) EXPECT_EQ(v, 7.0f);
}

TEST(moe_finalize_routing, ShapeErrorsNameArgumentValueAndRule) {
  const int64_t batch = 4, top_k = 2, n = 3, m = 8;
  std::vector<float> y(m * n, 1.0f), probs(batch * top_k, 1.0f), go(batch * n, 1.0f);
  std::vector<float> out(batch * (n + 1), 7.0f), gy(m * n, 7.0f), gp(batch * top_k, 7.0f);
  std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5, 6, 7};
  TensorGuard y_t({m, n}, DType::kF32, y.data());
  TensorGuard p_t({batch, top_k}, DType::kF32, probs.data());
  TensorGuard go_t({batch, n}, DType::kF32, go.data());
  TensorGuard i_t({m}, DType::kI64, idx.data());
  TensorGuard gy_t({m, n}, DType::kF32, gy.data());
  TensorGuard gp_t({batch, top_k}, DType::kF32, gp.data());
  uint64_t ws = 0;
  gkOpExecutor* executor = nullptr;
  const auto forward = [&](gkTensor* out_t) {
    EXPECT_EQ(gkMoeFinalizeRoutingGetWorkspaceSize(y_t.t, p_t.t, i_t.t, GK_ROW_IDX_GATHER, out_t,
                                                   &ws, &executor),
              out_t ? GK_ERROR_PARAM_INVALID : GK_ERROR_NULLPTR);
    EXPECT_EQ(executor, nullptr);
    return std::string(gkGetRecentErrMsg());
  };
  const auto backward = [&](const gkTensor* go_arg, const gkTensor* y_arg, gkTensor* gy_arg,
                            gkTensor* gp_arg) {
    EXPECT_NE(gkMoeFinalizeRoutingGradGetWorkspaceSize(go_arg, y_arg, p_t.t, i_t.t,
                                                       GK_ROW_IDX_GATHER, gy_arg, gp_arg, &ws,
                                                       &executor),
              GK_SUCCESS);
    EXPECT_EQ(executor, nullptr);
    return std::string(gkGetRecentErrMsg());
  };
  {
    TensorGuard bad({batch, n + 1}, DType::kF32, out.data());
    const auto msg = forward(bad.t);
    EXPECT_NE(msg.find("out has shape [4, 4]: dim 1 is 4, it must be 3 (N, expandedY.shape[1])"),
              std::string::npos) << msg;
  }
  {
    TensorGuard bad({batch - 1, n}, DType::kF32, out.data());
    const auto msg = forward(bad.t);
    EXPECT_NE(msg.find("out has shape [3, 3]: dim 0 is 3, it must be 4 (batch"),
              std::string::npos) << msg;
  }
  {
    const auto msg = forward(nullptr);
    EXPECT_NE(msg.find("out is NULL"), std::string::npos) << msg;
  }
  {
    TensorGuard alias({batch, n}, DType::kF32, y.data());
    const auto msg = forward(alias.t);
    EXPECT_NE(msg.find("out overlaps expandedY"), std::string::npos) << msg;
  }
  {
    TensorGuard bad({batch, n + 1}, DType::kF32, go.data());
    const auto msg = backward(bad.t, y_t.t, gy_t.t, gp_t.t);
    EXPECT_NE(msg.find("gradOut has shape [4, 4]: dim 1 is 4, it must be 3"), std::string::npos)
        << msg;
  }
  {
    TensorGuard bad({batch, top_k + 1}, DType::kF32, gp.data());
    const auto msg = backward(go_t.t, y_t.t, gy_t.t, bad.t);
    EXPECT_NE(msg.find("gradProbs has shape [4, 3] but probs has shape [4, 2]"),
              std::string::npos) << msg;
  }
  {
    TensorGuard overlap({batch, top_k}, DType::kF32, gy.data());
    const auto msg = backward(go_t.t, y_t.t, gy_t.t, overlap.t);
    EXPECT_NE(msg.find("gradExpandedY overlaps gradProbs"), std::string::npos) << msg;
  }
  {
    TensorGuard small({m - 1, n}, DType::kF32, gy.data());
    const auto msg = backward(go_t.t, y_t.t, small.t, gp_t.t);
    EXPECT_NE(msg.find("gradExpandedY has shape [7, 3] but expandedY has shape [8, 3]"),
              std::string::npos) << msg;
  }
  {
    const auto msg = backward(go_t.t, y_t.t, gy_t.t, nullptr);
    EXPECT_NE(msg.find("gradProbs is NULL"), std::string::npos) << msg;
  }
  for (float v : out) ASSERT_EQ(v, 7.0f);
  for (float v : gy) ASSERT_EQ(v, 7.0f);
  for (float v : gp) ASSERT_EQ(v, 7.0f);
}

// Phase 1 reads only expandedRowIdx: its memory follows what it reads, not batch * topK as
// probs' descriptor claims (the fuzzer found a 48 GiB table made from such a claim). probs and
// out here claim 2^32 slots over address space that is reserved, never backed.
TEST(moe_finalize_routing, PhaseOneMemoryFollowsTheIndexNotTheClaimedSlots) {
  const int64_t batch = int64_t{1} << 30, top_k = 4, n = 1, m = 4;
  const size_t reserved = size_t{48} << 30;
  void* space = mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(space, MAP_FAILED);
  char* base = static_cast<char*>(space);
  std::vector<float> y(m * n, 1.0f);
  std::vector<int64_t> idx = {5, 0, int64_t{1} << 31, 7};  // gather: distinct slots
  TensorGuard y_t({m, n}, DType::kF32, y.data());
  TensorGuard p_t({batch, top_k}, DType::kF32, base);                   // 16 GiB claimed
  TensorGuard o_t({batch, n}, DType::kF32, base + (size_t{32} << 30));  // 4 GiB claimed
  TensorGuard i_t({m}, DType::kI64, idx.data());
  uint64_t ws = 0;
  gkOpExecutor* executor = nullptr;
  EXPECT_EQ(gkMoeFinalizeRoutingGetWorkspaceSize(y_t.t, p_t.t, i_t.t, GK_ROW_IDX_GATHER, o_t.t,
                                                 &ws, &executor),
            GK_SUCCESS)
      << gkGetRecentErrMsg();
  EXPECT_GE(ws, uint64_t{8} << 32);  // phase 2's slot table: the caller's workspace, not ours
  gkDestroyExecutor(executor);
  munmap(space, reserved);
}

TEST(moe_finalize_routing, RepeatableExecutorChecksTheIndexAgain) {
  FinOptions o;
  o.row_idx_type = 1;
  const FinProblem pb = MakeFinProblem({6, 2, 3, 0.0, {}, 121}, 0, 4, o, Values::kSmallIntegers);
  std::vector<int64_t> idx = pb.routing.slot_row;
  std::vector<float> out(6 * 4, 7.0f);
  TensorGuard y_t({pb.routing.m, 4}, DType::kF32, pb.y.bytes.data());
  TensorGuard p_t({6, 2}, DType::kF32, pb.probs.bytes.data());
  TensorGuard i_t({12}, DType::kI64, idx.data());
  TensorGuard out_t({6, 4}, DType::kF32, out.data());
  uint64_t ws = 0;
  gkOpExecutor* executor = nullptr;
  ASSERT_EQ(gkMoeFinalizeRoutingGetWorkspaceSize(y_t.t, p_t.t, i_t.t, GK_ROW_IDX_SCATTER, out_t.t,
                                                 &ws, &executor),
            GK_SUCCESS);
  ASSERT_EQ(gkSetExecutorRepeatable(executor), GK_SUCCESS);
  std::vector<uint8_t> workspace(ws);
  ASSERT_EQ(gkMoeFinalizeRouting(workspace.data(), ws, executor, nullptr), GK_SUCCESS);
  idx[3] = idx[2];
  std::fill(out.begin(), out.end(), 7.0f);
  EXPECT_EQ(gkMoeFinalizeRouting(workspace.data(), ws, executor, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("gkMoeFinalizeRouting: expandedRowIdx[3]"),
            std::string::npos) << gkGetRecentErrMsg();
  for (float v : out) EXPECT_EQ(v, 7.0f);
  // An executor of one op is refused by the other's phase 2.
  EXPECT_EQ(gkMoeFinalizeRoutingGrad(workspace.data(), ws, executor, nullptr),
            GK_ERROR_PARAM_INVALID);
  gkDestroyExecutor(executor);
}

// ---- the chain: MoeInitRouting -> (expert = identity) -> MoeFinalizeRouting ---------------

TEST(moe_finalize_routing, ChainFromMoeInitRouting) {
  const int64_t batch = 30, top_k = 3, g = 5, h = 12, capacity = 10;
  for (int32_t row_idx_type : {0, 1}) {
    const RoutingSpec spec{batch, top_k, g, 0.5, {}, 131};
    const auto experts = MakeExpertIdx(spec);
    const FloatData x = MakeFloatData(batch * h, DType::kF32, Values::kSmallIntegers, 132);
    const FloatData probs = MakeFloatData(batch * top_k, DType::kF32, Values::kQuarters, 133);
    const int64_t rows = std::min(batch * top_k, g * capacity);
    const int64_t idx_len = row_idx_type == 0 ? rows : batch * top_k;
    std::vector<float> ex(static_cast<size_t>(rows * h));
    std::vector<int64_t> idx(static_cast<size_t>(idx_len)), groups(g);
    TensorGuard x_t({batch, h}, DType::kF32, x.bytes.data());
    TensorGuard e_t({batch, top_k}, DType::kI64, experts.data());
    TensorGuard ex_t({rows, h}, DType::kF32, ex.data());
    TensorGuard i_t({idx_len}, DType::kI64, idx.data());
    TensorGuard g_t({g}, DType::kI64, groups.data());
    uint64_t ws = 0;
    gkOpExecutor* executor = nullptr;
    ASSERT_EQ(gkMoeInitRoutingGetWorkspaceSize(x_t.t, e_t.t, capacity, g, GK_GROUP_LIST_CUMSUM,
                                               RowIdxTypeBits(row_idx_type), ex_t.t, i_t.t,
                                               g_t.t, &ws, &executor),
              GK_SUCCESS) << gkGetRecentErrMsg();
    ASSERT_EQ(RunPlanned(executor, ws, gkMoeInitRouting), GK_SUCCESS);
    gkDestroyExecutor(executor);
    const int64_t m = groups.back();
    std::vector<float> out(static_cast<size_t>(batch * h), std::nanf(""));
    TensorGuard y_t({m, h}, DType::kF32, ex.data());  // the first M rows of expandedX
    TensorGuard p_t({batch, top_k}, DType::kF32, probs.bytes.data());
    TensorGuard out_t({batch, h}, DType::kF32, out.data());
    ASSERT_EQ(gkMoeFinalizeRoutingGetWorkspaceSize(y_t.t, p_t.t, i_t.t,
                                                   RowIdxTypeBits(row_idx_type), out_t.t, &ws,
                                                   &executor),
              GK_SUCCESS) << gkGetRecentErrMsg();
    ASSERT_EQ(RunPlanned(executor, ws, gkMoeFinalizeRouting), GK_SUCCESS);
    gkDestroyExecutor(executor);
    // out[b] = (sum of probs[b, j] over kept slots) * x[b], in float64.
    const auto ref = MoeInitRoutingReference(experts, g, capacity);
    for (int64_t b = 0; b < batch; ++b) {
      double weight = 0;
      for (int64_t j = 0; j < top_k; ++j) {
        if (ref.slot_row[b * top_k + j] >= 0) weight += probs.values[b * top_k + j];
      }
      for (int64_t c = 0; c < h; ++c) {
        ASSERT_EQ(out[b * h + c], weight * x.values[b * h + c]) << "token " << b;
      }
    }
  }
}

}  // namespace
}  // namespace gk::testing
