// EluGradV2 and the shared core under hostile input: every bad argument is an error with a
// message and leaves gradInput untouched; sizes past 64 bits are errors; phase 2 refuses short
// workspaces and misused executors. Also the regression tests of what fuzzing found in core/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/tensor.h"
#include "ops/elu_grad_v2/elu_grad_v2_plan.h"
#include "ops/elu_grad_v2/elu_grad_v2_ref.h"
#include "tests/fuzz/c_caller.h"
#include "tests/reliability/reliability_util.h"

namespace gk::reliability {
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

struct EluAttributes {
  double alpha = 1.0, scale = 1.0, input_scale = 1.0;
  bool is_result = false;
};

gkStatus EluPhase1(const gkTensor* dy, const gkTensor* x, gkTensor* y, Executor* executor,
                   uint64_t* workspace_size, const EluAttributes& a = {}) {
  gkOpExecutor* raw = nullptr;
  const gkStatus status = gkEluGradV2GetWorkspaceSize(dy, x, a.alpha, a.scale, a.input_scale,
                                                      a.is_result, y, workspace_size, &raw);
  executor->reset(raw);
  return status;
}

// A valid float32 [4, 5] problem; each test breaks one thing.
struct EluProblem {
  Bytes dy{20 * 4}, x{20 * 4}, y{20 * 4};
  EluProblem() {
    for (int i = 0; i < 20; ++i) {
      dy.as<float>()[i] = 0.25f * static_cast<float>(i - 7);
      x.as<float>()[i] = 0.5f * static_cast<float>(i - 10);
    }
  }
  Tensor Dy() { return MakeTensor({4, 5}, DType::kF32, dy.data()); }
  Tensor X() { return MakeTensor({4, 5}, DType::kF32, x.data()); }
  Tensor Y() { return MakeTensor({4, 5}, DType::kF32, y.data()); }

  // Phase 1 must fail and write nothing (phase 1 never writes; phase 2 never gets to run).
  ::testing::AssertionResult Refuses(const gkTensor* dy_t, const gkTensor* x_t, gkTensor* y_t,
                                     const EluAttributes& a = {}) {
    const auto before = y.bytes;
    Executor executor;
    uint64_t workspace_size = 0;
    const gkStatus status = EluPhase1(dy_t, x_t, y_t, &executor, &workspace_size, a);
    if (executor != nullptr) return ::testing::AssertionFailure() << "an executor on failure";
    return FailedCleanly(status, before, y.bytes);
  }
};

TEST(EluGradV2Hostile, NullArguments) {
  EluProblem p;
  auto dy = p.Dy(), x = p.X(), y = p.Y();
  EXPECT_TRUE(p.Refuses(nullptr, x.get(), y.get()));
  EXPECT_TRUE(p.Refuses(dy.get(), nullptr, y.get()));
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), nullptr));
  gkOpExecutor* executor = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy.get(), x.get(), 1, 1, 1, false, y.get(), nullptr,
                                        &executor),
            GK_ERROR_NULLPTR);
  EXPECT_EQ(executor, nullptr);
  EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy.get(), x.get(), 1, 1, 1, false, y.get(), &size, nullptr),
            GK_ERROR_NULLPTR);
  // NULL data under a non-empty view.
  auto null_data = MakeTensor({4, 5}, DType::kF32, nullptr);
  EXPECT_TRUE(p.Refuses(null_data.get(), x.get(), y.get()));
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), null_data.get()));
}

TEST(EluGradV2Hostile, DTypesOutsideTheTable) {
  EluProblem p;
  auto x = p.X(), y = p.Y();
  for (DType dtype : {DType::kI32, DType::kI64, DType::kF64}) {
    auto dy = MakeTensor({4, 5}, dtype, p.dy.data());
    EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get())) << DTypeName(dtype);
  }
  auto dy = p.Dy();
  auto y16 = MakeTensor({4, 5}, DType::kF16, p.y.data());  // float32 in, float16 out: no
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y16.get()));
}

TEST(EluGradV2Hostile, RankAboveEight) {
  EluProblem p;
  const std::vector<int64_t> nine(9, 1);
  auto dy = MakeTensor(nine, DType::kF32, p.dy.data());
  auto x = MakeTensor(nine, DType::kF32, p.x.data());
  auto y = MakeTensor(nine, DType::kF32, p.y.data());
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get()));
}

