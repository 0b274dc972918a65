// GroupedMatmul and GroupedMatmulWeightGrad through their C API: float64 references over a case
// table (empty experts, one expert holding every row, skewed routing, topK 1..8, tile-edge
// shapes) in every dtype, input form (plain, gather-fused by either index type), group-list form,
// index width, weight form and output dtype; all forms of one input give identical bytes;
// determinism across runs and thread counts.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "ops/grouped_matmul/grouped_matmul_plan.h"
#include "tests/ops/grouped_matmul/grouped_matmul_test_util.h"

namespace gk::testing {
namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Shapes from the tiles: base_m = base_n = base_r = 256 and the row granule 16, each met, one
// short and one past; plus the routing edge cases.
const GmmCase kCases[] = {
    {"single_row", 1, 1, 1, 8, 8},
    {"one_expert_holds_every_row", 64, 2, 5, 24, 40, 1.0, 0.0, {1, 2, 3, 4}},
    {"empty_experts", 30, 2, 6, 20, 12, 0.6, 0.0, {0, 2, 5}},
    {"skewed", 300, 2, 8, 48, 33, 1.0, 0.9},
    {"topk_8", 40, 8, 9, 17, 19, 0.9},
    {"m_granule_edges", 17, 1, 1, 16, 16},  // M = 17: a full granule and one row
    {"tiles_exact", 128, 2, 1, 256, 256},   // M = N = K = 256
    {"tiles_plus_one", 257, 1, 1, 257, 257},
    {"tiles_minus_one", 255, 1, 2, 255, 255},
    {"two_row_blocks_many_experts", 260, 2, 7, 40, 300},
    {"k_is_1", 50, 2, 3, 1, 20},
    {"n_is_1", 50, 2, 3, 20, 1},
    {"tail_rows_past_x", 5, 3, 4, 16, 24},  // pieces whose padded GEMM would run past x
    // Expert 0 holds ~600 rows (three pieces of base_m from its first row), the others ~50 each,
    // so pieces start inside row blocks and run past them (forward: owned by their first row).
    {"pieces_past_row_blocks", 740, 1, 4, 24, 40, 1.0, 0.8},
    // Forward k-blocks (streamed weights: K > kGroupedMatmulStreamBaseK, experts averaging at most
    // base_m rows): 600 = 256 + 256 + 88, two row blocks, a unit of two column blocks (the last
    // 44 wide). Float32 x on Zen 4 / Zen 5 keeps the whole K in place (kGroupedMatmulMaxWholeK);
    // float16 x streams there.
    {"k_blocks", 150, 2, 3, 600, 300, 1.0, 0.5},
    // Float32 x past kGroupedMatmulMaxWholeK streams on every CPU, also with an expert of two
    // pieces (256 + 44 rows, each preparing every B k-block): 17 k-blocks, the last 200 long.
    {"k_past_whole_k", 300, 1, 1, kGroupedMatmulMaxWholeK + 200, 40},
    // Copied pieces in stages (gather-fused or float16 x): float32 stages of 64 rows, so the
    // expert's piece of 256 rows runs in four, and the last piece (44 rows; on oneDNN, padded
    // past x's end) in one; bfloat16 whole (only float32 GEMMs stage). Columns 256 + 40: on
    // oneDNN the 40-wide block runs on gemm:jit, the others on brgemm (float32 on Zen 4 / Zen 5:
    // all on gemm:jit), so both kernels meet staged rows against the plain form's whole pieces.
    {"a_stages", 300, 1, 1, kGroupedMatmulAStageBytes / (4 * 64), 296},
    // Exact expert sizes around the pieces of base_m rows: 320 and 321 (256 + 64 / 65), 257, 576
    // and 577 (three pieces, the last of 64 / 65 rows), 256, with empty and one-row experts
    // between them, so that pieces start at every offset into a row block.
    {"exact_piece_edges", 2388, 1, 9, 40, 300, 1.0, 0.0, {}, 1, {320, 0, 321, 1, 257, 576, 577, 80, 256}},
};

struct Form {
  int64_t row_idx_type;  // -1 plain
  gkGroupListType group_list_type;
  DType index_dtype;
};
constexpr Form kForms[] = {{-1, GK_GROUP_LIST_COUNT, DType::kI64},
                           {-1, GK_GROUP_LIST_CUMSUM, DType::kI32},
                           {0, GK_GROUP_LIST_COUNT, DType::kI64},
                           {0, GK_GROUP_LIST_CUMSUM, DType::kI32},
                           {1, GK_GROUP_LIST_COUNT, DType::kI32},
                           {1, GK_GROUP_LIST_CUMSUM, DType::kI64}};

GmmOptions Options(const Form& f, bool out_f32) {
  GmmOptions o;
  o.row_idx_type = f.row_idx_type;
  o.group_list_type = f.group_list_type;
  o.index_dtype = f.index_dtype;
  o.group_list_dtype = f.index_dtype;
  o.out_f32 = out_f32;
  return o;
}

std::string Describe(const GmmCase& c, DType dtype, GmmValues kind, const Form& f) {
  return fmt::format("{} {} {} x {} groupList {} index {}", c.name, DTypeName(dtype),
                     kind == GmmValues::kRandom ? "random" : "integers",
                     f.row_idx_type < 0 ? "plain" : f.row_idx_type == 0 ? "gather" : "scatter",
                     f.group_list_type == GK_GROUP_LIST_CUMSUM ? "cumsum" : "count",
                     DTypeName(f.index_dtype));
}

// Every case, dtype, value kind and form, float32 output; all forms must give the same bytes.
TEST(grouped_matmul_api, ForwardMatchesReferenceInEveryForm) {
  for (const GmmCase& c : kCases) {
    for (DType dtype : kDTypes) {
      for (GmmValues kind : {GmmValues::kSmallIntegers, GmmValues::kRandom}) {
        const GmmInputs in = MakeGmmInputs(c, dtype, kind);
        const GroupedMatmulRef ref = ForwardRef(in);
        std::vector<uint8_t> first;
        for (const Form& f : kForms) {
          const std::string what = Describe(c, dtype, kind, f);
          SCOPED_TRACE(what);
          const GmmOutput y = RunGroupedMatmul(in, Options(f, true));
          EXPECT_TRUE(MatchesRef(ref, y, kind == GmmValues::kSmallIntegers, what));
          if (first.empty()) first = y.bytes;
          EXPECT_EQ(first, y.bytes);
        }
      }
    }
  }
}

TEST(grouped_matmul_api, WeightGradMatchesReferenceInEveryForm) {
  for (const GmmCase& c : kCases) {
    for (DType dtype : kDTypes) {
      for (GmmValues kind : {GmmValues::kSmallIntegers, GmmValues::kRandom}) {
        const GmmInputs in = MakeGmmInputs(c, dtype, kind);
        const GroupedMatmulRef ref = WeightGradRef(in);
        std::vector<uint8_t> first;
        for (const Form& f : kForms) {
          const std::string what = Describe(c, dtype, kind, f);
          SCOPED_TRACE(what);
          const GmmOutput dw = RunWeightGrad(in, Options(f, true));
          EXPECT_TRUE(MatchesRef(ref, dw, kind == GmmValues::kSmallIntegers, what));
          if (first.empty()) first = dw.bytes;
          EXPECT_EQ(first, dw.bytes);
        }
      }
    }
  }
}

// The dtype output is the float32 output rounded once: bit for bit.
TEST(grouped_matmul_api, DTypeOutputIsTheFloat32OutputRoundedOnce) {
  const GmmCase cases[] = {{"rounding", 70, 3, 5, 300, 70, 0.9}, {"tails", 20, 2, 3, 33, 270}};
  for (const GmmCase& c : cases) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << c.name << " " << DTypeName(dtype));
      const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
      for (const Form& f : {kForms[0], kForms[3]}) {
        for (int op = 0; op < 2; ++op) {
          const auto run = [&](bool out_f32) {
            return op == 0 ? RunGroupedMatmul(in, Options(f, out_f32))
                           : RunWeightGrad(in, Options(f, out_f32));
          };
          const GmmOutput wide = run(true), narrow = run(false);
          ASSERT_EQ(narrow.dtype, dtype);
          ASSERT_EQ(wide.elems(), narrow.elems());
          int64_t mismatches = 0;
          for (int64_t i = 0; i < wide.elems(); ++i) {
            uint16_t expected_bits;
            const float v = static_cast<float>(wide.At(i));
            expected_bits = dtype == DType::kF16 ? F16FromF32(v) : Bf16FromF32(v);
            uint16_t got_bits;
            std::memcpy(&got_bits, narrow.bytes.data() + 2 * i, 2);
            mismatches += got_bits != expected_bits;
          }
          EXPECT_EQ(mismatches, 0) << (op == 0 ? "forward" : "weight grad");
        }
      }
    }
  }
}

