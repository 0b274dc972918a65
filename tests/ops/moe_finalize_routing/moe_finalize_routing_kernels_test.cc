// MoeFinalizeRouting's kernels with non-temporal stores write the bytes of the plain ones:
// every SIMD target, every (y, out / gradOut, gradExpandedY) dtype, slot counts, widths with and
// without a one-vector step (48, 112: on 16-lane targets too) and a scalar tail, output rows on
// a cache line (streamed) and not (plain stores);
// and the plans stream exactly when the bytes moved outgrow the last-level cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/stream_copy.h"
#include "core/cpu_info.h"
#include "core/dtype.h"
#include "ops/moe_finalize_routing/cpu/moe_finalize_routing_kernels.h"
#include "ops/moe_finalize_routing/moe_finalize_routing_plan.h"
#include "ops/moe_init_routing/moe_init_routing_plan.h"

namespace gk {
namespace {

constexpr int64_t kRowStride = 512;  // elements between rows: 64-byte aligned for every dtype
constexpr DType kFloats[] = {DType::kF32, DType::kF16, DType::kBF16};

// Rows of `dtype` values from a hash (never NaN), `rows` of kRowStride elements, 64-aligned.
struct Rows {
  Rows(DType dtype, int64_t rows, uint32_t seed)
      : dtype(dtype), rows(rows), storage(rows * kRowStride * 4 + 64) {
    for (int64_t i = 0; i < rows * kRowStride; ++i) {
      const uint32_t h = (static_cast<uint32_t>(i) + seed) * 2654435761u;
      StoreFromF32(base(), i, dtype, static_cast<float>(h % 2001) / 1000.0f - 1.0f);
    }
  }
  char* base() {
    const auto p = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + (64 - p % 64) % 64;
  }
  char* row(int64_t r, int64_t offset = 0) {
    return base() + (r * kRowStride + offset) * ElementBytes(dtype);
  }
  // Every byte of the rows (the allocations' alignment padding left out).
  bool operator==(Rows& other) {
    return rows == other.rows && dtype == other.dtype &&
           std::memcmp(base(), other.base(), rows * kRowStride * ElementBytes(dtype)) == 0;
  }
  DType dtype;
  int64_t rows;
  std::vector<char> storage;
};

class MoeFinalizeKernelsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(SelectIsa(GetParam())); }
  void TearDown() override { SelectIsa(""); }
};

TEST_P(MoeFinalizeKernelsTest, StreamedGradSlotsWriteThePlainBytes) {
  for (DType y_dtype : kFloats) {
    for (DType gy_dtype : {DType::kF32, y_dtype}) {
      for (DType g_dtype : {DType::kF32, y_dtype}) {
        for (int64_t count = 1; count <= kMoeFinalizeBackwardSlots; ++count) {
          for (int64_t n : {1, 7, 48, 64, 112, 200, 333}) {
            // Elements the grad_y rows start past a cache line (32: on the next line,
            // streamed; 1, 3: mid-line, plain stores); -1: row s at s elements (only row 0 on a
            // line: plain stores).
            for (int64_t offset : {0, 1, 3, 32, -1}) {
              Rows y(y_dtype, count, 1), g(g_dtype, 1, 2);
              Rows plain(gy_dtype, count, 3), streamed(gy_dtype, count, 3);
              const void* y_rows[4];
              void* plain_rows[4];
              void* streamed_rows[4];
              float probs[4], plain_probs[4], streamed_probs[4];
              for (int64_t s = 0; s < count; ++s) {
                y_rows[s] = y.row(s);
                const int64_t row_offset = offset >= 0 ? offset : s;
                plain_rows[s] = plain.row(s, row_offset);
                streamed_rows[s] = streamed.row(s, row_offset);
                probs[s] = 0.25f * static_cast<float>(s + 1);
              }
              MoeFinalizeGradArgs args{g_dtype, g.row(0), y_dtype, y_rows, probs, count, n,
                                       gy_dtype, plain_rows, plain_probs};
              MoeFinalizeGradSlots(args);
              args.grad_y_rows = streamed_rows;
              args.grad_probs = streamed_probs;
              args.stream = true;
              MoeFinalizeGradSlots(args);
              FlushStreamingStores();
              const std::string what = GetParam() + " y " + std::string(DTypeName(y_dtype)) +
                                       ", gradY " + std::string(DTypeName(gy_dtype)) + ", count " +
                                       std::to_string(count) + ", n " + std::to_string(n) +
                                       ", offset " + std::to_string(offset);
              ASSERT_TRUE(plain == streamed) << what;
              ASSERT_EQ(0, std::memcmp(plain_probs, streamed_probs, count * sizeof(float)))
                  << what;
            }
          }
        }
      }
    }
  }
}

