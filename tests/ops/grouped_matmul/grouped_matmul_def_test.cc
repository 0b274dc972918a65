// Every check of GroupedMatmul, GroupedMatmulWeightGrad and GroupedMatmulWeightGradAdd: the
// status, a message naming the argument, its value and the rule, and the output left untouched
// (filled with a sentinel).
#include <cstring>
#include <functional>

#include "tests/ops/grouped_matmul/grouped_matmul_test_util.h"

namespace gk::testing {
namespace {

constexpr float kSentinel = -12345.5f;

// A valid small problem of either operator, which each test breaks in one way.
// 6 tokens x topK 2 = 12 slots, 10 routed; rows sorted by expert, counts 4, 3, 3.
struct Problem {
  bool weight_grad = false;
  bool accumulate = false;  // weight grad: GroupedMatmulWeightGradAdd into the output
  int64_t batch = 6, top_k = 2, g = 3, k = 8, n = 4, m = 10;
  bool gather_fused = true;
  int64_t row_idx_type = 0;
  int64_t group_list_type = GK_GROUP_LIST_COUNT;
  bool transpose_weight = false;
  DType dtype = DType::kF32, operand_dtype = DType::kF32, out_dtype = DType::kF32;
  DType idx_dtype = DType::kI64, groups_dtype = DType::kI64;
  std::vector<int64_t> x_dims, operand_dims, idx_dims, groups_dims, out_dims;
  std::vector<float> x, operand, out;
  std::vector<int64_t> idx, groups;
  const int64_t* operand_strides = nullptr;
  const int64_t* out_strides = nullptr;
  bool out_aliases_x = false;
  bool null_idx = false;

