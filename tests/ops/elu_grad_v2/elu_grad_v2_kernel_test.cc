// Every kernel of the table, on every SIMD target this CPU runs, at every size around the vector
// width and the tile, against the float64 reference; and the special values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <hwy/base.h>  // HWY_ARCH_X86_64

#include "core/cpu/stream_copy.h"
#include "core/cpu_info.h"
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.h"
#include "ops/elu_grad_v2/elu_grad_v2_plan.h"
#include "tests/ops/elu_grad_v2/elu_grad_v2_test_util.h"

namespace gk::testing {
namespace {

struct KernelCase {
  std::string isa;
  EluGradV2KernelEntry entry;
  bool native_bf16 = true;  // false: integer bfloat16 rounding where the instruction would run
};
void PrintTo(const KernelCase& c, std::ostream* os) {
  *os << c.isa << (c.native_bf16 ? "" : " (integer bf16)") << " " << c.entry.name;
}

std::vector<KernelCase> AllKernelCases() {
  std::vector<KernelCase> cases;
  for (const auto& isa : AvailableIsas()) {
    for (const auto& entry : EluGradV2Kernels()) {
      cases.push_back({isa, entry});
      if (entry.output == DType::kBF16) cases.push_back({isa, entry, false});
    }
  }
  return cases;
}

class EluGradV2KernelTest : public ::testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(SelectIsa(GetParam().isa));
    AllowNativeBf16Conversion(GetParam().native_bf16);
  }
  void TearDown() override {
    SelectIsa("");
    AllowNativeBf16Conversion(true);
  }

  // Runs the kernel on n elements (offset by `misalign` elements from an aligned start) and
  // checks every output against the reference.
  void CheckSize(int64_t n, int64_t misalign, bool stream, const EluGradV2Coefficients& coef) {
    const auto& e = GetParam().entry;
    Buffer dy = RandomBuffer(e.input, n + misalign, -3.0f, 3.0f, static_cast<uint32_t>(n + 1));
    Buffer x = RandomBuffer(e.input, n + misalign, -8.0f, 4.0f, static_cast<uint32_t>(n + 2));
    Buffer y(e.output, n + misalign + 1);
    const float sentinel = -7.5f;  // exact in every dtype
    y.set(n + misalign, sentinel);
    const int64_t in_bytes = ElementBytes(e.input), out_bytes = ElementBytes(e.output);
    e.kernel(dy.bytes.data() + misalign * in_bytes, x.bytes.data() + misalign * in_bytes,
             y.bytes.data() + misalign * out_bytes, n, coef, stream);
    for (int64_t i = misalign; i < n + misalign; ++i) {
      ASSERT_TRUE(EluGradV2Matches(dy.get(i), x.get(i), y.get(i), coef, e.is_result, e.output))
          << e.name << " on " << GetParam().isa << ", n " << n << ", element " << i;
    }
    ASSERT_EQ(y.get(n + misalign), sentinel) << "wrote past the end";
  }
};

TEST_P(EluGradV2KernelTest, EverySizeAroundTheVectorWidth) {
  const auto coef = FoldEluGradV2Coefficients(1.6732632423543772, 1.0507009873554805, 1.0);
  for (int64_t n = 0; n <= 3 * 16 + 1; ++n) CheckSize(n, 0, false, coef);
}

TEST_P(EluGradV2KernelTest, SizesAroundTheTile) {
  const auto& e = GetParam().entry;
  const EluGradV2Problem problem{1 << 20, e.input, e.output, e.is_result, true,
                                 FoldEluGradV2Coefficients(1.0, 1.0, 1.0)};
  const int64_t tile = MakeEluGradV2Plan(problem, DetectEluGradV2Machine()).tile_elems;
  const auto coef = FoldEluGradV2Coefficients(0.5, 2.0, 1.5);
  for (int64_t n : {tile - 1, tile, tile + 1, 2 * tile + 7}) {
    for (int64_t misalign : {0, 1, 3}) {
      for (bool stream : {false, true}) CheckSize(n, misalign, stream, coef);
    }
  }
}

TEST_P(EluGradV2KernelTest, StreamingStoresGiveTheSameBytes) {
  const auto& e = GetParam().entry;
  const int64_t n = 4099;
  Buffer dy = RandomBuffer(e.input, n, -3.0f, 3.0f, 1), x = RandomBuffer(e.input, n, -5.0f, 5.0f, 2);
  Buffer cached(e.output, n + 1), streamed(e.output, n + 1);
  const auto coef = FoldEluGradV2Coefficients(1.0, 1.0, 1.0);
  e.kernel(dy.data(), x.data(), cached.bytes.data() + ElementBytes(e.output), n - 1, coef, false);
  e.kernel(dy.data(), x.data(), streamed.bytes.data() + ElementBytes(e.output), n - 1, coef, true);
  EXPECT_EQ(cached.bytes, streamed.bytes);
}

