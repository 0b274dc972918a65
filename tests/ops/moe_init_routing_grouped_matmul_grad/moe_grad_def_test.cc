// Every check of MoeInitRoutingGroupedMatmulGrad: the status, a message naming the argument, its
// value and the rule, and gradX left untouched (filled with a sentinel, compared after).
#include <cstring>
#include <functional>

#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"
#include "tests/ops/moe_init_routing_grouped_matmul_grad/moe_grad_test_util.h"

namespace gk::testing {
namespace {

constexpr float kSentinel = -12345.5f;

// A valid small problem whose pieces each test breaks in one way.
struct Problem {
  int64_t batch = 6, top_k = 2, g = 3, k = 8, n = 4;
  int64_t row_idx_type = 0;
  int64_t group_list_type = GK_GROUP_LIST_COUNT;
  DType dtype = DType::kF32;
  std::vector<int64_t> dy_dims, w_dims, idx_dims, groups_dims, dx_dims;
  DType idx_dtype = DType::kI64, groups_dtype = DType::kI64, dx_dtype = DType::kF32;
  DType w_dtype = DType::kF32;
  std::vector<float> dy, w, dx;
  std::vector<int64_t> idx, groups;
  const int64_t* dy_strides = nullptr;
  const int64_t* w_strides = nullptr;
  bool null_dy_data = false;
  bool dx_aliases_w = false;

  Problem() {
    // 12 slots, 10 routed: rows sorted by expert; expert counts 4, 3, 3.
    idx = {0, 3, 5, 8, 1, 6, 10, 2, 7, 11};
    groups = {4, 3, 3};
    const int64_t m = 10;
    dy_dims = {m, n};
    w_dims = {g, k, n};
    idx_dims = {m};
    groups_dims = {g};
    dx_dims = {batch, k};
    dy.assign(static_cast<size_t>(m * n), 1.0f);
    w.assign(static_cast<size_t>(g * k * n), 1.0f);
    dx.assign(static_cast<size_t>(batch * k * 2), kSentinel);  // room for larger gradX shapes
  }
  void UseScatter() {
    row_idx_type = 1;
    std::vector<int64_t> scatter(static_cast<size_t>(batch * top_k), -1);
    for (size_t i = 0; i < idx.size(); ++i) scatter[idx[i]] = static_cast<int64_t>(i);
    idx = scatter;
    idx_dims = {batch * top_k};
  }
  void UseCumsum() {
    group_list_type = GK_GROUP_LIST_CUMSUM;
    for (size_t e = 1; e < groups.size(); ++e) groups[e] += groups[e - 1];
  }
};

struct Outcome {
  gkStatus status;
  std::string message;
  bool dx_untouched;
};

Outcome Plan(Problem& p) {
  const auto make = [](const std::vector<int64_t>& dims, DType dtype, void* data,
                       const int64_t* strides = nullptr) {
    return gkCreateTensor(dims.data(), dims.size(), static_cast<gkDataType>(dtype), strides, 0, data);
  };
  gkTensor* dy = make(p.dy_dims, p.dtype, p.null_dy_data ? nullptr : p.dy.data(), p.dy_strides);
  gkTensor* w = make(p.w_dims, p.w_dtype, p.w.data(), p.w_strides);
  gkTensor* idx = make(p.idx_dims, p.idx_dtype, p.idx.data());
  gkTensor* groups = make(p.groups_dims, p.groups_dtype, p.groups.data());
  gkTensor* dx = make(p.dx_dims, p.dx_dtype, p.dx_aliases_w ? static_cast<void*>(p.w.data()) : p.dx.data());
  const std::vector<float> w_before = p.w;
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  Outcome out;
  out.status = gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
      dy, w, idx, groups, p.batch, p.top_k, static_cast<gkRowIdxType>(p.row_idx_type),
      static_cast<gkGroupListType>(p.group_list_type), dx, &size, &executor);
  out.message = gkGetRecentErrMsg();
  if (out.status == GK_SUCCESS) {
    std::vector<uint8_t> workspace(size);
    out.status = gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr);
    out.message = gkGetRecentErrMsg();
  }
  out.dx_untouched = p.w == w_before;
  for (float v : p.dx) out.dx_untouched &= F32Bits(v) == F32Bits(kSentinel);
  gkDestroyExecutor(executor);
  for (gkTensor* t : {dy, w, idx, groups, dx}) gkDestroyTensor(t);
  return out;
}

void ExpectRejected(Problem p, const std::vector<std::string>& words,
                    gkStatus status = GK_ERROR_PARAM_INVALID) {
  const Outcome out = Plan(p);
  EXPECT_EQ(out.status, status) << out.message;
  for (const auto& word : words) EXPECT_NE(out.message.find(word), std::string::npos)
      << "'" << word << "' missing from: " << out.message;
  EXPECT_TRUE(out.dx_untouched);
}

