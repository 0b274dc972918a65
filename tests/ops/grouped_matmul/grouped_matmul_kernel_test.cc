// GroupedMatmul(WeightGrad) kernels on every SIMD target compiled in, against element-by-element
// definitions: the transposed weight block (the values of the fused op's MoeTransposeWeightBlock),
// the transposed row gather with its zero padding, and the rounding store. Sizes around the
// register blocks (4 and 8 rows, 8 columns), so that every edge path runs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/cpu_info.h"
#include "core/dtype.h"
#include "ops/grouped_matmul/cpu/grouped_matmul_kernels.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.h"

namespace gk {
namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Random bits of valid finite values of the dtype.
std::vector<uint8_t> RandomValues(int64_t elems, DType dtype, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> real(-4.0f, 4.0f);
  std::vector<uint8_t> out(static_cast<size_t>(elems * ElementBytes(dtype)));
  for (int64_t i = 0; i < elems; ++i) StoreFromF32(out.data(), i, dtype, real(generator));
  return out;
}

class ForEachIsa : public ::testing::Test {
 protected:
  template <class Body>
  void Run(Body body) {
    for (const std::string& isa : AvailableIsas()) {
      SCOPED_TRACE(isa);
      ASSERT_TRUE(SelectIsa(isa));
      body();
    }
    SelectIsa("");
  }
};

using grouped_matmul_kernels = ForEachIsa;

TEST_F(grouped_matmul_kernels, TransposeBlockMatchesTheFusedOpsCopy) {
  Run([] {
    for (DType dtype : kDTypes) {
      const int64_t gemm_elem = dtype == DType::kBF16 ? 2 : 4;
      for (int64_t reduce : {1, 3, 4, 5, 8, 9, 17}) {
        for (int64_t cols : {1, 7, 8, 9, 16, 23}) {
          const int64_t ld_src = cols + 3, ld_dst = reduce + 2;
          const auto src = RandomValues(reduce * ld_src, dtype, static_cast<uint32_t>(reduce * 31 + cols));
          std::vector<uint8_t> got(static_cast<size_t>(cols * ld_dst * gemm_elem), 0xAB);
          std::vector<uint8_t> want = got;
          GroupedMatmulTransposeBlock(dtype, src.data(), ld_src, reduce, cols, got.data(), ld_dst);
          MoeTransposeWeightBlock(dtype, src.data(), ld_src, reduce, cols, want.data(), ld_dst);
          ASSERT_EQ(got, want) << DTypeName(dtype) << " reduce " << reduce << " cols " << cols;
        }
      }
    }
  });
}

TEST_F(grouped_matmul_kernels, TransposeRowsGathersAndPads) {
  Run([] {
    for (DType dtype : kDTypes) {
      const int64_t elem = ElementBytes(dtype), gemm_elem = dtype == DType::kBF16 ? 2 : 4;
      for (int64_t rows : {1, 3, 4, 7, 8, 9, 20}) {
        for (int64_t cols : {1, 7, 8, 9, 24, 30}) {
          const int64_t ld_dst = rows + 5, table_rows = 40, width = cols + 4;
          const auto table = RandomValues(table_rows * width, dtype, static_cast<uint32_t>(rows * 7 + cols));
          std::vector<const void*> row_ptrs;
          std::vector<int64_t> picks;
          for (int64_t r = 0; r < rows; ++r) {
            picks.push_back((r * 13 + 5) % table_rows);  // any rows, repeats allowed
            row_ptrs.push_back(table.data() + (picks.back() * width + 2) * elem);
          }
          std::vector<uint8_t> got(static_cast<size_t>(cols * ld_dst * gemm_elem), 0xCD);
          GroupedMatmulTransposeRows(dtype, row_ptrs.data(), rows, cols, got.data(), ld_dst);
          for (int64_t c = 0; c < cols; ++c) {
            for (int64_t r = 0; r < ld_dst; ++r) {
              const int64_t at = c * ld_dst + r;
              const float value = dtype == DType::kBF16 ? F32FromBf16(reinterpret_cast<uint16_t*>(got.data())[at])
                                                        : reinterpret_cast<float*>(got.data())[at];
              const float want = r < rows ? LoadAsF32(table.data(), picks[r] * width + 2 + c, dtype) : 0.0f;
              ASSERT_EQ(F32Bits(value), F32Bits(want))
                  << DTypeName(dtype) << " rows " << rows << " cols " << cols << " at " << c << ", " << r;
            }
          }
        }
      }
    }
  });
}

TEST_F(grouped_matmul_kernels, StoreRowRoundsOnceToNearestEven) {
  Run([] {
    std::mt19937 generator(3);
    std::uniform_real_distribution<float> real(-1e4f, 1e4f);
    for (int64_t n : {1, 7, 16, 33, 100}) {
      std::vector<float> src(static_cast<size_t>(n));
      for (float& v : src) v = real(generator);
      src[0] = 1.0f + 1.0f / 512;  // a bfloat16 tie: rounds to even (1.0)
      for (DType dtype : kDTypes) {
        std::vector<uint8_t> got(static_cast<size_t>(n * ElementBytes(dtype)));
        GroupedMatmulStoreRow(src.data(), got.data(), dtype, n);
        for (int64_t j = 0; j < n; ++j) {
          std::vector<uint8_t> want(static_cast<size_t>(ElementBytes(dtype)));
          StoreFromF32(want.data(), 0, dtype, src[j]);
          ASSERT_EQ(std::memcmp(got.data() + j * ElementBytes(dtype), want.data(), want.size()), 0)
              << DTypeName(dtype) << " n " << n << " at " << j;
        }
      }
    }
  });
}

}  // namespace
}  // namespace gk