// Streaming starts on y's first cache line (kStreamLineBytes), wherever y starts in its line:
// the bytes of plain stores at every offset, nothing written around them.
TEST_P(EluGradV2KernelTest, StreamedOutputAtEveryLineOffset) {
  const auto& e = GetParam().entry;
  const int64_t out_bytes = ElementBytes(e.output);
  const int64_t n = 4099;
  Buffer dy = RandomBuffer(e.input, n, -3.0f, 3.0f, 5), x = RandomBuffer(e.input, n, -5.0f, 5.0f, 6);
  const auto coef = FoldEluGradV2Coefficients(1.0, 1.0507, 1.0);
  const int64_t line = static_cast<int64_t>(kStreamLineBytes);
  for (int64_t offset = 0; offset < line; offset += std::max<int64_t>(out_bytes, 4)) {
    SCOPED_TRACE(::testing::Message() << "y " << offset << " bytes past a line");
    std::vector<uint8_t> cached(static_cast<size_t>(n * out_bytes + 2 * line), 0xA5);
    std::vector<uint8_t> streamed = cached;
    const auto at = [&](std::vector<uint8_t>& v) {
      const auto address = reinterpret_cast<uintptr_t>(v.data());
      return v.data() + (line - address % line) % line + offset;
    };
    uint8_t* const y_cached = at(cached);
    uint8_t* const y_streamed = at(streamed);
    e.kernel(dy.data(), x.data(), y_cached, n, coef, false);
    e.kernel(dy.data(), x.data(), y_streamed, n, coef, true);
    EXPECT_EQ(std::memcmp(y_cached, y_streamed, static_cast<size_t>(n * out_bytes)), 0);
    for (uint8_t* p = streamed.data(); p < y_streamed; ++p) ASSERT_EQ(*p, 0xA5) << "before y";
    for (uint8_t* p = y_streamed + n * out_bytes; p < streamed.data() + streamed.size(); ++p) {
      ASSERT_EQ(*p, 0xA5) << "after y";
    }
  }
}

TEST_P(EluGradV2KernelTest, SpecialValues) {
  const auto& e = GetParam().entry;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // x values: NaN, +-inf, +-0, exp underflow, large positive (branch not taken), tiny.
  const std::vector<float> xs = {nan,  kInf,   -kInf, 0.0f,  -0.0f,  -200.0f, -87.0f,
                                 -1e-30f, 1e-30f, 60000.0f, 3e38f, -1.0f, 1.0f, -104.0f};
  const std::vector<float> dys = {1.0f, -2.5f, 0.0f, kInf, nan};
  for (const float input_scale : {1.0f, -1.0f, 0.0f}) {
    const auto coef = FoldEluGradV2Coefficients(1.0, 1.0507, input_scale);
    if (e.is_result && coef.negcoef < 0) continue;
    const int64_t n = static_cast<int64_t>(xs.size() * dys.size());
    Buffer dy(e.input, n), x(e.input, n), y(e.output, n);
    for (size_t i = 0; i < xs.size(); ++i) {
      for (size_t j = 0; j < dys.size(); ++j) {
        x.set(static_cast<int64_t>(i * dys.size() + j), xs[i]);
        dy.set(static_cast<int64_t>(i * dys.size() + j), dys[j]);
      }
    }
    e.kernel(dy.data(), x.data(), y.data(), n, coef, false);
    for (int64_t i = 0; i < n; ++i) {
      // Where float32 arithmetic itself gives NaN or inf (0 * exp(200), inf * 0, ...) the kernel
      // must give the same as the scalar float32 formula; elsewhere it must meet the contract.
      const float scalar = RoundToDType(EluGradV2Formula(dy.get(i), x.get(i), coef, e.is_result),
                                        e.output);
      const std::string where = e.name + std::string(" on ") + GetParam().isa + ", dy " +
                                std::to_string(dy.get(i)) + ", x " + std::to_string(x.get(i)) +
                                ", input_scale " + std::to_string(input_scale);
      if (std::isnan(scalar)) {
        ASSERT_TRUE(std::isnan(y.get(i))) << where << ": got " << y.get(i);
      } else if (std::isinf(scalar)) {
        ASSERT_EQ(y.get(i), scalar) << where;
      } else {
        ASSERT_TRUE(EluGradV2Matches(dy.get(i), x.get(i), y.get(i), coef, e.is_result, e.output))
            << where;
      }
      if (std::isnan(x.get(i))) {
        ASSERT_TRUE(std::isnan(y.get(i))) << "NaN in x must give NaN";
      }
    }
  }
}

