// MoeInitRoutingGroupedMatmulGrad under hostile input: every bad argument (descriptors,
// attributes, index and group-list values) is an error with a message and leaves gradX
// untouched; sizes past 64 bits are errors; phase 2 refuses short workspaces, misused executors
// and index data made invalid after phase 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tests/fuzz/c_caller.h"
#include "tests/reliability/reliability_util.h"

namespace gk::reliability {
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// A valid problem: batch 3, topK 2 (6 slots), M = 5 routed rows over G = 2 experts, K = 3,
// N = 4, gather indices. Each test changes one thing.
struct MoeProblem {
  int64_t batch = 3, top_k = 2, g = 2, k = 3, n = 4, m = 5;
  int64_t dx_rows = 3;  // gradX.shape[0], = batch unless a test breaks that
  int32_t row_idx_type = 0;  // the C enums: any int
  int32_t group_list_type = GK_GROUP_LIST_COUNT;
  std::vector<float> dy, w;
  std::vector<int64_t> row_idx{4, 0, 5, 2, 1};  // row i -> slot
  std::vector<int64_t> group_list{2, 3};
  Bytes dx{3 * 3 * 4};
  DType float_dtype = DType::kF32;

  MoeProblem() {
    for (int64_t i = 0; i < m * n; ++i) dy.push_back(static_cast<float>(i % 5) - 2.0f);
    for (int64_t i = 0; i < g * k * n; ++i) w.push_back(static_cast<float>(i % 3) - 1.0f);
  }
  Tensor DyT() { return MakeTensor({m, n}, DType::kF32, dy.data()); }
  Tensor WT() { return MakeTensor({g, k, n}, DType::kF32, w.data()); }
  Tensor IdxT() {
    return MakeTensor({static_cast<int64_t>(row_idx.size())}, DType::kI64, row_idx.data());
  }
  Tensor GroupsT() {
    return MakeTensor({static_cast<int64_t>(group_list.size())}, DType::kI64, group_list.data());
  }
  Tensor DxT() { return MakeTensor({dx_rows, k}, DType::kF32, dx.data()); }

  gkStatus Phase1(const gkTensor* dy_t, const gkTensor* w_t, const gkTensor* idx_t,
                  const gkTensor* groups_t, gkTensor* dx_t, Executor* executor,
                  uint64_t* workspace_size) {
    gkOpExecutor* raw = nullptr;
    const gkStatus status = gkFuzzMoeGradGetWorkspaceSize(dy_t, w_t, idx_t, groups_t, batch, top_k,
                                                          row_idx_type, group_list_type, dx_t,
                                                          workspace_size, &raw);
    executor->reset(raw);
    return status;
  }

  // Phase 1 on the current fields must fail cleanly; `replace` swaps one descriptor.
  ::testing::AssertionResult Refuses(const std::function<void(Tensor*, Tensor*, Tensor*, Tensor*, Tensor*)>&
                                         replace = nullptr) {
    Tensor t[5] = {DyT(), WT(), IdxT(), GroupsT(), DxT()};
    if (replace) replace(&t[0], &t[1], &t[2], &t[3], &t[4]);
    const auto before = dx.bytes;
    Executor executor;
    uint64_t size = 0;
    const gkStatus status =
        Phase1(t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].get(), &executor, &size);
    if (executor != nullptr) return ::testing::AssertionFailure() << "an executor on failure";
    return FailedCleanly(status, before, dx.bytes);
  }

  // Runs both phases; gradX as floats.
  std::vector<float> Run() {
    Tensor dy_t = DyT(), w_t = WT(), idx_t = IdxT(), groups_t = GroupsT(), dx_t = DxT();
    Executor executor;
    uint64_t size = 0;
    EXPECT_EQ(Phase1(dy_t.get(), w_t.get(), idx_t.get(), groups_t.get(), dx_t.get(), &executor, &size),
              GK_SUCCESS)
        << gkGetRecentErrMsg();
    std::vector<uint8_t> workspace(size);
    EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr),
              GK_SUCCESS)
        << gkGetRecentErrMsg();
    return {dx.as<float>(), dx.as<float>() + batch * k};
  }
};

