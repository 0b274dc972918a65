// Every check of phase 1: the status, a message naming the argument, the value and the rule,
// and the output left untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "tests/ops/elu_grad_v2/elu_grad_v2_test_util.h"

namespace gk::testing {
namespace {

class EluGradV2CheckTest : public ::testing::Test {
 protected:
  static constexpr int64_t kElems = 64;
  Buffer dy_ = RandomBuffer(DType::kF32, kElems, -1, 1, 1);
  Buffer x_ = RandomBuffer(DType::kF32, kElems, -1, 1, 2);
  Buffer y_ = Buffer(DType::kF32, 4 * kElems);
  std::vector<uint8_t> y_before_;

  void SetUp() override {
    for (int64_t i = 0; i < 4 * kElems; ++i) y_.set(i, -7.0f);
    y_before_ = y_.bytes;
  }

  // Phase 1 must fail with `status` and a message containing every needle; y stays untouched.
  void ExpectRejected(const gkTensor* dy, const gkTensor* x, gkTensor* y, const EluGradV2Call& call,
                      gkStatus status, std::initializer_list<const char*> needles) {
    uint64_t workspace_size = 99;
    gkOpExecutor* executor = reinterpret_cast<gkOpExecutor*>(0x1);
    EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy, x, call.alpha, call.scale, call.input_scale,
                                          call.is_result, y, &workspace_size, &executor),
              status);
    EXPECT_EQ(executor, nullptr);
    const std::string message = gkGetRecentErrMsg();
    EXPECT_EQ(message.rfind("gkEluGradV2GetWorkspaceSize: ", 0), 0u) << message;
    for (const char* needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << "'" << needle << "' not in: " << message;
    }
    EXPECT_EQ(y_.bytes, y_before_);
  }
};

TEST_F(EluGradV2CheckTest, NullPointers) {
  auto dy = MakeTensor({kElems}, DType::kF32, dy_.data());
  auto x = MakeTensor({kElems}, DType::kF32, x_.data());
  auto y = MakeTensor({kElems}, DType::kF32, y_.data());
  ExpectRejected(nullptr, x.get(), y.get(), {}, GK_ERROR_NULLPTR, {"gradOutput is NULL"});
  ExpectRejected(dy.get(), nullptr, y.get(), {}, GK_ERROR_NULLPTR, {"x is NULL"});
  ExpectRejected(dy.get(), x.get(), nullptr, {}, GK_ERROR_NULLPTR, {"gradInput is NULL"});
  gkOpExecutor* executor = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy.get(), x.get(), 1, 1, 1, false, y.get(), nullptr,
                                        &executor),
            GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("workspaceSize is NULL"), std::string::npos);
  EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy.get(), x.get(), 1, 1, 1, false, y.get(), &size, nullptr),
            GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("executor is NULL"), std::string::npos);
  auto no_data = MakeTensor({kElems}, DType::kF32, nullptr);
  ExpectRejected(no_data.get(), x.get(), y.get(), {}, GK_ERROR_NULLPTR,
                 {"gradOutput data is NULL", "64 elements"});
}

