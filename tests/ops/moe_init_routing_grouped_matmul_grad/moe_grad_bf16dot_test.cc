// gradkit's bfloat16 dot-product tile GEMM (cpu/moe_grad_bf16dot.h), where the CPU has
// AVX512-BF16: each C element is exactly the instruction's chain over the pairs of k, whatever the
// rows, columns and reduction blocks of the call and the strides of A and C; B packed from its rows
// and from its transpose's rows gives the same bytes, zeros past the width and the reduction; a
// reduction split at an even k continues the chains; B packed by the kernel as it multiplies gives
// the same bytes and bits; lines asked for meanwhile change no bit; the weights-broadcast form
// (A packed into token panels, B read in place) gives the same bits.
// Sizes from the kernel's blocks: rows around its 6-row register block (every split of a rest
// into one or two blocks), widths around its 64-column panel (and its 32-column halves),
// reductions around kMoeBf16DotReduceBlock (cut into two or three blocks) and odd.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "tests/ops/moe_init_routing_grouped_matmul_grad/moe_grad_test_util.h"

namespace gk {
namespace {

constexpr int64_t kRowBlock = kMoeBf16DotRows;
constexpr int64_t kReduceBlock = kMoeBf16DotReduceBlock;

std::vector<uint16_t> Values(int64_t elems, uint32_t seed) { return testing::Bf16Values(elems, seed); }

float Bf16(uint16_t bits) { return LoadAsF32(&bits, 0, DType::kBF16); }

std::vector<int64_t> RowCounts() {
  std::vector<int64_t> rows;
  for (int64_t r = 1; r <= 3 * kRowBlock + 2; ++r) rows.push_back(r);
  rows.push_back(8 * kRowBlock + 5);
  return rows;
}

// Fewer, for the long reductions: a full block, every rest (1 and 2 split with the last full
// block), two blocks and more.
std::vector<int64_t> FewRowCounts() {
  return {1, 2, kRowBlock - 1, kRowBlock, kRowBlock + 1, kRowBlock + 2, 2 * kRowBlock + 3, 3 * kRowBlock + 1};
}

struct Operands {
  int64_t rows, width, reduce, lda, ldb;
  std::vector<uint16_t> a, b;  // A [rows, lda], B [width, ldb] (b[n * ldb + k])
  Operands(int64_t rows, int64_t width, int64_t reduce, uint32_t seed)
      : rows(rows), width(width), reduce(reduce), lda(reduce + 3), ldb(reduce + 5),
        a(Values(rows * lda, seed)), b(Values(width * ldb, seed * 7 + 1)) {}
  float A(int64_t r, int64_t k) const { return Bf16(a[static_cast<size_t>(r * lda + k)]); }
  float B(int64_t k, int64_t n) const { return Bf16(b[static_cast<size_t>(n * ldb + k)]); }
  // B^T's rows [reduce, width] of stride width + 9.
  std::vector<uint16_t> Transposed(int64_t ld) const {
    std::vector<uint16_t> t(static_cast<size_t>(reduce * ld), 0x7fc0);  // NaN where never read
    for (int64_t k = 0; k < reduce; ++k) {
      for (int64_t n = 0; n < width; ++n) t[static_cast<size_t>(k * ld + n)] = b[static_cast<size_t>(n * ldb + k)];
    }
    return t;
  }
  std::vector<uint16_t> Packed() const {
    std::vector<uint16_t> packed(MoeBf16DotPackedBytes(width, reduce) / 2 + 32);
    MoeBf16DotPackB(width, reduce, b.data(), ldb, /*kn=*/false, Aligned(packed));
    return packed;
  }
  // The 64-byte aligned start of a buffer allocated with 32 spare elements.
  static uint16_t* Aligned(std::vector<uint16_t>& v) {
    const auto address = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (64 - address % 64) % 64 / 2;
  }
  // C[r, n] as the instruction sums it, from `start`: c = (c + a[2p+1] b[2p+1]) + a[2p] b[2p]
  // over the pairs in order, an odd reduction's missing element zero.
  float Chain(int64_t r, int64_t n, int64_t k0, int64_t k1, float start) const {
    float sum = start;
    for (int64_t k = k0; k < k1; k += 2) {
      const float odd = k + 1 < k1 ? A(r, k + 1) * B(k + 1, n) : 0.0f * 0.0f;
      sum = sum + odd;
      sum = sum + A(r, k) * B(k, n);
    }
    return sum;
  }
};

class MoeBf16DotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!MoeBf16DotAvailable()) GTEST_SKIP() << "no AVX512-BF16 on this CPU (or an AVX-512 target off)";
  }
};