TEST(MoeGradHostile, TheBaselineRuns) {
  MoeProblem p;
  const auto dx = p.Run();
  EXPECT_EQ(dx.size(), 9u);
}

TEST(MoeGradHostile, NullArguments) {
  MoeProblem p;
  for (int which = 0; which < 5; ++which) {
    EXPECT_TRUE(p.Refuses([&](Tensor* a, Tensor* b, Tensor* c, Tensor* d, Tensor* e) {
      Tensor* all[] = {a, b, c, d, e};
      all[which]->reset();
    })) << which;
  }
  Tensor t[5] = {p.DyT(), p.WT(), p.IdxT(), p.GroupsT(), p.DxT()};
  gkOpExecutor* executor = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                t[0].get(), t[1].get(), t[2].get(), t[3].get(), p.batch, p.top_k, GK_ROW_IDX_GATHER,
                GK_GROUP_LIST_COUNT, t[4].get(), nullptr, &executor),
            GK_ERROR_NULLPTR);
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                t[0].get(), t[1].get(), t[2].get(), t[3].get(), p.batch, p.top_k, GK_ROW_IDX_GATHER,
                GK_GROUP_LIST_COUNT, t[4].get(), &size, nullptr),
            GK_ERROR_NULLPTR);
  EXPECT_TRUE(p.Refuses([&](Tensor* dy, Tensor*, Tensor*, Tensor*, Tensor*) {
    *dy = MakeTensor({p.m, p.n}, DType::kF32, nullptr);
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor*, Tensor* idx, Tensor*, Tensor*) {
    *idx = MakeTensor({5}, DType::kI64, nullptr);
  }));
}

TEST(MoeGradHostile, DTypes) {
  MoeProblem p;
  EXPECT_TRUE(p.Refuses([&](Tensor* dy, Tensor* w, Tensor*, Tensor*, Tensor*) {
    *dy = MakeTensor({p.m, p.n}, DType::kI32, p.dy.data());
    *w = MakeTensor({p.g, p.k, p.n}, DType::kI32, p.w.data());
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor* w, Tensor*, Tensor*, Tensor*) {
    *w = MakeTensor({p.g, p.k, p.n}, DType::kF16, p.w.data());  // gradY is float32
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor*, Tensor* idx, Tensor*, Tensor*) {
    *idx = MakeTensor({5}, DType::kF32, p.row_idx.data());
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor*, Tensor*, Tensor* groups, Tensor*) {
    *groups = MakeTensor({2}, DType::kI32, p.group_list.data());
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor*, Tensor*, Tensor*, Tensor* dx) {
    *dx = MakeTensor({p.batch, p.k}, DType::kF16, p.dx.data());
  }));
}

TEST(MoeGradHostile, Attributes) {
  for (auto [batch, top_k] : {std::pair<int64_t, int64_t>{0, 2}, {-1, 2}, {3, 0}, {3, -5},
                              {kI64Max, 2}, {int64_t{1} << 32, int64_t{1} << 32}, {kI64Min, -1}}) {
    MoeProblem p;
    p.batch = batch;
    p.top_k = top_k;
    EXPECT_TRUE(p.Refuses()) << batch << " x " << top_k;
  }
  for (int32_t row_idx_type : {2, -1, INT32_MAX, INT32_MIN}) {
    MoeProblem p;
    p.row_idx_type = row_idx_type;
    EXPECT_TRUE(p.Refuses()) << row_idx_type;
  }
}

