// GroupedMatmul(WeightGrad) kernels on every SIMD target compiled in, against element-by-element
// definitions: the transposed weight block (the values of the fused op's MoeTransposeWeightBlock),
// the transposed row gather with its zero padding, and the rounding store (plain and streamed). Sizes around the
// register blocks (4 and 8 rows, 8 columns), so that every edge path runs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/cpu/stream_copy.h"
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

// The fused op's scatter of a tile into gradX (MoeAddRowsF32): each row added, in row order, to
// its gradX row, one float32 addition per element, on every target: rows around the prefetch
// distance, widths inside one vector and past it, two rows into one gradX row (a token twice on
// one expert), gradX's other rows and the elements past n untouched.
TEST_F(grouped_matmul_kernels, AddRowsAddsEachRowInOrder) {
  Run([] {
    std::mt19937 generator(11);
    std::uniform_real_distribution<float> real(-4.0f, 4.0f);
    constexpr int64_t kTokens = 9, kLd = 80, kLdSrc = 72;
    for (int64_t rows : {1, 3, 4, 5, 9, 13}) {
      for (int64_t n : {1, 15, 16, 17, 64, 70}) {
        std::vector<float> dx(static_cast<size_t>(kTokens * kLd)), src(static_cast<size_t>(rows * kLdSrc));
        for (float& v : dx) v = real(generator);
        for (float& v : src) v = real(generator);
        std::vector<float*> dst(static_cast<size_t>(rows));
        std::vector<float> want = dx;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t token = ((r == 3 ? 2 : r) * 5 + 3) % kTokens;  // rows 2 and 3: one token
          dst[r] = dx.data() + token * kLd;
          for (int64_t j = 0; j < n; ++j) want[token * kLd + j] += src[r * kLdSrc + j];
        }
        MoeAddRowsF32(dst.data(), src.data(), kLdSrc, rows, n);
        ASSERT_EQ(std::memcmp(dx.data(), want.data(), dx.size() * sizeof(float)), 0)
            << "rows " << rows << " n " << n;
      }
    }
  });
}

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

// Streams `run` to a buffer `offset` bytes past a 64-byte boundary, guard bytes around it:
// exactly `want` lands there and no guard byte changes.
void ExpectStreamedBytes(const float* src, const GroupedMatmulTileRun& run, DType dtype,
                         int64_t offset, const std::vector<uint8_t>& want) {
  std::vector<uint8_t> storage(want.size() + 256, 0xA5);
  const auto base = reinterpret_cast<uintptr_t>(storage.data());
  const size_t start = (64 - base % 64) % 64 + static_cast<size_t>(offset);
  GroupedMatmulStreamTiles(src, run, storage.data() + start, dtype);
  FlushStreamingStores();
  ASSERT_EQ(std::memcmp(storage.data() + start, want.data(), want.size()), 0);
  for (size_t i = 0; i < storage.size(); ++i) {
    if (i < start || i >= start + want.size()) {
      ASSERT_EQ(storage[i], 0xA5) << "byte " << i;
    }
  }
}

