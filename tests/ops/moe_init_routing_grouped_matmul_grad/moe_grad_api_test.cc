// MoeInitRoutingGroupedMatmulGrad through its C API: the seed's white-box table in every dtype,
// index form and group-list form; dropped slots, skewed routing, exact and random inputs;
// determinism across runs and thread counts.
#include <algorithm>
#include <cstring>
#include <utility>

#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"
#include "tests/ops/moe_init_routing_grouped_matmul_grad/moe_grad_test_util.h"

namespace gk::testing {
namespace {

// The seed's white-box table (test design 4.2.1). Tails: K and N that no tile divides.
const MoeCase kSeedTable[] = {
    {"single_token_single_expert", 1, 1, 1, 128, 256},
    {"single_token_topk3", 1, 3, 3, 128, 256},
    {"all_tokens_one_expert", 128, 1, 1, 128, 256},
    {"many_tokens_many_experts", 128, 3, 10, 128, 256, 0.8},
    {"empty_expert", 10, 2, 4, 128, 256, 0.5, 0.0, {1}},
    {"tails", 10, 3, 4, 128 + 50, 256 + 30},
    {"m_is_1", 1, 1, 1, 128, 256},
    {"n_is_1", 128, 3, 4, 128, 1},
    {"k_is_1", 128, 3, 4, 1, 256},
    {"k_two_tiles_and_tail", 300, 2, 5, 256 + 256 + 40, 48},
    {"k_one_past_a_tile", 40, 2, 3, 257, 40},  // no one-column tail block (oneDNN 3.7 got it wrong)
};

struct Variant {
  int64_t row_idx_type;
  gkGroupListType group_list_type;
};
constexpr Variant kVariants[] = {{0, GK_GROUP_LIST_COUNT},
                                 {0, GK_GROUP_LIST_CUMSUM},
                                 {1, GK_GROUP_LIST_COUNT},
                                 {1, GK_GROUP_LIST_CUMSUM}};
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Every row of the table, both value kinds, every dtype and variant; all variants of one input
// must also give identical bytes (they describe the same routing).
TEST(moe_grad_api, SeedTableMatchesReference) {
  for (const MoeCase& c : kSeedTable) {
    for (DType dtype : kDTypes) {
      for (MoeValues kind : {MoeValues::kSmallIntegers, MoeValues::kRandom}) {
        const MoeInputs in = MakeMoeInputs(c, dtype, kind);
        std::vector<float> first;
        for (const Variant& v : kVariants) {
          SCOPED_TRACE(::testing::Message()
                       << c.name << " " << DTypeName(dtype)
                       << (kind == MoeValues::kRandom ? " random" : " integers") << " rowIdxType "
                       << v.row_idx_type << " groupListType " << v.group_list_type);
          const auto dx = RunMoeGrad(in, {v.row_idx_type, v.group_list_type});
          EXPECT_TRUE(MatchesReference(in, dx, kind == MoeValues::kSmallIntegers));
          if (first.empty()) first = dx;
          EXPECT_EQ(std::memcmp(first.data(), dx.data(), dx.size() * 4), 0);
        }
      }
    }
  }
}

// nn.Linear's [G, N, K] weight passed as its transposed view gives the bytes of the [G, K, N]
// weight: the kernels transpose each block into the same B tile. Over the table (one k-block,
// tails, N = 1, K = 1) and an N long enough to be cut into k-blocks.
TEST(moe_grad_api, TransposedWeightViewGivesTheSameBytes) {
  std::vector<MoeCase> cases(std::begin(kSeedTable), std::end(kSeedTable));
  cases.push_back({"k_blocks", 40, 2, 3, 72, 3000, 0.9});
  MoeGradShape long_n{};
  long_n.n = 3000;
  long_n.k = 72;
  long_n.g = 3;
  long_n.batch = 40;
  long_n.top_k = 2;
  long_n.m = 72;
  long_n.dtype = DType::kF32;
  ASSERT_GT(ChooseMoeGradTiles(long_n, DetectMoeGradMachine(long_n).gemm_any_stride).k_blocks, 1)
      << "the last case no longer has k-blocks";
  for (const MoeCase& c : cases) {
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(::testing::Message() << c.name << " " << DTypeName(dtype));
      const MoeInputs in = MakeMoeInputs(c, dtype, MoeValues::kRandom);
      const auto gkn = RunMoeGrad(in);
      MoeRunOptions nk;
      nk.weight_nk = true;
      const auto transposed = RunMoeGrad(in, nk);
      EXPECT_EQ(std::memcmp(gkn.data(), transposed.data(), gkn.size() * 4), 0);
      EXPECT_TRUE(MatchesReference(in, transposed, /*exact=*/false, /*stride=*/3));
    }
  }
}

// The seed's large-token case (batch 108 x 1024, topK 2, 60 experts, K 128, N 256): 64-bit
// indexing and many chunks. Checked on every 16th token (all of them would cost minutes).
TEST(moe_grad_api, LargeTokenCase) {
  const int64_t batch = kUnderSanitizer ? 110592 / 16 : 110592;
  const MoeCase c{"large_tokens", batch, 2, 60, 128, 256};
  for (DType dtype : kDTypes) {
    const MoeInputs in = MakeMoeInputs(c, dtype, MoeValues::kRandom);
    std::vector<float> first;
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " rowIdxType " << v.row_idx_type
                                        << " groupListType " << v.group_list_type);
      const auto dx = RunMoeGrad(in, {v.row_idx_type, v.group_list_type});
      if (first.empty()) {
        EXPECT_TRUE(MatchesReference(in, dx, false, 16));
        first = dx;
      } else {
        EXPECT_EQ(std::memcmp(first.data(), dx.data(), dx.size() * 4), 0);
      }
    }
  }
}