TEST_F(MoeBf16DotTest, EachElementIsTheInstructionsChain) {
  const int64_t nr = kMoeBf16DotPanel, kb = kReduceBlock;
  for (int64_t reduce : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{33}, kb, kb + 1, 2 * kb + 40}) {
    const bool long_reduce = reduce >= kb;
    for (int64_t rows : long_reduce ? FewRowCounts() : RowCounts()) {
      for (int64_t width : {int64_t{1}, nr / 2 + 1, nr, nr + 1, 2 * nr + 3}) {
        if (long_reduce && (width == nr / 2 + 1 || width == nr + 1)) continue;
        for (const auto& [accumulate, ldc] : {std::pair{false, width + 5}, std::pair{true, width + 5},
                                              std::pair{true, width + 1029}}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << " width " << width << " reduce "
                                            << reduce << " accumulate " << accumulate << " ldc " << ldc);
          const Operands op(rows, width, reduce, static_cast<uint32_t>(rows * 131 + width * 7 + reduce));
          std::vector<uint16_t> packed = op.Packed();
          std::vector<float> c(static_cast<size_t>(rows * ldc));
          for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 13) - 6.0f;
          const std::vector<float> before = c;
          MoeBf16DotGemm(rows, width, reduce, op.a.data(), op.lda, Operands::Aligned(packed), c.data(),
                         ldc, accumulate);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t n = 0; n < ldc; ++n) {
              const float was = before[static_cast<size_t>(r * ldc + n)];
              const float want = n < width ? op.Chain(r, n, 0, reduce, accumulate ? was : 0.0f) : was;
              ASSERT_EQ(c[static_cast<size_t>(r * ldc + n)], want) << "row " << r << " column " << n;
            }
          }
        }
      }
    }
  }
}

// Both packers write every byte of the packed size: the same bytes from B's rows and from its
// transpose's rows, zeros past the width and at an odd reduction's missing element.
TEST_F(MoeBf16DotTest, BothPackersGiveTheSameBytes) {
  const int64_t nr = kMoeBf16DotPanel;
  for (int64_t width : {int64_t{1}, nr / 2, nr / 2 + 1, nr, nr + 1, 3 * nr + 7}) {
    for (int64_t reduce : {int64_t{1}, int64_t{2}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{300}}) {
      SCOPED_TRACE(::testing::Message() << "width " << width << " reduce " << reduce);
      const Operands op(2, width, reduce, static_cast<uint32_t>(width * 5 + reduce));
      const size_t elems = MoeBf16DotPackedBytes(width, reduce) / 2;
      std::vector<uint16_t> from_rows(elems + 32, 0xffff), from_kn(elems + 32, 0xffff);
      uint16_t* rows_out = Operands::Aligned(from_rows);
      uint16_t* kn_out = Operands::Aligned(from_kn);
      MoeBf16DotPackB(width, reduce, op.b.data(), op.ldb, /*kn=*/false, rows_out);
      const std::vector<uint16_t> t = op.Transposed(width + 9);
      MoeBf16DotPackB(width, reduce, t.data(), width + 9, /*kn=*/true, kn_out);
      ASSERT_EQ(std::memcmp(rows_out, kn_out, elems * 2), 0);
      const int64_t pairs = (reduce + 1) / 2;
      for (int64_t n = 0; n < (width + nr - 1) / nr * nr; ++n) {
        for (int64_t k = 0; k < 2 * pairs; ++k) {
          const uint16_t got = rows_out[(n / nr) * pairs * 2 * nr + (k / 2) * 2 * nr + (n % nr) * 2 + k % 2];
          const uint16_t want = n < width && k < reduce ? op.b[static_cast<size_t>(n * op.ldb + k)] : 0;
          ASSERT_EQ(got, want) << "k " << k << " n " << n;
        }
      }
    }
  }
}