TEST(MoeGradHostile, RanksAndShapes) {
  MoeProblem p;
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor* w, Tensor*, Tensor*, Tensor*) {
    *w = MakeTensor({p.g * p.k, p.n}, DType::kF32, p.w.data());
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor* dy, Tensor*, Tensor*, Tensor*, Tensor*) {
    *dy = MakeTensor({p.m, p.n - 1}, DType::kF32, p.dy.data());  // N differs from weight's
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor*, Tensor*, Tensor* groups, Tensor*) {
    *groups = MakeTensor({1}, DType::kI64, p.group_list.data());  // G entries expected
  }));
  MoeProblem wrong_rows;
  wrong_rows.dx_rows = 2;
  EXPECT_TRUE(wrong_rows.Refuses());
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor*, Tensor* idx, Tensor*, Tensor*) {
    *idx = MakeTensor({4}, DType::kI64, p.row_idx.data());  // gather needs L >= M
  }));
  MoeProblem scatter;
  scatter.row_idx_type = 1;
  scatter.row_idx = {0, 1, -1, 2, 3, 4};
  EXPECT_TRUE(scatter.Refuses([&](Tensor*, Tensor*, Tensor* idx, Tensor*, Tensor*) {
    *idx = MakeTensor({5}, DType::kI64, scatter.row_idx.data());  // scatter needs L = batch * topK
  }));
  MoeProblem too_many_rows;  // M > batch * topK
  too_many_rows.top_k = 1;
  EXPECT_TRUE(too_many_rows.Refuses());
  // Empty experts or K / N of zero.
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor* w, Tensor*, Tensor* groups, Tensor*) {
    *w = MakeTensor({0, p.k, p.n}, DType::kF32, p.w.data());
    *groups = MakeTensor({0}, DType::kI64, p.group_list.data());
  }));
}

TEST(MoeGradHostile, LayoutAndOverlap) {
  MoeProblem p;
  EXPECT_TRUE(p.Refuses([&](Tensor* dy, Tensor*, Tensor*, Tensor*, Tensor*) {
    *dy = MakeTensor({p.m, p.n}, DType::kF32, p.dy.data(), {1, p.m});  // transposed
  }));
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor*, Tensor*, Tensor*, Tensor* dx) {
    *dx = MakeTensor({p.batch, p.k}, DType::kF32, p.dx.data(), {0, 1});
  }));
  // gradX on gradY's bytes.
  const std::vector<float> dy_before = p.dy;
  Tensor t[5] = {p.DyT(), p.WT(), p.IdxT(), p.GroupsT(),
                 MakeTensor({p.batch, p.k}, DType::kF32, p.dy.data() + 2)};
  Executor executor;
  uint64_t size = 0;
  EXPECT_NE(p.Phase1(t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].get(), &executor, &size),
            GK_SUCCESS);
  EXPECT_EQ(p.dy, dy_before);
}

TEST(MoeGradHostile, GatherIndexValues) {
  for (int64_t bad : {int64_t{-1}, int64_t{6}, kI64Max, kI64Min}) {
    MoeProblem p;
    p.row_idx[3] = bad;  // out of [0, batch * topK)
    EXPECT_TRUE(p.Refuses()) << bad;
  }
  MoeProblem repeated;
  repeated.row_idx[4] = repeated.row_idx[0];
  EXPECT_TRUE(repeated.Refuses());
  MoeProblem past_m;  // entries past M are ignored, whatever they hold
  past_m.row_idx.push_back(kI64Min);
  past_m.row_idx.push_back(-1);
  EXPECT_EQ(past_m.Run(), MoeProblem().Run());
}

TEST(MoeGradHostile, ScatterIndexValues) {
  const std::vector<int64_t> valid{0, 1, -1, 2, 3, 4};  // slot p -> expanded row, -1 dropped
  MoeProblem ok;
  ok.row_idx_type = 1;
  ok.row_idx = valid;
  ok.Run();
  const std::vector<std::vector<int64_t>> bad{
      {0, 1, -1, 2, 3, 5},         // row 5 >= M
      {0, 1, -2, 2, 3, 4},         // -2 is neither a row nor -1
      {0, 1, 1, 2, 3, 4},          // row 1 twice
      {0, 1, -1, -1, 3, 4},        // row 2 missing
      {0, 1, kI64Min, 2, 3, 4},
      {0, 1, kI64Max, 2, 3, 4}};
  for (const auto& row_idx : bad) {
    MoeProblem p;
    p.row_idx_type = 1;
    p.row_idx = row_idx;
    EXPECT_TRUE(p.Refuses());
  }
}

