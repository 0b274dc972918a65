// The bfloat16 weights-broadcast form on AMX tiles (cpu/moe_grad_bf16amx.h), where the CPU and OS
// grant AMX: each C element within float32 rounding of the exact sum (the products are exact), a
// row's bits whatever the call's other rows (so the fused op may cut an expert into calls), nothing
// of C's row stride past the width written, lines asked for meanwhile changing no bit, and
// reductions that are not whole tile steps refused. Sizes from its tiles: rows around the 16-token
// tile, its pairs and the 48-token panel group (every last group of one, two or three tiles) up to
// the fused op's 240-row calls; widths around the 16-row A tile and its 32-row pairs (tails of
// 1..15 rows on their own tile configuration); reductions of one step, of a whole 8-step chunk and
// a part of one, and long. Whether its bits equal oneDNN's packed AMX calls is the tile GEMM's
// run-time check (OneDnnTileGemm::broadcast_on_amx), whose verdict the fused op's test
// moe_grad_api.AmxBroadcastFormTakesExpertsPastBaseM relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16amx.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "tests/ops/moe_init_routing_grouped_matmul_grad/moe_grad_test_util.h"

namespace gk {
namespace {

std::vector<uint16_t> Values(int64_t elems, uint32_t seed) { return testing::Bf16Values(elems, seed); }

float Bf16(uint16_t bits) { return LoadAsF32(&bits, 0, DType::kBF16); }

struct Case {
  int64_t rows, width, reduce, lda, ldb, ldc;
  std::vector<uint16_t> a, b;  // A [rows, lda] (gradY rows), B [width, ldb] (weight rows)
  Case(int64_t rows, int64_t width, int64_t reduce, uint32_t seed)
      : rows(rows), width(width), reduce(reduce), lda(reduce + 6), ldb(reduce + 10), ldc(width + 3),
        a(Values(rows * lda, seed)), b(Values(width * ldb, seed * 7 + 1)) {}
  // C through the token panels; C's stride past the width holds -7.
  std::vector<float> Run(const uint16_t* next = nullptr, int64_t next_rows = 0) const {
    std::vector<uint32_t> tokens(MoeBf16DotTokensBytes(rows, reduce) / 4, 0xdeadbeef);
    MoeBf16DotPackTokens(rows, reduce, a.data(), lda, tokens.data());
    std::vector<float> scratch(MoeBf16DotBroadcastScratchBytes(rows, width) / 4);
    std::vector<float> c(static_cast<size_t>(rows * ldc), -7.0f);
    MoeBf16AmxGemmBroadcastB(rows, width, reduce, tokens.data(), b.data(), ldb, c.data(), ldc, scratch.data(),
                             next, next_rows);
    return c;
  }
  double Exact(int64_t r, int64_t n, double* magnitude) const {
    double sum = 0, mag = 0;
    for (int64_t k = 0; k < reduce; ++k) {
      const double p = static_cast<double>(Bf16(a[static_cast<size_t>(r * lda + k)])) *
                       Bf16(b[static_cast<size_t>(n * ldb + k)]);
      sum += p, mag += std::fabs(p);
    }
    *magnitude = mag;
    return sum;
  }
};

class MoeBf16AmxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!MoeBf16AmxAvailable()) GTEST_SKIP() << "no AMX-BF16 granted on this CPU and OS";
  }
};

TEST_F(MoeBf16AmxTest, BroadcastFormSumsEachRowAloneWithinRounding) {
  for (int64_t rows : {1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 97, 137, 240}) {
    for (int64_t width : {1, 15, 16, 17, 31, 32, 33, 48, 63, 128}) {
      for (int64_t reduce : {32, 224, 256, 288, 2048}) {
        if (reduce > 288 && rows * width > 137 * 33) continue;  // the long reduction: fewer shapes
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " width " << width << " reduce " << reduce);
        const Case c(rows, width, reduce, static_cast<uint32_t>(rows * 31 + width * 7 + reduce));
        const std::vector<float> got = c.Run();
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t n = 0; n < c.ldc; ++n) {
            const float v = got[static_cast<size_t>(r * c.ldc + n)];
            if (n >= width) {
              ASSERT_EQ(v, -7.0f) << "written past the width at row " << r << " column " << n;
              continue;
            }
            double magnitude = 0;
            const double exact = c.Exact(r, n, &magnitude);
            // One float32 rounding per step of the chain, each at most half an ulp of the
            // running magnitude.
            ASSERT_LE(std::fabs(v - exact), magnitude * reduce * 0x1p-24 + 1e-30) << "row " << r << " column " << n;
          }
        }
        // A row's bits whatever the call's other rows: the first row alone, and the rows from
        // a whole panel group on (the calls the fused op cuts an expert into).
        if (rows > 1) {
          Case first = c;
          first.rows = 1;
          const std::vector<float> alone = first.Run();
          ASSERT_EQ(std::memcmp(alone.data(), got.data(), static_cast<size_t>(width) * 4), 0);
        }
        if (rows > 48) {
          Case rest = c;
          rest.rows = rows - 48;
          rest.a.erase(rest.a.begin(), rest.a.begin() + 48 * c.lda);
          const std::vector<float> later = rest.Run();
          ASSERT_EQ(std::memcmp(later.data(), got.data() + 48 * c.ldc, later.size() * 4), 0);
        }
      }
    }
  }
}

// The next block's rows asked for (another buffer of the same stride) change no bit.
TEST_F(MoeBf16AmxTest, PrefetchChangesNoBit) {
  const Case c(137, 128, 768, 5);
  const std::vector<uint16_t> next = Values(40 * c.ldb, 9);
  EXPECT_EQ(c.Run(), c.Run(next.data(), 40));
  EXPECT_EQ(c.Run(), c.Run(next.data(), 7));
}

TEST(MoeBf16AmxShape, TakesWholeTileStepsOnly) {
  EXPECT_TRUE(MoeBf16AmxTakesReduce(32));
  EXPECT_TRUE(MoeBf16AmxTakesReduce(768));
  EXPECT_FALSE(MoeBf16AmxTakesReduce(0));
  EXPECT_FALSE(MoeBf16AmxTakesReduce(30));
  EXPECT_FALSE(MoeBf16AmxTakesReduce(202));
  std::vector<uint32_t> tokens(64);
  std::vector<uint16_t> b(64);
  std::vector<float> c(64), scratch(1024);
  EXPECT_THROW(MoeBf16AmxGemmBroadcastB(2, 2, 30, tokens.data(), b.data(), 30, c.data(), 2, scratch.data()),
               std::logic_error);
}

}  // namespace
}  // namespace gk
