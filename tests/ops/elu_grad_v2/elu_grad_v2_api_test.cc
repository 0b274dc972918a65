// End to end through the C API: dtypes x modes x output dtypes, sizes from the plan's tile,
// 8-D and strided views, in place, threads, and the executor's life cycle.
#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "ops/elu_grad_v2/elu_grad_v2_plan.h"
#include "tests/ops/elu_grad_v2/elu_grad_v2_test_util.h"

namespace gk::testing {
namespace {

struct ApiCase {
  DType in;
  DType out;
  bool is_result;
};
void PrintTo(const ApiCase& c, std::ostream* os) {
  *os << DTypeName(c.in) << "->" << DTypeName(c.out) << (c.is_result ? " result" : " exp");
}

std::vector<ApiCase> AllApiCases() {
  std::vector<ApiCase> cases;
  for (DType in : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool is_result : {false, true}) {
      cases.push_back({in, in, is_result});
      if (in != DType::kF32) cases.push_back({in, DType::kF32, is_result});
    }
  }
  return cases;
}

class EluGradV2ApiTest : public ::testing::TestWithParam<ApiCase> {
 protected:
  EluGradV2Call Call() const { return {1.6732632, 1.0507, 1.25, GetParam().is_result}; }

  // Runs on a contiguous tensor of `shape` and checks every element.
  void CheckShape(const std::vector<int64_t>& shape) {
    const auto& p = GetParam();
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    Buffer dy = RandomBuffer(p.in, n, -2, 2, 5), x = RandomBuffer(p.in, n, -6, 3, 6);
    Buffer y(p.out, n);
    auto dy_t = MakeTensor(shape, p.in, dy.data()), x_t = MakeTensor(shape, p.in, x.data());
    auto y_t = MakeTensor(shape, p.out, y.data());
    ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), y_t.get(), Call()), GK_SUCCESS)
        << gkGetRecentErrMsg();
    const auto c = Call();
    const auto coef = FoldEluGradV2Coefficients(c.alpha, c.scale, c.input_scale);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(EluGradV2Matches(dy.get(i), x.get(i), y.get(i), coef, p.is_result, p.out))
          << "element " << i << " of " << n;
    }
  }

  int64_t Tile() const {
    const auto& p = GetParam();
    return MakeEluGradV2Plan({1 << 20, p.in, p.out, p.is_result, true, {1, 1, 1}},
                             DetectEluGradV2Machine())
        .tile_elems;
  }
};

TEST_P(EluGradV2ApiTest, SizesFromTheTile) {
  const int64_t tile = Tile();
  for (int64_t n : {int64_t{0}, int64_t{1}, tile - 1, tile, tile + 1, 3 * tile + 5,
                    int64_t{300001}}) {
    CheckShape({n});
  }
}

TEST_P(EluGradV2ApiTest, EightDims) { CheckShape({2, 3, 1, 4, 5, 2, 3, 7}); }

TEST_P(EluGradV2ApiTest, StridedViewsMatchContiguous) {
  const auto& p = GetParam();
  // A [33, 70] view with a transposed x, a dy taken every other column and an output with a
  // row pitch: the results must equal those of contiguous copies, bit for bit.
  const int64_t rows = 33, cols = 70;
  Buffer dy_storage = RandomBuffer(p.in, rows * cols * 2, -2, 2, 8);
  Buffer x_storage = RandomBuffer(p.in, rows * cols, -5, 3, 9);
  Buffer y_storage(p.out, rows * (cols + 3));
  auto dy_t = MakeTensor({rows, cols}, p.in, dy_storage.data(), {2 * cols, 2});
  auto x_t = MakeTensor({rows, cols}, p.in, x_storage.data(), {1, rows});
  auto y_t = MakeTensor({rows, cols}, p.out, y_storage.data(), {cols + 3, 1});
  ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), y_t.get(), Call()), GK_SUCCESS)
      << gkGetRecentErrMsg();

  Buffer dy(p.in, rows * cols), x(p.in, rows * cols), y(p.out, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dy.set(r * cols + c, dy_storage.get(r * 2 * cols + 2 * c));
      x.set(r * cols + c, x_storage.get(c * rows + r));
    }
  }
  auto dyc = MakeTensor({rows, cols}, p.in, dy.data()), xc = MakeTensor({rows, cols}, p.in, x.data());
  auto yc = MakeTensor({rows, cols}, p.out, y.data());
  ASSERT_EQ(RunEluGradV2(dyc.get(), xc.get(), yc.get(), Call()), GK_SUCCESS);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(y_storage.get(r * (cols + 3) + c), y.get(r * cols + c)) << r << "," << c;
    }
  }
}