TEST(moe_grad_def, TheValidProblemRuns) {
  for (bool scatter : {false, true}) {
    for (bool cumsum : {false, true}) {
      Problem p;
      if (scatter) p.UseScatter();
      if (cumsum) p.UseCumsum();
      const Outcome out = Plan(p);
      EXPECT_EQ(out.status, GK_SUCCESS) << out.message;
      // Every token row gets topK - dropped ones: with all-ones inputs each routed row adds N.
      EXPECT_EQ(p.dx[0], 4.0f * 2);  // token 0: slots 0 and 1 routed
      EXPECT_EQ(p.dx[2 * p.k], 4.0f * 1);  // token 2: slot 5 only (slot 4 dropped)
    }
  }
}

TEST(moe_grad_def, NullPointers) {
  Problem p;
  gkTensor* t = gkCreateTensor(p.dy_dims.data(), 2, GK_FLOAT, nullptr, 0, p.dy.data());
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(t, t, t, t, 1, 1, GK_ROW_IDX_GATHER,
                                                              GK_GROUP_LIST_COUNT, t, nullptr,
                                                              &executor),
            GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("workspaceSize is NULL"), std::string::npos);
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(t, t, t, t, 1, 1, GK_ROW_IDX_GATHER,
                                                              GK_GROUP_LIST_COUNT, t, &size,
                                                              nullptr),
            GK_ERROR_NULLPTR);
  const char* names[] = {"gradY", "weight", "expandedRowIdx", "groupList", "gradX"};
  for (int which = 0; which < 5; ++which) {
    gkTensor* args[5] = {t, t, t, t, t};
    args[which] = nullptr;
    EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                  args[0], args[1], args[2], args[3], 1, 1, GK_ROW_IDX_GATHER, GK_GROUP_LIST_COUNT, args[4],
                  &size, &executor),
              GK_ERROR_NULLPTR);
    EXPECT_NE(std::string(gkGetRecentErrMsg()).find(std::string(names[which]) + " is NULL"),
              std::string::npos);
    EXPECT_EQ(executor, nullptr);
  }
  gkDestroyTensor(t);
  Problem no_data;
  no_data.null_dy_data = true;
  ExpectRejected(no_data, {"gradY data is NULL", "40 elements"}, GK_ERROR_NULLPTR);
}

TEST(moe_grad_def, DTypes) {
  Problem p;
  p.dtype = DType::kI32;
  p.w_dtype = DType::kI32;
  ExpectRejected(p, {"gradY", "int32", "float32, float16, bfloat16"});
  p = Problem();
  p.w_dtype = DType::kBF16;
  ExpectRejected(p, {"weight has dtype bfloat16", "gradY has dtype float32", "must match"});
  p = Problem();
  p.idx_dtype = DType::kF32;
  ExpectRejected(p, {"expandedRowIdx has dtype float32", "int64, int32"});
  p = Problem();
  p.groups_dtype = DType::kF32;
  ExpectRejected(p, {"groupList has dtype float32", "supported: int64, int32"});
  p = Problem();
  p.dx_dtype = DType::kBF16;
  ExpectRejected(p, {"gradX has dtype bfloat16", "supported: float32"});
}

TEST(moe_grad_def, Attributes) {
  Problem p;
  p.batch = 0;
  ExpectRejected(p, {"batch is 0", "> 0"});
  p = Problem();
  p.top_k = -2;
  ExpectRejected(p, {"topK is -2", "> 0"});
  p = Problem();
  p.batch = int64_t{1} << 40;
  p.top_k = int64_t{1} << 30;
  ExpectRejected(p, {"overflows int64"});
  p = Problem();
  p.row_idx_type = 2;
  ExpectRejected(p, {"rowIdxType is 2", "GK_ROW_IDX_GATHER (0", "GK_ROW_IDX_SCATTER (1"});
  p = Problem();
  p.group_list_type = 7;
  ExpectRejected(p, {"groupListType is 7", "GK_GROUP_LIST_COUNT (0)", "GK_GROUP_LIST_CUMSUM (1)"});
}