// B packed on the way (MoeBf16DotGemmPackingKN: each panel's first register block packs B^T's
// rows as it multiplies) gives the bytes of MoeBf16DotPackB and the bits of the call on them:
// rows around the register block and past one L2 chunk of rows (only the first chunk packs),
// widths around the panel, reductions around the reduction block and odd, with and without C's
// start; a call without rows packs it all.
TEST_F(MoeBf16DotTest, PackingOnTheWayGivesTheSameBytesAndBits) {
  const int64_t nr = kMoeBf16DotPanel, kb = kReduceBlock;
  std::vector<int64_t> row_counts = RowCounts();
  row_counts.push_back(0);
  row_counts.push_back(30 * kRowBlock + 5);  // past the kernel's 256 KiB chunk of A and C rows
  for (int64_t rows : row_counts) {
    for (int64_t width : {int64_t{1}, nr / 2 + 1, nr, nr + 1, 3 * nr + 7}) {
      for (int64_t reduce : {int64_t{1}, int64_t{7}, kb, kb + 1, 2 * kb + 40}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << " width " << width << " reduce " << reduce
                                            << " accumulate " << accumulate);
          const Operands op(rows, width, reduce, static_cast<uint32_t>(rows * 3 + width + reduce));
          const std::vector<uint16_t> t = op.Transposed(width + 9);
          const size_t elems = MoeBf16DotPackedBytes(width, reduce) / 2;
          std::vector<uint16_t> before(elems + 32, 0xffff), on_the_way(elems + 32, 0xffff);
          MoeBf16DotPackB(width, reduce, t.data(), width + 9, /*kn=*/true, Operands::Aligned(before));
          std::vector<float> c(static_cast<size_t>(rows * (width + 2)), 3.0f), c_on_the_way = c;
          MoeBf16DotGemm(rows, width, reduce, op.a.data(), op.lda, Operands::Aligned(before), c.data(),
                         width + 2, accumulate);
          MoeBf16DotGemmPackingKN(rows, width, reduce, op.a.data(), op.lda, t.data(), width + 9,
                                  Operands::Aligned(on_the_way), c_on_the_way.data(), width + 2, accumulate);
          ASSERT_EQ(std::memcmp(Operands::Aligned(before), Operands::Aligned(on_the_way), elems * 2), 0);
          ASSERT_EQ(c_on_the_way, c);
        }
      }
    }
  }
}