TEST_F(EluGradV2CheckTest, DTypes) {
  auto dy = MakeTensor({kElems}, DType::kF32, dy_.data());
  auto x = MakeTensor({kElems}, DType::kF32, x_.data());
  auto y = MakeTensor({kElems}, DType::kF32, y_.data());
  auto dy_int = MakeTensor({kElems}, DType::kI32, dy_.data());
  auto x_int = MakeTensor({kElems}, DType::kI32, x_.data());
  ExpectRejected(dy_int.get(), x_int.get(), y.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradOutput has dtype int32", "supported: float32, float16, bfloat16"});
  auto x_half = MakeTensor({kElems}, DType::kF16, x_.data());
  ExpectRejected(dy.get(), x_half.get(), y.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"x has dtype float16 but gradOutput has dtype float32"});
  auto y_half = MakeTensor({kElems}, DType::kF16, y_.data());
  ExpectRejected(dy.get(), x.get(), y_half.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradInput has dtype float16 for float32 inputs"});
  auto dy_bf = MakeTensor({kElems}, DType::kBF16, dy_.data());
  auto x_bf = MakeTensor({kElems}, DType::kBF16, x_.data());
  ExpectRejected(dy_bf.get(), x_bf.get(), y_half.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradInput has dtype float16 for bfloat16 inputs", "bfloat16 or float32"});
}

TEST_F(EluGradV2CheckTest, ShapesAndRank) {
  auto dy = MakeTensor({8, 8}, DType::kF32, dy_.data());
  auto x = MakeTensor({8, 8}, DType::kF32, x_.data());
  auto x_other = MakeTensor({64}, DType::kF32, x_.data());
  auto y = MakeTensor({8, 8}, DType::kF32, y_.data());
  auto y_other = MakeTensor({4, 16}, DType::kF32, y_.data());
  ExpectRejected(dy.get(), x_other.get(), y.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"x has shape [64] but gradOutput has shape [8, 8]"});
  ExpectRejected(dy.get(), x.get(), y_other.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradInput has shape [4, 16]"});
  const std::vector<int64_t> nine(9, 1);
  auto dy9 = MakeTensor(nine, DType::kF32, dy_.data());
  auto x9 = MakeTensor(nine, DType::kF32, x_.data());
  auto y9 = MakeTensor(nine, DType::kF32, y_.data());
  ExpectRejected(dy9.get(), x9.get(), y9.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradOutput has 9 dims", "at most 8"});
}

TEST_F(EluGradV2CheckTest, Attributes) {
  auto dy = MakeTensor({kElems}, DType::kF32, dy_.data());
  auto x = MakeTensor({kElems}, DType::kF32, x_.data());
  auto y = MakeTensor({kElems}, DType::kF32, y_.data());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  ExpectRejected(dy.get(), x.get(), y.get(), {nan, 1, 1, false}, GK_ERROR_PARAM_INVALID,
                 {"alpha is nan", "finite in float32"});
  ExpectRejected(dy.get(), x.get(), y.get(), {1, inf, 1, false}, GK_ERROR_PARAM_INVALID,
                 {"scale is inf"});
  ExpectRejected(dy.get(), x.get(), y.get(), {1, 1, 1e300, false}, GK_ERROR_PARAM_INVALID,
                 {"inputScale is 1e+300"});
  ExpectRejected(dy.get(), x.get(), y.get(), {-0.5, 1, 1, true}, GK_ERROR_PARAM_INVALID,
                 {"alpha is -0.5 with isResult true", "negative slope which is not supported"});
  // A negative alpha is fine when x is the forward's input.
  EXPECT_EQ(RunEluGradV2(dy.get(), x.get(), y.get(), {-0.5, 1, 1, false}), GK_SUCCESS);
}

TEST_F(EluGradV2CheckTest, OutputOverlap) {
  auto dy = MakeTensor({8, 8}, DType::kF32, dy_.data());
  auto x = MakeTensor({8, 8}, DType::kF32, x_.data());
  auto y_broadcast = MakeTensor({8, 8}, DType::kF32, y_.data(), {0, 1});
  ExpectRejected(dy.get(), x.get(), y_broadcast.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradInput with shape [8, 8] and strides [0, 1] addresses some elements twice"});
  auto y_shifted = MakeTensor({8, 8}, DType::kF32, dy_.data(), {}, 1);  // overlaps dy off by one
  ExpectRejected(dy.get(), x.get(), y_shifted.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradInput overlaps gradOutput without being the same view"});
  auto y_transposed = MakeTensor({8, 8}, DType::kF32, x_.data(), {1, 8});
  ExpectRejected(dy.get(), x.get(), y_transposed.get(), {}, GK_ERROR_PARAM_INVALID,
                 {"gradInput overlaps x"});
}

TEST_F(EluGradV2CheckTest, MessagesAreClearedBySuccess) {
  auto dy = MakeTensor({kElems}, DType::kF32, dy_.data());
  auto x = MakeTensor({kElems}, DType::kF32, x_.data());
  auto y = MakeTensor({kElems}, DType::kF32, y_.data());
  ExpectRejected(dy.get(), nullptr, y.get(), {}, GK_ERROR_NULLPTR, {"x is NULL"});
  EXPECT_EQ(RunEluGradV2(dy.get(), x.get(), y.get(), {}), GK_SUCCESS);
  EXPECT_STREQ(gkGetRecentErrMsg(), "");
}

}  // namespace
}  // namespace gk::testing
