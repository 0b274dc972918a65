// MoeInitRouting through its C API: against the reference (a stable sort) over routings, dtypes,
// index and group-list types and capacities; every error (outputs untouched); thread counts;
// and the round trip into gkMoeInitRoutingGroupedMatmulGrad.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ops/moe_init_routing/moe_init_routing_ref.h"
#include "tests/ops/moe_init_routing/moe_routing_test_util.h"

namespace gk::testing {
namespace {

constexpr uint8_t kSentinel = 0xAB;

struct InitOptions {
  DType dtype = DType::kF32;
  DType expert_idx_dtype = DType::kI64;
  DType row_idx_dtype = DType::kI64;
  int32_t row_idx_type = 0;
  int32_t group_list_type = GK_GROUP_LIST_COUNT;
  int64_t capacity = 0;
  int64_t rows = -1;          // expandedX rows; -1: Rmax
  int64_t x_row_stride = 0;   // 0: H (contiguous)
  int32_t threads = 0;
  bool index_only = false;    // expandedX NULL: only the indices and groupList
};

struct InitProblem {
  RoutingSpec spec;
  int64_t h;
  std::vector<int64_t> experts;
  FloatData x;  // batch rows of x_row_stride elements
  int64_t x_row_stride;
};

inline int64_t MaxRows(const RoutingSpec& s, int64_t capacity) {
  const int64_t slots = s.batch * s.top_k;
  return capacity > 0 ? std::min(slots, s.g * capacity) : slots;
}

InitProblem MakeProblem(const RoutingSpec& spec, int64_t h, const InitOptions& o) {
  const int64_t stride = o.x_row_stride > 0 ? o.x_row_stride : h;
  return {spec, h, MakeExpertIdx(spec),
          MakeFloatData(spec.batch * stride, o.dtype, Values::kRandom, spec.seed), stride};
}

struct InitResult {
  gkStatus planned = GK_SUCCESS, ran = GK_SUCCESS;
  std::string message;
  int64_t rows = 0;
  std::vector<uint8_t> ex, idx, groups;
};

InitResult RunInitRouting(const InitProblem& pb, const InitOptions& o,
                          std::vector<int64_t> experts_override = {}, int64_t expert_num = -1) {
  const RoutingSpec& s = pb.spec;
  const int64_t slots = s.batch * s.top_k;
  InitResult r;
  r.rows = o.rows >= 0 ? o.rows : MaxRows(s, o.capacity);
  const auto experts =
      IndexBytes(experts_override.empty() ? pb.experts : experts_override, o.expert_idx_dtype);
  const int64_t idx_len = o.row_idx_type == 1 ? slots : r.rows;
  r.ex.assign(static_cast<size_t>(r.rows * pb.h * ElementBytes(o.dtype)), kSentinel);
  r.idx.assign(static_cast<size_t>(idx_len * ElementBytes(o.row_idx_dtype)), kSentinel);
  r.groups.assign(static_cast<size_t>(s.g * 8), kSentinel);
  TensorGuard x_t({s.batch, pb.h}, o.dtype, pb.x.bytes.data(), {pb.x_row_stride, 1});
  TensorGuard e_t({s.batch, s.top_k}, o.expert_idx_dtype, experts.data());
  TensorGuard ex_t({r.rows, pb.h}, o.dtype, r.ex.data());
  TensorGuard idx_t({idx_len}, o.row_idx_dtype, r.idx.data());
  TensorGuard g_t({s.g}, DType::kI64, r.groups.data());
  ThreadsScope threads(o.threads);
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  gkRowIdxType row_idx_type;
  gkGroupListType group_list_type;
  std::memcpy(&row_idx_type, &o.row_idx_type, sizeof row_idx_type);
  std::memcpy(&group_list_type, &o.group_list_type, sizeof group_list_type);
  r.planned = gkMoeInitRoutingGetWorkspaceSize(
      x_t.t, e_t.t, o.capacity, expert_num >= 0 ? expert_num : s.g, group_list_type,
      row_idx_type, o.index_only ? nullptr : ex_t.t, idx_t.t, g_t.t, &workspace_size, &executor);
  r.message = gkGetRecentErrMsg();
  if (r.planned == GK_SUCCESS) {
    r.ran = RunPlanned(executor, workspace_size, gkMoeInitRouting);
    if (r.ran != GK_SUCCESS) r.message = gkGetRecentErrMsg();
  }
  gkDestroyExecutor(executor);
  return r;
}

::testing::AssertionResult MatchesReference(const InitProblem& pb, const InitOptions& o,
                                            const InitResult& r) {
  if (r.planned != GK_SUCCESS || r.ran != GK_SUCCESS) {
    return ::testing::AssertionFailure() << "failed: " << r.message;
  }
  const RoutingSpec& s = pb.spec;
  const auto ref = MoeInitRoutingReference(pb.experts, s.g, o.capacity);
  const auto groups = IndexValues(r.groups, DType::kI64);
  const auto& want_groups =
      o.group_list_type == GK_GROUP_LIST_CUMSUM ? ref.group_cumsum : ref.group_counts;
  if (groups != want_groups) return ::testing::AssertionFailure() << "groupList differs";
  const auto idx = IndexValues(r.idx, o.row_idx_dtype);
  if (o.row_idx_type == 1) {
    if (idx != ref.slot_row) return ::testing::AssertionFailure() << "scatter index differs";
  } else {
    for (int64_t i = 0; i < r.rows; ++i) {
      const int64_t want = i < ref.m ? ref.row_slot[i] : -1;
      if (idx[i] != want) {
        return ::testing::AssertionFailure()
               << "expandedRowIdx[" << i << "] = " << idx[i] << ", want " << want;
      }
    }
  }
  const int64_t row_bytes = pb.h * ElementBytes(o.dtype);
  const std::vector<uint8_t> zeros(static_cast<size_t>(row_bytes), 0);
  if (o.index_only) {
    const bool untouched = std::all_of(r.ex.begin(), r.ex.end(), [](uint8_t b) { return b == kSentinel; });
    return untouched ? ::testing::AssertionSuccess()
                     : ::testing::AssertionFailure() << "index-only routing wrote expandedX's buffer";
  }
  for (int64_t i = 0; i < r.rows; ++i) {
    const uint8_t* got = r.ex.data() + i * row_bytes;
    const uint8_t* want =
        i < ref.m ? pb.x.bytes.data() + ref.row_slot[i] / s.top_k * pb.x_row_stride *
                                            ElementBytes(o.dtype)
                  : zeros.data();
    if (std::memcmp(got, want, static_cast<size_t>(row_bytes)) != 0) {
      return ::testing::AssertionFailure() << "expandedX row " << i << " differs (M = " << ref.m
                                           << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

struct NamedSpec {
  std::string name;
  RoutingSpec spec;
  int64_t h;
};

std::vector<NamedSpec> Specs() {
  std::vector<NamedSpec> specs = {
      {"tiny", {1, 1, 1, 0.0, {}, 1}, 1},
      {"uniform_topk2", {37, 2, 5, 1, {}, 3}, 19},
      {"skewed_topk4", {64, 4, 8, 0.7, {}, 4}, 33},
      {"one_expert_all", {40, 3, 6, 1.0, {}, 5}, 8},
      {"empty_experts", {50, 2, 9, 0.0, {0, 3, 8}, 6}, 16},
      {"topk8", {23, 8, 16, 0.2, {5}, 7}, 64},
      {"topk1", {100, 1, 4, 0.0, {}, 8}, 7},
  };
  for (int64_t k = 1; k <= 8; ++k) {
    specs.push_back({"topk" + std::to_string(k) + "_sweep", {29, k, 7, 0.3, {2}, static_cast<uint64_t>(10 + k)}, 5});
  }
  return specs;
}

TEST(moe_init_routing, MatchesReferenceEverywhere) {
  for (const auto& [name, spec, h] : Specs()) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (DType index_dtype : {DType::kI64, DType::kI32}) {
        for (int32_t row_idx_type : {0, 1}) {
          for (int32_t gl : {GK_GROUP_LIST_COUNT, GK_GROUP_LIST_CUMSUM}) {
            for (int64_t capacity : {int64_t{0}, int64_t{1}, int64_t{3}, spec.batch * spec.top_k}) {
              InitOptions o;
              o.dtype = dtype;
              o.expert_idx_dtype = index_dtype;
              o.row_idx_dtype = index_dtype == DType::kI64 ? DType::kI32 : DType::kI64;
              o.row_idx_type = row_idx_type;
              o.group_list_type = gl;
              o.capacity = capacity;
              const InitProblem pb = MakeProblem(spec, h, o);
              EXPECT_TRUE(MatchesReference(pb, o, RunInitRouting(pb, o)))
                  << name << " " << DTypeName(dtype) << " expertIdx " << DTypeName(index_dtype)
                  << " rowIdxType " << row_idx_type << " groupListType " << gl << " capacity "
                  << capacity;
            }
          }
        }
      }
    }
  }
}

// expandedX NULL: the same indices and groupList as the full call, and nothing else written.
TEST(moe_init_routing, IndexOnlyRoutingWritesTheSameIndices) {
  for (const NamedSpec& ns : Specs()) {
    for (int32_t row_idx_type : {0, 1}) {
      for (int64_t capacity : {int64_t{0}, int64_t{3}}) {
        InitOptions o;
        o.row_idx_type = row_idx_type;
        o.capacity = capacity;
        o.index_only = true;
        const InitProblem pb = MakeProblem(ns.spec, ns.h, o);
        EXPECT_TRUE(MatchesReference(pb, o, RunInitRouting(pb, o)))
            << ns.name << " rowIdxType " << row_idx_type << " capacity " << capacity;
      }
    }
  }
  // Without expandedX, a gather index longer than any routing can fill is named as such.
  InitOptions o;
  o.index_only = true;
  o.rows = 7;  // batch 2 * topK 2 = 4 slots at most
  const InitProblem pb = MakeProblem({2, 2, 3, 0.0, {}, 1}, 4, o);
  const InitResult r = RunInitRouting(pb, o);
  EXPECT_EQ(r.planned, GK_ERROR_PARAM_INVALID);
  EXPECT_NE(r.message.find("expandedRowIdx (rowIdxType 0, no expandedX) has 7 rows"),
            std::string::npos)
      << r.message;
}

TEST(moe_init_routing, CapacityDropsTheLaterSlotsOfAnExpert) {
  // 3 tokens x topK 2; experts by slot: 1 0 | 1 1 | 0 1. Capacity 2: expert 1 keeps slots 0 and
  // 2 and drops 3 and 5; expert 0 keeps 1 and 4.
  InitProblem pb{{3, 2, 2, 0.0, {}, 1}, 2, {1, 0, 1, 1, 0, 1}, MakeFloatData(6, DType::kF32, Values::kSmallIntegers, 1), 2};
  InitOptions o;
  o.capacity = 2;
  o.row_idx_type = 1;
  const InitResult r = RunInitRouting(pb, o);
  ASSERT_EQ(r.ran, GK_SUCCESS) << r.message;
  EXPECT_EQ(IndexValues(r.idx, DType::kI64), (std::vector<int64_t>{2, 0, 3, -1, 1, -1}));
  EXPECT_EQ(IndexValues(r.groups, DType::kI64), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(MatchesReference(pb, o, r));
}

TEST(moe_init_routing, RowsBetweenMAndTheWorstCaseArePadded) {
  const RoutingSpec spec{30, 2, 4, 0.8, {}, 21};
  for (int32_t row_idx_type : {0, 1}) {
    InitOptions o;
    o.capacity = 5;
    o.row_idx_type = row_idx_type;
    const InitProblem pb = MakeProblem(spec, 6, o);
    const int64_t m = MoeInitRoutingReference(pb.experts, spec.g, o.capacity).m;
    for (int64_t rows : {m, m + 1, MaxRows(spec, o.capacity)}) {
      o.rows = rows;
      EXPECT_TRUE(MatchesReference(pb, o, RunInitRouting(pb, o))) << "rows " << rows;
    }
  }
}

TEST(moe_init_routing, StridedRowsOfX) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    InitOptions o;
    o.dtype = dtype;
    o.x_row_stride = 11;
    const InitProblem pb = MakeProblem({17, 3, 5, 0.2, {}, 31}, 7, o);
    EXPECT_TRUE(MatchesReference(pb, o, RunInitRouting(pb, o)));
  }
}

TEST(moe_init_routing, SameBytesForOneToFourThreads) {
  InitOptions o;
  o.dtype = DType::kBF16;
  o.capacity = 300;
  const InitProblem pb = MakeProblem({2048, 4, 16, 0.3, {3}, 41}, 256, o);
  o.threads = 1;
  const InitResult one = RunInitRouting(pb, o);
  ASSERT_TRUE(MatchesReference(pb, o, one));
  for (int32_t threads : {2, 3, 4}) {
    o.threads = threads;
    const InitResult r = RunInitRouting(pb, o);
    EXPECT_EQ(r.ex, one.ex) << threads << " threads";
    EXPECT_EQ(r.idx, one.idx) << threads << " threads";
    EXPECT_EQ(r.groups, one.groups) << threads << " threads";
  }
}

// ---- errors: status, message, and outputs untouched ----------------------------------------

struct ErrorCase {
  std::string name;
  std::string expected_message;
  std::function<void(InitProblem&, InitOptions&, std::vector<int64_t>&, int64_t&)> mutate;
};

void ExpectRefused(const ErrorCase& c) {
  InitOptions o;
  o.capacity = 0;
  InitProblem pb = MakeProblem({6, 2, 3, 0.0, {}, 51}, 4, o);
  std::vector<int64_t> experts = pb.experts;
  int64_t expert_num = pb.spec.g;
  c.mutate(pb, o, experts, expert_num);
  const InitResult r = RunInitRouting(pb, o, experts, expert_num);
  EXPECT_EQ(r.planned, GK_ERROR_PARAM_INVALID) << c.name;
  EXPECT_NE(r.message.find(c.expected_message), std::string::npos)
      << c.name << ": message is \"" << r.message << "\"";
  for (const auto* out : {&r.ex, &r.idx, &r.groups}) {
    for (uint8_t byte : *out) {
      if (byte != kSentinel) {
        ADD_FAILURE() << c.name << ": an output was written";
        break;
      }
    }
  }
}

TEST(moe_init_routing, ErrorsNameArgumentValueAndRule) {
  const std::vector<ErrorCase> cases = {
      {"expert too large", "expertIdx[2, 1] is 3, it must be an expert in [0, 3)",
       [](auto&, auto&, auto& e, auto&) { e[5] = 3; }},
      {"expert negative", "expertIdx[0, 0] is -1", [](auto&, auto&, auto& e, auto&) { e[0] = -1; }},
      {"capacity < 0", "expertCapacity is -2, it must be >= 0",
       [](auto&, auto& o, auto&, auto&) { o.capacity = -2; }},
      {"expertNum 0", "expertNum is 0", [](auto&, auto&, auto&, auto& g) { g = 0; }},
      {"groupList size", "groupList has shape [3]: dim 0 is 3, it must be 4 (expertNum)",
       [](auto&, auto&, auto&, auto& g) { g = 4; }},
      {"rows past worst case", "expandedX has 13 rows, more than any routing can fill: at most 12",
       [](auto&, auto& o, auto&, auto&) { o.rows = 13; }},
      {"rows below M", "expandedX has 5 rows but this routing keeps M = 12 slots",
       [](auto&, auto& o, auto&, auto&) { o.rows = 5; }},
      {"rows below M with capacity", "keeps M = 6 slots (expertCapacity 2)",
       [](auto&, auto& o, auto& e, auto&) {
         o.capacity = 2;
         o.rows = 5;
         e = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2};
       }},
      {"rowIdxType", "rowIdxType is 2", [](auto&, auto& o, auto&, auto&) { o.row_idx_type = 2; }},
      {"groupListType", "groupListType is -1",
       [](auto&, auto& o, auto&, auto&) { o.group_list_type = -1; }},
      {"x dtype", "x has dtype int32",
       [](auto& pb, auto& o, auto&, auto&) {
         o.dtype = DType::kI32;
         pb.x.bytes.resize(pb.x.bytes.size());
       }},
  };
  for (const auto& c : cases) ExpectRefused(c);
}

TEST(moe_init_routing, ShapeAndDescriptorErrors) {
  const int64_t batch = 4, top_k = 2, g = 3, h = 5;
  std::vector<float> x(batch * h, 1.0f), ex(batch * top_k * h, 7.0f);
  std::vector<int64_t> experts(batch * top_k, 1), idx(batch * top_k, 9), groups(g, 9);
  const auto plan = [&](const gkTensor* xt, const gkTensor* et, gkTensor* ext, gkTensor* it,
                        gkTensor* gt) {
    uint64_t ws = 0;
    gkOpExecutor* executor = nullptr;
    const gkStatus s = gkMoeInitRoutingGetWorkspaceSize(xt, et, 0, g, GK_GROUP_LIST_COUNT,
                                                        GK_ROW_IDX_GATHER, ext, it, gt, &ws,
                                                        &executor);
    EXPECT_EQ(executor, nullptr);
    return std::pair<gkStatus, std::string>(s, gkGetRecentErrMsg());
  };
  TensorGuard x_t({batch, h}, DType::kF32, x.data());
  TensorGuard e_t({batch, top_k}, DType::kI64, experts.data());
  TensorGuard ex_t({batch * top_k, h}, DType::kF32, ex.data());
  TensorGuard i_t({batch * top_k}, DType::kI64, idx.data());
  TensorGuard g_t({g}, DType::kI64, groups.data());
  {
    auto [s, m] = plan(nullptr, e_t.t, ex_t.t, i_t.t, g_t.t);
    EXPECT_EQ(s, GK_ERROR_NULLPTR);
    EXPECT_NE(m.find("x is NULL"), std::string::npos) << m;
  }
  {
    TensorGuard bad({batch * top_k, h + 1}, DType::kF32, ex.data());
    auto [s, m] = plan(x_t.t, e_t.t, bad.t, i_t.t, g_t.t);
    EXPECT_NE(m.find("expandedX has shape [8, 6]: dim 1 is 6, it must be 5 (H, x.shape[1])"),
              std::string::npos) << m;
  }
  {
    TensorGuard bad({batch + 1, top_k}, DType::kI64, experts.data());
    auto [s, m] = plan(x_t.t, bad.t, ex_t.t, i_t.t, g_t.t);
    EXPECT_NE(m.find("expertIdx has shape [5, 2]: dim 0 is 5, it must be 4"), std::string::npos)
        << m;
  }
  {
    TensorGuard bad({batch * top_k - 1}, DType::kI64, idx.data());
    auto [s, m] = plan(x_t.t, e_t.t, ex_t.t, bad.t, g_t.t);
    EXPECT_NE(m.find("expandedRowIdx has shape [7]: dim 0 is 7, it must be 8"), std::string::npos)
        << m;
  }
  {
    TensorGuard bad({batch * top_k, h}, DType::kBF16, ex.data());
    auto [s, m] = plan(x_t.t, e_t.t, bad.t, i_t.t, g_t.t);
    EXPECT_NE(m.find("expandedX has dtype bfloat16 but x has dtype float32"), std::string::npos)
        << m;
  }
  {
    TensorGuard bad({g}, DType::kI32, groups.data());
    auto [s, m] = plan(x_t.t, e_t.t, ex_t.t, i_t.t, bad.t);
    EXPECT_NE(m.find("groupList has dtype int32, supported: int64"), std::string::npos) << m;
  }
  {
    TensorGuard overlap({batch * top_k}, DType::kI64, ex.data());
    auto [s, m] = plan(x_t.t, e_t.t, ex_t.t, overlap.t, g_t.t);
    EXPECT_NE(m.find("expandedRowIdx overlaps expandedX"), std::string::npos) << m;
  }
  {
    TensorGuard col({batch, h}, DType::kF32, x.data(), {1, batch});
    auto [s, m] = plan(col.t, e_t.t, ex_t.t, i_t.t, g_t.t);
    EXPECT_NE(m.find("its last dim must be contiguous"), std::string::npos) << m;
  }
  for (float v : ex) ASSERT_EQ(v, 7.0f);
  for (int64_t v : idx) ASSERT_EQ(v, 9);
  for (int64_t v : groups) ASSERT_EQ(v, 9);
}

TEST(moe_init_routing, RepeatableExecutorChecksExpertIdxAgain) {
  const int64_t batch = 3, top_k = 2, g = 2, h = 2;
  std::vector<float> x(batch * h, 1.0f), ex(batch * top_k * h, 7.0f);
  std::vector<int64_t> experts = {0, 1, 1, 0, 0, 1}, idx(batch * top_k, 9), groups(g, 9);
  TensorGuard x_t({batch, h}, DType::kF32, x.data());
  TensorGuard e_t({batch, top_k}, DType::kI64, experts.data());
  TensorGuard ex_t({batch * top_k, h}, DType::kF32, ex.data());
  TensorGuard i_t({batch * top_k}, DType::kI64, idx.data());
  TensorGuard g_t({g}, DType::kI64, groups.data());
  uint64_t ws = 0;
  gkOpExecutor* executor = nullptr;
  ASSERT_EQ(gkMoeInitRoutingGetWorkspaceSize(x_t.t, e_t.t, 0, g, GK_GROUP_LIST_CUMSUM,
                                             GK_ROW_IDX_SCATTER, ex_t.t, i_t.t, g_t.t, &ws,
                                             &executor),
            GK_SUCCESS);
  ASSERT_EQ(gkSetExecutorRepeatable(executor), GK_SUCCESS);
  std::vector<uint8_t> workspace(ws);
  ASSERT_EQ(gkMoeInitRouting(workspace.data(), ws, executor, nullptr), GK_SUCCESS);
  EXPECT_EQ(groups, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(idx, (std::vector<int64_t>{0, 3, 4, 1, 2, 5}));
  experts[4] = 2;
  std::fill(ex.begin(), ex.end(), 7.0f);
  std::fill(idx.begin(), idx.end(), 9);
  std::fill(groups.begin(), groups.end(), 9);
  EXPECT_EQ(gkMoeInitRouting(workspace.data(), ws, executor, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("gkMoeInitRouting: expertIdx[2, 0] is 2"),
            std::string::npos)
      << gkGetRecentErrMsg();
  for (float v : ex) EXPECT_EQ(v, 7.0f);
  for (int64_t v : idx) EXPECT_EQ(v, 9);
  for (int64_t v : groups) EXPECT_EQ(v, 9);
  gkDestroyExecutor(executor);
}

// ---- the round trip: MoeInitRouting's outputs drive the fused backward unchanged -----------

TEST(moe_init_routing, OutputsFeedTheFusedGradUnchanged) {
  const int64_t k = 24, n = 20;
  for (int64_t capacity : {int64_t{0}, int64_t{7}}) {
    for (int32_t row_idx_type : {0, 1}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        InitOptions o;
        o.dtype = dtype;
        o.capacity = capacity;
        o.row_idx_type = row_idx_type;
        o.group_list_type = row_idx_type == 0 ? GK_GROUP_LIST_COUNT : GK_GROUP_LIST_CUMSUM;
        const RoutingSpec spec{40, 3, 6, 0.4, {4}, 61 + static_cast<uint64_t>(capacity)};
        const InitProblem pb = MakeProblem(spec, k, o);
        const InitResult routed = RunInitRouting(pb, o);
        ASSERT_TRUE(MatchesReference(pb, o, routed));
        const auto groups = IndexValues(routed.groups, DType::kI64);
        int64_t m = 0;  // the count total, or the last running total
        for (int64_t c : groups) m = o.group_list_type == GK_GROUP_LIST_CUMSUM ? c : m + c;
        // gradY [M, N] and weight [G, K, N] of small integers: every float32 sum is exact.
        const FloatData dy = MakeFloatData(m * n, dtype, Values::kSmallIntegers, 71);
        const FloatData w = MakeFloatData(spec.g * k * n, dtype, Values::kSmallIntegers, 72);
        std::vector<float> dx(static_cast<size_t>(spec.batch * k), std::nanf(""));
        const int64_t idx_len = static_cast<int64_t>(routed.idx.size() / 8);
        TensorGuard dy_t({m, n}, dtype, dy.bytes.data());
        TensorGuard w_t({spec.g, k, n}, dtype, w.bytes.data());
        TensorGuard idx_t({idx_len}, DType::kI64, routed.idx.data());
        TensorGuard g_t({spec.g}, DType::kI64, routed.groups.data());
        TensorGuard dx_t({spec.batch, k}, DType::kF32, dx.data());
        uint64_t ws = 0;
        gkOpExecutor* executor = nullptr;
        ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                      dy_t.t, w_t.t, idx_t.t, g_t.t, spec.batch, spec.top_k,
                      static_cast<gkRowIdxType>(row_idx_type),
                      static_cast<gkGroupListType>(o.group_list_type), dx_t.t, &ws, &executor),
                  GK_SUCCESS)
            << gkGetRecentErrMsg();
        ASSERT_EQ(RunPlanned(executor, ws, gkMoeInitRoutingGroupedMatmulGrad), GK_SUCCESS)
            << gkGetRecentErrMsg();
        gkDestroyExecutor(executor);
        // The float64 reference, from expertIdx and capacity alone.
        const auto ref = MoeInitRoutingReference(pb.experts, spec.g, capacity);
        ASSERT_EQ(ref.m, m);
        std::vector<double> want(static_cast<size_t>(spec.batch * k), 0.0);
        for (int64_t i = 0; i < m; ++i) {
          const int64_t slot = ref.row_slot[i], b = slot / spec.top_k;
          const int64_t expert = pb.experts[slot];
          for (int64_t kk = 0; kk < k; ++kk) {
            double sum = 0;
            for (int64_t nn = 0; nn < n; ++nn) {
              sum += static_cast<double>(dy.values[i * n + nn]) *
                     w.values[(expert * k + kk) * n + nn];
            }
            want[b * k + kk] += sum;
          }
        }
        for (size_t e = 0; e < want.size(); ++e) {
          ASSERT_EQ(dx[e], want[e]) << "gradX element " << e << " capacity " << capacity
                                    << " rowIdxType " << row_idx_type << " " << DTypeName(dtype);
        }
      }
    }
  }
}

}  // namespace
}  // namespace gk::testing
