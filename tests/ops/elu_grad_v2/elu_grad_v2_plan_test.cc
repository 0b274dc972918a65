// The plan: mode selection rules, the share split and the tile, as plain data.
#include "ops/elu_grad_v2/elu_grad_v2_plan.h"

#include <gtest/gtest.h>

#include "ops/elu_grad_v2/elu_grad_v2_layout.h"

namespace gk {
namespace {

constexpr EluGradV2Machine kMachine{4, 48 * 1024, 8 * 1024 * 1024};

EluGradV2Problem Problem(int64_t elems, DType in, bool is_result, bool contiguous = true,
                         DType out = DType::kF32) {
  return {elems, in, in == DType::kF32 ? DType::kF32 : out, is_result, contiguous,
          FoldEluGradV2Coefficients(1.0, 1.0, 1.0)};
}

TEST(EluGradV2Plan, ModeSelectionRules) {
  struct Case {
    EluGradV2Problem problem;
    EluGradV2Mode mode;
  };
  const int64_t big = 1 << 20;
  const Case cases[] = {
      {Problem(big, DType::kF32, false), EluGradV2Mode::kSafeExp},
      {Problem(big, DType::kF32, true), EluGradV2Mode::kSafeResult},
      {Problem(100, DType::kF32, false), EluGradV2Mode::kSingleTileExp},
      {Problem(100, DType::kBF16, true), EluGradV2Mode::kSingleTileResult},
      {Problem(big, DType::kBF16, false), EluGradV2Mode::kMixedExpFast},
      {Problem(big, DType::kBF16, true, true, DType::kBF16), EluGradV2Mode::kMixedResultFast},
      {Problem(big, DType::kF16, false, true, DType::kF16), EluGradV2Mode::kFloat16ExpFast},
      {Problem(big, DType::kF16, true), EluGradV2Mode::kFloat16ResultFast},
      // Strided views take the SAFE path whatever their dtype or size.
      {Problem(big, DType::kF16, false, false), EluGradV2Mode::kSafeExp},
      {Problem(10, DType::kBF16, true, false), EluGradV2Mode::kSafeResult},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(EluGradV2ModeName(MakeEluGradV2Plan(c.problem, kMachine).mode),
              EluGradV2ModeName(c.mode))
        << "elems " << c.problem.elems << " dtype " << DTypeName(c.problem.input_dtype);
  }
}

TEST(EluGradV2Plan, SingleTileBoundaryIsTheTile) {
  const int64_t tile = MakeEluGradV2Plan(Problem(1 << 20, DType::kF32, false), kMachine).tile_elems;
  EXPECT_EQ(MakeEluGradV2Plan(Problem(tile, DType::kF32, false), kMachine).mode,
            EluGradV2Mode::kSingleTileExp);
  EXPECT_EQ(MakeEluGradV2Plan(Problem(tile + 1, DType::kF32, false), kMachine).mode,
            EluGradV2Mode::kSafeExp);
}

TEST(EluGradV2Plan, SharesCoverTheTensorOnBlockBoundaries) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t elems : {int64_t{1}, int64_t{63}, int64_t{4097}, int64_t{100000},
                          int64_t{1} << 20, (int64_t{1} << 24) + 77}) {
      for (int32_t threads : {1, 2, 3, 7}) {
        const EluGradV2Machine machine{threads, 32 * 1024, 1 << 20};
        const auto plan = MakeEluGradV2Plan(Problem(elems, dtype, false), machine);
        ASSERT_GE(plan.threads, 1);
        ASSERT_LE(plan.threads, threads);
        EXPECT_EQ(plan.block_elems * ElementBytes(dtype), kEluGradV2BlockBytes);
        EXPECT_EQ(plan.tile_elems % plan.block_elems, 0);
        int64_t covered = 0;
        for (int32_t s = 0; s < plan.threads; ++s) {
          EXPECT_EQ(plan.ShareBegin(s), covered) << "share " << s;
          EXPECT_EQ(plan.ShareBegin(s) % plan.block_elems, 0) << "share " << s;
          EXPECT_GT(plan.ShareElems(s), 0) << "share " << s;
          covered += plan.ShareElems(s);
        }
        EXPECT_EQ(covered, elems) << DTypeName(dtype) << " elems " << elems << " threads " << threads;
        EXPECT_LE(plan.big_share_elems - plan.small_share_elems, plan.block_elems);
      }
    }
  }
}

TEST(EluGradV2Plan, SmallWorkUsesFewThreads) {
  const auto plan = MakeEluGradV2Plan(Problem(8192, DType::kF32, false), kMachine);
  EXPECT_EQ(plan.threads, 1);  // 32 KiB of input is not worth a second thread
  // Nor 64 K elements (measured slower on two threads than on one).
  EXPECT_EQ(MakeEluGradV2Plan(Problem(1 << 16, DType::kF32, false), kMachine).threads, 1);
  EXPECT_EQ(MakeEluGradV2Plan(Problem(1 << 16, DType::kBF16, false), kMachine).threads, 1);
  EXPECT_EQ(MakeEluGradV2Plan(Problem(kEluGradV2MinShareBytes / 4 * 2, DType::kF32, false),
                              kMachine).threads, 2);
  EXPECT_EQ(MakeEluGradV2Plan(Problem(1 << 22, DType::kF32, false), kMachine).threads, 4);
}