// Runs [rows, cols] views cut from storage with row pitches (an element offset too, so no row
// starts on a vector boundary) against contiguous copies: the same bytes, on 1 and 2 threads
// (shares then split rows).
void CheckSlicedMatchesContiguous(const ApiCase& p, const EluGradV2Call& call, int64_t rows,
                                  int64_t cols) {
  const int64_t dy_pitch = cols + 5, x_pitch = cols + 1, y_pitch = cols + 3;
  Buffer dy_storage = RandomBuffer(p.in, rows * dy_pitch + 1, -2, 2, 12);
  Buffer x_storage = RandomBuffer(p.in, rows * x_pitch + 1, -5, 3, 13);
  Buffer dy(p.in, rows * cols), x(p.in, rows * cols), expected(p.out, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dy.set(r * cols + c, dy_storage.get(1 + r * dy_pitch + c));
      x.set(r * cols + c, x_storage.get(1 + r * x_pitch + c));
    }
  }
  auto dyc = MakeTensor({rows, cols}, p.in, dy.data()), xc = MakeTensor({rows, cols}, p.in, x.data());
  auto ec = MakeTensor({rows, cols}, p.out, expected.data());
  ASSERT_EQ(RunEluGradV2(dyc.get(), xc.get(), ec.get(), call), GK_SUCCESS);
  for (int32_t threads : {1, 2}) {
    ASSERT_EQ(gkSetNumThreads(threads), GK_SUCCESS);
    Buffer y_storage(p.out, rows * y_pitch + 1);
    auto dy_t = MakeTensor({rows, cols}, p.in, dy_storage.data(), {dy_pitch, 1}, 1);
    auto x_t = MakeTensor({rows, cols}, p.in, x_storage.data(), {x_pitch, 1}, 1);
    auto y_t = MakeTensor({rows, cols}, p.out, y_storage.data(), {y_pitch, 1}, 1);
    ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), y_t.get(), call), GK_SUCCESS)
        << gkGetRecentErrMsg();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(y_storage.get(1 + r * y_pitch + c), expected.get(r * cols + c))
            << rows << "x" << cols << " at " << r << "," << c << ", " << threads << " threads";
      }
    }
  }
  gkSetNumThreads(0);
}

TEST_P(EluGradV2ApiTest, SlicedRowsMatchContiguous) {
  // Rows of at least kEluGradV2MinRowElems run the kernel in place (rows split between shares);
  // shorter ones are gathered.
  CheckSlicedMatchesContiguous(GetParam(), Call(), 4100, 130);
  CheckSlicedMatchesContiguous(GetParam(), Call(), 33, kEluGradV2MinRowElems);
  CheckSlicedMatchesContiguous(GetParam(), Call(), 257, 7);
}

TEST_P(EluGradV2ApiTest, AnyElementAlignedPointerWorks) {
  // Data one element past a vector boundary (not aligned to anything but the element), large
  // enough for the plan to stream the output: every element checked.
  const auto& p = GetParam();
  const int64_t n = 3 * (1 << 20) + 5;
  Buffer dy = RandomBuffer(p.in, n + 1, -2, 2, 14), x = RandomBuffer(p.in, n + 1, -6, 3, 15);
  Buffer y(p.out, n + 1);
  const int64_t in_bytes = ElementBytes(p.in), out_bytes = ElementBytes(p.out);
  auto dy_t = MakeTensor({n}, p.in, dy.bytes.data() + in_bytes);
  auto x_t = MakeTensor({n}, p.in, x.bytes.data() + in_bytes);
  auto y_t = MakeTensor({n}, p.out, y.bytes.data() + out_bytes);
  ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), y_t.get(), Call()), GK_SUCCESS)
      << gkGetRecentErrMsg();
  const auto c = Call();
  const auto coef = FoldEluGradV2Coefficients(c.alpha, c.scale, c.input_scale);
  EXPECT_EQ(y.get(0), 0.0f) << "wrote before the start";
  for (int64_t i = 1; i <= n; ++i) {
    ASSERT_TRUE(EluGradV2Matches(dy.get(i), x.get(i), y.get(i), coef, p.is_result, p.out))
        << "element " << i;
  }
}