// The four weight forms are the same weights: the same bits out.
TEST(grouped_matmul_api, EveryWeightFormGivesTheSameBytes) {
  const GmmCase cases[] = {kCases[3],  kCases[7],  kCases[9], kCases[10],
                           kCases[11], kCases[12], kCases[14], kCases[15]};
  for (const GmmCase& c : cases) {
    for (DType dtype : kDTypes) {
      const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
      const GroupedMatmulRef ref = ForwardRef(in);
      for (int64_t row_idx_type : {-1, 1}) {
        std::vector<uint8_t> first;
        for (WeightForm form : {WeightForm::kGkn, WeightForm::kGknViewOfGnk, WeightForm::kGnk,
                                WeightForm::kGnkViewOfGkn}) {
          SCOPED_TRACE(::testing::Message() << c.name << " " << DTypeName(dtype) << " form "
                                            << static_cast<int>(form) << " rowIdxType "
                                            << row_idx_type);
          GmmOptions o;
          o.row_idx_type = row_idx_type;
          o.weight_form = form;
          const GmmOutput y = RunGroupedMatmul(in, o);
          EXPECT_TRUE(MatchesRef(ref, y, false, c.name, 3));
          if (first.empty()) first = y.bytes;
          EXPECT_EQ(first, y.bytes);
        }
      }
    }
  }
}