TEST(EluGradV2Plan, WorkspaceOnlyForGatheredStridedViews) {
  EXPECT_EQ(MakeEluGradV2Plan(Problem(1 << 20, DType::kBF16, false), kMachine).workspace_bytes, 0u);
  // Rows long enough run in place: no scratch.
  auto rows = Problem(1 << 20, DType::kBF16, false, false);
  rows.row_elems = kEluGradV2MinRowElems;
  const auto in_place = MakeEluGradV2Plan(rows, kMachine);
  EXPECT_FALSE(in_place.gather);
  EXPECT_EQ(in_place.workspace_bytes, 0u);
  // Shorter rows are gathered: one tile of dy, x and y per thread.
  rows.row_elems = kEluGradV2MinRowElems - 1;
  const auto gathered = MakeEluGradV2Plan(rows, kMachine);
  EXPECT_TRUE(gathered.gather);
  EXPECT_GE(gathered.scratch_bytes_per_thread, gathered.tile_elems * (2 + 2 + 2));
  EXPECT_EQ(gathered.scratch_bytes_per_thread % kEluGradV2WorkspaceAlignment, 0);
  EXPECT_EQ(gathered.workspace_bytes,
            static_cast<uint64_t>(gathered.threads * gathered.scratch_bytes_per_thread +
                                  kEluGradV2WorkspaceAlignment));
  EXPECT_EQ(MakeEluGradV2Plan(Problem(0, DType::kF32, false, false), kMachine).workspace_bytes, 0u);
}

TEST(EluGradV2Plan, StreamingStoresOnlyPastTheLastLevelCache) {
  EXPECT_FALSE(MakeEluGradV2Plan(Problem(1 << 16, DType::kF32, false), kMachine).streaming_stores);
  EXPECT_TRUE(MakeEluGradV2Plan(Problem(1 << 22, DType::kF32, false), kMachine).streaming_stores);
  EXPECT_FALSE(
      MakeEluGradV2Plan(Problem(1 << 22, DType::kF32, false, false), kMachine).streaming_stores);
}

TEST(EluGradV2Plan, JsonNamesEveryField) {
  const std::string json = EluGradV2PlanToJson(MakeEluGradV2Plan(Problem(5000, DType::kF16, true), kMachine));
  for (const char* key : {"\"mode\": \"FLOAT16_RESULT_FAST\"", "\"tile_elems\"", "\"threads\"",
                          "\"big_share_elems\"", "\"last_share_elems\"", "\"workspace_bytes\"",
                          "\"negcoef\"", "\"streaming_stores\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
}

gkTensor View(std::vector<int64_t> dims, std::vector<int64_t> strides, int64_t offset = 0) {
  gkTensor t;
  t.ndims = static_cast<int32_t>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    t.dims[d] = dims[d];
    t.strides[d] = strides[d];
  }
  t.offset = offset;
  return t;
}

TEST(EluGradV2Layout, MergesDimsEveryViewStepsOverExactly) {
  // A [4, 5, 6] slice of [4, 5, 8] rows: the outer two merge, the rows stay 6 long.
  const gkTensor sliced = View({4, 5, 6}, {40, 8, 1}, 3);
  const gkTensor dense = View({4, 5, 6}, {30, 6, 1});
  const auto layout = MergeEluGradV2Dims(sliced, dense, dense);
  ASSERT_EQ(layout.dy.ndims, 2);
  EXPECT_EQ(layout.dy.dims[0], 20);
  EXPECT_EQ(layout.dy.strides[0], 8);
  EXPECT_EQ(layout.x.strides[0], 6);
  EXPECT_EQ(layout.dy.offset, 3);
  EXPECT_EQ(layout.row_elems, 6);
  // All dense: one row of everything.
  const auto flat = MergeEluGradV2Dims(dense, dense, dense);
  EXPECT_EQ(flat.dy.ndims, 1);
  EXPECT_EQ(flat.row_elems, 120);
}

TEST(EluGradV2Layout, SizeOneDimsDropAndUnitStrideDecidesRows) {
  const gkTensor with_ones = View({1, 7, 1, 9}, {999, 9, 5, 1});
  const auto layout = MergeEluGradV2Dims(with_ones, with_ones, with_ones);
  EXPECT_EQ(layout.dy.ndims, 1);
  EXPECT_EQ(layout.row_elems, 63);
  // A transposed x: no view-wide unit-stride dim, nothing merges.
  const gkTensor dense = View({7, 9}, {9, 1});
  const auto transposed = MergeEluGradV2Dims(dense, View({7, 9}, {1, 7}), dense);
  EXPECT_EQ(transposed.dy.ndims, 2);
  EXPECT_EQ(transposed.row_elems, 1);
  // One element.
  const gkTensor one = View({1, 1}, {5, 3});
  const auto single = MergeEluGradV2Dims(one, one, one);
  EXPECT_EQ(single.dy.ndims, 1);
  EXPECT_EQ(single.row_elems, 1);
  // A stride whose product with a dim overflows never merges (4 * 2^62 wraps to the 0 above).
  const gkTensor huge = View({2, 4}, {0, int64_t{1} << 62});
  EXPECT_EQ(MergeEluGradV2Dims(huge, huge, huge).dy.ndims, 2);
}

TEST(EluGradV2Plan, CoefficientsFoldInFloat32) {
  const auto c = FoldEluGradV2Coefficients(1.6732632423543772, 1.0507009873554805, 2.0);
  EXPECT_EQ(c.negcoef, 1.6732632423543772f * 1.0507009873554805f);
  EXPECT_EQ(c.poscoef, 1.0507009873554805f);
  EXPECT_EQ(c.negiptcoef, 2.0f);
}

}  // namespace
}  // namespace gk