TEST(moe_grad_def, RanksAndShapes) {
  Problem p;
  p.dy_dims = {10, 2, 2};
  ExpectRejected(p, {"gradY has 3 dims", "[10, 2, 2]", "must have 2"});
  p = Problem();
  p.w_dims = {3, 32};
  ExpectRejected(p, {"weight has 2 dims", "must have 3"});
  p = Problem();
  p.idx_dims = {5, 2};
  ExpectRejected(p, {"expandedRowIdx has 2 dims", "must have 1"});
  p = Problem();
  p.groups_dims = {3, 1};
  ExpectRejected(p, {"groupList has 2 dims", "must have 1"});
  p = Problem();
  p.dx_dims = {48};
  ExpectRejected(p, {"gradX has 1 dims", "must have 2"});
  p = Problem();
  p.w_dims = {0, 8, 4};
  p.groups_dims = {0};
  ExpectRejected(p, {"weight has shape [0, 8, 4]", "0 experts", "at least 1"});
  p = Problem();
  p.w_dims = {3, 0, 4};
  ExpectRejected(p, {"weight has shape [3, 0, 4]", "must both be >= 1"});
  p = Problem();
  p.dy_dims = {8, 5};
  p.dy.resize(40);
  ExpectRejected(p, {"gradY has shape [8, 5]", "dim 1 is 5, it must be 4", "weight.shape[2]"});
  p = Problem();
  p.groups_dims = {2};
  ExpectRejected(p, {"groupList has shape [2]", "dim 0 is 2, it must be 3", "G, weight.shape[0]"});
  p = Problem();
  p.dx_dims = {7, 8};
  ExpectRejected(p, {"gradX has shape [7, 8]", "dim 0 is 7, it must be 6", "batch"});
  p = Problem();
  p.dx_dims = {6, 9};
  ExpectRejected(p, {"gradX has shape [6, 9]", "dim 1 is 9, it must be 8", "K, weight.shape[1]"});
}

TEST(moe_grad_def, RowCountsAndIndexLengths) {
  Problem p;
  p.top_k = 1;  // 6 slots for 10 rows
  ExpectRejected(p, {"gradY has 10 rows (M)", "batch 6 * topK 1 = 6"});
  p = Problem();
  p.idx_dims = {9};
  ExpectRejected(p, {"expandedRowIdx has 9 entries", "M = 10", "L >= M"});
  p = Problem();
  p.UseScatter();
  p.idx_dims = {11};
  ExpectRejected(p, {"expandedRowIdx has 11 entries", "rowIdxType 1", "batch 6 * topK 2 = 12"});
}

TEST(moe_grad_def, LayoutAndOverlap) {
  Problem p;
  const int64_t strides[2] = {8, 2};  // every other element of a wider buffer
  p.dy.resize(80);
  p.dy_strides = strides;
  ExpectRejected(p, {"gradY", "strides [8, 2]", "must be contiguous"});
  p = Problem();
  p.dx_aliases_w = true;
  ExpectRejected(p, {"gradX overlaps weight", "must not"});
}

// weight [G, K, N] = [3, 8, 4]: C-contiguous, or the transposed view of a [G, N, K] buffer
// (strides 32, 1, 8); any other strides are refused with both layouts named.
TEST(moe_grad_def, WeightLayouts) {
  Problem p;
  const int64_t transposed[3] = {32, 1, 8};
  p.w_strides = transposed;
  EXPECT_EQ(Plan(p).status, GK_SUCCESS) << Plan(p).message;
  p = Problem();
  const int64_t padded[3] = {64, 8, 1};  // rows of a wider [G, K, 8] buffer
  p.w.resize(3 * 64);
  p.w_strides = padded;
  ExpectRejected(p, {"weight with shape [3, 8, 4] has strides [64, 8, 1]",
                     "C-contiguous [G, K, N] (strides (32, 4, 1))",
                     "transposed view of a C-contiguous [G, N, K] (strides (32, 1, 8))"});
}

TEST(moe_grad_def, GroupListValues) {
  Problem p;
  p.groups = {4, -1, 7};
  ExpectRejected(p, {"groupList[1] is -1", "row count must be >= 0"});
  p = Problem();
  p.groups = {4, 3, 4};
  ExpectRejected(p, {"groupList[2] is 4 after 7 rows", "M = 10"});
  p = Problem();
  p.groups = {4, 3, 2};
  ExpectRejected(p, {"groupList (count) totals 9", "M = 10", "must be equal"});
  p = Problem();
  p.UseCumsum();
  p.groups = {4, 3, 10};
  ExpectRejected(p, {"groupList[1] is 3", "below groupList[0] = 4", "non-decreasing"});
  p = Problem();
  p.UseCumsum();
  p.groups = {-1, 7, 10};
  ExpectRejected(p, {"groupList[0] is -1", "start at >= 0"});
  p = Problem();
  p.UseCumsum();
  p.groups = {4, 7, 9};
  ExpectRejected(p, {"groupList (cumsum) totals 9", "M = 10"});
  p = Problem();
  p.UseCumsum();
  p.groups = {4, 11, 11};
  ExpectRejected(p, {"groupList[1] is 11", "past M = 10"});
}