TEST(moe_grad_api, DroppedSlotsLeaveZeroRows) {
  // Half the slots dropped: some tokens receive nothing and must read exactly 0.
  const MoeCase c{"dropped", 200, 2, 6, 96, 64, 0.3};
  for (DType dtype : kDTypes) {
    const MoeInputs in = MakeMoeInputs(c, dtype, MoeValues::kSmallIntegers);
    ASSERT_LT(in.routing.m, c.batch * c.top_k);
    for (const Variant& v : kVariants) {
      const auto dx = RunMoeGrad(in, {v.row_idx_type, v.group_list_type});
      EXPECT_TRUE(MatchesReference(in, dx, true));
      std::vector<bool> routed(static_cast<size_t>(c.batch));
      for (int64_t token : in.routing.row_token) routed[token] = true;
      int64_t silent = 0;
      for (int64_t b = 0; b < c.batch; ++b) {
        if (routed[b]) continue;
        ++silent;
        for (int64_t k = 0; k < c.k; ++k) EXPECT_EQ(F32Bits(dx[b * c.k + k]), 0u);
      }
      EXPECT_GT(silent, 0);
    }
  }
}

TEST(moe_grad_api, AllSlotsDropped) {
  MoeCase c{"all_dropped", 16, 2, 3, 40, 24};
  c.keep = 0.0;
  const MoeInputs in = MakeMoeInputs(c, DType::kF32, MoeValues::kRandom);
  ASSERT_EQ(in.routing.m, 0);
  for (const Variant& v : kVariants) {
    const auto dx = RunMoeGrad(in, {v.row_idx_type, v.group_list_type});
    for (float value : dx) EXPECT_EQ(F32Bits(value), 0u);
  }
}

TEST(moe_grad_api, SkewedRouting) {
  // 95% of the slots on expert 0, the rest spread, several experts empty.
  MoeCase c{"skewed", 1500, 2, 12, 300, 80};
  c.skew = 0.95;
  c.forced_empty = {3, 7, 11};
  for (DType dtype : kDTypes) {
    const MoeInputs in = MakeMoeInputs(c, dtype, MoeValues::kRandom);
    ASSERT_GT(in.routing.group_counts[0], in.routing.m * 9 / 10);
    EXPECT_TRUE(MatchesReference(in, RunMoeGrad(in, {0, GK_GROUP_LIST_COUNT}), false));
    EXPECT_TRUE(MatchesReference(in, RunMoeGrad(in, {1, GK_GROUP_LIST_CUMSUM}), false));
  }
}