TEST_P(EluGradV2ApiTest, InPlaceOverGradOutputAndX) {
  const auto& p = GetParam();
  if (p.in != p.out) GTEST_SKIP() << "in place needs equal dtypes";
  const int64_t n = 5000;
  for (bool over_x : {false, true}) {
    Buffer dy = RandomBuffer(p.in, n, -2, 2, 10), x = RandomBuffer(p.in, n, -4, 3, 11);
    Buffer expected(p.out, n);
    auto dy_t = MakeTensor({n}, p.in, dy.data()), x_t = MakeTensor({n}, p.in, x.data());
    auto e_t = MakeTensor({n}, p.out, expected.data());
    ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), e_t.get(), Call()), GK_SUCCESS);
    auto y_t = MakeTensor({n}, p.out, over_x ? x.data() : dy.data());
    ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), y_t.get(), Call()), GK_SUCCESS)
        << gkGetRecentErrMsg();
    EXPECT_EQ(over_x ? x.bytes : dy.bytes, expected.bytes);
  }
}

TEST_P(EluGradV2ApiTest, SameBytesForEveryThreadCount) {
  const auto& p = GetParam();
  const int64_t n = (1 << 21) + 333;  // 4 MiB of 16-bit input: 4 shares
  Buffer dy = RandomBuffer(p.in, n, -2, 2, 12), x = RandomBuffer(p.in, n, -6, 3, 13);
  std::vector<uint8_t> first;
  for (int32_t threads : {1, 2, 3, 4}) {
    ASSERT_EQ(gkSetNumThreads(threads), GK_SUCCESS);
    Buffer y(p.out, n);
    auto dy_t = MakeTensor({n}, p.in, dy.data()), x_t = MakeTensor({n}, p.in, x.data());
    auto y_t = MakeTensor({n}, p.out, y.data());
    ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), y_t.get(), Call()), GK_SUCCESS);
    if (first.empty()) first = y.bytes;
    EXPECT_EQ(y.bytes, first) << threads << " threads";
  }
  gkSetNumThreads(0);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, EluGradV2ApiTest, ::testing::ValuesIn(AllApiCases()),
                         [](const ::testing::TestParamInfo<ApiCase>& info) {
                           return std::string(DTypeName(info.param.in)) + "_to_" +
                                  std::string(DTypeName(info.param.out)) +
                                  (info.param.is_result ? "_result" : "_exp");
                         });

class EluGradV2ExecutorTest : public ::testing::Test {
 protected:
  static constexpr int64_t kElems = 1000;
  Buffer dy_ = RandomBuffer(DType::kF32, kElems, -1, 1, 1), x_ = RandomBuffer(DType::kF32, kElems, -1, 1, 2);
  Buffer y_ = Buffer(DType::kF32, kElems);
  TensorOwner dy_t_ = MakeTensor({kElems}, DType::kF32, dy_.data());
  TensorOwner x_t_ = MakeTensor({kElems}, DType::kF32, x_.data());
  TensorOwner y_t_ = MakeTensor({kElems}, DType::kF32, y_.data());

  gkOpExecutor* Plan(uint64_t* size, const std::vector<int64_t>& y_strides = {}) {
    gkOpExecutor* executor = nullptr;
    EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy_t_.get(), x_t_.get(), 1, 1, 1, false, y_t_.get(),
                                          size, &executor),
              GK_SUCCESS);
    return executor;
  }
};