TEST_P(MoeFinalizeKernelsTest, StreamedWeightedSumWritesThePlainBytes) {
  for (DType y_dtype : kFloats) {
    for (DType out_dtype : {DType::kF32, y_dtype}) {
      for (int64_t count : {int64_t{1}, int64_t{3}, kMoeFinalizeForwardSlots}) {
        for (int64_t n : {1, 7, 48, 64, 112, 200, 333}) {
          for (int64_t offset : {0, 1, 3, 32}) {  // elements past a cache line
            Rows y(y_dtype, count, 4), plain(out_dtype, 1, 5), streamed(out_dtype, 1, 5);
            std::vector<const void*> rows(count);
            std::vector<float> probs(count), acc(n);
            for (int64_t s = 0; s < count; ++s) {
              rows[s] = y.row(s);
              probs[s] = 0.5f - 0.125f * static_cast<float>(s);
            }
            MoeFinalizeSumArgs args{y_dtype, rows.data(), probs.data(), count, n, nullptr,
                                    acc.data(), out_dtype, plain.row(0, offset)};
            MoeFinalizeWeightedSum(args);
            args.out = streamed.row(0, offset);
            args.stream = true;
            MoeFinalizeWeightedSum(args);
            FlushStreamingStores();
            ASSERT_TRUE(plain == streamed)
                << GetParam() << " y " << DTypeName(y_dtype) << ", out " << DTypeName(out_dtype)
                << ", count " << count << ", n " << n << ", offset " << offset;
          }
        }
      }
    }
  }
}

// Each output element is its products, each rounded to float32, added in slot order from 0,
// then rounded once to the output dtype, whatever step (four, two, one vector, scalar tail)
// covers its column: random values, where another order or a fused multiply-add shows.
TEST_P(MoeFinalizeKernelsTest, WeightedSumIsProductsAddedInSlotOrder) {
  for (DType y_dtype : kFloats) {
    for (int64_t count : {int64_t{1}, int64_t{2}, int64_t{8}, kMoeFinalizeForwardSlots}) {
      for (int64_t n : {1, 9, 31, 33, 64, 100, 129, 333}) {
        Rows y(y_dtype, count, 7);
        std::vector<const void*> rows(count);
        std::vector<float> probs(count), out(n);
        for (int64_t s = 0; s < count; ++s) {
          rows[s] = y.row(s);
          probs[s] = 0.3f + 0.0173f * static_cast<float>(s * s) - 0.07f * static_cast<float>(s);
        }
        MoeFinalizeSumArgs args{y_dtype, rows.data(), probs.data(), count, n, nullptr,
                                nullptr, DType::kF32, out.data()};
        MoeFinalizeWeightedSum(args);
        for (int64_t j = 0; j < n; ++j) {
          float want = 0.0f;
          for (int64_t s = 0; s < count; ++s) {
            volatile float product = probs[s] * LoadAsF32(rows[s], j, y_dtype);  // no contraction
            want = want + product;
          }
          ASSERT_EQ(F32Bits(out[j]), F32Bits(want))
              << GetParam() << " y " << DTypeName(y_dtype) << ", count " << count << ", n " << n
              << ", column " << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, MoeFinalizeKernelsTest, ::testing::ValuesIn(AvailableIsas()),
                         [](const auto& info) { return info.param; });

// The rule, from the plans' own byte counts: S1 (batch 4096, topK 2, H 2048) in float32 moves
// 96 MiB (forward) and 160 MiB (backward); a batch of 64 moves 1.5 / 2.5 MiB.
TEST(moe_finalize_routing_plan, StreamsOncePastTheLastLevelCache) {
  for (bool backward : {false, true}) {
    MoeFinalizeShape s{};
    s.backward = backward;
    s.top_k = 2;
    s.n = 2048;
    s.dtype = s.token_dtype = s.grad_y_dtype = DType::kF32;
    s.batch = 4096;
    s.m = 8192;
    EXPECT_TRUE(MakeMoeFinalizePlan(s, 2, 32 << 20).streaming_stores) << backward;
    EXPECT_FALSE(MakeMoeFinalizePlan(s, 2, int64_t{1} << 30).streaming_stores) << backward;
    s.batch = 64;
    s.m = 128;
    EXPECT_FALSE(MakeMoeFinalizePlan(s, 2, 32 << 20).streaming_stores) << backward;
  }
}

TEST(moe_init_routing_plan, StreamsOncePastTheLastLevelCache) {
  MoeInitRoutingShape s{};
  s.batch = 4096;
  s.top_k = 2;
  s.h = 2048;
  s.g = 8;
  s.rows = 8192;
  s.dtype = DType::kF32;
  s.expand_x = true;  // 8192 rows of 8 KiB, read and written: 128 MiB
  EXPECT_TRUE(MakeMoeInitRoutingPlan(s, 2, 32 << 20).streaming_stores);
  EXPECT_FALSE(MakeMoeInitRoutingPlan(s, 2, int64_t{1} << 30).streaming_stores);
  s.expand_x = false;  // index-only routing copies no row
  EXPECT_FALSE(MakeMoeInitRoutingPlan(s, 2, 32 << 20).streaming_stores);
}

}  // namespace
}  // namespace gk