TEST(EluGradV2Hostile, AttributesNotFiniteInFloat32) {
  EluProblem p;
  auto dy = p.Dy(), x = p.X(), y = p.Y();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf, 1e39, -1e39, std::numeric_limits<double>::max()}) {
    EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get(), {bad, 1, 1, false})) << bad;
    EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get(), {1, bad, 1, false})) << bad;
    EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get(), {1, 1, bad, false})) << bad;
  }
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get(), {-0.5, 1, 1, true}));  // isResult, alpha < 0
}

TEST(EluGradV2Hostile, OutputThatOverlapsItselfOrPartOfAnInput) {
  EluProblem p;
  auto dy = p.Dy(), x = p.X();
  auto self_overlap = MakeTensor({4, 5}, DType::kF32, p.y.data(), {0, 1});
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), self_overlap.get()));
  auto shifted = MakeTensor({4, 5}, DType::kF32, p.dy.data(), {}, 1);  // dy's bytes, one over
  const auto before = p.dy.bytes;
  Executor executor;
  uint64_t size = 0;
  EXPECT_TRUE(FailedCleanly(EluPhase1(dy.get(), x.get(), shifted.get(), &executor, &size), before,
                            p.dy.bytes));
}

// ---- 64-bit overflow ---------------------------------------------------------------------

TEST(Overflow64, EluElementCountPast2To63IsAnError) {
  EluProblem p;
  auto dy = MakeTensor({int64_t{1} << 32, int64_t{1} << 32}, DType::kF32, p.dy.data(), {0, 0});
  auto x = MakeTensor({int64_t{1} << 32, int64_t{1} << 32}, DType::kF32, p.x.data(), {0, 0});
  auto y = MakeTensor({int64_t{1} << 32, int64_t{1} << 32}, DType::kF32, p.y.data(), {0, 0});
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get()));
  // gkCreateTensor computes contiguous strides and refuses what does not fit.
  const int64_t dims[] = {int64_t{1} << 32, int64_t{1} << 32};
  EXPECT_EQ(gkCreateTensor(dims, 2, GK_FLOAT, nullptr, 0, p.y.data()), nullptr);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("2^63"), std::string::npos);
}

TEST(Overflow64, EluByteSizePast2To63IsAnError) {
  EluProblem p;
  // 2^62 float32 elements fit in int64; their 2^64 bytes do not.
  const std::vector<int64_t> dims{int64_t{1} << 62};
  auto dy = MakeTensor(dims, DType::kF32, p.dy.data());
  auto x = MakeTensor(dims, DType::kF32, p.x.data());
  auto y = MakeTensor(dims, DType::kF32, p.y.data());
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get()));
  // An offset whose byte position overflows.
  auto far = MakeTensor({4, 5}, DType::kF32, p.y.data(), {}, int64_t{1} << 62);
  auto dy2 = p.Dy(), x2 = p.X();
  EXPECT_TRUE(p.Refuses(dy2.get(), x2.get(), far.get()));
}

TEST(Overflow64, EluViewsPastEitherEndOfTheAddressSpaceAreErrors) {
  EluProblem p;
  auto dy = p.Dy(), x = p.X();
  auto top = MakeTensor({4, 5}, DType::kF32, FakeAddress(UINTPTR_MAX - 15));
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), top.get()));
  // The first element addressed lies 11 elements (44 bytes) below data = 16.
  auto below_zero = MakeTensor({4, 5}, DType::kF32, FakeAddress(16), {-5, 1}, 4);
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), below_zero.get()));
}

// ---- regressions of fuzz findings in src/core and the EluGradV2 plan -----------------------

// Finding 1: gkCreateTensor loaded its gkDataType argument as an enum; a C caller may pass any
// int, and loading an out-of-range enum is undefined in C++ (UBSan: invalid-enum-load).
TEST(CoreRegression, CreateTensorTakesAnyIntAsDType) {
  const int64_t dims[] = {2};
  float data[2] = {};
  for (int32_t dtype : {-1, 2, 28, 1000, std::numeric_limits<int32_t>::min()}) {
    EXPECT_EQ(gkFuzzCreateTensor(dims, 1, dtype, nullptr, 0, data), nullptr) << dtype;
    EXPECT_NE(std::string(gkGetRecentErrMsg()).find("is not a gkDataType"), std::string::npos);
  }
}