TEST(MoeGradHostile, GroupListsThatDoNotAddUp) {
  const std::vector<std::vector<int64_t>> bad_counts{
      {2, 2}, {3, 3}, {-1, 6}, {6, -1}, {kI64Max, 1}, {kI64Max, kI64Max}, {kI64Min, 5}};
  for (const auto& groups : bad_counts) {
    MoeProblem p;
    p.group_list = groups;
    EXPECT_TRUE(p.Refuses()) << groups[0] << ", " << groups[1];
  }
  const std::vector<std::vector<int64_t>> bad_cumsums{
      {3, 2}, {-1, 5}, {2, 4}, {2, 6}, {kI64Max, 5}, {kI64Min, 5}, {5, kI64Max}};
  for (const auto& groups : bad_cumsums) {
    MoeProblem p;
    p.group_list_type = GK_GROUP_LIST_CUMSUM;
    p.group_list = groups;
    EXPECT_TRUE(p.Refuses()) << groups[0] << ", " << groups[1];
  }
  MoeProblem cumsum;
  cumsum.group_list_type = GK_GROUP_LIST_CUMSUM;
  cumsum.group_list = {2, 5};
  EXPECT_EQ(cumsum.Run(), MoeProblem().Run());
}

// Regression: refusing a count group list whose running total passes M, the message once
// computed previous + value in int64, which overflows for a value near 2^63 after a positive
// prefix (undefined behaviour; UBSan aborted). It now prints the value and the prefix.
TEST(MoeGradHostile, CountGroupListPastInt64InTheMessage) {
  MoeProblem p;
  p.group_list = {1, kI64Max};
  EXPECT_TRUE(p.Refuses());
}

// Regression: the API converted its gkGroupListType argument with a cast, a load of an enum
// whose range is [0, 1]; a C caller may pass any int, and clang's UBSan (the fuzz preset)
// aborted on 2, -1, 2^31. It now copies the argument's bits into an int32_t before checking.
TEST(MoeGradHostile, GroupListTypeOutsideTheEnum) {
  for (int32_t type : {2, -1, std::numeric_limits<int32_t>::min()}) {
    MoeProblem p;
    p.group_list_type = type;
    EXPECT_TRUE(p.Refuses()) << type;
  }
}

// Regression (fuzz corpus crash-081bef37, UBSan's enum check in the fuzz preset): the weight
// gradient's two phase-1 entry points passed their enum arguments on to a shared helper as the
// enum types, a load of a value outside the enum. They now take the bits (EnumBits) at the C
// boundary, as every other entry point does. Any int refused with a message, no executor.
TEST(GroupedMatmulHostile, WeightGradEnumsOutsideTheirRange) {
  const int64_t m = 4, k = 3, n = 2, g = 2;
  std::vector<float> x(m * k, 1.0f), dy(m * n, 1.0f), dw(g * k * n, 7.0f);
  std::vector<int64_t> groups = {2, 2}, idx = {0, 1, 2, 3};
  const Tensor x_t = MakeTensor({m, k}, DType::kF32, x.data());
  const Tensor dy_t = MakeTensor({m, n}, DType::kF32, dy.data());
  const Tensor groups_t = MakeTensor({g}, DType::kI64, groups.data());
  const Tensor idx_t = MakeTensor({m}, DType::kI64, idx.data());
  const Tensor dw_t = MakeTensor({g, k, n}, DType::kF32, dw.data());
  for (bool accumulate : {false, true}) {
    for (int32_t bad : {2, -1, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()}) {
      for (bool bad_group_list : {true, false}) {
        SCOPED_TRACE(::testing::Message() << (accumulate ? "Add " : "") << (bad_group_list ? "groupListType " : "rowIdxType ") << bad);
        gkOpExecutor* executor = nullptr;
        uint64_t size = 0;
        const gkStatus status = gkFuzzGroupedMatmulWeightGradGetWorkspaceSize(
            x_t.get(), dy_t.get(), groups_t.get(), bad_group_list ? bad : GK_GROUP_LIST_COUNT,
            idx_t.get(), bad_group_list ? GK_ROW_IDX_GATHER : bad, /*topK=*/1, dw_t.get(), accumulate,
            &size, &executor);
        EXPECT_NE(status, GK_SUCCESS);
        EXPECT_EQ(executor, nullptr);
        EXPECT_NE(std::string(gkGetRecentErrMsg()).find(bad_group_list ? "groupListType" : "rowIdxType"),
                  std::string::npos) << gkGetRecentErrMsg();
        EXPECT_EQ(dw, std::vector<float>(g * k * n, 7.0f));
      }
    }
  }
}