  Problem() {
    idx = {0, 3, 5, 8, 1, 6, 10, 2, 7, 11};
    groups = {4, 3, 3};
    x_dims = {batch, k};
    operand_dims = {g, k, n};
    idx_dims = {m};
    groups_dims = {g};
    out_dims = {m, n};
    x.assign(static_cast<size_t>(m * k * 2), 1.0f);  // room for larger shapes
    operand.assign(static_cast<size_t>(g * k * n * 2), 1.0f);
    out.assign(static_cast<size_t>(g * k * n * 2), kSentinel);
  }
  static Problem WeightGrad() {
    Problem p;
    p.weight_grad = true;
    p.operand_dims = {p.m, p.n};
    p.out_dims = {p.g, p.k, p.n};
    return p;
  }
  void UsePlain() {
    gather_fused = false;
    x_dims = {m, k};
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
  bool out_untouched;
};

Outcome Plan(Problem& p) {
  const auto make = [](const std::vector<int64_t>& dims, DType dtype, void* data,
                       const int64_t* strides = nullptr) {
    return gkCreateTensor(dims.data(), dims.size(), static_cast<gkDataType>(dtype), strides, 0, data);
  };
  gkTensor* x = make(p.x_dims, p.dtype, p.x.data());
  gkTensor* operand = make(p.operand_dims, p.operand_dtype, p.operand.data(), p.operand_strides);
  gkTensor* idx = p.gather_fused ? make(p.idx_dims, p.idx_dtype, p.idx.data()) : nullptr;
  gkTensor* groups = make(p.groups_dims, p.groups_dtype, p.groups.data());
  gkTensor* out = make(p.out_dims, p.out_dtype,
                       p.out_aliases_x ? static_cast<void*>(p.x.data()) : p.out.data(),
                       p.out_strides);
  const std::vector<float> x_before = p.x;
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  Outcome result;
  const auto group_type = static_cast<gkGroupListType>(p.group_list_type);
  const auto row_type = static_cast<gkRowIdxType>(p.row_idx_type);
  if (p.accumulate) {
    result.status = gkGroupedMatmulWeightGradAddGetWorkspaceSize(
        x, operand, groups, group_type, p.null_idx ? nullptr : idx, row_type, p.top_k, out, &size,
        &executor);
  } else if (p.weight_grad) {
    result.status = gkGroupedMatmulWeightGradGetWorkspaceSize(
        x, operand, groups, group_type, p.null_idx ? nullptr : idx, row_type, p.top_k, out, &size,
        &executor);
  } else {
    result.status = gkGroupedMatmulGetWorkspaceSize(x, operand, groups, group_type,
                                                    p.transpose_weight, p.null_idx ? nullptr : idx,
                                                    row_type, p.top_k, out, &size, &executor);
  }
  result.message = gkGetRecentErrMsg();
  if (result.status == GK_SUCCESS) {
    std::vector<uint8_t> workspace(size);
    result.status = p.accumulate
                        ? gkGroupedMatmulWeightGradAdd(workspace.data(), size, executor, nullptr)
                    : p.weight_grad
                        ? gkGroupedMatmulWeightGrad(workspace.data(), size, executor, nullptr)
                        : gkGroupedMatmul(workspace.data(), size, executor, nullptr);
    result.message = gkGetRecentErrMsg();
  }
  result.out_untouched = p.x == x_before;
  for (float v : p.out) result.out_untouched &= F32Bits(v) == F32Bits(kSentinel);
  gkDestroyExecutor(executor);
  for (gkTensor* t : {x, operand, idx, groups, out}) gkDestroyTensor(t);
  return result;
}

void ExpectRejected(Problem p, const std::vector<std::string>& words,
                    gkStatus status = GK_ERROR_PARAM_INVALID) {
  const Outcome out = Plan(p);
  EXPECT_EQ(out.status, status) << out.message;
  for (const auto& word : words) {
    EXPECT_NE(out.message.find(word), std::string::npos)
        << "'" << word << "' missing from: " << out.message;
  }
  EXPECT_TRUE(out.out_untouched);
}

// Every operator (the weight gradient written and added), each check.
void ForBoth(const std::function<void(Problem&)>& edit, const std::vector<std::string>& words,
             gkStatus status = GK_ERROR_PARAM_INVALID) {
  for (int op = 0; op < 3; ++op) {
    SCOPED_TRACE(op == 0 ? "forward" : op == 1 ? "weight grad" : "weight grad add");
    Problem p = op == 0 ? Problem() : Problem::WeightGrad();
    p.accumulate = op == 2;
    edit(p);
    ExpectRejected(p, words, status);
  }
}

TEST(grouped_matmul_def, TheValidProblemRuns) {
  for (bool weight_grad : {false, true}) {
    for (int form = 0; form < 3; ++form) {
      for (bool cumsum : {false, true}) {
        Problem p = weight_grad ? Problem::WeightGrad() : Problem();
        if (form == 1) p.UseScatter();
        if (form == 2) p.UsePlain();
        if (cumsum) p.UseCumsum();
        const Outcome out = Plan(p);
        EXPECT_EQ(out.status, GK_SUCCESS) << out.message;
        // All-ones inputs: y = K everywhere; gradWeight[g] = rows of g everywhere.
        EXPECT_EQ(p.out[0], weight_grad ? 4.0f : 8.0f);
        EXPECT_EQ(p.out[weight_grad ? p.g * p.k * p.n - 1 : p.m * p.n - 1], weight_grad ? 3.0f : 8.0f);
      }
    }
  }
  // The weight gradient added to what the output held.
  Problem add = Problem::WeightGrad();
  add.accumulate = true;
  const Outcome out = Plan(add);
  EXPECT_EQ(out.status, GK_SUCCESS) << out.message;
  EXPECT_EQ(add.out[0], kSentinel + 4.0f);
  EXPECT_EQ(add.out[add.g * add.k * add.n - 1], kSentinel + 3.0f);
  EXPECT_EQ(add.out[add.g * add.k * add.n], kSentinel);  // past gradWeightRef
}

TEST(grouped_matmul_def, NullPointers) {
  Problem p;
  std::vector<int64_t> dims{p.batch, p.k};
  gkTensor* t = gkCreateTensor(dims.data(), 2, GK_FLOAT, nullptr, 0, p.x.data());
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  EXPECT_EQ(gkGroupedMatmulGetWorkspaceSize(nullptr, t, t, GK_GROUP_LIST_COUNT, false, nullptr,
                                            GK_ROW_IDX_GATHER, 1, t, &size, &executor),
            GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("x"), std::string::npos);
  EXPECT_EQ(gkGroupedMatmulGetWorkspaceSize(t, t, t, GK_GROUP_LIST_COUNT, false, nullptr,
                                            GK_ROW_IDX_GATHER, 1, t, nullptr, &executor),
            GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("workspaceSize"), std::string::npos);
  EXPECT_EQ(gkGroupedMatmulWeightGradGetWorkspaceSize(t, nullptr, t, GK_GROUP_LIST_COUNT, nullptr,
                                                      GK_ROW_IDX_GATHER, 1, t, &size, &executor),
            GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("gradY"), std::string::npos);
  EXPECT_EQ(gkGroupedMatmulWeightGradGetWorkspaceSize(t, t, t, GK_GROUP_LIST_COUNT, nullptr,
                                                      GK_ROW_IDX_GATHER, 1, t, &size, nullptr),
            GK_ERROR_NULLPTR);
  EXPECT_EQ(gkGroupedMatmulWeightGradAddGetWorkspaceSize(t, t, t, GK_GROUP_LIST_COUNT, nullptr,
                                                         GK_ROW_IDX_GATHER, 1, nullptr, &size,
                                                         &executor),
            GK_ERROR_NULLPTR);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("gradWeightRef"), std::string::npos);
  EXPECT_EQ(gkGroupedMatmul(nullptr, 0, nullptr, nullptr), GK_ERROR_NULLPTR);
  EXPECT_EQ(gkGroupedMatmulWeightGrad(nullptr, 0, nullptr, nullptr), GK_ERROR_NULLPTR);
  EXPECT_EQ(gkGroupedMatmulWeightGradAdd(nullptr, 0, nullptr, nullptr), GK_ERROR_NULLPTR);
  gkDestroyTensor(t);
}

// An executor of one operator is refused by the other's phase 2.
TEST(grouped_matmul_def, ExecutorOfTheOtherOperator) {
  Problem p;
  std::vector<int64_t> x_dims = p.x_dims, w_dims = p.operand_dims, y_dims = p.out_dims;
  TensorGuard x(x_dims, DType::kF32, p.x.data()), w(w_dims, DType::kF32, p.operand.data());
  TensorGuard idx({p.m}, DType::kI64, p.idx.data()), groups({p.g}, DType::kI64, p.groups.data());
  TensorGuard y(y_dims, DType::kF32, p.out.data());
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  ASSERT_EQ(gkGroupedMatmulGetWorkspaceSize(x.t, w.t, groups.t, GK_GROUP_LIST_COUNT, false, idx.t,
                                            GK_ROW_IDX_GATHER, p.top_k, y.t, &size, &executor),
            GK_SUCCESS);
  std::vector<uint8_t> workspace(size);
  EXPECT_EQ(gkGroupedMatmulWeightGrad(workspace.data(), size, executor, nullptr),
            GK_ERROR_PARAM_INVALID);
  EXPECT_EQ(gkGroupedMatmulWeightGradAdd(workspace.data(), size, executor, nullptr),
            GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("GroupedMatmulWeightGradAdd"), std::string::npos);
  EXPECT_EQ(gkGroupedMatmul(workspace.data(), size - 1, executor, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("workspaceSize"), std::string::npos);
  for (float v : p.out) EXPECT_EQ(F32Bits(v), F32Bits(kSentinel));
  gkDestroyExecutor(executor);
}

TEST(grouped_matmul_def, DTypes) {
  ForBoth([](Problem& p) { p.dtype = DType::kI32; }, {"x", "int32"});
  ForBoth([](Problem& p) { p.dtype = DType::kF64; }, {"x", "float64"});
  ForBoth([](Problem& p) { p.operand_dtype = DType::kBF16; }, {"bfloat16", "x"});
  ForBoth([](Problem& p) { p.idx_dtype = DType::kF32; }, {"expandedRowIdx", "float32"});
  ForBoth([](Problem& p) { p.groups_dtype = DType::kF32; }, {"groupList", "float32"});
  // Output: float32 or x's dtype, nothing else.
  ForBoth([](Problem& p) { p.out_dtype = DType::kF16; }, {"float16", "float32 or x's dtype"});
  ForBoth([](Problem& p) { p.out_dtype = DType::kF64; }, {"float64"});
}

TEST(grouped_matmul_def, Attributes) {
  ForBoth([](Problem& p) { p.group_list_type = 2; }, {"groupListType is 2"});
  ForBoth([](Problem& p) { p.row_idx_type = -1; }, {"rowIdxType is -1"});
  ForBoth([](Problem& p) { p.top_k = 0; }, {"topK is 0"});
  // Plain x: rowIdxType and topK are not read.
  for (bool weight_grad : {false, true}) {
    Problem p = weight_grad ? Problem::WeightGrad() : Problem();
    p.UsePlain();
    p.row_idx_type = 7;
    p.top_k = -3;
    EXPECT_EQ(Plan(p).status, GK_SUCCESS);
  }
}

TEST(grouped_matmul_def, RanksAndShapes) {
  ForBoth([](Problem& p) { p.x_dims = {p.batch, p.k, 1}; }, {"x", "dims"});
  ForBoth([](Problem& p) { p.groups_dims = {p.g, 1}; }, {"groupList", "dims"});
  ForBoth([](Problem& p) { p.idx_dims = {p.m, 1}; }, {"expandedRowIdx", "dims"});
  ForBoth([](Problem& p) { p.groups_dims = {2}; }, {"groupList", "dim 0 is 2", "G"});
  // Forward
  Problem f;
  f.operand_dims = {f.g, f.k};
  ExpectRejected(f, {"weight", "dims"});
  f = Problem();
  f.x_dims = {f.batch, f.k - 1};
  ExpectRejected(f, {"x", "dim 1 is 7", "K, weight.shape[1]"});
  f = Problem();
  f.out_dims = {f.m, f.n + 1};
  ExpectRejected(f, {"y", "dim 1 is 5", "N, weight.shape[2]"});
  f = Problem();
  f.out_dims = {f.m + 1, f.n};  // gather-fused: y's rows are M
  ExpectRejected(f, {"expandedRowIdx has 10 entries", "M = 11 rows of y"});
  f = Problem();
  f.UseScatter();
  f.out_dims = {f.m + 1, f.n};
  ExpectRejected(f, {"groupList", "totals 10 rows", "y has M = 11"});
  f = Problem();
  f.UsePlain();
  f.out_dims = {f.m - 1, f.n};
  ExpectRejected(f, {"y", "dim 0 is 9", "M, x.shape[0]"});
  f = Problem();
  f.operand_dims = {0, f.k, f.n};
  f.groups_dims = {0};
  ExpectRejected(f, {"weight", "0 experts"});
  // Weight grad
  Problem w = Problem::WeightGrad();
  w.out_dims = {w.g, w.k + 1, w.n};
  ExpectRejected(w, {"gradWeight", "dim 1 is 9", "K, x.shape[1]"});
  w = Problem::WeightGrad();
  w.out_dims = {w.g, w.k, w.n + 2};
  ExpectRejected(w, {"gradWeight", "dim 2 is 6", "N, gradY.shape[1]"});
  w = Problem::WeightGrad();
  w.UsePlain();
  w.operand_dims = {w.m - 1, w.n};
  ExpectRejected(w, {"gradY", "dim 0 is 9", "M, x.shape[0]"});
  w = Problem::WeightGrad();
  w.operand_dims = {w.m, w.n, 1};
  ExpectRejected(w, {"gradY", "dims"});
}

// K and N swapped: the message says so, and how to pass the weight.
TEST(grouped_matmul_def, SwappedKAndN) {
  Problem f;
  f.operand_dims = {f.g, f.n, f.k};  // [G, N, K] without transposeWeight
  ExpectRejected(f, {"x has 8 columns", "K and N look swapped", "transposeWeight true"});
  f = Problem();
  f.transpose_weight = true;  // [G, K, N] with transposeWeight
  ExpectRejected(f, {"K and N look swapped", "transposeWeight false"});
  Problem w = Problem::WeightGrad();
  w.out_dims = {w.g, w.n, w.k};
  ExpectRejected(w, {"gradWeight", "[G, N, K]", "K and N look swapped"});
}

TEST(grouped_matmul_def, WeightLayouts) {
  // [G, N, K] with transposeWeight runs; its transposed view without the flag runs too.
  Problem f;
  f.operand_dims = {f.g, f.n, f.k};
  f.transpose_weight = true;
  EXPECT_EQ(Plan(f).status, GK_SUCCESS);
  const int64_t view[] = {8 * 4, 1, 8};  // [G, K, N] view of [G, N, K]
  f = Problem();
  f.operand_strides = view;
  EXPECT_EQ(Plan(f).status, GK_SUCCESS);
  const int64_t odd[] = {100, 4, 1};
  f = Problem();
  f.operand_strides = odd;
  ExpectRejected(f, {"weight", "strides [100, 4, 1]", "C-contiguous"});
  // Weight grad: gradY must be contiguous.
  const int64_t strided[] = {8, 1};
  Problem w = Problem::WeightGrad();
  w.operand_strides = strided;
  ExpectRejected(w, {"gradY", "contiguous"});
}

// A tensor without elements may carry any offset (nothing is addressed through it): no check
// refuses it, and phase 2 never forms its offset in bytes (2^62 * 4 overflows int64; libFuzzer
// found phase 2 doing so, which UBSan reports in the sanitizer build). M = 0 rows, G = 2.
TEST(grouped_matmul_def, EmptyTensorsMayCarryAnyOffset) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  const int64_t g = 2, k = 3, n = 5;
  std::vector<float> weight(g * k * n, 1.0f), grad(g * k * n, kSentinel);
  std::vector<int64_t> counts{0, 0};
  float nothing = 0.0f;
  TensorGuard x({0, k}, DType::kF32, &nothing, {}, kHuge);
  TensorGuard w({g, k, n}, DType::kF32, weight.data());
  TensorGuard groups({g}, DType::kI64, counts.data());
  TensorGuard y({0, n}, DType::kF32, &nothing, {}, kHuge);
  TensorGuard dy({0, n}, DType::kF32, &nothing, {}, kHuge);
  TensorGuard dw({g, k, n}, DType::kF32, grad.data());
  for (int op = 0; op < 3; ++op) {
    SCOPED_TRACE(op);
    uint64_t size = 0;
    gkOpExecutor* executor = nullptr;
    const gkStatus planned =
        op == 0 ? gkGroupedMatmulGetWorkspaceSize(x.t, w.t, groups.t, GK_GROUP_LIST_COUNT, false,
                                                  nullptr, GK_ROW_IDX_GATHER, 1, y.t, &size,
                                                  &executor)
        : op == 1 ? gkGroupedMatmulWeightGradGetWorkspaceSize(x.t, dy.t, groups.t,
                                                              GK_GROUP_LIST_COUNT, nullptr,
                                                              GK_ROW_IDX_GATHER, 1, dw.t, &size,
                                                              &executor)
                  : gkGroupedMatmulWeightGradAddGetWorkspaceSize(x.t, dy.t, groups.t,
                                                                 GK_GROUP_LIST_COUNT, nullptr,
                                                                 GK_ROW_IDX_GATHER, 1, dw.t,
                                                                 &size, &executor);
    ASSERT_EQ(planned, GK_SUCCESS) << gkGetRecentErrMsg();
    std::vector<uint8_t> workspace(size);
    const auto run = op == 0   ? gkGroupedMatmul
                     : op == 1 ? gkGroupedMatmulWeightGrad
                               : gkGroupedMatmulWeightGradAdd;
    EXPECT_EQ(run(workspace.data(), size, executor, nullptr), GK_SUCCESS) << gkGetRecentErrMsg();
    gkDestroyExecutor(executor);
    // Weight grad: empty experts are zeros; added: zeros stay (no expert has rows).
    if (op >= 1) {
      for (float v : grad) EXPECT_EQ(F32Bits(v), 0u);
    }
  }
}

TEST(grouped_matmul_def, LayoutAndOverlap) {
  ForBoth([](Problem& p) { p.out_aliases_x = true; }, {"overlaps x"});
  const int64_t strided[] = {8, 2};
  Problem f;
  f.out_strides = strided;
  ExpectRejected(f, {"y", "contiguous"});
}

TEST(grouped_matmul_def, RowCountsAndIndexLengths) {
  // More rows than slots.
  Problem f;
  f.batch = 4;
  f.x_dims = {4, f.k};
  f.idx = {0, 3, 5, 1, 6, 2, 7, 4, 0, 0};
  ExpectRejected(f, {"y has 10 rows", "batch 4", "topK 2 = 8"});
  ForBoth([](Problem& p) { p.idx_dims = {p.m - 1}; }, {"expandedRowIdx has 9 entries", "L >= M"});
  ForBoth(
      [](Problem& p) {
        p.UseScatter();
        p.idx_dims = {p.batch * p.top_k - 1};
      },
      {"expandedRowIdx has 11 entries", "rowIdxType 1"});
  ForBoth([](Problem& p) { p.x_dims = {0, p.k}; }, {"batch >= 1"});
}

TEST(grouped_matmul_def, GroupListValues) {
  ForBoth([](Problem& p) { p.groups = {4, -1, 7}; }, {"groupList[1] is -1"});
  ForBoth([](Problem& p) { p.groups = {4, 3, 4}; }, {"groupList[2] is 4", "more than M = 10"});
  ForBoth([](Problem& p) { p.groups = {4, 3, 2}; }, {"totals 9 rows", "M = 10"});
  ForBoth(
      [](Problem& p) {
        p.UseCumsum();
        p.groups = {4, 3, 10};
      },
      {"groupList[1] is 3", "non-decreasing"});
  ForBoth(
      [](Problem& p) {
        p.UseCumsum();
        p.groups = {4, 7, 11};
      },
      {"groupList[2] is 11", "past M = 10"});
  // The messages name the tensor whose rows M counts.
  Problem plain;
  plain.UsePlain();
  plain.groups = {4, 3, 2};
  ExpectRejected(plain, {"but x has M = 10"});
  Problem wg = Problem::WeightGrad();
  wg.groups = {4, 3, 2};
  ExpectRejected(wg, {"but gradY has M = 10"});
}

TEST(grouped_matmul_def, IndexValues) {
  ForBoth([](Problem& p) { p.idx[3] = 12; }, {"expandedRowIdx[3] is 12", "[0, 12)"});
  ForBoth([](Problem& p) { p.idx[3] = -1; }, {"expandedRowIdx[3] is -1"});
  ForBoth([](Problem& p) { p.idx[4] = 0; }, {"expandedRowIdx[4] is 0", "already named"});
  ForBoth(
      [](Problem& p) {
        p.UseScatter();
        p.idx[0] = 10;
      },
      {"expandedRowIdx[0] is 10", "-1 for a dropped slot"});
  ForBoth(
      [](Problem& p) {
        p.UseScatter();
        p.idx[3] = p.idx[0];
      },
      {"already named"});
  ForBoth(
      [](Problem& p) {
        p.UseScatter();
        p.idx[0] = -1;
      },
      {"names 9 of the M = 10", "row 0 is missing"});
  // int32 indices: the same checks.
  ForBoth(
      [](Problem& p) {
        p.idx_dtype = DType::kI32;
        std::vector<int32_t> narrow(p.idx.begin(), p.idx.end());
        narrow[2] = 99;
        std::memcpy(p.idx.data(), narrow.data(), narrow.size() * 4);
      },
      {"expandedRowIdx[2] is 99"});
}

}  // namespace
}  // namespace gk::testing