// Finding 2: TouchedBytes negated a lowest byte offset of exactly -2^63 (signed overflow).
TEST(CoreRegression, TouchedBytesOfAViewStartingAtMinus2To63Bytes) {
  gkTensor t;
  t.dtype = DType::kF16;
  t.ndims = 1;
  t.dims[0] = 2;
  t.strides[0] = -(int64_t{1} << 62);  // the second element lies 2^63 bytes below the first
  t.data = FakeAddress(4096);
  EXPECT_FALSE(TouchedBytes(t).has_value());
  EluProblem p;
  const int64_t dims[] = {2}, strides[] = {-(int64_t{1} << 62)};
  Tensor dy(gkCreateTensor(dims, 1, GK_FLOAT16, strides, 0, FakeAddress(4096)));
  Tensor x = MakeTensor({2}, DType::kF16, p.x.data());
  Tensor y = MakeTensor({2}, DType::kF16, p.y.data());
  EXPECT_TRUE(p.Refuses(dy.get(), x.get(), y.get()));
}

// ... and computed the end of a view ending at element 2^63 - 1 as high + 1 (signed overflow).
TEST(CoreRegression, TouchedBytesOfAViewEndingAtTheLastInt64Element) {
  gkTensor t;
  t.dtype = DType::kF32;
  t.ndims = 1;
  t.dims[0] = 1;
  t.strides[0] = 1;
  t.offset = kI64Max;
  t.data = FakeAddress(4096);
  EXPECT_FALSE(TouchedBytes(t).has_value());
}

// Finding 3: StridedCursor stepped past the end of a dim before wrapping it, so a size-1 dim
// with stride -2^63 overflowed int64 after the last element.
TEST(CoreRegression, StridedCursorOverASizeOneDimWithStrideMinus2To63) {
  float dy[6], x[6], y[6];
  for (int i = 0; i < 6; ++i) dy[i] = 1.0f + i, x[i] = i % 2 ? 1.0f : -1.0f, y[i] = -7.0f;
  // [1, 3] views, stride 2 along the last dim (strided path), any stride along the size-1 dim.
  Tensor dy_t = MakeTensor({1, 3}, DType::kF32, dy, {kI64Min, 2});
  Tensor x_t = MakeTensor({1, 3}, DType::kF32, x, {kI64Min, 2});
  Tensor y_t = MakeTensor({1, 3}, DType::kF32, y, {kI64Max, 2});
  Executor executor;
  uint64_t size = 0;
  ASSERT_EQ(EluPhase1(dy_t.get(), x_t.get(), y_t.get(), &executor, &size), GK_SUCCESS)
      << gkGetRecentErrMsg();
  std::vector<uint8_t> workspace(size);
  ASSERT_EQ(gkEluGradV2(workspace.data(), size, executor.get(), nullptr), GK_SUCCESS);
  const EluGradV2Coefficients c = FoldEluGradV2Coefficients(1, 1, 1);
  for (int i = 0; i < 6; ++i) {
    if (i % 2) {
      EXPECT_EQ(y[i], -7.0f) << i;  // between the view's elements: untouched
    } else {
      EXPECT_NEAR(y[i], EluGradV2Formula(dy[i], x[i], c, false), 1e-6) << i;
    }
  }
}

// Finding 4: IsContiguous multiplied the dims up without an overflow check; an empty view may
// hold dims whose product past the zero overflows ([0, 5, 2^62]).
TEST(CoreRegression, IsContiguousOfAnEmptyViewWithHugeDims) {
  gkTensor t;
  t.ndims = 3;
  t.dims = {0, 5, int64_t{1} << 62};
  t.strides = {1, int64_t{1} << 62, 1};  // dense strides up to the dim whose product overflows
  EXPECT_FALSE(IsContiguous(t));
  const int64_t dims[] = {0, 5, int64_t{1} << 62}, strides[] = {0, int64_t{1} << 62, 1};
  float dy = 0, x = 0, y = 0;
  Tensor dy_t(gkCreateTensor(dims, 3, GK_FLOAT, strides, 0, &dy));
  Tensor x_t(gkCreateTensor(dims, 3, GK_FLOAT, strides, 0, &x));
  Tensor y_t(gkCreateTensor(dims, 3, GK_FLOAT, strides, 0, &y));
  Executor executor;
  uint64_t size = 1;
  ASSERT_EQ(EluPhase1(dy_t.get(), x_t.get(), y_t.get(), &executor, &size), GK_SUCCESS)
      << gkGetRecentErrMsg();
  EXPECT_EQ(size, 0u);
  EXPECT_EQ(gkEluGradV2(nullptr, 0, executor.get(), nullptr), GK_SUCCESS);
}