TEST_F(EluGradV2ExecutorTest, RunsOnceUnlessRepeatable) {
  uint64_t size = 0;
  gkOpExecutor* executor = Plan(&size);
  EXPECT_EQ(gkEluGradV2(nullptr, size, executor, nullptr), GK_SUCCESS);
  EXPECT_EQ(gkEluGradV2(nullptr, size, executor, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("already run"), std::string::npos);
  EXPECT_EQ(gkSetExecutorRepeatable(executor), GK_SUCCESS);
  EXPECT_EQ(gkEluGradV2(nullptr, size, executor, nullptr), GK_SUCCESS);
  EXPECT_EQ(gkDestroyExecutor(executor), GK_SUCCESS);
}

TEST_F(EluGradV2ExecutorTest, NullExecutorAndShortWorkspace) {
  EXPECT_EQ(gkEluGradV2(nullptr, 0, nullptr, nullptr), GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("executor is NULL"), std::string::npos);
  EXPECT_EQ(gkDestroyExecutor(nullptr), GK_SUCCESS);
  EXPECT_EQ(gkSetExecutorRepeatable(nullptr), GK_ERROR_NULLPTR);

  // A strided output needs scratch: a smaller or missing workspace is an error, y untouched.
  Buffer dy_storage = RandomBuffer(DType::kF32, 2 * kElems, -1, 1, 3);
  auto dy = MakeTensor({kElems}, DType::kF32, dy_storage.data(), {2});
  gkOpExecutor* executor = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(gkEluGradV2GetWorkspaceSize(dy.get(), x_t_.get(), 1, 1, 1, false, y_t_.get(), &size,
                                        &executor),
            GK_SUCCESS);
  ASSERT_GT(size, 0u);
  const auto before = y_.bytes;
  EXPECT_EQ(gkEluGradV2(nullptr, size, executor, nullptr), GK_ERROR_NULLPTR);
  std::vector<uint8_t> workspace(size);
  EXPECT_EQ(gkEluGradV2(workspace.data(), size - 1, executor, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("workspaceSize is " + std::to_string(size - 1)),
            std::string::npos);
  EXPECT_EQ(y_.bytes, before);
  EXPECT_EQ(gkEluGradV2(workspace.data(), size, executor, nullptr), GK_SUCCESS);
  gkDestroyExecutor(executor);
}

TEST_F(EluGradV2ExecutorTest, DescriptorsMayBeReleasedAfterPhaseOne) {
  uint64_t size = 0;
  auto dy = MakeTensor({kElems}, DType::kF32, dy_.data());
  gkOpExecutor* executor = nullptr;
  ASSERT_EQ(gkEluGradV2GetWorkspaceSize(dy.get(), x_t_.get(), 1, 1, 1, false, y_t_.get(), &size,
                                        &executor),
            GK_SUCCESS);
  dy = TensorOwner();
  EXPECT_EQ(gkEluGradV2(nullptr, size, executor, nullptr), GK_SUCCESS);
  gkDestroyExecutor(executor);
}

TEST_F(EluGradV2ExecutorTest, ConcurrentCallersGetTheSameBytes) {
  const int64_t n = 1 << 18;
  Buffer dy = RandomBuffer(DType::kBF16, n, -2, 2, 20), x = RandomBuffer(DType::kBF16, n, -5, 3, 21);
  Buffer expected(DType::kBF16, n);
  auto dy_t = MakeTensor({n}, DType::kBF16, dy.data()), x_t = MakeTensor({n}, DType::kBF16, x.data());
  {
    auto e_t = MakeTensor({n}, DType::kBF16, expected.data());
    ASSERT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), e_t.get(), {}), GK_SUCCESS);
  }
  std::vector<Buffer> outputs(6, Buffer(DType::kBF16, n));
  std::vector<std::thread> callers;
  for (auto& out : outputs) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 5; ++rep) {
        auto y_t = MakeTensor({n}, DType::kBF16, out.data());
        EXPECT_EQ(RunEluGradV2(dy_t.get(), x_t.get(), y_t.get(), {}), GK_SUCCESS);
      }
    });
  }
  for (auto& c : callers) c.join();
  for (const auto& out : outputs) EXPECT_EQ(out.bytes, expected.bytes);
}

}  // namespace
}  // namespace gk::testing