// ---- 64-bit overflow ---------------------------------------------------------------------

TEST(Overflow64, MoeGradElementCountPast2To63IsAnError) {
  MoeProblem p;
  EXPECT_TRUE(p.Refuses([&](Tensor*, Tensor* w, Tensor*, Tensor*, Tensor*) {
    *w = MakeTensor({p.g, int64_t{1} << 32, int64_t{1} << 32}, DType::kF32, p.w.data(), {0, 0, 0});
  }));
}

// One token, one expert, K = 1: only N is large. Phase 1 never reads gradY or weight, so the
// views may point anywhere.
MoeProblem OneRowProblem(int64_t n) {
  MoeProblem p;
  p.batch = 1, p.top_k = 1, p.g = 1, p.k = 1, p.n = n, p.m = 1, p.dx_rows = 1;
  p.row_idx = {0};
  p.group_list = {1};
  return p;
}

TEST(Overflow64, MoeGradByteSizePast2To63IsAnError) {
  MoeProblem p = OneRowProblem(int64_t{1} << 61);  // 2^61 float32: the count fits, 2^63 bytes do not
  EXPECT_TRUE(p.Refuses([&](Tensor* dy, Tensor* w, Tensor*, Tensor*, Tensor*) {
    *dy = MakeTensor({p.m, p.n}, DType::kF32, FakeAddress(uintptr_t{1} << 40));
    *w = MakeTensor({p.g, p.k, p.n}, DType::kF32, FakeAddress(uintptr_t{1} << 44));
  }));
}

// Regression: views that fit in 64 bits but whose tiles do not. Phase 1 once handed N = 2^61 to
// the tile GEMM (oneDNN died of SIGFPE creating the primitive; without it the plan's
// threads * base_m * N wrapped). Phase 1 now refuses G, K, N of 2^31 or more, as the seed bounds
// them.
TEST(Overflow64, MoeGradHugeNIsAnErrorNotACrashOrAWrap) {
  MoeProblem p = OneRowProblem(int64_t{1} << 61);  // float16: 2^62 bytes per view, addressable
  Tensor dy = MakeTensor({1, p.n}, DType::kF16, FakeAddress(uintptr_t{1} << 62));  // above any heap
  Tensor w = MakeTensor({1, 1, p.n}, DType::kF16, FakeAddress(uintptr_t{1} << 63));
  Tensor idx = p.IdxT(), groups = p.GroupsT(), dx = p.DxT();
  Executor executor;
  uint64_t size = 0;
  EXPECT_EQ(p.Phase1(dy.get(), w.get(), idx.get(), groups.get(), dx.get(), &executor, &size),
            GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("G, K and N must each be below 2^31"),
            std::string::npos)
      << gkGetRecentErrMsg();
}

// M = 2^60 rows pass every check (the views fit in the address space and are never read), and
// phase 1's table of M row tokens is more than a vector can hold: std::length_error. It once
// reached std::terminate through the C boundary; now it is a status like any failed allocation.
TEST(Overflow64, MoeGradHugeMIsAStatusNotATerminate) {
  MoeProblem p;
  const int64_t m = int64_t{1} << 60;
  p.batch = m, p.top_k = 1, p.g = 1, p.k = 1, p.n = 1, p.m = m, p.dx_rows = m;
  p.group_list = {m};
  Tensor dy = MakeTensor({m, 1}, DType::kF16, FakeAddress(uintptr_t{1} << 12));        // 2^61 bytes
  Tensor idx = MakeTensor({m}, DType::kI32, FakeAddress((uintptr_t{1} << 61) + 4096));  // 2^62
  Tensor dx = MakeTensor({m, 1}, DType::kF32, FakeAddress(uintptr_t{1} << 63));         // 2^62
  std::vector<uint16_t> w(1, 0);
  Tensor w_t = MakeTensor({1, 1, 1}, DType::kF16, w.data());
  Tensor groups = p.GroupsT();
  Executor executor;
  uint64_t size = 0;
  EXPECT_EQ(p.Phase1(dy.get(), w_t.get(), idx.get(), groups.get(), dx.get(), &executor, &size),
            GK_ERROR_RUNTIME)
      << gkGetRecentErrMsg();
  EXPECT_EQ(executor, nullptr);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("out of memory"), std::string::npos)
      << gkGetRecentErrMsg();
}