TEST(moe_grad_api, GatherEntriesPastMAreIgnoredAndInt32IndicesWork) {
  const MoeCase c{"extra_entries", 64, 3, 5, 70, 40, 0.7};
  const MoeInputs in = MakeMoeInputs(c, DType::kBF16, MoeValues::kSmallIntegers);
  const auto base = RunMoeGrad(in, {0, GK_GROUP_LIST_COUNT});
  EXPECT_TRUE(MatchesReference(in, base, true));
  MoeRunOptions junk{0, GK_GROUP_LIST_COUNT};
  junk.extra_gather_entries = 9;  // out-of-range values past M
  EXPECT_EQ(std::memcmp(base.data(), RunMoeGrad(in, junk).data(), base.size() * 4), 0);
  for (int64_t type : {0, 1}) {
    MoeRunOptions narrow{type, GK_GROUP_LIST_CUMSUM};
    narrow.index_dtype = DType::kI32;
    EXPECT_EQ(std::memcmp(base.data(), RunMoeGrad(in, narrow).data(), base.size() * 4), 0);
  }
}

// Determinism: the same bytes on every run and for 1, 2, 3 and 4 threads, with random inputs
// (where the order of float additions shows). The cases cover one and several token chunks,
// one and several k-blocks (checked against the plan, so that each path is the one tested), and
// with several chunks both an expert's rows run as one range (MoeGradPlan::WholeBlocks) and
// chunk by chunk, among the thread counts.
TEST(moe_grad_api, BitIdenticalAcrossRunsAndThreadCounts) {
  const MoeCase cases[] = {{"one_chunk", 100, 4, 9, 600, 200, 0.9},
                           {"chunks", 700, 4, 3, 600, 200, 0.9},
                           {"chunks_and_k_blocks", 300, 4, 3, 160, 3200, 0.9}};
  for (const MoeCase& c : cases) {
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(::testing::Message() << c.name << " " << DTypeName(dtype));
      const MoeInputs in = MakeMoeInputs(c, dtype, MoeValues::kRandom);
      const MoeGradShape shape =
          MoeGradGatherCountShape(c.batch, c.top_k, in.routing.m, c.g, c.k, c.n, dtype);
      const MoeGradTiles tiles =
          ChooseMoeGradTiles(shape, DetectMoeGradMachine(shape).gemm_any_stride);
      EXPECT_EQ(tiles.token_chunks > 1, c.name != "one_chunk");
      EXPECT_EQ(tiles.k_blocks > 1, c.name == "chunks_and_k_blocks");
      if (tiles.token_chunks > 1) {  // 1 thread runs whole blocks; some thread count does not
        bool chunk_by_chunk = false;
        for (int64_t threads : {2, 3, 4}) chunk_by_chunk = chunk_by_chunk || tiles.col_blocks % threads != 0;
        EXPECT_TRUE(chunk_by_chunk) << tiles.col_blocks << " column blocks";
      }
      MoeRunOptions o{1, GK_GROUP_LIST_COUNT};
      o.threads = 1;
      const auto reference = RunMoeGrad(in, o);
      EXPECT_TRUE(MatchesReference(in, reference, false));
      for (int32_t threads : {1, 2, 3, 4}) {
        for (int repeat = 0; repeat < 2; ++repeat) {
          o.threads = threads;
          const auto dx = RunMoeGrad(in, o);
          EXPECT_EQ(std::memcmp(reference.data(), dx.data(), dx.size() * 4), 0)
              << threads << " threads, repeat " << repeat;
        }
      }
    }
  }
}

