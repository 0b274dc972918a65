// gradkit's own tile GEMM (cpu/moe_grad_microkernel.h) on every SIMD target compiled in: each C
// element is exactly one multiply-add chain over k ascending (fused where the target has FMA),
// whatever the rows, columns and reduction blocks of the call; B packed from its rows and from
// its transpose's rows gives the same panels, with zeros past the width. Sizes from the kernel's
// own blocks: rows around the target's row block MoeMicroRowBlock() (every tail split), widths
// around the panel width, and reductions around kMoeMicroReduceBlock. And the choice of GEMM
// (GRADKIT_GEMM). The float32 weights-broadcast form gives the micro-kernel's chains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_info.h"
#include "core/dtype.h"
#include "core/error.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_f32bcast.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"
#include "tests/ops/op_test_support.h"

namespace gk {
namespace {

// Values of the dtype from a hash: small, of both signs, never NaN.
std::vector<uint16_t> Values(int64_t elems, DType dtype, uint32_t seed) {
  std::vector<uint16_t> out(static_cast<size_t>(elems * ElementBytes(dtype) / 2 + 1));
  for (int64_t i = 0; i < elems; ++i) {
    const uint32_t h = (static_cast<uint32_t>(i) + seed) * 2654435761u;
    StoreFromF32(out.data(), i, dtype, static_cast<float>(h % 4001) / 1000.0f - 2.0f);
  }
  return out;
}

// Whether the target's multiply-add is fused (x86: AVX2 and later; the others here are not).
bool FusedMultiplyAdd(const std::string& isa) {
  return isa != "SSE4" && isa != "SSSE3" && isa != "SSE2" && isa != "SCALAR" && isa != "EMU128";
}

// Row counts of calls: every count up to the row block plus 9 (each way a remainder of one to
// three rows joins the last full block, each tail of 4 + 3 ... 4 + 5 rows), and a few of several
// blocks, on the target selected.
std::vector<int64_t> RowCounts() {
  const int64_t block = MoeMicroRowBlock();
  std::vector<int64_t> rows;
  for (int64_t r = 1; r <= block + 9; ++r) rows.push_back(r);
  rows.push_back(2 * block + 4);
  rows.push_back(4 * block + 5);
  return rows;
}

struct Operands {
  DType dtype;
  int64_t rows, width, reduce, lda, ldb;
  std::vector<uint16_t> a, b;  // A [rows, lda], B [width, ldb] (b[n * ldb + k])
  Operands(DType dtype, int64_t rows, int64_t width, int64_t reduce, uint32_t seed)
      : dtype(dtype), rows(rows), width(width), reduce(reduce), lda(reduce + 3), ldb(reduce + 5),
        a(Values(rows * lda, dtype, seed)), b(Values(width * ldb, dtype, seed * 7 + 1)) {}
  float A(int64_t r, int64_t k) const { return LoadAsF32(a.data(), r * lda + k, dtype); }
  float B(int64_t k, int64_t n) const { return LoadAsF32(b.data(), n * ldb + k, dtype); }
  std::vector<float> Packed() const {
    std::vector<float> packed(MoeMicroPackedBytes(width, reduce) / sizeof(float), -1.0f);
    MoeMicroPackB(dtype, width, reduce, b.data(), ldb, /*kn=*/false, packed.data());
    return packed;
  }
};

class MoeMicroKernelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(SelectIsa(GetParam())); }
  void TearDown() override { SelectIsa(""); }
};

TEST_P(MoeMicroKernelTest, EachElementIsOneMultiplyAddChain) {
  const bool fused = FusedMultiplyAdd(GetParam());
  const int64_t nr = MoeMicroPanelWidth();
  const int64_t block = kMoeMicroReduceBlock;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : RowCounts()) {
      for (int64_t width : {int64_t{1}, nr - 1, nr, nr + 1, 2 * nr + 3}) {
        for (int64_t reduce : {int64_t{1}, int64_t{7}, block, block + 1, 2 * block + 40}) {
          // C's rows close together, and more than 4 KiB apart.
          for (const auto& [accumulate, ldc] : {std::pair{false, width + 5}, std::pair{true, width + 5},
                                                std::pair{true, width + 1029}}) {
            SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " rows " << rows << " width "
                                              << width << " reduce " << reduce << " accumulate "
                                              << accumulate << " ldc " << ldc);
            const Operands op(dtype, rows, width, reduce, static_cast<uint32_t>(rows * 131 + width * 7 + reduce));
            const std::vector<float> packed = op.Packed();
            std::vector<float> c(static_cast<size_t>(rows * ldc));
            for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 13) - 6.0f;
            const std::vector<float> before = c;
            std::vector<float> scratch(MoeMicroAScratchBytes(dtype, rows) / sizeof(float) + 1);
            MoeMicroGemm(dtype, rows, width, reduce, op.a.data(), op.lda, packed.data(), c.data(), ldc,
                         accumulate, scratch.data());
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t n = 0; n < ldc; ++n) {
                float want = before[r * ldc + n];
                if (n < width) {
                  float sum = accumulate ? want : 0.0f;
                  for (int64_t k = 0; k < reduce; ++k) {
                    sum = fused ? std::fma(op.A(r, k), op.B(k, n), sum) : sum + op.A(r, k) * op.B(k, n);
                  }
                  want = sum;
                }
                ASSERT_EQ(c[r * ldc + n], want) << "row " << r << " column " << n;
              }
            }
          }
        }
      }
    }
  }
}