// The weights' alignment changes no byte of y: float32 [K, N] weights whose k-block rows start
// on 64-byte lines are read in place by the own kernel's streamed forward, where it runs
// (MoeMicroGemmKN; packed otherwise: 16 bytes off, or a column block of part of a panel), and
// the plan says which. K past kGroupedMatmulMaxWholeK streams float32 on every CPU; N 304 =
// a 256-column block (whole panels of 32 on AVX-512, 16 elsewhere: read in place) and a
// 48-column one (packed on AVX-512).
TEST(grouped_matmul_api, ForwardBytesWhateverTheWeightsAlignment) {
  const GmmCase c{"aligned_weights", 300, 1, 2, kGroupedMatmulMaxWholeK + 200, 304, 1.0, 0.5};
  const GmmInputs in = MakeGmmInputs(c, DType::kF32, GmmValues::kRandom);
  const GroupedMatmulRef ref = ForwardRef(in);
  for (WeightForm form : {WeightForm::kGkn, WeightForm::kGnk}) {
    GmmOptions o;
    o.weight_form = form;
    o.w_offset = 0;
    const GmmOutput aligned = RunGroupedMatmul(in, o);
    EXPECT_TRUE(MatchesRef(ref, aligned, false, "forward", 7));
    for (int64_t offset : {4, 16, 36}) {
      SCOPED_TRACE(::testing::Message() << "form " << static_cast<int>(form) << " offset " << offset);
      o.w_offset = offset;
      EXPECT_EQ(RunGroupedMatmul(in, o).bytes, aligned.bytes);
    }
    o.w_offset = 0;
    o.threads = 3;
    EXPECT_EQ(RunGroupedMatmul(in, o).bytes, aligned.bytes);
  }
}

// topK 1..8, some slots dropped, gather-fused by both index types.
TEST(grouped_matmul_api, TopKOneToEight) {
  for (int64_t top_k = 1; top_k <= 8; ++top_k) {
    const GmmCase c{"topk", 37, top_k, 6, 40, 36, 0.85, 0.0, {}, static_cast<uint64_t>(top_k)};
    const GmmInputs in = MakeGmmInputs(c, DType::kBF16, GmmValues::kSmallIntegers);
    for (int64_t row_idx_type : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "topK " << top_k << " rowIdxType " << row_idx_type);
      GmmOptions o;
      o.row_idx_type = row_idx_type;
      EXPECT_TRUE(MatchesRef(ForwardRef(in), RunGroupedMatmul(in, o), true, "forward"));
      EXPECT_TRUE(MatchesRef(WeightGradRef(in), RunWeightGrad(in, o), true, "weight grad"));
    }
  }
}