// One thread's result within the float64 reference, and its bytes on 2, 3 and 4 threads.
void ExpectReferenceBytesOnTwoToFourThreads(const MoeInputs& in) {
  MoeRunOptions o{0, GK_GROUP_LIST_COUNT};
  o.threads = 1;
  const auto reference = RunMoeGrad(in, o);
  EXPECT_TRUE(MatchesReference(in, reference, false));
  for (int32_t threads : {2, 3, 4}) {
    o.threads = threads;
    const auto dx = RunMoeGrad(in, o);
    EXPECT_EQ(std::memcmp(reference.data(), dx.data(), dx.size() * 4), 0) << threads << " threads";
  }
}

// The weights-broadcast form (experts of at most plan.broadcast_max_rows rows, run as one range)
// and the packed-weights form give the same bits: with several token chunks, the thread counts
// that run an expert's rows as one range (1, and those dividing the column blocks) take the
// broadcast form for the few-row experts, the others run them chunk by chunk in the packed form;
// expert 0, past broadcast_max_rows, takes the packed form on every count. bfloat16 on the
// dot-product kernel, float32 on the micro-kernel's AVX-512 chains (elsewhere no expert takes
// the broadcast form: the plan says 0). On the GEMM auto takes and on gradkit's own, so that
// the form runs wherever it can (auto keeps oneDNN on CPUs other than Zen 5).
TEST(moe_grad_api, BroadcastAndPackedWeightFormsGiveTheSameBits) {
  MoeCase c{"few_rows_per_expert", 700, 4, 40, 600, 202, 0.95};
  c.skew = 0.3;  // expert 0 past broadcast_max_rows, the rest about 45 rows each
  int tested = 0;
  for (const auto& [choice, dtype] : {std::pair{"auto", DType::kBF16}, std::pair{"auto", DType::kF32},
                                      std::pair{"gradkit", DType::kBF16}, std::pair{"gradkit", DType::kF32}}) {
    SCOPED_TRACE(::testing::Message() << "GRADKIT_GEMM=" << choice << " " << DTypeName(dtype));
    const gk::testing::EnvScope scope("GRADKIT_GEMM", choice);
    const MoeInputs in = MakeMoeInputs(c, dtype, MoeValues::kRandom);
    const MoeGradShape shape =
        MoeGradGatherCountShape(c.batch, c.top_k, in.routing.m, c.g, c.k, c.n, dtype);
    const MoeGradPlan plan = MakeMoeGradPlan(shape, DetectMoeGradMachine(shape));
    if (plan.broadcast_max_rows == 0) continue;
    ++tested;
    ASSERT_GT(in.routing.group_counts[0], plan.broadcast_max_rows);
    ASSERT_LE(*std::max_element(in.routing.group_counts.begin() + 1, in.routing.group_counts.end()),
              plan.broadcast_max_rows);
    ASSERT_GT(plan.token_chunks, 1);
    bool chunk_by_chunk = false;
    for (int64_t threads : {2, 3, 4}) chunk_by_chunk = chunk_by_chunk || plan.col_blocks % threads != 0;
    ASSERT_TRUE(chunk_by_chunk) << plan.col_blocks << " column blocks";
    ExpectReferenceBytesOnTwoToFourThreads(in);
  }
  if (tested == 0) GTEST_SKIP() << "no expert takes the broadcast form on this machine's GEMM";
}