// The reduction split by the caller (the fused op's k-blocks) gives the bits of one call: the
// second call continues the first one's chains.
TEST_P(MoeMicroKernelTest, SplitReductionContinuesTheChains) {
  const int64_t nr = MoeMicroPanelWidth();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t rows = 2 * MoeMicroRowBlock() + 1, width = 2 * nr + 1, reduce = kMoeMicroReduceBlock + 70;
    const Operands op(dtype, rows, width, reduce, 99);
    std::vector<float> scratch(MoeMicroAScratchBytes(dtype, rows) / sizeof(float) + 1);
    std::vector<float> whole(static_cast<size_t>(rows * width));
    MoeMicroGemm(dtype, rows, width, reduce, op.a.data(), op.lda, op.Packed().data(), whole.data(),
                 width, false, scratch.data());
    for (int64_t split : {int64_t{1}, int64_t{33}, kMoeMicroReduceBlock}) {
      std::vector<float> parts(whole.size());
      const int64_t elem = ElementBytes(dtype);
      std::vector<float> first(MoeMicroPackedBytes(width, split) / sizeof(float));
      std::vector<float> second(MoeMicroPackedBytes(width, reduce - split) / sizeof(float));
      MoeMicroPackB(dtype, width, split, op.b.data(), op.ldb, false, first.data());
      MoeMicroPackB(dtype, width, reduce - split, reinterpret_cast<const char*>(op.b.data()) + split * elem,
                    op.ldb, false, second.data());
      MoeMicroGemm(dtype, rows, width, split, op.a.data(), op.lda, first.data(), parts.data(), width,
                   false, scratch.data());
      MoeMicroGemm(dtype, rows, width, reduce - split,
                   reinterpret_cast<const char*>(op.a.data()) + split * elem, op.lda, second.data(),
                   parts.data(), width, true, scratch.data());
      EXPECT_EQ(parts, whole) << DTypeName(dtype) << " split at " << split;
    }
  }
}

// C's final values by non-temporal stores (stream_c) are the same bits as by plain stores, and
// no element past the width is touched: C 64-byte aligned with a row stride of whole lines (the
// streamed path, on its last k-block only), and C one vector off a line (the plain fallback).
TEST_P(MoeMicroKernelTest, StreamedCIsTheSameBits) {
  const int64_t nr = MoeMicroPanelWidth();
  const int64_t rows = 2 * MoeMicroRowBlock() + 5, width = 2 * nr + 3;
  const int64_t ldc = (width + 15) / 16 * 16 + 16;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t reduce : {int64_t{7}, kMoeMicroReduceBlock + 70}) {
      const Operands op(dtype, rows, width, reduce, static_cast<uint32_t>(reduce * 3 + 1));
      const std::vector<float> packed = op.Packed();
      std::vector<float> scratch(MoeMicroAScratchBytes(dtype, rows) / sizeof(float) + 1);
      for (int64_t offset : {int64_t{0}, int64_t{4}}) {  // floats past a 64-byte boundary
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " reduce " << reduce << " offset "
                                            << offset << " accumulate " << accumulate);
          std::vector<float> storage[2];
          float* c[2];
          for (int s = 0; s < 2; ++s) {
            storage[s].resize(static_cast<size_t>(rows * ldc + 32));
            const auto address = reinterpret_cast<uintptr_t>(storage[s].data());
            c[s] = storage[s].data() + (64 - address % 64) % 64 / sizeof(float) + offset;
            for (int64_t i = 0; i < rows * ldc; ++i) c[s][i] = static_cast<float>(i % 11) - 5.0f;
            MoeMicroGemm(dtype, rows, width, reduce, op.a.data(), op.lda, packed.data(), c[s], ldc,
                         accumulate, scratch.data(), /*stream_c=*/s == 1);
          }
          for (int64_t i = 0; i < rows * ldc; ++i) ASSERT_EQ(c[1][i], c[0][i]) << "element " << i;
        }
      }
    }
  }
}