// An expert with exactly the chunk's rows, one less, one more, two chunks and a tail: the weight
// gradient's reduction chunks (first writes, the rest add). A remainder of up to a quarter
// chunk joins the last full chunk: 257 and 320 (= 256 + 64) rows in one chunk, 321 in two, 830
// (= 3 x 256 + 62) in three, the last of 318 rows. K 24 keeps C tiles; K 32 writes float32
// gradWeight direct where the CPU does not stream it.
TEST(grouped_matmul_api, WeightGradReductionChunks) {
  for (int64_t rows : {255, 256, 257, 320, 321, 512, 700, 830}) {
    for (int64_t k : {24, 32}) {
      const GmmCase c{"chunks", rows, 1, 1, k, 20};
      for (DType dtype : kDTypes) {
        SCOPED_TRACE(::testing::Message() << rows << " rows, K " << k << ", " << DTypeName(dtype));
        const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
        EXPECT_TRUE(MatchesRef(WeightGradRef(in), RunWeightGrad(in), false, "weight grad"));
      }
    }
  }
}

// Weight grad units of several K groups and column groups: K 1100 = 5 blocks in groups of 2, 2, 1;
// N 2100 = 9 blocks (the last 52 wide) in groups of 8, 1.
TEST(grouped_matmul_api, WeightGradTileGroups) {
  const GmmCase c{"groups", 60, 2, 3, 1100, 2100, 0.9};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
    const GmmOutput dw = RunWeightGrad(in);
    EXPECT_TRUE(MatchesRef(WeightGradRef(in), dw, false, "weight grad", 5));
    GmmOptions o;
    o.row_idx_type = 1;
    o.threads = 3;
    EXPECT_EQ(dw.bytes, RunWeightGrad(in, o).bytes);
  }
}

// gradWeight's alignment changes no byte of it (on Intel its rows are streamed out in runs
// across a unit's tiles from the first 64-byte line on, the ends by plain stores): offsets past a
// line of 0 to 60 bytes, with units spanning part of N (the case above: 8 + 1 column blocks) and
// all of it (rows end to end: one run a unit), and gradWeight in the input dtype.
TEST(grouped_matmul_api, WeightGradBytesWhateverGradWeightsAlignment) {
  // "direct": K and N multiples of 16, experts of about 400 rows (two chunks): float32 gradWeight
  // written by the GEMMs (out_direct, CPUs that do not stream it), the last chunk by
  // non-temporal stores where gradWeight is 64-byte aligned (offset 0), plain ones elsewhere.
  for (const GmmCase& c : {GmmCase{"groups", 60, 2, 3, 1100, 2100, 0.9}, GmmCase{"whole_n", 90, 2, 3, 600, 520},
                           GmmCase{"direct", 600, 2, 3, 272, 544}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
      for (bool out_f32 : {true, false}) {
        GmmOptions o;
        o.out_f32 = out_f32;
        o.out_offset = 0;
        const GmmOutput aligned = RunWeightGrad(in, o);
        EXPECT_TRUE(MatchesRef(WeightGradRef(in), aligned, false, "weight grad", 7));
        for (int64_t offset : {2, 4, 16, 36, 60}) {
          if (offset % ElementBytes(aligned.dtype) != 0) continue;
          SCOPED_TRACE(::testing::Message() << c.name << " " << DTypeName(dtype) << " out "
                                            << DTypeName(aligned.dtype) << " offset " << offset);
          o.out_offset = offset;
          EXPECT_EQ(RunWeightGrad(in, o).bytes, aligned.bytes);
        }
      }
    }
  }
}

// Every slot dropped: y is empty; every gradWeight element is +0.
TEST(grouped_matmul_api, NoRowsAtAll) {
  GmmCase c{"no_rows", 8, 2, 3, 16, 12};
  c.keep = 0.0;
  const GmmInputs in = MakeGmmInputs(c, DType::kF32, GmmValues::kRandom);
  ASSERT_EQ(in.m(), 0);
  for (int64_t row_idx_type : {-1, 0, 1}) {
    GmmOptions o;
    o.row_idx_type = row_idx_type;
    EXPECT_TRUE(RunGroupedMatmul(in, o).bytes.empty());
    for (bool out_f32 : {true, false}) {
      o.out_f32 = out_f32;
      const GmmOutput dw = RunWeightGrad(in, o);
      for (uint8_t byte : dw.bytes) ASSERT_EQ(byte, 0);
    }
  }
}