// On AMX (bfloat16, oneDNN's packed AMX calls, whose bits the form was checked to give), experts
// of more rows than base_m take the weights-broadcast form too, packed once and run in calls of
// MoeGradBroadcastCallRows rows: expert 0 past the form's rows (packed form), the others between
// one call's rows and the form's limit (two calls each, the second from a whole panel group on).
// Within the float64 reference, and the same bytes on 1-4 threads (each thread count runs the
// experts' blocks on other threads, some as whole ranges in the form, some chunk by chunk packed).
TEST(moe_grad_api, AmxBroadcastFormTakesExpertsPastBaseM) {
  MoeCase c{"amx_long_experts", 1000, 4, 9, 256, 768, 1.0};
  c.skew = 0.3;  // expert 0: ~1200 rows, the other eight ~350 each
  const MoeInputs in = MakeMoeInputs(c, DType::kBF16, MoeValues::kRandom);
  const MoeGradShape shape = MoeGradGatherCountShape(c.batch, c.top_k, in.routing.m, c.g, c.k, c.n, DType::kBF16);
  const MoeGradGemm made = CreateMoeGradGemm(shape);
  if (!made.gemm->broadcast_on_amx()) GTEST_SKIP() << "the weights-broadcast form does not run on AMX here";
  const MoeGradPlan plan = MakeMoeGradPlan(shape, MoeGradMachineOf(*made.gemm, made.shape));
  const int64_t call_rows = MoeGradBroadcastCallRows(plan.base_m);
  ASSERT_GT(plan.broadcast_max_rows, plan.base_m);
  ASSERT_GT(in.routing.group_counts[0], plan.broadcast_max_rows);
  int64_t past_one_call = 0;
  for (int64_t g = 1; g < c.g; ++g) {
    ASSERT_LE(in.routing.group_counts[g], plan.broadcast_max_rows) << "expert " << g;
    past_one_call += in.routing.group_counts[g] > call_rows;
  }
  ASSERT_GT(past_one_call, 0) << "no expert runs in two calls (" << call_rows << " rows each)";
  ExpectReferenceBytesOnTwoToFourThreads(in);
}

// int32 index lists (what int32 routing code hands over) give the bytes of int64 ones.
TEST(moe_grad_api, Int32IndexListsGiveTheInt64Bytes) {
  const MoeCase c{"int32_lists", 40, 2, 5, 96 + 7, 40 + 3, 0.8};
  const MoeInputs in = MakeMoeInputs(c, DType::kF32, MoeValues::kRandom);
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(::testing::Message() << "rowIdxType " << v.row_idx_type << " groupListType "
                                      << v.group_list_type);
    const auto wide = RunMoeGrad(in, {v.row_idx_type, v.group_list_type});
    for (DType idx_dtype : {DType::kI64, DType::kI32}) {
      MoeRunOptions o{v.row_idx_type, v.group_list_type};
      o.index_dtype = idx_dtype;
      o.group_list_dtype = DType::kI32;
      const auto narrow = RunMoeGrad(in, o);
      EXPECT_EQ(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)), 0);
    }
    EXPECT_TRUE(MatchesReference(in, wide, false));
  }
}