TEST(moe_grad_def, GatherIndexValues) {
  Problem p;
  p.idx[3] = 12;
  ExpectRejected(p, {"expandedRowIdx[3] is 12", "[0, 12)", "batch 6 * topK 2", "rowIdxType 0"});
  p = Problem();
  p.idx[0] = -1;
  ExpectRejected(p, {"expandedRowIdx[0] is -1", "[0, 12)"});
  p = Problem();
  p.idx[6] = 3;  // slot 3 twice
  ExpectRejected(p, {"expandedRowIdx[6] is 3", "already named", "at most one"});
  p = Problem();
  p.idx_dtype = DType::kI32;
  std::vector<int32_t> narrow(p.idx.begin(), p.idx.end());
  narrow[9] = 99;
  std::memcpy(p.idx.data(), narrow.data(), narrow.size() * 4);
  ExpectRejected(p, {"expandedRowIdx[9] is 99"});
}

TEST(moe_grad_def, ScatterIndexValues) {
  Problem p;
  p.UseScatter();
  p.idx[4] = 10;  // slot 4 was dropped; row 10 does not exist
  ExpectRejected(p, {"expandedRowIdx[4] is 10", "[0, 10) (M) or -1", "rowIdxType 1"});
  p = Problem();
  p.UseScatter();
  p.idx[4] = -2;
  ExpectRejected(p, {"expandedRowIdx[4] is -2"});
  p = Problem();
  p.UseScatter();
  p.idx[4] = 0;  // row 0 is also slot 0's
  ExpectRejected(p, {"expandedRowIdx[4] is 0", "already named", "token 0", "exactly once"});
  p = Problem();
  p.UseScatter();
  p.idx[5] = -1;  // row 2 (slot 5) is never named
  ExpectRejected(p, {"names 9 of the M = 10", "row 2 is missing", "exactly once"});
}

// Phase 2: the executor and workspace checks, and index data changed after phase 1.
TEST(moe_grad_def, PhaseTwoChecks) {
  Problem p;
  TensorGuard dy({10, 4}, DType::kF32, p.dy.data()), w({3, 8, 4}, DType::kF32, p.w.data()),
      idx({10}, DType::kI64, p.idx.data()), groups({3}, DType::kI64, p.groups.data()),
      dx({6, 8}, DType::kF32, p.dx.data());
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(dy.t, w.t, idx.t, groups.t, 6, 2, GK_ROW_IDX_GATHER,
                                                              GK_GROUP_LIST_COUNT, dx.t, &size,
                                                              &executor),
            GK_SUCCESS);
  std::vector<uint8_t> workspace(size);
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, nullptr, nullptr),
            GK_ERROR_NULLPTR);
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size - 1, executor, nullptr),
            GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("workspaceSize is"), std::string::npos);
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(nullptr, size, executor, nullptr), GK_ERROR_NULLPTR);
  EXPECT_EQ(gkEluGradV2(workspace.data(), size, executor, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("planned for MoeInitRoutingGroupedMatmulGrad"),
            std::string::npos);
  for (float v : p.dx) EXPECT_EQ(v, kSentinel);

  ASSERT_EQ(gkSetExecutorRepeatable(executor), GK_SUCCESS);
  p.idx[2] = 1000;  // changed after phase 1 checked it
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr),
            GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("gkMoeInitRoutingGroupedMatmulGrad: expandedRowIdx[2] is 1000"),
            std::string::npos)
      << gkGetRecentErrMsg();
  p.idx[2] = 5;
  p.groups[0] = 5;
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr),
            GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("groupList"), std::string::npos);
  for (float v : p.dx) EXPECT_EQ(v, kSentinel);
  p.groups[0] = 4;
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr), GK_SUCCESS);
  gkDestroyExecutor(executor);

  // Without gkSetExecutorRepeatable an executor runs once.
  ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(dy.t, w.t, idx.t, groups.t, 6, 2, GK_ROW_IDX_GATHER,
                                                              GK_GROUP_LIST_COUNT, dx.t, &size,
                                                              &executor),
            GK_SUCCESS);
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr), GK_SUCCESS);
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr),
            GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("already run"), std::string::npos);
  gkDestroyExecutor(executor);
}

// The chunk table: rows grouped by (chunk, expert), ascending inside each bucket.
TEST(moe_grad_routing, ChunkRowsAreStableBuckets) {
  const std::vector<int64_t> offsets = {0, 4, 4, 9};  // expert 1 empty
  const std::vector<int64_t> token = {5, 0, 3, 1, 2, 4, 0, 5, 3};
  std::vector<int64_t> starts(3 * 3 + 1), rows(9);
  BuildChunkRows(offsets.data(), token.data(), 3, 3, 2, starts.data(), rows.data());
  // chunk 0: tokens 0-1, chunk 1: 2-3, chunk 2: 4-5.
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 2, 2, 3, 4, 4, 6, 7, 7, 9}));
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 3, 6, 2, 4, 8, 0, 5, 7}));
}

}  // namespace
}  // namespace gk::testing