// The reduction split by the caller at an even k (the forward's k-blocks) gives the bits of one
// call: the second call continues the first one's chains.
TEST_F(MoeBf16DotTest, SplitAtEvenKContinuesTheChains) {
  const int64_t rows = 2 * kRowBlock + 1, width = 2 * kMoeBf16DotPanel + 1;
  const int64_t reduce = kReduceBlock + 71;
  const Operands op(rows, width, reduce, 99);
  std::vector<uint16_t> packed = op.Packed();
  std::vector<float> whole(static_cast<size_t>(rows * width));
  MoeBf16DotGemm(rows, width, reduce, op.a.data(), op.lda, Operands::Aligned(packed), whole.data(),
                 width, false);
  for (int64_t split : {int64_t{2}, int64_t{34}, int64_t{256}, kReduceBlock}) {
    std::vector<uint16_t> first(MoeBf16DotPackedBytes(width, split) / 2 + 32);
    std::vector<uint16_t> second(MoeBf16DotPackedBytes(width, reduce - split) / 2 + 32);
    MoeBf16DotPackB(width, split, op.b.data(), op.ldb, false, Operands::Aligned(first));
    MoeBf16DotPackB(width, reduce - split, op.b.data() + split, op.ldb, false, Operands::Aligned(second));
    std::vector<float> parts(whole.size());
    MoeBf16DotGemm(rows, width, split, op.a.data(), op.lda, Operands::Aligned(first), parts.data(), width,
                   false);
    MoeBf16DotGemm(rows, width, reduce - split, op.a.data() + split, op.lda, Operands::Aligned(second),
                   parts.data(), width, true);
    EXPECT_EQ(parts, whole) << "split at " << split;
  }
}

// The weights-broadcast form (MoeBf16DotPackTokens, then MoeBf16DotGemmBroadcastB): each C element
// is the instruction's chain, the bits of MoeBf16DotGemm, and nothing of C's row stride past the
// width is written. Sizes from its blocks: rows around the 16-token vector and the 48-token
// group (every last group of one, two or three vectors) and up to 256 (the fused op's tile),
// widths around the 8-row weight block and the 16-column transposes, reductions around the
// packer's 16 pairs and long; the next block named or not.
TEST_F(MoeBf16DotTest, BroadcastFormGivesTheChainsOfTheDotKernel) {
  const int64_t wr = kMoeBf16DotWeightRows, tg = kMoeBf16DotTokenGroup;
  const std::vector<int64_t> row_counts{1, 15, 16, 17, 31, 33, tg - 1, tg, tg + 1, tg + 16, 2 * tg + 1, 137, 256};
  for (int64_t rows : row_counts) {
    for (int64_t width : {int64_t{1}, wr - 1, wr, wr + 1, 2 * wr + 1, int64_t{64}, int64_t{65}}) {
      for (int64_t reduce : {int64_t{2}, int64_t{30}, int64_t{32}, int64_t{34}, int64_t{66}, kReduceBlock + 34}) {
        if (reduce > 66 && rows * width > 137 * 64) continue;  // the long reduction: fewer shapes
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " width " << width << " reduce " << reduce);
        const Operands op(rows, width, reduce, static_cast<uint32_t>(rows * 17 + width * 5 + reduce));
        std::vector<uint16_t> packed = op.Packed();
        const int64_t ldc = width + 3;
        std::vector<float> want(static_cast<size_t>(rows * ldc), -7.0f), got = want;
        MoeBf16DotGemm(rows, width, reduce, op.a.data(), op.lda, Operands::Aligned(packed), want.data(), ldc,
                       false);
        std::vector<uint32_t> tokens(MoeBf16DotTokensBytes(rows, reduce) / 4, 0xdeadbeef);
        MoeBf16DotPackTokens(rows, reduce, op.a.data(), op.lda, tokens.data());
        std::vector<float> scratch(MoeBf16DotBroadcastScratchBytes(rows, width) / 4);
        const std::vector<uint16_t> next = Values(wr * op.ldb, 5);
        MoeBf16DotGemmBroadcastB(rows, width, reduce, tokens.data(), op.b.data(), op.ldb, got.data(), ldc,
                                 scratch.data(), rows % 2 == 0 ? next.data() : nullptr, wr);
        ASSERT_EQ(got, want);
        for (int64_t r = 0; r < std::min<int64_t>(rows, 3); ++r) {
          for (int64_t n = 0; n < width; ++n) {
            ASSERT_EQ(got[static_cast<size_t>(r * ldc + n)], op.Chain(r, n, 0, reduce, 0.0f));
          }
        }
      }
    }
  }
}