// Empty experts' gradWeight slices are exactly +0, whatever the NaN the output held before.
TEST(grouped_matmul_api, EmptyExpertsGetZeroGradients) {
  const GmmCase c{"empty", 50, 2, 6, 30, 20, 1.0, 0.0, {1, 4}};
  for (DType dtype : kDTypes) {
    const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
    for (bool out_f32 : {true, false}) {
      GmmOptions o;
      o.out_f32 = out_f32;
      const GmmOutput dw = RunWeightGrad(in, o);
      const int64_t slice = c.k * c.n * ElementBytes(dw.dtype);
      for (int64_t e : {1, 4}) {
        for (int64_t b = 0; b < slice; ++b) ASSERT_EQ(dw.bytes[e * slice + b], 0);
      }
    }
  }
}

// GroupedMatmulWeightGradAdd: each element of gradWeightRef becomes its old value (as float32)
// plus the float32 sum GroupedMatmulWeightGrad computes, rounded once to its dtype; an empty
// expert's slice keeps its bits (here -0.0 and NaN, which an addition of 0 would change). The
// same bytes for 1 and 3 threads. Experts of 300+ rows reduce in more than one chunk.
TEST(grouped_matmul_api, WeightGradAddIsTheSumAddedOnce) {
  const GmmCase c{"add", 700, 2, 5, 40, 36, 1.0, 0.2, {3}};
  for (DType dtype : kDTypes) {
    const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
    for (int64_t row_idx_type : {-1, 1}) {
      GmmOptions o;
      o.row_idx_type = row_idx_type;
      const GmmOutput sum = RunWeightGrad(in, o);  // float32
      for (bool out_f32 : {true, false}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " rowIdxType " << row_idx_type
                                          << (out_f32 ? " float32 out" : " dtype out"));
        o.out_f32 = out_f32;
        GmmOutput before{out_f32 ? DType::kF32 : dtype, {}};
        const int64_t elems = c.g * c.k * c.n, slice = c.k * c.n;
        before.bytes.resize(static_cast<size_t>(elems * ElementBytes(before.dtype)));
        std::mt19937 generator(5);
        std::uniform_real_distribution<float> real(-4.0f, 4.0f);
        for (int64_t i = 0; i < elems; ++i) StoreFromF32(before.bytes.data(), i, before.dtype, real(generator));
        StoreFromF32(before.bytes.data(), 3 * slice, before.dtype, -0.0f);
        StoreFromF32(before.bytes.data(), 3 * slice + 1, before.dtype, std::nanf(""));
        for (int32_t threads : {1, 3}) {
          o.threads = threads;
          const GmmOutput after = RunWeightGrad(in, o, &before);
          std::vector<uint8_t> want(before.bytes);
          for (int64_t i = 0; i < elems; ++i) {
            if (i / slice == 3) continue;  // empty: unchanged
            StoreFromF32(want.data(), i, before.dtype,
                         static_cast<float>(before.At(i)) + static_cast<float>(sum.At(i)));
          }
          ASSERT_EQ(after.bytes, want) << threads << " threads";
        }
      }
    }
  }
}

// Determinism: the same bytes on every run and for 1, 2, 3 and 4 threads, with random inputs.
// The cases have many units, both unit orders of the forward pass, and several chunks; the last
// third forward k-blocks whose units span 3, 2, 1 and 1 column blocks at 1, 2, 3 and 4 threads
// (kGroupedMatmulStreamUnitsPerThread; grouped_matmul_plan.StreamedWeightsInKBlocks); the last
// K past kGroupedMatmulMaxWholeK, experts of ~520 rows (three pieces each), whose units span two
// row blocks at 1 thread and one at 2-4 (grouped_matmul_plan.KBlockedUnitsSpanAnExpertsPieces).
TEST(grouped_matmul_api, BitIdenticalAcrossRunsAndThreadCounts) {
  const GmmCase cases[] = {{"many_units", 400, 3, 9, 100, 600, 0.9},
                           {"long_experts", 900, 1, 3, 300, 70},
                           // 700 rows an expert, three chunks (bfloat16: the dot-product kernel
                           // where the CPU rule takes it, bf16_dot_where_faster)
                           {"chunked_experts", 1400, 1, 2, 100, 300},
                           {"k_block_units", 300, 2, 5, 520, 1100, 0.9},
                           {"k_block_row_groups", 780, 2, 3, kGroupedMatmulMaxWholeK + 100, 40}};
  for (const GmmCase& c : cases) {
    for (DType dtype : kDTypes) {
      const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
      for (int64_t row_idx_type : {-1, 0}) {
        for (int op = 0; op < 2; ++op) {
          SCOPED_TRACE(::testing::Message() << c.name << " " << DTypeName(dtype) << " rowIdxType "
                                            << row_idx_type << (op ? " weight grad" : " forward"));
          GmmOptions o;
          o.row_idx_type = row_idx_type;
          const auto run = [&](int32_t threads) {
            o.threads = threads;
            return op == 0 ? RunGroupedMatmul(in, o) : RunWeightGrad(in, o);
          };
          const GmmOutput reference = run(1);
          EXPECT_TRUE(MatchesRef(op == 0 ? ForwardRef(in) : WeightGradRef(in), reference, false,
                                 c.name, 7));
          for (int32_t threads : {1, 2, 3, 4}) {
            for (int repeat = 0; repeat < 2; ++repeat) {
              EXPECT_EQ(reference.bytes, run(threads).bytes)
                  << threads << " threads, repeat " << repeat;
            }
          }
        }
      }
    }
  }
}