// ---- phase 2 -------------------------------------------------------------------------------

TEST(MoeGradPhase2, WorkspaceShorterThanAskedOrNullIsAnError) {
  MoeProblem p;
  Tensor t[5] = {p.DyT(), p.WT(), p.IdxT(), p.GroupsT(), p.DxT()};
  Executor executor;
  uint64_t size = 0;
  ASSERT_EQ(p.Phase1(t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].get(), &executor, &size),
            GK_SUCCESS);
  ASSERT_GT(size, 0u);
  std::vector<uint8_t> workspace(size);
  const auto before = p.dx.bytes;
  EXPECT_TRUE(FailedCleanly(
      gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size - 1, executor.get(), nullptr),
      before, p.dx.bytes));
  EXPECT_TRUE(FailedCleanly(gkMoeInitRoutingGroupedMatmulGrad(nullptr, size, executor.get(), nullptr),
                            before, p.dx.bytes));
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr),
            GK_SUCCESS);
}

TEST(ExecutorMisuse, MoeGradRunTwiceNullOrOtherOperator) {
  MoeProblem p;
  Tensor t[5] = {p.DyT(), p.WT(), p.IdxT(), p.GroupsT(), p.DxT()};
  Executor executor;
  uint64_t size = 0;
  ASSERT_EQ(p.Phase1(t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].get(), &executor, &size),
            GK_SUCCESS);
  std::vector<uint8_t> workspace(size);
  auto before = p.dx.bytes;
  EXPECT_TRUE(FailedCleanly(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, nullptr, nullptr),
                            before, p.dx.bytes));
  EXPECT_TRUE(FailedCleanly(gkEluGradV2(workspace.data(), size, executor.get(), nullptr), before,
                            p.dx.bytes));
  ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr),
            GK_SUCCESS);
  before = p.dx.bytes;
  p.dy[0] += 100.0f;  // a second run would change gradX
  EXPECT_TRUE(FailedCleanly(
      gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr), before,
      p.dx.bytes));
}

// A repeatable executor re-reads the index arrays: values made invalid after phase 1 are
// refused before gradX is written.
TEST(MoeGradPhase2, IndexDataMadeInvalidAfterPhaseOneIsAnError) {
  MoeProblem p;
  Tensor t[5] = {p.DyT(), p.WT(), p.IdxT(), p.GroupsT(), p.DxT()};
  Executor executor;
  uint64_t size = 0;
  ASSERT_EQ(p.Phase1(t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].get(), &executor, &size),
            GK_SUCCESS);
  ASSERT_EQ(gkSetExecutorRepeatable(executor.get()), GK_SUCCESS);
  std::vector<uint8_t> workspace(size);
  ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr),
            GK_SUCCESS);
  const auto before = p.dx.bytes;
  p.row_idx[2] = 6;  // past batch * topK
  EXPECT_TRUE(FailedCleanly(
      gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr), before,
      p.dx.bytes));
  p.row_idx[2] = 5;
  p.group_list = {4, 4};  // totals 8, M is 5
  EXPECT_TRUE(FailedCleanly(
      gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr), before,
      p.dx.bytes));
  p.group_list = {-1, 6};
  EXPECT_TRUE(FailedCleanly(
      gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr), before,
      p.dx.bytes));
  p.group_list = {2, 3};
  p.row_idx[2] = 4;  // the slot of row 0 again: two rows in one slot
  EXPECT_TRUE(FailedCleanly(
      gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr), before,
      p.dx.bytes));
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("a slot already named by an earlier row"),
            std::string::npos)
      << gkGetRecentErrMsg();
  p.row_idx[2] = 5;
  EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr),
            GK_SUCCESS);
  EXPECT_EQ(p.dx.bytes, before);
}

}  // namespace
}  // namespace gk::reliability