TEST_P(EluGradV2KernelTest, ExpAcrossItsWholeRange) {
  // x sweeps [-100, 0], so x * input_scale sweeps [-100, 0] and [0, 100]: both exp paths,
  // subnormal results, the overflow edge. The product is exact, so only exp's own error and the
  // final products count.
  const auto& e = GetParam().entry;
  if (e.is_result) GTEST_SKIP() << "no exp in isResult mode";
  const int64_t n = 20000;
  for (const float input_scale : {1.0f, -1.0f}) {
    Buffer dy(e.input, n), x(e.input, n), y(e.output, n);
    for (int64_t i = 0; i < n; ++i) {
      x.set(i, -100.0f * static_cast<float>(i) / n);
      dy.set(i, 1.0f);
    }
    const auto coef = FoldEluGradV2Coefficients(1.0, 1.0, input_scale);
    e.kernel(dy.data(), x.data(), y.data(), n, coef, false);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(EluGradV2Matches(dy.get(i), x.get(i), y.get(i), coef, false, e.output))
          << e.name << " on " << GetParam().isa << ", input_scale " << input_scale;
    }
  }
}

TEST_P(EluGradV2KernelTest, EverySixteenBitInput) {
  // Every 16-bit x (all 65536 patterns: NaNs, infinities, subnormals, exp's whole range and
  // both branches) with dy of both signs and magnitudes, against the float64 reference: the
  // short exp polynomials of 16-bit outputs are held to the same contract as the full one.
  const auto& e = GetParam().entry;
  if (e.input == DType::kF32) GTEST_SKIP() << "float32 inputs: see ExpAcrossItsWholeRange";
  const int64_t n = 1 << 16;
  const float dys[] = {1.0f, -2.5f, 0.3125f, 100.0f};
  for (const float input_scale : {1.0f, -1.0f, 0.5f}) {
    const auto coef = FoldEluGradV2Coefficients(1.6732632423543772, 1.0507009873554805, input_scale);
    Buffer dy(e.input, n), x(e.input, n), y(e.output, n);
    for (int64_t i = 0; i < n; ++i) {
      const auto bits = static_cast<uint16_t>(i);
      std::memcpy(x.bytes.data() + 2 * i, &bits, 2);
      dy.set(i, dys[(i * 7) % 4]);
    }
    e.kernel(dy.data(), x.data(), y.data(), n, coef, false);
    for (int64_t i = 0; i < n; ++i) {
      const std::string where = e.name + std::string(" on ") + GetParam().isa + ", x bits " +
                                std::to_string(i) + ", input_scale " + std::to_string(input_scale);
      const float scalar = RoundToDType(EluGradV2Formula(dy.get(i), x.get(i), coef, e.is_result),
                                        e.output);
      if (std::isnan(scalar)) {
        ASSERT_TRUE(std::isnan(y.get(i))) << where << ": got " << y.get(i);
      } else if (std::isinf(scalar)) {
        ASSERT_EQ(y.get(i), scalar) << where;
      } else {
        ASSERT_TRUE(EluGradV2Matches(dy.get(i), x.get(i), y.get(i), coef, e.is_result, e.output))
            << where;
      }
    }
  }
}

TEST_P(EluGradV2KernelTest, NanInBodyAndTailPropagates) {
  const auto& e = GetParam().entry;
  const int64_t n = 67;
  for (int64_t at : {0, 15, 31, 63, 66}) {
    Buffer dy = RandomBuffer(e.input, n, -1.0f, 1.0f, 3), x = RandomBuffer(e.input, n, -1.0f, 1.0f, 4);
    Buffer y(e.output, n);
    x.set(at, std::numeric_limits<float>::quiet_NaN());
    e.kernel(dy.data(), x.data(), y.data(), n, FoldEluGradV2Coefficients(1, 1, 1), false);
    EXPECT_TRUE(std::isnan(y.get(at))) << e.name << " position " << at;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, EluGradV2KernelTest, ::testing::ValuesIn(AllKernelCases()),
                         [](const ::testing::TestParamInfo<KernelCase>& info) {
                           return info.param.isa + (info.param.native_bf16 ? "_" : "_IntBf16_") +
                                  info.param.entry.name;
                         });

TEST(EluGradV2KernelTable, CoversEverySupportedDTypePair) {
  for (DType in : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool is_result : {false, true}) {
      EXPECT_NE(FindEluGradV2Kernel(in, in, is_result), nullptr);
      EXPECT_NE(FindEluGradV2Kernel(in, DType::kF32, is_result), nullptr);
    }
  }
  EXPECT_EQ(FindEluGradV2Kernel(DType::kF32, DType::kF16, false), nullptr);
}

// Dispatch ends in a target every CPU of the architecture runs: the scalar one (SCALAR in
// Highway 1.0, EMU128 later), or, where Highway >= 1.2 compiles the x86-64 baseline instead,
// SSE2, which every x86-64 CPU has.
TEST(EluGradV2KernelTable, FallbackEveryCpuRunsIsAvailable) {
  const auto isas = AvailableIsas();
  ASSERT_FALSE(isas.empty());
  const bool scalar = isas.back() == "SCALAR" || isas.back() == "EMU128";
#if HWY_ARCH_X86_64
  EXPECT_TRUE(scalar || isas.back() == "SSE2") << isas.back();
#else
  EXPECT_TRUE(scalar) << isas.back();
#endif
}

}  // namespace
}  // namespace gk::testing