// gradkit/base.h asks only for element-aligned data: every tensor placed one element past a
// 64-byte boundary (aligned to no vector width) gives the bytes of 64-byte-aligned ones.
TEST(moe_grad_api, ElementAlignedPointersGiveTheAlignedBytes) {
  const MoeCase c{"unaligned", 37, 2, 3, 128 + 5, 64 + 3, 0.9};
  struct Placed {  // a copy of `bytes` at `shift` bytes past a 64-byte boundary
    std::vector<uint8_t> arena;
    uint8_t* data;
    Placed(const void* src, size_t bytes, size_t shift) : arena(bytes + 128) {
      const auto base = reinterpret_cast<uintptr_t>(arena.data());
      data = arena.data() + (64 - base % 64) % 64 + shift;
      std::memcpy(data, src, bytes);
    }
  };
  for (DType dtype : kDTypes) {
    const MoeInputs in = MakeMoeInputs(c, dtype, MoeValues::kRandom);
    const int64_t m = in.routing.m;
    for (int64_t row_idx_type : {0, 1}) {
      const auto& idx = row_idx_type == 1 ? in.routing.scatter_idx : in.routing.gather_idx;
      std::vector<uint8_t> results[2];
      for (size_t misaligned : {0, 1}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " rowIdxType " << row_idx_type
                                          << (misaligned ? " element-aligned" : " 64-aligned"));
        const size_t esize = static_cast<size_t>(ElementBytes(dtype));
        Placed dy(in.dy.data(), in.dy.size(), misaligned * esize);
        Placed w(in.w.data(), in.w.size(), misaligned * esize);
        Placed idx_p(idx.data(), idx.size() * 8, misaligned * 8);
        Placed groups(in.routing.group_counts.data(), in.routing.group_counts.size() * 8,
                      misaligned * 8);
        const size_t dx_bytes = static_cast<size_t>(c.batch * c.k) * sizeof(float);
        const std::vector<uint8_t> nan_fill(dx_bytes, 0xFF);
        Placed dx(nan_fill.data(), dx_bytes, misaligned * sizeof(float));
        TensorGuard dy_t({m, c.n}, dtype, dy.data), w_t({c.g, c.k, c.n}, dtype, w.data);
        TensorGuard idx_t({static_cast<int64_t>(idx.size())}, DType::kI64, idx_p.data);
        TensorGuard groups_t({c.g}, DType::kI64, groups.data);
        TensorGuard dx_t({c.batch, c.k}, DType::kF32, dx.data);
        uint64_t size = 0;
        gkOpExecutor* executor = nullptr;
        ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                      dy_t.t, w_t.t, idx_t.t, groups_t.t, c.batch, c.top_k,
                      static_cast<gkRowIdxType>(row_idx_type), GK_GROUP_LIST_COUNT, dx_t.t,
                      &size, &executor),
                  GK_SUCCESS)
            << gkGetRecentErrMsg();
        // The workspace too, one byte past a 64-byte boundary: gradkit aligns it itself.
        std::vector<uint8_t> workspace_arena(size + 65);
        const auto base = reinterpret_cast<uintptr_t>(workspace_arena.data());
        uint8_t* workspace = workspace_arena.data() + (64 - base % 64) % 64 + misaligned;
        ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace, size, executor, nullptr),
                  GK_SUCCESS)
            << gkGetRecentErrMsg();
        gkDestroyExecutor(executor);
        results[misaligned].assign(dx.data, dx.data + dx_bytes);
        std::vector<float> values(static_cast<size_t>(c.batch * c.k));
        std::memcpy(values.data(), dx.data, dx_bytes);
        EXPECT_TRUE(MatchesReference(in, values, false));
      }
      EXPECT_EQ(results[0], results[1]);
    }
  }
}

// A repeatable executor runs again on changed data (same shapes) and gives the new answer.
TEST(moe_grad_api, RepeatableExecutorSeesNewData) {
  const MoeCase c{"repeat", 50, 2, 4, 64, 32};
  MoeInputs in = MakeMoeInputs(c, DType::kF32, MoeValues::kSmallIntegers);
  std::vector<float> dx(static_cast<size_t>(c.batch * c.k));
  TensorGuard dy_t({in.routing.m, c.n}, in.dtype, in.dy.data());
  TensorGuard w_t({c.g, c.k, c.n}, in.dtype, in.w.data());
  TensorGuard idx_t({in.routing.m}, DType::kI64, in.routing.gather_idx.data());
  TensorGuard groups_t({c.g}, DType::kI64, in.routing.group_counts.data());
  TensorGuard dx_t({c.batch, c.k}, DType::kF32, dx.data());
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                dy_t.t, w_t.t, idx_t.t, groups_t.t, c.batch, c.top_k, GK_ROW_IDX_GATHER, GK_GROUP_LIST_COUNT,
                dx_t.t, &size, &executor),
            GK_SUCCESS);
  ASSERT_EQ(gkSetExecutorRepeatable(executor), GK_SUCCESS);
  std::vector<uint8_t> workspace(size);
  ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr), GK_SUCCESS);
  EXPECT_TRUE(MatchesReference(in, dx, true));
  // Reverse the slot order of the rows (still a valid routing) and double gradY.
  std::reverse(in.routing.gather_idx.begin(), in.routing.gather_idx.end());
  for (int64_t i = 0; i < in.routing.m; ++i) {
    in.routing.row_token[i] = in.routing.gather_idx[i] / c.top_k;
  }
  for (size_t i = 0; i < in.dy_values.size(); ++i) {
    in.dy_values[i] *= 2;
    reinterpret_cast<float*>(in.dy.data())[i] = in.dy_values[i];
  }
  ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor, nullptr), GK_SUCCESS);
  EXPECT_TRUE(MatchesReference(in, dx, true));
  gkDestroyExecutor(executor);
}

}  // namespace
}  // namespace gk::testing