// The streaming store writes StoreRow's bytes whatever dst's alignment (heads of 0..63 bytes
// before the first cache line, 16-bit ones included) and length (under one pair of vectors,
// across several, ending inside one), and nothing outside [dst, dst + n).
TEST_F(grouped_matmul_kernels, StreamRowWritesTheStoredBytes) {
  Run([] {
    std::mt19937 generator(5);
    std::uniform_real_distribution<float> real(-1e4f, 1e4f);
    for (DType dtype : kDTypes) {
      const int64_t elem = ElementBytes(dtype);
      for (int64_t offset = 0; offset < 64; offset += elem) {
        for (int64_t n : {1, 15, 31, 32, 33, 64, 100, 257}) {
          std::vector<float> src(static_cast<size_t>(n));
          for (float& v : src) v = real(generator);
          std::vector<uint8_t> want(static_cast<size_t>(n * elem));
          GroupedMatmulStoreRow(src.data(), want.data(), dtype, n);
          SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " offset " << offset << " n " << n);
          ExpectStreamedBytes(src.data(), GroupedMatmulTileRun{1, n, 1, 0, 0, n, 0}, dtype, offset, want);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  });
}

// A run across tiles (GroupedMatmulStreamTiles: the weight grad's unit of K blocks x column
// blocks) writes, in order, the stored bytes of the values its layout names, whatever dst's
// alignment: rows across blocks of rows_per_block (the last block short), pieces of piece_cols
// with a narrower last one, runs of one row; pieces narrower than a pair of vectors and wider.
// Nothing outside the run is written.
TEST_F(grouped_matmul_kernels, StreamTilesWritesTheRunInOrder) {
  Run([] {
    std::mt19937 generator(7);
    std::uniform_real_distribution<float> real(-1e4f, 1e4f);
    struct Case {
      int64_t rows, rows_per_block, piece_cols, pieces, last_cols;
    };
    for (const Case c : {Case{37, 16, 24, 3, 10}, Case{1, 16, 256, 8, 256}, Case{5, 2, 48, 2, 48},
                         Case{9, 4, 7, 4, 3}, Case{3, 3, 40, 1, 33}}) {
      const int64_t row_cols = (c.pieces - 1) * c.piece_cols + c.last_cols;
      const int64_t tile_elems = c.rows_per_block * c.piece_cols;  // one [rows_per_block, piece_cols] tile
      const int64_t blocks = (c.rows + c.rows_per_block - 1) / c.rows_per_block;
      std::vector<float> tiles(static_cast<size_t>(blocks * c.pieces * tile_elems));
      for (float& v : tiles) v = real(generator);
      const GroupedMatmulTileRun run{c.rows, row_cols, c.rows_per_block, c.pieces * tile_elems,
                                     c.piece_cols, c.piece_cols, tile_elems};
      for (DType dtype : kDTypes) {
        const int64_t elem = ElementBytes(dtype);
        // The run's values in order, stored one by one.
        const size_t bytes = static_cast<size_t>(c.rows * row_cols * elem);
        std::vector<uint8_t> want(bytes);
        for (int64_t r = 0; r < c.rows; ++r) {
          for (int64_t col = 0; col < row_cols; ++col) {
            const float v = tiles[static_cast<size_t>((r / c.rows_per_block * c.pieces + col / c.piece_cols) *
                                                          tile_elems +
                                                      r % c.rows_per_block * c.piece_cols + col % c.piece_cols)];
            StoreFromF32(want.data(), r * row_cols + col, dtype, v);
          }
        }
        for (int64_t offset = 0; offset < 64; offset += elem) {
          SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " offset " << offset << " rows "
                                            << c.rows << " pieces " << c.pieces << " x " << c.piece_cols);
          ExpectStreamedBytes(tiles.data(), run, dtype, offset, want);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  });
}

// MoePackB (B packed once into oneDNN's blocked layout) against the layout's formula, element by
// element, padding included: both dtypes' words (float32, bfloat16 pairs), B given as columns'
// rows or as its transpose's rows, blocks visited k first (BA) and n first (AB), and sizes that
// end inside a block, inside a pair, inside a gathered vector of 8 columns and inside a step of
// the 8 x 8 register transpose (8 words of 8 columns).
TEST_F(grouped_matmul_kernels, PackBWritesTheBlockedLayout) {
  Run([] {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const int64_t elem = ElementBytes(dtype), pair = 4 / elem;
      for (int64_t n_block : {16, 64}) {
        for (bool k_outer_inner : {true, false}) {
          for (int64_t width : {1, 7, 8, 9, 16, 64, 70}) {
            for (int64_t reduce : {1, 2, 3, 31, 32, 33, 65}) {
              for (bool kn : {false, true}) {
                MoeBlockedB layout{};
                layout.pair = pair;
                layout.k_block = 16 * pair;
                layout.n_block = n_block;
                layout.padded_reduce = (reduce + layout.k_block - 1) / layout.k_block * layout.k_block;
                layout.padded_width = (width + n_block - 1) / n_block * n_block;
                const int64_t block = layout.k_block * n_block;
                layout.k_stride = k_outer_inner ? block : layout.padded_width / n_block * block;
                layout.n_stride = k_outer_inner ? layout.padded_reduce / layout.k_block * block : block;
                const int64_t ldb = (kn ? width : reduce) + 3;
                const auto b = RandomValues((kn ? reduce : width) * ldb, dtype,
                                            static_cast<uint32_t>(width * 97 + reduce * 5 + kn));
                std::vector<uint8_t> got(static_cast<size_t>(layout.Elements() * elem), 0xAB);
                MoePackB(dtype, layout, width, reduce, b.data(), ldb, kn, got.data());
                for (int64_t k = 0; k < layout.padded_reduce; ++k) {
                  for (int64_t n = 0; n < layout.padded_width; ++n) {
                    const int64_t at = k / layout.k_block * layout.k_stride + n / n_block * layout.n_stride +
                                       k % layout.k_block / pair * n_block * pair + n % n_block * pair + k % pair;
                    std::vector<uint8_t> want(static_cast<size_t>(elem), 0);
                    if (k < reduce && n < width) {
                      std::memcpy(want.data(), b.data() + (kn ? k * ldb + n : n * ldb + k) * elem, want.size());
                    }
                    ASSERT_EQ(std::memcmp(got.data() + at * elem, want.data(), want.size()), 0)
                        << DTypeName(dtype) << " n_block " << n_block << (k_outer_inner ? " BA" : " AB")
                        << " width " << width << " reduce " << reduce << (kn ? " kn" : "") << " at k "
                        << k << ", n " << n;
                  }
                }
              }
            }
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace gk