// A repeatable executor runs again on changed data (same shapes) and gives the new answer.
TEST(grouped_matmul_api, RepeatableExecutorSeesNewRouting) {
  const GmmCase c{"repeat", 30, 2, 4, 24, 16};
  GmmInputs in = MakeGmmInputs(c, DType::kF32, GmmValues::kSmallIntegers);
  std::vector<float> y(static_cast<size_t>(in.m() * c.n));
  TensorGuard x_t({c.batch, c.k}, in.dtype, in.tokens.data());
  TensorGuard w_t({c.g, c.k, c.n}, in.dtype, in.w.data());
  TensorGuard idx_t({in.m()}, DType::kI64, in.routing.gather_idx.data());
  TensorGuard groups_t({c.g}, DType::kI64, in.routing.group_counts.data());
  TensorGuard y_t({in.m(), c.n}, DType::kF32, y.data());
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  ASSERT_EQ(gkGroupedMatmulGetWorkspaceSize(x_t.t, w_t.t, groups_t.t, GK_GROUP_LIST_COUNT, false,
                                            idx_t.t, GK_ROW_IDX_GATHER, c.top_k, y_t.t, &size,
                                            &executor),
            GK_SUCCESS)
      << gkGetRecentErrMsg();
  ASSERT_EQ(gkSetExecutorRepeatable(executor), GK_SUCCESS);
  std::vector<uint8_t> workspace(size);
  const auto check = [&] {
    GmmOutput out{DType::kF32, std::vector<uint8_t>(y.size() * 4)};
    std::memcpy(out.bytes.data(), y.data(), out.bytes.size());
    return MatchesRef(ForwardRef(in), out, true, "repeat");
  };
  ASSERT_EQ(gkGroupedMatmul(workspace.data(), size, executor, nullptr), GK_SUCCESS);
  EXPECT_TRUE(check());
  // Reverse the slot order of the rows (still a valid routing).
  std::reverse(in.routing.gather_idx.begin(), in.routing.gather_idx.end());
  for (int64_t i = 0; i < in.m(); ++i) in.routing.row_token[i] = in.routing.gather_idx[i] / c.top_k;
  ASSERT_EQ(gkGroupedMatmul(workspace.data(), size, executor, nullptr), GK_SUCCESS);
  EXPECT_TRUE(check());
  // A duplicate slot now: refused in phase 2, y untouched.
  const std::vector<float> before = y;
  in.routing.gather_idx[1] = in.routing.gather_idx[0];
  EXPECT_EQ(gkGroupedMatmul(workspace.data(), size, executor, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("expandedRowIdx[1]"), std::string::npos)
      << gkGetRecentErrMsg();
  EXPECT_EQ(std::memcmp(before.data(), y.data(), y.size() * 4), 0);
  gkDestroyExecutor(executor);
}

// A large case: many row blocks and column blocks, every 13th element checked.
TEST(grouped_matmul_api, LargeCase) {
  const GmmCase c{"large", kUnderSanitizer ? 256 : 1024, 4, 16, 512, 384, 0.95, 0.3};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const GmmInputs in = MakeGmmInputs(c, dtype, GmmValues::kRandom);
    GmmOptions o;
    o.row_idx_type = 1;
    EXPECT_TRUE(MatchesRef(ForwardRef(in), RunGroupedMatmul(in, o), false, "forward", 13));
    EXPECT_TRUE(MatchesRef(WeightGradRef(in), RunWeightGrad(in, o), false, "weight grad", 13));
  }
}

}  // namespace
}  // namespace gk::testing