// Lines asked for meanwhile (MoeMicroPrefetch: the next weight block's rows, here an unrelated
// buffer of 16 rows of 4 lines (200 bytes), 3 lines a register block) change no bit, and all are
// asked for once the call has run 22 register blocks: every row count of RowCounts, whole and
// narrower panels, one and several reduction blocks, A's rows kMoeMicroReduceBlock apart (the
// kernel asks inside its loop) or not (before each block), C's rows near and more than 4 KiB
// apart; none past the buffer's rows (the cursor stops at them).
TEST_P(MoeMicroKernelTest, PrefetchChangesNoBit) {
  const int64_t nr = MoeMicroPanelWidth();
  const int64_t kb = kMoeMicroReduceBlock;
  const std::vector<float> elsewhere(4096, 1.0f);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : RowCounts()) {
      for (int64_t width : {int64_t{1}, nr, 2 * nr + 3}) {
        for (int64_t reduce : {int64_t{7}, kb, 2 * kb + 40}) {
          for (int64_t ldc : {width + 5, width + 1029}) {
            SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " rows " << rows << " width "
                                              << width << " reduce " << reduce << " ldc " << ldc);
            const Operands op(dtype, rows, width, reduce, static_cast<uint32_t>(rows * 17 + width + reduce));
            // A of one full block: dense (rows kb apart); else as Operands keeps it (lda reduce + 3).
            const int64_t elem = ElementBytes(dtype);
            const int64_t lda = reduce == kb ? kb : op.lda;
            std::vector<uint16_t> a(static_cast<size_t>(rows * lda * elem / 2 + 1));
            for (int64_t r = 0; r < rows; ++r) {
              std::memcpy(reinterpret_cast<char*>(a.data()) + r * lda * elem,
                          reinterpret_cast<const char*>(op.a.data()) + r * op.lda * elem,
                          static_cast<size_t>(reduce * elem));
            }
            const std::vector<float> packed = op.Packed();
            std::vector<float> scratch(MoeMicroAScratchBytes(dtype, rows) / sizeof(float) + 1);
            std::vector<float> c(static_cast<size_t>(rows * ldc), 3.0f), c_prefetched = c;
            MoeMicroGemm(dtype, rows, width, reduce, a.data(), lda, packed.data(), c.data(), ldc,
                         /*accumulate=*/true, scratch.data());
            MoeMicroPrefetch prefetch{reinterpret_cast<const char*>(elsewhere.data()), 16, 200, 1024, 3};
            MoeMicroGemm(dtype, rows, width, reduce, a.data(), lda, packed.data(),
                         c_prefetched.data(), ldc, /*accumulate=*/true, scratch.data(), false, &prefetch);
            ASSERT_EQ(c_prefetched, c);
            const int64_t blocks = std::max<int64_t>(1, rows / MoeMicroRowBlock()) *
                                   ((width + nr - 1) / nr) * ((reduce + kb - 1) / kb);
            if (blocks >= 22) {
              EXPECT_EQ(prefetch.row, 16);  // 16 rows x 4 lines, 3 a block
            }
            EXPECT_LE(prefetch.row, 16);
            EXPECT_GT(prefetch.row * 4 + prefetch.byte / 64, 0);
          }
        }
      }
    }
  }
}

// float32 B^T's rows read in place (MoeMicroGemmKN: GroupedMatmul's [K, N] weights, nothing
// packed) give the bits of the same B packed from those rows: every row count of RowCounts,
// one to three whole panels, one and several reduction blocks, A dense in one block (the kernel's
// in-loop stream, with lines asked for) or not, B's rows just past the width or more than 4 KiB
// apart, C written or added to. A width of part of a panel is refused.
TEST_P(MoeMicroKernelTest, KNRowsReadInPlaceAreTheSameBits) {
  const int64_t nr = MoeMicroPanelWidth();
  const int64_t kb = kMoeMicroReduceBlock;
  const std::vector<float> elsewhere(4096, 1.0f);
  for (int64_t rows : RowCounts()) {
    for (int64_t width : {nr, 3 * nr}) {
      for (int64_t reduce : {int64_t{7}, kb, 2 * kb + 40}) {
        for (int64_t ld_kn : {width + 3, width + 1029}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << " width " << width << " reduce "
                                            << reduce << " ld_kn " << ld_kn);
          const int64_t lda = reduce == kb ? kb : reduce + 3;
          const std::vector<uint16_t> a16 = Values(rows * lda, DType::kF32, static_cast<uint32_t>(rows + reduce));
          const std::vector<uint16_t> kn16 =
              Values(reduce * ld_kn, DType::kF32, static_cast<uint32_t>(width * 3 + ld_kn));
          const auto* a = reinterpret_cast<const float*>(a16.data());
          const auto* kn = reinterpret_cast<const float*>(kn16.data());
          std::vector<float> packed(MoeMicroPackedBytes(width, reduce) / sizeof(float));
          MoeMicroPackB(DType::kF32, width, reduce, kn, ld_kn, /*kn=*/true, packed.data());
          const int64_t ldc = width + 5;
          for (bool accumulate : {false, true}) {
            std::vector<float> want(static_cast<size_t>(rows * ldc));
            for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i % 7) - 3.0f;
            std::vector<float> got = want;
            MoeMicroGemm(DType::kF32, rows, width, reduce, a, lda, packed.data(), want.data(), ldc,
                         accumulate, nullptr);
            MoeMicroPrefetch prefetch{reinterpret_cast<const char*>(elsewhere.data()), 16, 200, 1024, 3};
            MoeMicroGemmKN(rows, width, reduce, a, lda, kn, ld_kn, got.data(), ldc, accumulate,
                           /*stream_c=*/false, &prefetch);
            ASSERT_EQ(got, want) << "accumulate " << accumulate;
          }
        }
      }
    }
  }
  std::vector<float> c(64), b(64 * 64), a(64);
  EXPECT_THROW(MoeMicroGemmKN(1, nr + 1, 1, a.data(), 1, b.data(), 64, c.data(), 64, false),
               std::logic_error);
}

TEST_P(MoeMicroKernelTest, PackedFromRowsOrTransposeIsTheSamePanels) {
  const int64_t nr = MoeMicroPanelWidth();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t width : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, nr, nr + 3, 3 * nr - 1}) {
      for (int64_t reduce : {1, 2, 7, 8, 9, 17, 33}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " width " << width << " reduce " << reduce);
        const Operands op(dtype, 1, width, reduce, static_cast<uint32_t>(width * 5 + reduce));
        const std::vector<float> from_rows = op.Packed();
        ASSERT_EQ(static_cast<int64_t>(from_rows.size()), (width + nr - 1) / nr * nr * reduce);
        for (int64_t n = 0; n < (width + nr - 1) / nr * nr; ++n) {
          for (int64_t k = 0; k < reduce; ++k) {
            const float want = n < width ? op.B(k, n) : 0.0f;
            ASSERT_EQ(from_rows[(n / nr) * reduce * nr + k * nr + n % nr], want) << "n " << n << " k " << k;
          }
        }
        // B^T [reduce, width] with a row stride past width.
        const int64_t ld_kn = width + 2;
        std::vector<uint16_t> kn(static_cast<size_t>(reduce * ld_kn * ElementBytes(dtype) / 2 + 1));
        for (int64_t k = 0; k < reduce; ++k) {
          for (int64_t n = 0; n < width; ++n) StoreFromF32(kn.data(), k * ld_kn + n, dtype, op.B(k, n));
        }
        std::vector<float> from_kn(from_rows.size(), -1.0f);
        MoeMicroPackB(dtype, width, reduce, kn.data(), ld_kn, /*kn=*/true, from_kn.data());
        EXPECT_EQ(from_kn, from_rows);
      }
    }
  }
}