// Token panels: every word where the layout puts it, zeros past the rows; an odd reduction is
// refused by both calls.
TEST_F(MoeBf16DotTest, TokenPanelsHoldEachRowsPairs) {
  const int64_t tg = kMoeBf16DotTokenGroup;
  for (int64_t rows : {int64_t{1}, int64_t{17}, tg, tg + 17, 2 * tg + 33}) {
    for (int64_t reduce : {int64_t{2}, int64_t{34}, int64_t{64}}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " reduce " << reduce);
      const Operands op(rows, 1, reduce, static_cast<uint32_t>(rows + reduce));
      const int64_t tokens = (rows + 15) / 16 * 16, pairs = reduce / 2;
      ASSERT_EQ(MoeBf16DotTokensBytes(rows, reduce), static_cast<uint64_t>(tokens * pairs * 4));
      std::vector<uint32_t> panels(static_cast<size_t>(tokens * pairs), 0xdeadbeef);
      MoeBf16DotPackTokens(rows, reduce, op.a.data(), op.lda, panels.data());
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t g0 = t / tg * tg, width = std::min(tg, tokens - g0);
        for (int64_t p = 0; p < pairs; ++p) {
          uint32_t want = 0;
          if (t < rows) std::memcpy(&want, op.a.data() + t * op.lda + 2 * p, 4);
          ASSERT_EQ(panels[static_cast<size_t>(g0 * pairs + p * width + t - g0)], want) << "t " << t << " p " << p;
        }
      }
    }
  }
  std::vector<uint32_t> panels(64);
  std::vector<float> c(64), scratch(1024);
  const Operands op(2, 2, 3, 1);
  EXPECT_THROW(MoeBf16DotPackTokens(2, 3, op.a.data(), op.lda, panels.data()), std::logic_error);
  EXPECT_THROW(MoeBf16DotGemmBroadcastB(2, 2, 3, panels.data(), op.b.data(), op.ldb, c.data(), 2, scratch.data()),
               std::logic_error);
}

// Lines asked for meanwhile (an unrelated buffer of 16 rows of 4 lines, 3 lines a register
// block) change no bit, are all asked for once the call ran 22 register blocks, and none past the
// buffer's rows.
TEST_F(MoeBf16DotTest, PrefetchChangesNoBit) {
  const int64_t nr = kMoeBf16DotPanel, kb = kReduceBlock;
  const std::vector<float> elsewhere(4096, 1.0f);
  for (int64_t rows : RowCounts()) {
    for (int64_t width : {int64_t{1}, nr, 2 * nr + 3}) {
      for (int64_t reduce : {int64_t{7}, kb, 2 * kb + 40}) {
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " width " << width << " reduce " << reduce);
        const Operands op(rows, width, reduce, static_cast<uint32_t>(rows + width + reduce));
        std::vector<uint16_t> packed = op.Packed();
        std::vector<float> c(static_cast<size_t>(rows * width), 3.0f), c_prefetched = c;
        MoeBf16DotGemm(rows, width, reduce, op.a.data(), op.lda, Operands::Aligned(packed), c.data(),
                       width, true);
        MoeMicroPrefetch prefetch{reinterpret_cast<const char*>(elsewhere.data()), 16, 200, 1024, 3};
        MoeBf16DotGemm(rows, width, reduce, op.a.data(), op.lda, Operands::Aligned(packed),
                       c_prefetched.data(), width, true, &prefetch);
        ASSERT_EQ(c_prefetched, c);
        const int64_t blocks = ((rows + kRowBlock - 1) / kRowBlock) * ((width + nr - 1) / nr) *
                               ((reduce + kb - 1) / kb);
        if (blocks >= 22) {
          EXPECT_EQ(prefetch.row, 16);  // 16 rows x 4 lines, 3 a block
        }
        EXPECT_LE(prefetch.row, 16);
        EXPECT_GT(prefetch.row * 4 + prefetch.byte / 64, 0);
      }
    }
  }
}

}  // namespace
}  // namespace gk