// Finding 5: the plan multiplied the element count by the bytes moved per element without an
// overflow check; inputs with zero strides reach 2^61 elements with a few bytes of memory.
TEST(EluGradV2Regression, PlanOfHugeZeroStrideInputsDoesNotOverflow) {
  EluGradV2Problem problem{int64_t{1} << 61, DType::kF16, DType::kF16, false, true,
                           FoldEluGradV2Coefficients(1, 1, 1)};
  const EluGradV2Plan plan = MakeEluGradV2Plan(problem, {4, 48 * 1024, 32 << 20});
  EXPECT_TRUE(plan.streaming_stores);
  EXPECT_EQ(plan.ShareBegin(plan.threads - 1) + plan.last_share_elems, problem.elems);
  problem.elems = kI64Max / 2;  // the most a float16 gradInput can address
  problem.contiguous = false;
  const EluGradV2Plan strided = MakeEluGradV2Plan(problem, {4, 48 * 1024, 32 << 20});
  EXPECT_EQ(strided.ShareBegin(strided.threads - 1) + strided.last_share_elems, problem.elems);
  // The same through the API: phase 1 only (the views are never read).
  const int64_t dims[] = {int64_t{1} << 61}, zero[] = {0};
  Tensor dy(gkCreateTensor(dims, 1, GK_FLOAT16, zero, 0, FakeAddress(4096)));
  Tensor x(gkCreateTensor(dims, 1, GK_FLOAT16, zero, 0, FakeAddress(8192)));
  Tensor y(gkCreateTensor(dims, 1, GK_FLOAT16, nullptr, 0, FakeAddress(uintptr_t{1} << 20)));
  Executor executor;
  uint64_t size = 0;
  EXPECT_EQ(EluPhase1(dy.get(), x.get(), y.get(), &executor, &size), GK_SUCCESS)
      << gkGetRecentErrMsg();
}

// ---- phase 2: workspace and executor misuse -------------------------------------------------

TEST(EluGradV2Phase2, WorkspaceShorterThanAskedOrNullIsAnError) {
  EluProblem p;
  auto dy = MakeTensor({4, 5}, DType::kF32, p.dy.data(), {1, 4});  // strided: needs a workspace
  auto x = p.X(), y = p.Y();
  Executor executor;
  uint64_t size = 0;
  ASSERT_EQ(EluPhase1(dy.get(), x.get(), y.get(), &executor, &size), GK_SUCCESS);
  ASSERT_GT(size, 0u);
  std::vector<uint8_t> workspace(size);
  const auto before = p.y.bytes;
  EXPECT_TRUE(FailedCleanly(gkEluGradV2(workspace.data(), size - 1, executor.get(), nullptr),
                            before, p.y.bytes));
  EXPECT_TRUE(FailedCleanly(gkEluGradV2(workspace.data(), 0, executor.get(), nullptr), before,
                            p.y.bytes));
  EXPECT_TRUE(FailedCleanly(gkEluGradV2(nullptr, size, executor.get(), nullptr), before, p.y.bytes));
  // The refusals did not use up the executor.
  EXPECT_EQ(gkEluGradV2(workspace.data(), size, executor.get(), nullptr), GK_SUCCESS);
}

TEST(ExecutorMisuse, EluGradV2RunTwiceNullOrOtherOperator) {
  EluProblem p;
  auto dy = p.Dy(), x = p.X(), y = p.Y();
  Executor executor;
  uint64_t size = 0;
  ASSERT_EQ(EluPhase1(dy.get(), x.get(), y.get(), &executor, &size), GK_SUCCESS);
  std::vector<uint8_t> workspace(size + 1);
  auto before = p.y.bytes;
  EXPECT_TRUE(FailedCleanly(gkEluGradV2(workspace.data(), size, nullptr, nullptr), before, p.y.bytes));
  EXPECT_TRUE(FailedCleanly(
      gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr), before,
      p.y.bytes));
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("planned for EluGradV2"), std::string::npos);
  ASSERT_EQ(gkEluGradV2(workspace.data(), size, executor.get(), nullptr), GK_SUCCESS);
  before = p.y.bytes;
  p.dy.as<float>()[0] = 1000.0f;  // a second run would change the output
  EXPECT_TRUE(FailedCleanly(gkEluGradV2(workspace.data(), size, executor.get(), nullptr), before,
                            p.y.bytes));
  EXPECT_EQ(gkSetExecutorRepeatable(nullptr), GK_ERROR_NULLPTR);
  EXPECT_EQ(gkDestroyExecutor(nullptr), GK_SUCCESS);
}

}  // namespace
}  // namespace gk::reliability