// The float32 weights-broadcast form (cpu/moe_grad_f32bcast.h) gives the micro-kernel's chains
// bit for bit, where it runs (the AVX-512 target). Sizes from its blocks: rows around the
// 16-token vector and the 48-token group (every last group of one, two or three vectors), up to
// 256 (the fused op's tile); widths around the 8-row weight block and the 16-column transposes;
// reductions around the packer's 16 and long enough to run in several chunks (at 256 rows a chunk
// holds kMoeF32BroadcastChunkBytes / 1 KiB = 640 elements); the next block named or not. Nothing
// of C's row stride past the width is written.
TEST_P(MoeMicroKernelTest, F32BroadcastFormGivesTheMicroKernelsChains) {
  if (!MoeF32BroadcastAvailable()) GTEST_SKIP() << "the float32 broadcast form runs on AVX3 only";
  const int64_t wr = kMoeF32BroadcastWeightRows, tg = kMoeF32BroadcastTokenGroup;
  const int64_t chunk_at_256 = static_cast<int64_t>(kMoeF32BroadcastChunkBytes) / (4 * 256);
  for (int64_t rows : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, tg - 1, tg, tg + 1, tg + 16,
                       2 * tg + 1, int64_t{137}, int64_t{256}}) {
    for (int64_t width : {int64_t{1}, wr - 1, wr, wr + 1, 2 * wr + 1, int64_t{64}, int64_t{65}}) {
      for (int64_t reduce : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{256}, 3 * chunk_at_256 + 17}) {
        if (reduce > 256 && rows * width > 137 * 64) continue;  // the long reduction: fewer shapes
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " width " << width << " reduce " << reduce);
        const Operands op(DType::kF32, rows, width, reduce, static_cast<uint32_t>(rows * 17 + width * 5 + reduce));
        const auto* a = reinterpret_cast<const float*>(op.a.data());
        const auto* b = reinterpret_cast<const float*>(op.b.data());
        const int64_t ldc = width + 3;
        std::vector<float> want(static_cast<size_t>(rows * ldc), -7.0f), got = want;
        const std::vector<float> packed = op.Packed();
        MoeMicroGemm(DType::kF32, rows, width, reduce, a, op.lda, packed.data(), want.data(), ldc, false, nullptr);
        std::vector<float> tokens(MoeF32TokensBytes(rows, reduce) / 4, -9.0f);
        MoeF32PackTokens(rows, reduce, a, op.lda, tokens.data());
        std::vector<float> scratch(MoeF32BroadcastScratchBytes(rows, width) / 4);
        const std::vector<uint16_t> next = Values(wr * op.ldb, DType::kF32, 5);
        MoeF32GemmBroadcastB(rows, width, reduce, tokens.data(), b, op.ldb, got.data(), ldc, scratch.data(),
                             rows % 2 == 0 ? reinterpret_cast<const float*>(next.data()) : nullptr, wr);
        ASSERT_EQ(got, want);
        for (int64_t n = 0; n < width; ++n) {
          float sum = 0.0f;
          for (int64_t k = 0; k < reduce; ++k) sum = std::fma(op.A(0, k), op.B(k, n), sum);
          ASSERT_EQ(got[static_cast<size_t>(n)], sum) << "column " << n;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, MoeMicroKernelTest, ::testing::ValuesIn(AvailableIsas()),
                         [](const auto& info) { return info.param; });

using gk::testing::EnvScope;

MoeGradShape SmallShape(DType dtype) {
  return MoeGradGatherCountShape(64, 2, 128, 4, 96, 80, dtype);
}

// auto: oneDNN exactly where it has brgemm kernels for the dtype (decided from the CPU here) and
// neither the fused op's float32 tiles (on Zen 4; on Zen 5 where they take the weights-broadcast
// form, MoeGradAsksF32Broadcast) nor its streamed bfloat16 ones (MoeGradStreamsWeights) are
// faster on gradkit's kernels on this CPU, else gradkit's, whose rows need no padding. A shape of
// short experts (streamed in bfloat16, broadcast in float32) and one of long experts in wide
// weight blocks (S1's: neither).
TEST(moe_grad_gemm, AutoTakesOneDnnWhereItHasBrgemm) {
  const EnvScope scope("GRADKIT_GEMM", "auto");
  MoeGradShape long_experts = SmallShape(DType::kF32);
  long_experts.batch = 2048, long_experts.m = long_experts.l = 4096, long_experts.k = 2048;
  long_experts.n = 1408;
  for (const MoeGradShape& base : {SmallShape(DType::kF32), long_experts}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      MoeGradShape shape = base;
      shape.dtype = dtype;
      const MoeGradMachine m = DetectMoeGradMachine(shape);
      const CpuIdentity cpu = DetectCpuIdentity();
      const bool streamed = MoeGradStreamsWeights(shape, ChooseMoeGradTiles(shape, false));
      EXPECT_EQ(streamed, dtype == DType::kBF16 && shape.m == 128) << DTypeName(dtype);
      const bool f32_broadcast = MoeGradAsksF32Broadcast(shape);
      EXPECT_EQ(f32_broadcast, dtype == DType::kF32 && shape.m == 128) << DTypeName(dtype);
      const bool own_faster = (dtype == DType::kF32 && MoeOwnF32TilesOutrunBrgemm(cpu)) ||
                              (streamed && MoeOwnStreamedBf16OnDot(cpu)) ||
                              (f32_broadcast && MoeF32BroadcastOutrunsBrgemm(cpu) && MoeF32BroadcastAvailable());
      const bool onednn = MoeGemmHasOneDnn() && gk::testing::CpuHasBrgemmFor(dtype) && !own_faster;
      EXPECT_EQ(m.gemm_backend, onednn ? "onednn" : "gradkit") << DTypeName(dtype);
      // oneDNN: any row count too, run as a whole granule's call and a short one (tail_calls),
      // where the short calls run on the same kernels (TailCallsGiveTheBitsOfPaddedRows).
      if (onednn) {
        EXPECT_TRUE(m.gemm_row_granule == 1 || m.gemm_row_granule == kMoeGradGemmRowGranule)
            << DTypeName(dtype) << " " << m.gemm_row_granule;
      } else {
        EXPECT_EQ(m.gemm_row_granule, 1) << DTypeName(dtype);
      }
    }
  }
}

// oneDNN with tail_calls: a row count off the granule runs as the granule's multiple and a
// short call, A and C advanced by the multiple's rows: every row the sum of its own A row over
// both k-blocks (the second accumulating), for both widths, nothing written past C's rows and
// width, and the same bits on a second run. (Not the bits of the padded call: with oneDNN 2.6 on
// Zen 5 a call of one row and 16 columns differed from it in the last bit.) Sizes
// from the granule: every remainder below and past one granule, and whole multiples. On float32
// brgemm (AVX-512) the short calls must be taken.
TEST(moe_grad_gemm, TailCallsRunAnyRowCount) {
  if (!MoeGemmHasOneDnn()) GTEST_SKIP() << "built without oneDNN";
  const EnvScope scope("GRADKIT_GEMM", "onednn");
  const int64_t granule = kMoeGradGemmRowGranule;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    if (!gk::testing::CpuHasBrgemmFor(dtype)) continue;
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t max_rows = 4 * granule, reduce = 48, widths[] = {32, 16};
    MoeTileGemmShape shape{};
    shape.gemm_dtype = dtype, shape.max_rows = max_rows, shape.row_granule = granule;
    shape.ldc = widths[0], shape.ldb = reduce, shape.lda = reduce;
    shape.widths = {widths[0], widths[1]};
    shape.steps = {{reduce, false}, {reduce, true}};
    shape.prepared_b = true;
    MoeTileGemmShape padded_shape = shape;
    shape.tail_calls = true;
    const auto gemm = MoeTileGemm::Create(shape), padded = MoeTileGemm::Create(padded_shape);
    ASSERT_EQ(gemm->name(), "onednn");
    EXPECT_EQ(padded->row_granule(), granule);
    if (dtype == DType::kF32) {
      EXPECT_EQ(gemm->row_granule(), 1);
    }
    if (gemm->row_granule() != 1) continue;  // short calls dropped (another implementation)
    std::vector<char> scratch(gemm->scratchpad_bytes() + 64);
    const auto worker = gemm->MakeWorker(scratch.data());
    const int64_t elem = ElementBytes(dtype);
    const std::vector<uint16_t> a = Values(2 * max_rows * reduce, dtype, 3);  // [step][row][k]
    for (const int64_t width : widths) {
      const std::vector<uint16_t> b = Values(2 * width * reduce, dtype, 5);  // [step][n][k]
      for (int64_t rows = 1; rows <= max_rows; ++rows) {
        if (rows > granule && rows % granule == 0 && rows != max_rows) continue;
        SCOPED_TRACE(::testing::Message() << "width " << width << " rows " << rows);
        const auto run = [&] {
          std::vector<float> c(static_cast<size_t>(max_rows * shape.ldc), -7.0f);
          for (int64_t step = 0; step < 2; ++step) {
            const char* a_step = reinterpret_cast<const char*>(a.data()) + step * max_rows * reduce * elem;
            const char* b_step = reinterpret_cast<const char*>(b.data()) + step * width * reduce * elem;
            worker->Run(rows, width, reduce, step > 0, a_step, worker->PrepareB(width, reduce, b_step),
                        c.data());
          }
          return c;
        };
        const std::vector<float> c = run();
        EXPECT_EQ(std::memcmp(c.data(), run().data(), c.size() * 4), 0) << "not deterministic";
        for (int64_t r = 0; r < max_rows; ++r) {
          for (int64_t n = 0; n < shape.ldc; ++n) {
            const float got = c[static_cast<size_t>(r * shape.ldc + n)];
            if (r >= rows || n >= width) {
              ASSERT_EQ(got, -7.0f) << "wrote outside C's rows and width: " << r << "," << n;
              continue;
            }
            double want = 0.0, magnitude = 0.0;
            for (int64_t step = 0; step < 2; ++step) {
              for (int64_t k = 0; k < reduce; ++k) {
                const double p = static_cast<double>(LoadAsF32(a.data(), (step * max_rows + r) * reduce + k, dtype)) *
                                 LoadAsF32(b.data(), (step * width + n) * reduce + k, dtype);
                want += p;
                magnitude += std::fabs(p);
              }
            }
            ASSERT_NEAR(got, want, 1e-6 * magnitude + 1e-6) << r << "," << n;
          }
        }
      }
    }
  }
}

// What the fused op's whole blocks rest on (MoeTileGemm::rows_independent): where a GEMM says so
// for a width, a row of C gets the bits of the full-height call whatever the call's row count
// and the rows around it, over every reduction step (the later ones accumulating). The tile GEMMs
// of fused-op shapes (the presets' widths and reductions, k-blocks, a narrow last column block)
// for every GRADKIT_GEMM choice and GEMM dtype; row counts around the register blocks and
// granules, at the top and the bottom of the tile (the GEMM's own check calls from row 0 only).
// Widths that do not say so are skipped (and counted: the narrow last blocks of 16, 32 and 88
// columns run on oneDNN 2.6's gemm:jit; oneDNN 3.7's brgemm fails the check); the own kernels say
// so for every width.
TEST(moe_grad_gemm, RowsIndependentGemmsGiveEachRowItsBits) {
  const int64_t shapes[][5] = {{4096, 2, 8, 2048, 1408}, {2048, 8, 64, 2048, 768}, {1024, 8, 60, 7168, 2048},
                               {300, 4, 3, 160, 3200}, {700, 4, 3, 600, 200}, {300, 4, 3, 272, 1408},
                               {300, 4, 3, 48, 200}};  // batch, topK, G, K, N
  int64_t checked = 0, skipped = 0;
  for (const char* choice : {"onednn", "gradkit"}) {
    const EnvScope scope("GRADKIT_GEMM", choice);
    for (const auto& [batch, top_k, g, k, n] : shapes) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        const MoeGradShape s = MoeGradGatherCountShape(batch, top_k, batch * top_k, g, k, n, dtype);
        const MoeGradGemm made = CreateMoeGradGemm(s);
        const MoeTileGemmShape& shape = made.shape;
        const MoeTileGemm& gemm = *made.gemm;
        std::vector<char> scratch(gemm.scratchpad_bytes() + 64);  // 64-byte aligned, as the workspace
        const auto worker = gemm.MakeWorker(
            scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64);
        const int64_t elem = ElementBytes(shape.gemm_dtype), max_rows = shape.max_rows;
        const int64_t granule = gemm.row_granule();
        for (const int64_t width : shape.widths) {
          SCOPED_TRACE(::testing::Message() << choice << " " << gemm.impl(width) << " " << DTypeName(dtype)
                                            << " K " << k << " N " << n << " width " << width);
          if (gemm.name() == "gradkit") {
            EXPECT_TRUE(gemm.rows_independent(width));  // one chain each
          }
          if (!gemm.rows_independent(width)) {
            ++skipped;
            continue;
          }
          std::vector<std::vector<uint16_t>> a, b;
          for (size_t step = 0; step < shape.steps.size(); ++step) {
            const int64_t reduce = shape.steps[step].reduce;
            a.push_back(Values(max_rows * shape.LdaOf(reduce), shape.gemm_dtype, 11 + static_cast<uint32_t>(step)));
            b.push_back(Values(width * shape.LdbOf(reduce), shape.gemm_dtype, 23 + static_cast<uint32_t>(step)));
          }
          const auto run = [&](int64_t r0, int64_t rows) {
            std::vector<float> c(static_cast<size_t>(max_rows * shape.ldc), -7.0f);
            for (size_t step = 0; step < shape.steps.size(); ++step) {
              const auto& [reduce, accumulate] = shape.steps[step];
              const void* packed = worker->PrepareB(width, reduce, b[step].data());
              worker->Run(rows, width, reduce, accumulate,
                          reinterpret_cast<const char*>(a[step].data()) + r0 * shape.LdaOf(reduce) * elem,
                          packed, c.data() + r0 * shape.ldc);
            }
            return c;
          };
          const std::vector<float> whole = run(0, max_rows);
          for (int64_t rows : {1, 2, 3, 5, 7, 11, 12, 13, 16, 17, 24, 31, 32, 33, 64, 100, 137, 255}) {
            rows = std::min(max_rows, (rows + granule - 1) / granule * granule);
            for (const int64_t r0 : {int64_t{0}, (max_rows - rows) / granule * granule}) {
              const std::vector<float> part = run(r0, rows);
              for (int64_t r = r0; r < r0 + rows; ++r) {
                ASSERT_EQ(std::memcmp(&part[static_cast<size_t>(r * shape.ldc)],
                                      &whole[static_cast<size_t>(r * shape.ldc)], width * sizeof(float)),
                          0)
                    << "row " << r << " of a call of " << rows << " rows from " << r0;
              }
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
  RecordProperty("widths_checked", static_cast<int>(checked));
  RecordProperty("widths_not_rows_independent", static_cast<int>(skipped));
}

// The CPUs the float32 rule names: AMD family 0x19 (Zen 4 with AVX-512; Zen 3), not Zen 5, not
// Intel, not an unknown CPU.
TEST(moe_grad_gemm, OwnFloat32TilesOnZen4Only) {
  EXPECT_TRUE(MoeOwnF32TilesOutrunBrgemm({"AuthenticAMD", 0x19, 0x11}));
  EXPECT_TRUE(MoeOwnF32TilesOutrunBrgemm({"AuthenticAMD", 0x19, 0x01}));
  EXPECT_FALSE(MoeOwnF32TilesOutrunBrgemm({"AuthenticAMD", 0x1A, 0x02}));
  EXPECT_FALSE(MoeOwnF32TilesOutrunBrgemm({"GenuineIntel", 0x6, 0x8F}));
  EXPECT_FALSE(MoeOwnF32TilesOutrunBrgemm({"", 0, 0}));
}

// The CPUs whose streamed float32 forward runs on the micro-kernel: AMD family 0x1A (Zen 5), where
// it was measured; not Zen 4, not Intel, not an unknown CPU. bfloat16 there too, where this CPU
// has the dot-product kernel.
TEST(moe_grad_gemm, OwnStreamedTilesOnZen5Only) {
  EXPECT_TRUE(MoeOwnStreamedOutrunsBrgemm({"AuthenticAMD", 0x1A, 0x02}));
  EXPECT_FALSE(MoeOwnStreamedOutrunsBrgemm({"AuthenticAMD", 0x19, 0x11}));
  EXPECT_FALSE(MoeOwnStreamedOutrunsBrgemm({"GenuineIntel", 0x6, 0x8F}));
  EXPECT_FALSE(MoeOwnStreamedOutrunsBrgemm({"", 0, 0}));
  EXPECT_EQ(MoeOwnStreamedBf16OnDot({"AuthenticAMD", 0x1A, 0x02}), MoeBf16DotAvailable());
  EXPECT_FALSE(MoeOwnStreamedBf16OnDot({"AuthenticAMD", 0x19, 0x11}));
  EXPECT_FALSE(MoeOwnStreamedBf16OnDot({"GenuineIntel", 0x6, 0x8F}));
}

// The CPUs whose fused float32 tiles take the weights-broadcast form (and the micro-kernel for the
// rest): Zen 5 and Intel's AMX Xeons, where it was measured; not Zen 4, not Intel without AMX
// (an Ice Lake server, 0x6A), not an unknown CPU.
TEST(moe_grad_gemm, F32BroadcastOnZen5AndAmxXeons) {
  EXPECT_TRUE(MoeF32BroadcastOutrunsBrgemm({"AuthenticAMD", 0x1A, 0x02}));
  EXPECT_TRUE(MoeF32BroadcastOutrunsBrgemm({"GenuineIntel", 0x6, 0x8F, /*amx_bf16=*/true}));
  EXPECT_FALSE(MoeF32BroadcastOutrunsBrgemm({"AuthenticAMD", 0x19, 0x11}));
  EXPECT_FALSE(MoeF32BroadcastOutrunsBrgemm({"GenuineIntel", 0x6, 0x8F}));
  EXPECT_FALSE(MoeF32BroadcastOutrunsBrgemm({"GenuineIntel", 0x6, 0x6A}));
  EXPECT_FALSE(MoeF32BroadcastOutrunsBrgemm({"", 0, 0}));
}

// The CPUs whose float32 forward reads [K, N] weights in place: AMD families 0x19 (Zen 4) and
// 0x1A (Zen 5), measured on both; not Intel, not an unknown CPU.
TEST(moe_grad_gemm, InPlaceKNFloat32OnZen4AndZen5) {
  EXPECT_TRUE(MoeF32InPlaceKNOutrunsPackedBrgemm({"AuthenticAMD", 0x19, 0x11}));
  EXPECT_TRUE(MoeF32InPlaceKNOutrunsPackedBrgemm({"AuthenticAMD", 0x1A, 0x02}));
  EXPECT_FALSE(MoeF32InPlaceKNOutrunsPackedBrgemm({"AuthenticAMD", 0x17, 0x31}));
  EXPECT_FALSE(MoeF32InPlaceKNOutrunsPackedBrgemm({"GenuineIntel", 0x6, 0x8F}));
  EXPECT_FALSE(MoeF32InPlaceKNOutrunsPackedBrgemm({"", 0, 0}));
}

TEST(moe_grad_gemm, EnvironmentPicksTheGemm) {
  {
    const EnvScope scope("GRADKIT_GEMM", "gradkit");
    const MoeGradMachine m = DetectMoeGradMachine(SmallShape(DType::kF32));
    EXPECT_EQ(m.gemm_backend, "gradkit");
    EXPECT_EQ(m.gemm_impls.front().second.rfind("microkernel", 0), 0u) << m.gemm_impls.front().second;
  }
  if (MoeGemmHasOneDnn()) {  // oneDNN has a float32 GEMM on every x86 CPU it runs on
    const EnvScope scope("GRADKIT_GEMM", "onednn");
    EXPECT_EQ(DetectMoeGradMachine(SmallShape(DType::kF32)).gemm_backend, "onednn");
  }
  const EnvScope scope("GRADKIT_GEMM", "fastest");
  EXPECT_THROW(DetectMoeGradMachine(SmallShape(DType::kF32)), ConfigError);
}

// The own GEMM reads A and B at any stride, B as itself or its transpose: the bits of the same
// values copied dense to the shape's strides first (what a caller of oneDNN's GEMM does). A
// reduction of two k-blocks, the second one accumulating, as the fused op's k-blocks run.
TEST(moe_grad_gemm, StridedOperandsGiveTheBytesOfDenseCopies) {
  const EnvScope scope("GRADKIT_GEMM", "gradkit");
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t rows = 2 * MoeMicroRowBlock() + 1, width = 2 * MoeMicroPanelWidth() + 3;
    const int64_t half = kMoeMicroReduceBlock + 5;  // each k-block: a reduction block and a tail
    const Operands op(dtype, rows, width, 2 * half, 11);  // A [rows, lda], B [width, ldb]
    MoeTileGemmShape shape{};
    shape.gemm_dtype = dtype, shape.max_rows = rows, shape.row_granule = 1, shape.ldc = width;
    shape.ldb = half, shape.lda = half, shape.widths = {width};
    shape.steps = {{half, false}, {half, true}};
    shape.prepared_b = true;
    const auto gemm = MoeTileGemm::Create(shape);
    ASSERT_TRUE(gemm->takes_any_stride());
    std::vector<char> scratch(gemm->scratchpad_bytes() + 64);
    const auto worker = gemm->MakeWorker(scratch.data());
    const int64_t elem = ElementBytes(dtype);
    const auto* a = reinterpret_cast<const char*>(op.a.data());
    const auto* b = reinterpret_cast<const char*>(op.b.data());
    // B^T [2 * half, width] with a row stride past the width.
    const int64_t ld_kn = width + 4;
    std::vector<uint16_t> kn(static_cast<size_t>(2 * half * ld_kn * elem / 2 + 1));
    for (int64_t k = 0; k < 2 * half; ++k) {
      for (int64_t n = 0; n < width; ++n) StoreFromF32(kn.data(), k * ld_kn + n, dtype, op.B(k, n));
    }
    std::vector<float> dense(static_cast<size_t>(rows * width)), strided = dense, from_kn = dense;
    for (int64_t step = 0; step < 2; ++step) {
      const int64_t k0 = step * half;
      std::vector<char> a_copy(static_cast<size_t>(rows * half * elem));
      std::vector<char> b_copy(static_cast<size_t>(width * half * elem));
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(&a_copy[r * half * elem], a + (r * op.lda + k0) * elem, half * elem);
      }
      for (int64_t n = 0; n < width; ++n) {
        std::memcpy(&b_copy[n * half * elem], b + (n * op.ldb + k0) * elem, half * elem);
      }
      const void* packed = worker->PrepareB(width, half, b_copy.data());
      worker->Run(rows, width, half, step > 0, a_copy.data(), packed, dense.data());
      packed = worker->PrepareBStrided(width, half, b + k0 * elem, op.ldb, /*kn=*/false);
      worker->RunStrided(rows, width, half, step > 0, a + k0 * elem, op.lda, packed, strided.data());
      packed = worker->PrepareBStrided(width, half, reinterpret_cast<const char*>(kn.data()) +
                                                        k0 * ld_kn * elem, ld_kn, /*kn=*/true);
      worker->RunStrided(rows, width, half, step > 0, a + k0 * elem, op.lda, packed, from_kn.data());
    }
    EXPECT_EQ(std::memcmp(dense.data(), strided.data(), dense.size() * 4), 0);
    EXPECT_EQ(std::memcmp(dense.data(), from_kn.data(), dense.size() * 4), 0);
  }
  if (MoeGemmHasOneDnn()) {  // oneDNN's kernels are made for the shape's strides: refused
    const EnvScope onednn("GRADKIT_GEMM", "onednn");
    MoeTileGemmShape shape{};
    shape.gemm_dtype = DType::kF32, shape.max_rows = 16, shape.row_granule = 16, shape.ldc = 16;
    shape.ldb = 32, shape.lda = 32, shape.widths = {16}, shape.steps = {{32, false}};
    const auto gemm = MoeTileGemm::Create(shape);
    EXPECT_FALSE(gemm->takes_any_stride());
    std::vector<char> scratch(gemm->scratchpad_bytes() + 64);
    const auto worker = gemm->MakeWorker(scratch.data());
    std::vector<float> a(16 * 40), b(16 * 40), c(16 * 16);
    EXPECT_THROW(worker->RunStrided(16, 16, 32, false, a.data(), 40, b.data(), c.data()),
                 std::logic_error);
  }
}

// Through the C API a bad value is the caller's error, named, found in phase 1.
TEST(moe_grad_gemm, BadEnvironmentValueFailsPhaseOne) {
  const EnvScope scope("GRADKIT_GEMM", "fastest");
  std::vector<float> dy(4 * 8), w(2 * 8 * 8), dx(2 * 8);
  std::vector<int64_t> idx = {0, 1, 2, 3}, groups = {2, 2};
  using gk::testing::TensorGuard;
  const TensorGuard dy_t({4, 8}, DType::kF32, dy.data()), w_t({2, 8, 8}, DType::kF32, w.data());
  const TensorGuard idx_t({4}, DType::kI64, idx.data()), groups_t({2}, DType::kI64, groups.data());
  const TensorGuard dx_t({2, 8}, DType::kF32, dx.data());
  uint64_t workspace = 0;
  gkOpExecutor* executor = nullptr;
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(dy_t.t, w_t.t, idx_t.t,
                                                              groups_t.t, 2, 2, GK_ROW_IDX_GATHER,
                                                              GK_GROUP_LIST_COUNT, dx_t.t,
                                                              &workspace, &executor),
            GK_ERROR_PARAM_INVALID);
  EXPECT_EQ(executor, nullptr);
  const std::string message = gkGetRecentErrMsg();
  EXPECT_NE(message.find("GRADKIT_GEMM"), std::string::npos) << message;
  EXPECT_NE(message.find("fastest"), std::string::npos) << message;
}

}  // namespace
}  // namespace gk
