// GroupedMatmul(WeightGrad) plans: tiles from the shape, the unit order each input form selects,
// the workspace layout, threads, and the JSON. No kernel runs here.
#include <algorithm>
#include <array>
#include <string>
#include <gtest/gtest.h>

#include "ops/grouped_matmul/grouped_matmul_plan.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"
#include "tests/ops/op_test_support.h"

namespace gk {
namespace {

GroupedMatmulShape Shape(GroupedMatmulOp op, int64_t m, int64_t k, int64_t n, int64_t g,
                         DType dtype = DType::kF32) {
  GroupedMatmulShape s{};
  s.op = op;
  s.m = m, s.k = k, s.n = n, s.g = g;
  s.x_rows = m;
  s.dtype = dtype;
  s.out_dtype = DType::kF32;
  s.routing.m = m, s.routing.g = g, s.routing.k = k, s.routing.n = n;
  s.routing.batch = std::max<int64_t>(m, 1), s.routing.top_k = 1;
  s.routing.dtype = dtype;
  s.routing.index_dtype = DType::kI64;
  return s;
}

GroupedMatmulMachine Machine(int32_t threads) { return {threads, 4096, "test", {}}; }

// The weight grad writes gradWeight straight from its GEMMs (no C tiles) only for float32
// gradWeight summed by float32 GEMMs, not Add, K a multiple of the row granule, a CPU that does
// not stream gradWeight, and a GEMM made for rows of stride N; else it keeps its C tiles.
TEST(grouped_matmul_plan, WeightGradWritesGradWeightDirect) {
  const auto plan = [](GroupedMatmulShape s, bool streams, int64_t ldc) {
    GroupedMatmulMachine machine = Machine(2);
    machine.streams_grad_weight = streams;
    machine.gemm_ldc = ldc;
    return MakeGroupedMatmulPlan(s, machine);
  };
  const int64_t k = 4 * kGroupedMatmulRowGranule * 16, n = 768;
  const GroupedMatmulShape s = Shape(GroupedMatmulOp::kWeightGrad, 4096, k, n, 16);
  const auto direct = plan(s, false, n);
  EXPECT_TRUE(direct.out_direct);
  EXPECT_EQ(direct.c_tile_elems, 0);
  const auto tiled = plan(s, false, 256);  // a GEMM of another C stride
  EXPECT_FALSE(tiled.out_direct);
  EXPECT_EQ(tiled.c_tile_elems, tiled.k_group_blocks * tiled.n_group_blocks * tiled.base_m * tiled.base_n);
  EXPECT_LT(direct.thread_bytes, tiled.thread_bytes);
  EXPECT_FALSE(plan(s, true, n).out_direct);  // gradWeight streamed
  auto add = s;
  add.accumulate = true;
  EXPECT_FALSE(plan(add, false, n).out_direct);
  // bfloat16: direct through tiles of all N (one column block, the GEMM's ldc and width N), up to
  // N = kGroupedMatmulGradGroupCols; past it, tiles of at most base_n columns as before.
  const auto bf16 = Shape(GroupedMatmulOp::kWeightGrad, 4096, k, n, 16, DType::kBF16);
  // ChooseTiles asks the CPU whether it streams gradWeight; the machine here says it does not
  // and that its GEMM writes rows of stride N, so the plan writes direct on every CPU, in tiles of
  // all N only where the CPU does not stream (elsewhere such a GEMM would be the micro-kernel's).
  const bool whole = !GroupedMatmulStreamsGradWeight(DetectCpuIdentity());
  EXPECT_TRUE(GroupedMatmulWholeRowTiles(bf16, false));
  EXPECT_FALSE(GroupedMatmulWholeRowTiles(bf16, true));
  EXPECT_TRUE(plan(bf16, false, n).out_direct);
  EXPECT_EQ(plan(bf16, false, n).base_n, whole ? n : 256);
  EXPECT_EQ(plan(bf16, false, n).col_blocks, whole ? 1 : 3);
  EXPECT_EQ(plan(bf16, false, n).c_tile_elems, 0);
  EXPECT_FALSE(plan(bf16, false, 256).out_direct);  // a GEMM of another C stride: tiles
  EXPECT_EQ(GroupedMatmulTileGemmShape(bf16).ldc, whole ? n : 256);  // C dense in its width
  EXPECT_EQ(GroupedMatmulTileGemmShape(bf16).widths, std::vector<int64_t>{whole ? n : 256});
  const auto bf16_wide = Shape(GroupedMatmulOp::kWeightGrad, 4096, k, kGroupedMatmulGradGroupCols + 16,
                               16, DType::kBF16);
  EXPECT_FALSE(GroupedMatmulWholeRowTiles(bf16_wide, false));
  EXPECT_FALSE(plan(bf16_wide, false, bf16_wide.n).out_direct);
  EXPECT_LE(plan(bf16_wide, false, bf16_wide.n).base_n, kGroupedMatmulBaseN);
  auto bf16_add = bf16;
  bf16_add.accumulate = true;
  EXPECT_FALSE(GroupedMatmulWholeRowTiles(bf16_add, false));
  auto bf16_out = bf16;
  bf16_out.out_dtype = DType::kBF16;
  EXPECT_FALSE(GroupedMatmulWholeRowTiles(bf16_out, false));
  auto f16 = Shape(GroupedMatmulOp::kWeightGrad, 4096, k, n, 16, DType::kF16);
  EXPECT_TRUE(plan(f16, false, n).out_direct);  // float32 GEMMs
  f16.out_dtype = DType::kF16;
  EXPECT_FALSE(plan(f16, false, n).out_direct);
  const auto odd_k = Shape(GroupedMatmulOp::kWeightGrad, 4096, k + 1, n, 16);
  EXPECT_FALSE(plan(odd_k, false, n).out_direct);
  EXPECT_FALSE(plan(Shape(GroupedMatmulOp::kForward, 4096, k, n, 16), false, n).out_direct);
  // The GEMM shape agrees with the predicate on this CPU (unless oneDNN is asked for).
  if (MoeTileGemmChoiceFromEnv() != MoeTileGemmChoice::kOneDnn) {
    const bool here = GroupedMatmulWritesGradWeightDirect(
        s, GroupedMatmulStreamsGradWeight(DetectCpuIdentity()));
    EXPECT_EQ(GroupedMatmulTileGemmShape(s).ldc, here ? n : GroupedMatmulTileGemmShape(add).ldc);
    const auto real = MakeGroupedMatmulPlan(s, DetectGroupedMatmulMachine(s));
    EXPECT_EQ(real.out_direct, here);
  }
}

// With oneDNN 2.x both ops pack each B once, through gradkit's packer (checked against oneDNN's
// reorder in phase 1) for the main column width, in float32 and bfloat16, [G, K, N] weights
// packed from their rows; also when K or N leaves a narrower last column block. Detects the
// real machine: the GEMM library is asked.
TEST(grouped_matmul_plan, BPackedOnceByGradkitsPackerOnOneDnn2) {
  if (MoeGemmLibraryName().rfind("oneDNN 2.", 0) != 0) {
    GTEST_SKIP() << MoeGemmLibraryName() << ": B is packed once on oneDNN 2.x only";
  }
  if (MoeTileGemmChoiceFromEnv() == MoeTileGemmChoice::kGradkit) {
    GTEST_SKIP() << "GRADKIT_GEMM=gradkit: the tiles do not run on oneDNN";
  }
  // oneDNN's tiles, wherever auto would take them or not (MoeOwnF32TilesOutrunBrgemm).
  const gk::testing::EnvScope onednn("GRADKIT_GEMM", "onednn");
  int cases = 0;
  for (GroupedMatmulOp op : {GroupedMatmulOp::kForward, GroupedMatmulOp::kWeightGrad}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      // The packer writes oneDNN's brgemm layout: dtypes this CPU has no brgemm kernel for
      // (AVX2 without AVX-512: float32 on gemm:jit, bfloat16 on gradkit's GEMM) have none.
      if (!gk::testing::CpuHasBrgemmFor(dtype)) continue;
      for (const auto& [m, k, n, g] : {std::array<int64_t, 4>{8192, 2048, 1408, 8},
                                       std::array<int64_t, 4>{700, 300, 200, 5}}) {
        SCOPED_TRACE(::testing::Message() << (op == GroupedMatmulOp::kForward ? "forward" : "weight grad")
                                        << " " << DTypeName(dtype) << " M " << m << " K " << k << " N " << n);
        const GroupedMatmulMachine machine = DetectGroupedMatmulMachine(Shape(op, m, k, n, g, dtype));
        ++cases;
        // The float32 forward without k-blocks reads [K, N] rows in place where that measured
        // faster (the 700-row case streams k-blocks, so it packs).
        const bool in_place = op == GroupedMatmulOp::kForward && dtype == DType::kF32 && m == 8192 &&
                              MoeF32InPlaceKNOutrunsPackedBrgemm(DetectCpuIdentity());
        EXPECT_EQ(machine.reads_b_in_place, in_place);
        EXPECT_EQ(machine.packs_b, !in_place);
        EXPECT_TRUE(machine.packs_b_from_kn);
        ASSERT_FALSE(machine.gemm_impls.empty());
        EXPECT_NE(machine.gemm_impls.front().second.find(
                      in_place ? "gemm:jit, B read in place from [K, N] rows" : "B packed once per block by gradkit"),
                  std::string::npos)
            << machine.gemm_impls.front().second;
        if (in_place) {
          // [K, N] rows: row block first, nothing copied. [N, K] weights: the same kernel on
          // [K, N] copies of the blocks, column block first.
          const auto kn = MakeGroupedMatmulPlan(Shape(op, m, k, n, g, dtype), machine);
          EXPECT_FALSE(kn.column_block_first);
          EXPECT_FALSE(kn.b_kn_tile);
          auto nk_shape = Shape(op, m, k, n, g, dtype);
          nk_shape.weight_nk = true;
          const GroupedMatmulMachine nk_machine = DetectGroupedMatmulMachine(nk_shape);
          EXPECT_TRUE(nk_machine.reads_b_in_place);
          EXPECT_EQ(nk_machine.gemm_impls, machine.gemm_impls);
          const auto nk = MakeGroupedMatmulPlan(nk_shape, nk_machine);
          EXPECT_TRUE(nk.b_kn_tile);
          EXPECT_TRUE(nk.column_block_first);
          EXPECT_EQ(nk.b_tile_elems, k * GroupedMatmulKNTileStride(nk.base_n));
        }
      }
    }
  }
  if (cases == 0) GTEST_SKIP() << "this CPU has no brgemm kernel for float32 or bfloat16 (AVX-512)";
}

// auto: the forward on oneDNN wherever it runs brgemm, but its k-blocks (streamed weights) on
// the own kernels where the CPU rules say so (float32: MoeOwnStreamedOutrunsBrgemm; bfloat16 on the
// dot-product kernel: MoeOwnStreamedBf16OnDot); the weight gradient's float32 tiles on the
// micro-kernel where the CPU rule says they run faster (the fused op's rule), bfloat16 on
// oneDNN unless its experts average more than one chunk (bf16_dot_where_faster), then on the
// dot-product kernel where the CPU rule for it says so. (700 rows over 5 experts: one piece an
// expert, one chunk; over 1 expert: three chunks; K 300: k-blocks of 256 and 44 for float32
// where the CPU does not read N < 256 columns in place; K 1500: bfloat16 k-blocks of 1024 and 476
// off AMX.)
TEST(grouped_matmul_plan, AutoTakesOneDnnWhereItHasBrgemm) {
  if (MoeTileGemmChoiceFromEnv() != MoeTileGemmChoice::kAuto) GTEST_SKIP() << "GRADKIT_GEMM set";
  const bool own_f32 = MoeOwnF32TilesOutrunBrgemm(DetectCpuIdentity());
  const bool own_streamed = MoeOwnStreamedOutrunsBrgemm(DetectCpuIdentity());
  const bool own_streamed_bf16 = MoeOwnStreamedBf16OnDot(DetectCpuIdentity());
  for (GroupedMatmulOp op : {GroupedMatmulOp::kForward, GroupedMatmulOp::kWeightGrad}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (const auto& [k, g] : {std::pair<int64_t, int64_t>{300, 5}, {1500, 5}, {300, 1}}) {
        const GroupedMatmulShape shape = Shape(op, 700, k, 200, g, dtype);
        const MoeTileGemmShape gemm_shape = GroupedMatmulTileGemmShape(shape);
        const bool streamed = gemm_shape.streamed_b;
        const bool own = dtype == DType::kF32
                             ? (op == GroupedMatmulOp::kWeightGrad && own_f32) || (streamed && own_streamed)
                             : (streamed || gemm_shape.bf16_dot_where_faster) && own_streamed_bf16;
        const bool onednn = MoeGemmHasOneDnn() && gk::testing::CpuHasBrgemmFor(dtype) && !own;
        const GroupedMatmulMachine machine = DetectGroupedMatmulMachine(shape);
        SCOPED_TRACE(::testing::Message() << (op == GroupedMatmulOp::kForward ? "forward " : "weight grad ")
                                          << DTypeName(dtype) << " K " << k << " G " << g);
        EXPECT_EQ(machine.gemm_backend, onednn ? "onednn" : "gradkit");
        if (dtype == DType::kBF16 && own) {
          EXPECT_NE(machine.gemm_impls.front().second.find("dot-product"), std::string::npos)
              << machine.gemm_impls.front().second;
          // [G, K, N] weights: each block packed from its rows as the kernel multiplies; [G, N, K]
          // rows in a pass before.
          EXPECT_NE(machine.gemm_impls.front().second.find("as it multiplies"), std::string::npos)
              << machine.gemm_impls.front().second;
          if (op == GroupedMatmulOp::kWeightGrad) continue;  // gradY's [M, N] rows: no weight form
          GroupedMatmulShape nk = shape;
          nk.weight_nk = true;
          const std::string nk_impl = DetectGroupedMatmulMachine(nk).gemm_impls.front().second;
          EXPECT_NE(nk_impl.find("dot-product"), std::string::npos) << nk_impl;
          EXPECT_EQ(nk_impl.find("as it multiplies"), std::string::npos) << nk_impl;
        }
        if (dtype == DType::kF32 && own && streamed) {
          // float32 [K, N] weights read in place where a column block is whole panels (N 256),
          // packed where it is not (N 200: 200 = 6 x 32 + 8).
          EXPECT_EQ(machine.gemm_impls.front().second.find("in place"), std::string::npos)
              << machine.gemm_impls.front().second;
          const std::string whole =
              DetectGroupedMatmulMachine(Shape(op, 700, k, 256, 5, dtype)).gemm_impls.front().second;
          EXPECT_NE(whole.find("B read in place"), std::string::npos) << whole;
        }
      }
    }
  }
}

// The weight grad asks for the dot-product kernel (where the CPU rule allows it) in bfloat16 only,
// and only where the average expert's rows take more than one chunk: M > G x (reduce + fold), a
// rule of the shape, so that every routing of it runs the same kernel.
TEST(grouped_matmul_plan, WeightGradBf16OnTheDotKernelWhereExpertsTakeSeveralChunks) {
  const int64_t one_chunk = kGroupedMatmulBaseR + GroupedMatmulReduceFold(kGroupedMatmulBaseR);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (GroupedMatmulOp op : {GroupedMatmulOp::kForward, GroupedMatmulOp::kWeightGrad}) {
      for (int64_t g : {1, 4, 8}) {
        for (int64_t m : {g * one_chunk, g * one_chunk + 1, g * 1024}) {
          const bool want = op == GroupedMatmulOp::kWeightGrad && dtype == DType::kBF16 && m > g * one_chunk;
          EXPECT_EQ(GroupedMatmulTileGemmShape(Shape(op, m, 256, 128, g, dtype)).bf16_dot_where_faster, want)
              << DTypeName(dtype) << (op == GroupedMatmulOp::kForward ? " forward" : " weight grad") << " M "
              << m << " G " << g;
        }
      }
    }
  }
  // Where auto takes the dot-product kernel for it, the columns go in blocks of whole panels, not
  // in one block of all N (which only oneDNN's brgemm needs): S1's N 1408 in blocks of 128.
  if (MoeTileGemmChoiceFromEnv() == MoeTileGemmChoice::kAuto && MoeOwnStreamedBf16OnDot(DetectCpuIdentity())) {
    const GroupedMatmulShape s1 = Shape(GroupedMatmulOp::kWeightGrad, 8192, 2048, 1408, 8, DType::kBF16);
    EXPECT_EQ(MakeGroupedMatmulPlan(s1, Machine(2)).base_n, 128);
    EXPECT_EQ(DetectGroupedMatmulMachine(s1).gemm_backend, "gradkit");
  }
}

// The forward's float32 and bfloat16 k-blocks name each next weight block to the GEMM
// (streamed_b), whatever the weight form (all forms run one kernel); not without k-blocks, not
// float16 (whose B goes through the B tile, converted), not the weight grad.
TEST(grouped_matmul_plan, StreamedWeightsAreForwardKBlocksOfFloat32AndBfloat16) {
  for (GroupedMatmulOp op : {GroupedMatmulOp::kForward, GroupedMatmulOp::kWeightGrad}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (bool weight_nk : {false, true}) {
        for (int64_t k : {int64_t{300}, kGroupedMatmulMaxWholeK + 200}) {
          GroupedMatmulShape s = Shape(op, 700, k, 200, 5, dtype);
          s.weight_nk = weight_nk && op == GroupedMatmulOp::kForward;
          const bool k_blocks = MakeGroupedMatmulPlan(s, Machine(2)).k_blocks > 1;
          EXPECT_EQ(GroupedMatmulTileGemmShape(s).streamed_b,
                    op == GroupedMatmulOp::kForward && dtype != DType::kF16 && k_blocks)
              << DTypeName(dtype) << " K " << k << " weight_nk " << weight_nk;
        }
      }
    }
  }
}

TEST(grouped_matmul_plan, ForwardTilesFromTheShape) {
  const auto p = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 1000, 300, 600, 8), Machine(4));
  EXPECT_EQ(p.base_m, 256);
  EXPECT_EQ(p.base_n, 256);
  EXPECT_EQ(p.reduce, 300);  // the whole K of a unit...
  // ...in k-blocks of 256 and 44 (1000 rows over 8 experts: one piece each), but where the CPU
  // reads float32 weights in place.
  EXPECT_EQ(p.k_blocks, MoeF32InPlaceKNOutrunsPackedBrgemm(DetectCpuIdentity()) ? 1 : 2);
  EXPECT_EQ(p.row_blocks, 4);
  EXPECT_EQ(p.last_block_rows, 1000 - 3 * 256);
  EXPECT_EQ(p.col_blocks, 3);
  EXPECT_EQ(p.last_block_cols, 600 - 2 * 256);
  EXPECT_EQ(p.units, 12);
  EXPECT_EQ(p.threads, 4);
  EXPECT_EQ(p.units_per_grab, 1);  // 12 units, 4 threads: one at a time
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 100000, 300, 600, 8), Machine(4))
                .units_per_grab, 391 * 3 / 32);
  // Small M: one granule-rounded tile.
  const auto small = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 17, 8, 8, 2), Machine(4));
  EXPECT_EQ(small.base_m, 32);
  EXPECT_EQ(small.units, 1);
  EXPECT_EQ(small.threads, 1);  // at most one thread per unit
}

// The unit order follows which operand is copied: a real path, selected per form.
TEST(grouped_matmul_plan, UnitOrderFollowsTheCopiedOperand) {
  auto s = Shape(GroupedMatmulOp::kForward, 1000, 64, 512, 4);
  auto p = MakeGroupedMatmulPlan(s, Machine(2));  // [G, K, N] weights, plain float32 x
  EXPECT_FALSE(p.a_copied);
  EXPECT_TRUE(p.b_copied);
  EXPECT_TRUE(p.column_block_first);
  s.weight_nk = true;  // nn.Linear's layout: B read in place
  p = MakeGroupedMatmulPlan(s, Machine(2));
  EXPECT_FALSE(p.b_copied);
  EXPECT_FALSE(p.column_block_first);
  EXPECT_EQ(p.b_tile_elems, 0);
  s.weight_nk = false;
  s.gather_fused = true;  // A gathered, B transposed: the B tile is the one kept across units
  p = MakeGroupedMatmulPlan(s, Machine(2));
  EXPECT_TRUE(p.a_copied);
  EXPECT_TRUE(p.column_block_first);
  s.weight_nk = true;  // A gathered, B in place: row block first, one gather for every column block
  p = MakeGroupedMatmulPlan(s, Machine(2));
  EXPECT_FALSE(p.column_block_first);
  s.weight_nk = false;
  EXPECT_EQ(p.layout.row_token.bytes, 1000u * 8);
  s.gather_fused = false;
  s.weight_nk = true;
  s.dtype = DType::kF16;  // converted, both
  p = MakeGroupedMatmulPlan(s, Machine(2));
  EXPECT_TRUE(p.a_copied && p.b_copied);
  EXPECT_EQ(p.gemm_dtype, DType::kF32);
  s.dtype = DType::kBF16;
  EXPECT_EQ(MakeGroupedMatmulPlan(s, Machine(2)).gemm_dtype, DType::kBF16);
}

// A GEMM that reads float32 B in place (reads_b_in_place, MoeTileGemm::reads_b_in_place):
// [G, K, N] rows stay where they are, units row block first; [G, N, K] blocks go through the B
// tile as [K, N] rows of GroupedMatmulKNTileStride, units column block first (each copy kept
// for the thread's row blocks), so both forms run on the one kernel.
TEST(grouped_matmul_plan, InPlaceGemmTakesNKWeightsAsKNCopies) {
  GroupedMatmulMachine in_place = Machine(2);
  in_place.packs_b_from_kn = in_place.reads_b_in_place = true;
  auto s = Shape(GroupedMatmulOp::kForward, 1000, 64, 512, 4);
  auto p = MakeGroupedMatmulPlan(s, in_place);
  EXPECT_TRUE(p.b_from_kn);
  EXPECT_FALSE(p.b_kn_tile);
  EXPECT_FALSE(p.b_copied);
  EXPECT_EQ(p.b_tile_elems, 0);
  EXPECT_FALSE(p.column_block_first);
  s.weight_nk = true;
  p = MakeGroupedMatmulPlan(s, in_place);
  EXPECT_FALSE(p.b_from_kn);
  EXPECT_TRUE(p.b_kn_tile);
  EXPECT_TRUE(p.b_copied);
  EXPECT_TRUE(p.column_block_first);
  EXPECT_EQ(GroupedMatmulKNTileStride(p.base_n), p.base_n + 16);
  EXPECT_EQ(p.b_tile_elems, 64 * (p.base_n + 16));
  // Elsewhere [G, N, K] rows are read (and packed) where they are.
  EXPECT_FALSE(MakeGroupedMatmulPlan(s, Machine(2)).b_kn_tile);
  EXPECT_FALSE(MakeGroupedMatmulPlan(s, Machine(2)).b_copied);
}

// A piece that goes through the A tile by itself is copied and multiplied in stages of
// kGroupedMatmulAStageBytes of A, whole granules of rows (at least one, at most base_m), and the
// A tile holds one stage: float32 GEMMs only; a block copied whole, with k-blocks, or a
// bfloat16 piece is not staged.
TEST(grouped_matmul_plan, CopiedPiecesInStagesOfA) {
  const int64_t k = kGroupedMatmulAStageBytes / (4 * 64);  // 64 float32 rows a stage
  auto s = Shape(GroupedMatmulOp::kForward, 1000, k, 512, 2);  // 500 rows an expert: no k-blocks
  s.gather_fused = true;
  GroupedMatmulMachine packing = Machine(2);
  packing.packs_b = packing.packs_b_from_kn = true;
  auto p = MakeGroupedMatmulPlan(s, packing);
  ASSERT_TRUE(p.a_copied && p.column_block_first);
  EXPECT_EQ(p.k_blocks, 1);
  EXPECT_EQ(p.a_stage_rows, 64);
  EXPECT_EQ(p.a_tile_elems, (64 + p.row_granule) * k);
  s.dtype = DType::kF16;  // converted to float32: the same rows
  EXPECT_EQ(MakeGroupedMatmulPlan(s, packing).a_stage_rows, 64);
  s.dtype = DType::kBF16;  // a bfloat16 GEMM: whole pieces
  EXPECT_EQ(MakeGroupedMatmulPlan(s, packing).a_stage_rows, p.base_m);
  s.dtype = DType::kF16;  // rows past the stage bytes are past kGroupedMatmulMaxWholeK too:
  s.k = s.routing.k = 40 * k;  // k-blocks, a k-block of a whole piece at a time
  EXPECT_GT(MakeGroupedMatmulPlan(s, packing).k_blocks, 1);
  EXPECT_EQ(MakeGroupedMatmulPlan(s, packing).a_stage_rows, p.base_m);
  s.dtype = DType::kF32;
  s.k = s.routing.k = 8;  // short rows: the whole piece
  EXPECT_EQ(MakeGroupedMatmulPlan(s, packing).a_stage_rows, p.base_m);
  s.k = s.routing.k = k;
  s.weight_nk = true;  // B in place: row block first, the block's rows copied once, whole
  packing.packs_b = false;
  p = MakeGroupedMatmulPlan(s, packing);
  ASSERT_FALSE(p.column_block_first);
  EXPECT_EQ(p.a_stage_rows, p.base_m);
  EXPECT_EQ(p.a_tile_elems, (2 * p.base_m + p.row_granule) * k);
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 1000, k, 512, 2), packing)
                .a_stage_rows, 256);
  // float32 GEMMs' k-blocks (one piece an expert; float16 x, which no CPU reads in place): a
  // whole piece's k-block in the A tile, one stage.
  p = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 400, k, 512, 2, DType::kF16), packing);
  ASSERT_GT(p.k_blocks, 1);
  EXPECT_EQ(p.a_stage_rows, p.base_m);
  EXPECT_EQ(p.a_tile_elems, (p.base_m + p.row_granule) * p.base_k);
}

// A GEMM that packs B itself (oneDNN 2.x): [G, K, N] weights are packed from their rows, no
// transposed copy, and units run column block first (the packed block serves every row block a
// thread runs in a row); float16 weights are still converted first.
TEST(grouped_matmul_plan, PackingGemmTakesKNWeightRows) {
  GroupedMatmulMachine packing = Machine(2);
  packing.packs_b = packing.packs_b_from_kn = true;
  auto s = Shape(GroupedMatmulOp::kForward, 1000, 64, 512, 4);
  auto p = MakeGroupedMatmulPlan(s, packing);
  EXPECT_TRUE(p.b_from_kn);
  EXPECT_FALSE(p.b_copied);
  EXPECT_EQ(p.b_tile_elems, 0);
  EXPECT_TRUE(p.column_block_first);
  EXPECT_EQ(GroupedMatmulTileGemmShape(s).ldb_kn, 512);  // N: the weight rows' stride
  s.weight_nk = true;  // [N, K] rows: packed as they are
  p = MakeGroupedMatmulPlan(s, packing);
  EXPECT_FALSE(p.b_from_kn || p.b_copied);
  EXPECT_TRUE(p.column_block_first);
  s.weight_nk = false;
  s.dtype = DType::kF16;
  p = MakeGroupedMatmulPlan(s, packing);
  EXPECT_FALSE(p.b_from_kn);
  EXPECT_TRUE(p.b_copied);
  EXPECT_EQ(GroupedMatmulTileGemmShape(s).ldb_kn, 0);
  // Without that capability: the transposed copy, as before.
  EXPECT_TRUE(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 1000, 64, 512, 4), Machine(2)).b_copied);
  // Weight grad: full chunks packed from gradY's rows (stride N), partial ones through the tile.
  const auto grad = Shape(GroupedMatmulOp::kWeightGrad, 1000, 64, 512, 4);
  p = MakeGroupedMatmulPlan(grad, packing);
  EXPECT_TRUE(p.b_from_kn && p.b_copied);
  EXPECT_EQ(GroupedMatmulTileGemmShape(grad).ldb_kn, 512);
}

// Column blocks of one width where N allows (N = 1408 = 8 x 176); else 256 and a tail. The
// weight gradient's float32 blocks are whole micro-kernel panels where such a width divides N
// (1408 = 11 x 128 where panels are 32 wide, AVX-512), so that no panel is padded.
TEST(grouped_matmul_plan, ColumnBlocksDivideN) {
  for (auto op : {GroupedMatmulOp::kForward, GroupedMatmulOp::kWeightGrad}) {
    const auto p = MakeGroupedMatmulPlan(Shape(op, 4096, 2048, 1408, 8), Machine(2));
    const int64_t panel = MoeMicroPanelWidth();
    // float32 in whole micro-kernel panels where N allows: 11 x 128 rather than 8 x 176 on
    // AVX-512 (panels of 32); 176 is 11 panels of 16 on AVX2. bfloat16: multiples of 16, but its
    // forward k-blocks (K 2048 off AMX) in panels of 32 where they run on the dot-product kernel.
    const int64_t width = 176 % panel != 0 ? 128 : 176;
    EXPECT_EQ(p.base_n, width);
    EXPECT_EQ(p.col_blocks, 1408 / width);
    EXPECT_EQ(p.last_block_cols, width);
    EXPECT_EQ(p.base_n % panel, 0);
    if (op == GroupedMatmulOp::kForward) {
      EXPECT_EQ(MakeGroupedMatmulPlan(Shape(op, 4096, 2048, 1408, 8, DType::kBF16), Machine(2)).base_n,
                MoeOwnStreamedBf16OnDot(DetectCpuIdentity()) ? 128 : 176);
    }
    EXPECT_EQ(MakeGroupedMatmulPlan(Shape(op, 4096, 2048, 768, 8), Machine(2)).base_n, 256);
    EXPECT_EQ(MakeGroupedMatmulPlan(Shape(op, 4096, 2048, 100, 8), Machine(2)).base_n, 100);
    // No tail narrower than 16 columns (oneDNN 3.7 wrote a one-column tail as zeros): 257 = 144 + 113.
    const auto tail = MakeGroupedMatmulPlan(Shape(op, 4096, 2048, 257, 8), Machine(2));
    EXPECT_EQ(tail.base_n, 144);
    EXPECT_EQ(tail.col_blocks, 2);
    EXPECT_EQ(tail.last_block_cols, 113);
    for (int64_t n = 257; n <= 300; ++n) {
      EXPECT_GE(MakeGroupedMatmulPlan(Shape(op, 4096, 2048, n, 8), Machine(2)).last_block_cols, 16) << n;
    }
  }
}

TEST(grouped_matmul_plan, WeightGradTilesFromTheShape) {
  const auto p = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 5000, 300, 600, 8), Machine(3));
  EXPECT_EQ(p.base_m, 256);  // K rows per block
  EXPECT_EQ(p.row_blocks, 2);
  EXPECT_EQ(p.last_block_rows, 300 - 256);
  EXPECT_EQ(p.col_blocks, 3);
  EXPECT_EQ(p.reduce, 256);  // rows per reduction chunk
  // gradWeight by non-temporal stores on CPUs of the rule (Intel's); Add reads it: plain stores.
  EXPECT_FALSE(p.stream_out);
  GroupedMatmulMachine streaming = Machine(3);
  streaming.streams_grad_weight = true;
  EXPECT_TRUE(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 5000, 300, 600, 8), streaming).stream_out);
  auto add = Shape(GroupedMatmulOp::kWeightGrad, 5000, 300, 600, 8);
  add.accumulate = true;
  EXPECT_FALSE(MakeGroupedMatmulPlan(add, streaming).stream_out);
  EXPECT_FALSE(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 5000, 300, 600, 8), streaming).stream_out);
  EXPECT_TRUE(GroupedMatmulStreamsGradWeight({"GenuineIntel", 6, 143}));
  EXPECT_FALSE(GroupedMatmulStreamsGradWeight({"AuthenticAMD", 0x19, 0x11}));
  EXPECT_EQ(DetectGroupedMatmulMachine(Shape(GroupedMatmulOp::kWeightGrad, 500, 30, 60, 8)).streams_grad_weight,
            GroupedMatmulStreamsGradWeight(DetectCpuIdentity()));
  // Units: groups of tiles of one expert (here all 2 x 3 of them: 6 float32 tiles of 256 KiB).
  EXPECT_EQ(p.k_group_blocks, 2);
  EXPECT_EQ(p.n_group_blocks, 3);
  EXPECT_EQ(p.units, 8);
  EXPECT_EQ(p.c_tile_elems, 6 * 256 * 256);
  // Wide: column groups of 2048, and the C tiles of a unit within 4 MiB.
  const auto wide = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 5000, 2000, 5000, 3), Machine(3));
  EXPECT_EQ(wide.n_group_blocks, 8);
  EXPECT_EQ(wide.NGroups(), 3);
  EXPECT_EQ(wide.k_group_blocks, 2);
  EXPECT_EQ(wide.KGroups(), 4);
  EXPECT_EQ(wide.units, 3 * 4 * 3);
  EXPECT_LE(wide.c_tile_elems, kGroupedMatmulGradGroupElems);
  const auto few = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 20, 8, 8, 1), Machine(3));
  EXPECT_EQ(few.reduce, 32);
  const MoeTileGemmShape gemm = GroupedMatmulTileGemmShape(Shape(GroupedMatmulOp::kWeightGrad, 5000, 300, 600, 8));
  // Every chunk length an expert can end with (its rows padded to 16, up to base_r and a folded
  // remainder), each as the first chunk (writes) and a later one (adds); A and B dense in that
  // length.
  ASSERT_EQ(gemm.steps.size(), 2u * 320 / 16);
  for (size_t i = 0; i < gemm.steps.size(); ++i) {
    EXPECT_EQ(gemm.steps[i].reduce, static_cast<int64_t>(i / 2 + 1) * 16);
    EXPECT_EQ(gemm.steps[i].accumulate, i % 2 == 1);
  }
  EXPECT_TRUE(gemm.dense_steps);
  EXPECT_EQ(gemm.LdaOf(48), 48);
  EXPECT_EQ(p.reduce_granule, 16);
  // bfloat16 on AMX: chunks padded to whole 32-row blocks (oneDNN's AMX kernels), the reduction
  // too; elsewhere to 16 as float32.
  const int64_t bf16_granule = DetectCpuIdentity().amx_bf16 ? kGroupedMatmulBf16ReduceGranule : 16;
  const auto bf16 = Shape(GroupedMatmulOp::kWeightGrad, 5000, 300, 600, 8, DType::kBF16);
  EXPECT_EQ(MakeGroupedMatmulPlan(bf16, Machine(3)).reduce_granule, bf16_granule);
  const MoeTileGemmShape bf16_gemm = GroupedMatmulTileGemmShape(bf16);
  ASSERT_EQ(bf16_gemm.steps.size(), static_cast<size_t>(2 * 320 / bf16_granule));
  EXPECT_EQ(bf16_gemm.steps.front().reduce, bf16_granule);
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 40, 8, 8, 1, DType::kBF16),
                                  Machine(3)).reduce, bf16_granule == 32 ? 64 : 48);  // 40 rows
  GroupedMatmulMachine any_rows = Machine(3);
  any_rows.gemm_row_granule = 1;  // the own kernel: nothing padded
  EXPECT_EQ(MakeGroupedMatmulPlan(bf16, any_rows).reduce_granule, 1);
  // Rows: the K blocks, full or the last one padded (300 - 256 = 44 -> 48).
  EXPECT_EQ(gemm.row_counts, (std::vector<int64_t>{48, 256}));
  EXPECT_EQ(gemm.widths, (std::vector<int64_t>{256, 600 - 512}));
}

// Weight grad: an expert's remainder of up to a quarter of a chunk joins its last full chunk, so
// the chunk's A and B tiles hold base_r + that many rows and the tile GEMM is prepared for
// reductions that long (whatever its row granule); the forward folds nothing.
TEST(grouped_matmul_plan, WeightGradFoldsShortRemainders) {
  const auto s = Shape(GroupedMatmulOp::kWeightGrad, 5000, 300, 600, 8);
  GroupedMatmulMachine any_rows = Machine(2);
  any_rows.gemm_row_granule = 1;
  for (const GroupedMatmulMachine& machine : {Machine(2), any_rows}) {
    const GroupedMatmulPlan p = MakeGroupedMatmulPlan(s, machine);
    EXPECT_EQ(p.reduce, kGroupedMatmulBaseR);
    EXPECT_EQ(p.reduce_fold, kGroupedMatmulBaseR / 4);
    EXPECT_EQ(p.a_tile_elems, p.k_group_blocks * p.base_m * (kGroupedMatmulBaseR * 5 / 4));
    EXPECT_EQ(p.b_tile_elems, p.n_group_blocks * p.base_n * (kGroupedMatmulBaseR * 5 / 4));
    EXPECT_NE(GroupedMatmulPlanToJson(p).find("\"reduce_fold\": 64"), std::string::npos);
  }
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 5000, 300, 600, 8), any_rows).reduce_fold, 0);
  const MoeTileGemmShape gemm = GroupedMatmulTileGemmShape(s);
  EXPECT_EQ(gemm.steps.back().reduce, kGroupedMatmulBaseR * 5 / 4);
  const auto own = MoeTileGemm::CreateOwn(gemm);  // its packed B holds the longest folded chunk
  EXPECT_GE(own->scratchpad_bytes(), MoeMicroPackedBytes(256, kGroupedMatmulBaseR * 5 / 4));
}

// The chunks the weight grad's executor cuts an expert's rows into (GroupedMatmulChunkRows, from
// the plan's reduce and reduce_fold): full chunks from the first row on, the last one taking a
// remainder of at most reduce_fold rows, so no chunk outgrows the tiles the plan sized.
TEST(grouped_matmul_plan, WeightGradChunksFoldTheRemainder) {
  const GroupedMatmulPlan p =
      MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 5000, 300, 600, 8), Machine(2));
  const int64_t r = p.reduce, fold = p.reduce_fold;
  ASSERT_GT(fold, 0);
  const auto chunks = [&](int64_t rows) {
    std::vector<int64_t> out;
    for (int64_t left = rows; left > 0; left -= out.back()) {
      out.push_back(GroupedMatmulChunkRows(left, r, fold));
    }
    return out;
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(chunks(1), V{1});
  EXPECT_EQ(chunks(r), V{r});
  EXPECT_EQ(chunks(r + 1), V{r + 1});
  EXPECT_EQ(chunks(r + fold), V{r + fold});
  EXPECT_EQ(chunks(r + fold + 1), (V{r, fold + 1}));
  EXPECT_EQ(chunks(2 * r), (V{r, r}));
  EXPECT_EQ(chunks(3 * r + fold), (V{r, r, r + fold}));
  EXPECT_EQ(chunks(3 * r + fold + 1), (V{r, r, r, fold + 1}));
  const int64_t capacity = p.a_tile_elems / (p.k_group_blocks * p.base_m);  // rows a tile holds
  for (int64_t rows = 1; rows <= 5 * r; ++rows) {
    const V c = chunks(rows);
    for (size_t i = 0; i + 1 < c.size(); ++i) ASSERT_EQ(c[i], r) << rows;
    ASSERT_LE(c.back(), r + fold) << rows;
    ASSERT_LE(c.back(), capacity) << rows;
    if (c.size() > 1) {
      ASSERT_GT(c.back(), fold) << rows;
    }
  }
}

// Forward k-blocks (streamed weights): bfloat16 on AMX whenever K spans more than one k-block,
// otherwise when experts average at most base_m rows (float32 on CPUs that read it in place only
// past kGroupedMatmulMaxWholeK), and float32 x past kGroupedMatmulMaxWholeK whatever the rows;
// k-blocks of kGroupedMatmulStreamBaseK (bfloat16 off AMX: of kGroupedMatmulBf16StreamBaseK
// whenever K is longer), units of up to kGroupedMatmulStreamGroupCols columns, narrowed until
// each thread has kGroupedMatmulStreamUnitsPerThread units.
TEST(grouped_matmul_plan, StreamedWeightsInKBlocks) {
  const int64_t bk = kGroupedMatmulStreamBaseK;
  const bool amx = DetectCpuIdentity().amx_bf16;
  const int64_t bf16_bk = amx ? bk : kGroupedMatmulBf16StreamBaseK;
  // S2: 16384 rows over 64 experts (256 each), K 2048, N 768: float32 keeps the whole K where the
  // CPU reads it in place; float16 x streams everywhere; so does float32 past the in-place K.
  const bool in_place_f32 = MoeF32InPlaceKNOutrunsPackedBrgemm(DetectCpuIdentity());
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 16384, 2048, 768, 64), Machine(2)).k_blocks,
            in_place_f32 ? 1 : 2048 / bk);
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 16384, 2048, 768, 64, DType::kF16),
                                  Machine(2)).k_blocks, 2048 / bk);
  const int64_t past = kGroupedMatmulMaxWholeK + bk;
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 16384, past, 768, 64), Machine(2)).k_blocks,
            past / bk);
  // One column block (N <= 256): nothing is read in place, k-blocks.
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 16384, 2048, 256, 64), Machine(2)).k_blocks,
            2048 / bk);
  // S3: 8192 rows over 60 experts (~137 each), K 7168, N 2048 (8 blocks of 256).
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const auto s = Shape(GroupedMatmulOp::kForward, 8192, 7168, 2048, 60, dtype);
    const auto p = MakeGroupedMatmulPlan(s, Machine(2));
    const int64_t bk = dtype == DType::kBF16 ? bf16_bk : kGroupedMatmulStreamBaseK;
    EXPECT_EQ(p.base_k, bk);
    EXPECT_EQ(p.k_blocks, 7168 / bk);
    EXPECT_EQ(p.last_k, bk);
    EXPECT_EQ(p.n_group_blocks, std::min<int64_t>(8, kGroupedMatmulStreamGroupCols / 256));
    EXPECT_EQ(p.units, 32 * p.NGroups());
    EXPECT_FALSE(p.column_block_first);
    EXPECT_TRUE(p.a_copied);
    EXPECT_EQ(p.a_tile_elems, (256 + p.row_granule) * bk);  // one k-block of one piece
    EXPECT_EQ(p.c_tile_elems, p.n_group_blocks * 256 * 256);
    // Narrower units on bigger machines, at least kGroupedMatmulStreamUnitsPerThread a thread
    // while a unit has more than one column block.
    for (int32_t threads : {4, 16, 64, 128}) {
      const auto wide = MakeGroupedMatmulPlan(s, Machine(threads));
      EXPECT_EQ(wide.k_blocks, p.k_blocks);
      EXPECT_TRUE(wide.n_group_blocks == 1 ||
                  wide.units >= kGroupedMatmulStreamUnitsPerThread * threads) << threads;
      EXPECT_LE(wide.n_group_blocks, p.n_group_blocks);
    }
    EXPECT_EQ(MakeGroupedMatmulPlan(s, Machine(128)).n_group_blocks, 1);
    // The tile GEMM: A dense per k-block; B where it is ([G, N, K] rows of stride K) or one
    // k-block in the B tile (float16 converted, [G, K, N] transposed where not packed from its
    // rows: stride base_k), and the B tile holds one k-block of a block.
    for (bool weight_nk : {false, true}) {
      SCOPED_TRACE(weight_nk ? "GNK" : "GKN");
      auto sw = s;
      sw.weight_nk = weight_nk;
      const MoeTileGemmShape gemm = GroupedMatmulTileGemmShape(sw);
      EXPECT_TRUE(gemm.dense_a_steps);
      EXPECT_FALSE(gemm.dense_steps);
      const bool tile_only = dtype == DType::kF16 || !weight_nk;
      EXPECT_EQ(gemm.ldb, tile_only ? bk : 7168);
      EXPECT_EQ(gemm.steps, (std::vector<MoeTileGemmShape::Step>{{bk, false}, {bk, true}}));
      const auto pw = MakeGroupedMatmulPlan(sw, Machine(2));
      EXPECT_EQ(pw.b_tile_ld, gemm.ldb);
      if (pw.b_copied) {
        EXPECT_EQ(pw.b_tile_elems, 256 * bk);
      }
    }
  }
  // bfloat16 off AMX: deep k-blocks past kGroupedMatmulBf16StreamBaseK whatever the rows (S1:
  // 1024 an expert), none up to it (K 1000 with one piece an expert, which streams in k-blocks of
  // 256 in the other dtypes).
  if (!amx) {
    const auto s1 = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 8192, 2048, 1408, 8, DType::kBF16),
                                          Machine(2));
    EXPECT_EQ(s1.base_k, kGroupedMatmulBf16StreamBaseK);
    EXPECT_EQ(s1.k_blocks, 2048 / kGroupedMatmulBf16StreamBaseK);
    EXPECT_EQ(s1.m_group_blocks, 4);  // an expert's four pieces
    EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 300, kGroupedMatmulBf16StreamBaseK, 500, 4,
                                          DType::kBF16), Machine(2)).k_blocks, 1);
    EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 300, 1000, 500, 4, DType::kF16),
                                    Machine(2)).k_blocks, 4);
  }
  // Float32 and float16 x past kGroupedMatmulMaxWholeK stream with several pieces an expert too
  // (Mixtral's down projection: 1024 rows an expert, K 14336), so does bfloat16 (its own
  // k-blocks); at kGroupedMatmulMaxWholeK float32 and float16 keep the whole K.
  const int64_t whole = kGroupedMatmulMaxWholeK;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t dtype_bk = dtype == DType::kBF16 ? bf16_bk : bk;
    EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 8192, 14336, 4096, 8, dtype),
                                    Machine(2)).k_blocks, 14336 / dtype_bk);
    EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 8192, whole, 4096, 8, dtype),
                                    Machine(2)).k_blocks,
              dtype == DType::kBF16 ? whole / dtype_bk : 1);
  }
  // A last, shorter k-block: K = 1000 = 3 x 256 + 232 (float16 x: k-blocks of 256 on every CPU).
  const auto tail = Shape(GroupedMatmulOp::kForward, 300, 1000, 500, 4, DType::kF16);
  const auto pt = MakeGroupedMatmulPlan(tail, Machine(1));
  EXPECT_EQ(pt.k_blocks, 4);
  EXPECT_EQ(pt.last_k, 1000 - 3 * bk);
  EXPECT_EQ(GroupedMatmulTileGemmShape(tail).steps,
            (std::vector<MoeTileGemmShape::Step>{{bk, false}, {bk, true}, {1000 - 3 * bk, true}}));
  // S1: 1024 rows an expert. bfloat16 streams (its own k-blocks), float32 keeps the whole K (B
  // packed once for an expert's four pieces); K within one k-block: never.
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 8192, 2048, 1408, 8, DType::kBF16),
                                  Machine(2)).k_blocks, 2048 / bf16_bk);
  for (DType dtype : {DType::kF32, DType::kF16}) {
    EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 8192, 2048, 1408, 8, dtype),
                                    Machine(2)).k_blocks, 1);
  }
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 300, bk, 500, 4, DType::kBF16),
                                  Machine(1)).k_blocks, 1);
  // The weight gradient has none.
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 8192, 7168, 2048, 60, DType::kBF16),
                                  Machine(2)).k_blocks, 1);
}

// Forward k-blocks: a unit spans as many row blocks as an average expert has pieces (up to
// kGroupedMatmulStreamGroupRowBlocks), so that each B k-block is prepared once for all of them,
// and its float32 C tiles (one per row block and column block) stay within
// kGroupedMatmulGradGroupElems; units narrow, the wider side first, until each thread has
// kGroupedMatmulStreamUnitsPerThread of them (or a unit is one tile).
TEST(grouped_matmul_plan, KBlockedUnitsSpanAnExpertsPieces) {
  const int64_t past = kGroupedMatmulMaxWholeK + kGroupedMatmulStreamBaseK;
  // Mixtral 8x7B's down projection at 4096 tokens: 1024 rows an expert (four pieces), N 4096
  // (16 column blocks): four row blocks, columns halved from 8 to 4 (16 tiles of 256 KiB).
  const auto mixtral = Shape(GroupedMatmulOp::kForward, 8192, 14336, 4096, 8);
  const auto p = MakeGroupedMatmulPlan(mixtral, Machine(2));
  ASSERT_GT(p.k_blocks, 1);
  EXPECT_EQ(p.m_group_blocks, 4);
  EXPECT_EQ(p.n_group_blocks, 4);
  EXPECT_EQ(p.units, (32 / 4) * (16 / 4));
  EXPECT_EQ(p.c_tile_elems, 4 * 4 * 256 * 256);
  EXPECT_EQ(p.a_tile_elems, (4 * 256 + p.row_granule) * kGroupedMatmulStreamBaseK);  // a k-block of 4 pieces
  // Row blocks from the rows an expert averages, whatever K (past the whole K) and the dtype.
  struct Case { int64_t m, g, n, want; };
  for (const Case& c : {Case{8192, 60, 2048, 1},    // S3: ~137 rows an expert
                        Case{16384, 64, 768, 1},    // S2: 256
                        Case{2400, 4, 40, 3},       // 600: three pieces (the third 88 rows)
                        Case{4096, 2, 40, 4},       // 2048: eight pieces, capped
                        Case{100000, 2, 40, 4}}) {  // 50000
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {  // bfloat16: streams on AMX
      if (dtype == DType::kBF16 && !DetectCpuIdentity().amx_bf16) continue;
      SCOPED_TRACE(::testing::Message() << "M " << c.m << " G " << c.g << " " << DTypeName(dtype));
      const auto q = MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, c.m, past, c.n, c.g, dtype),
                                           Machine(1));
      ASSERT_GT(q.k_blocks, 1);
      EXPECT_EQ(q.m_group_blocks, c.want);
      EXPECT_LE(q.c_tile_elems, kGroupedMatmulGradGroupElems);
    }
  }
  // One thread wants kGroupedMatmulStreamUnitsPerThread units too: one expert of 256 + 44 rows
  // (two pieces, two row blocks, one column block) runs a row block a unit.
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 300, past, 40, 1), Machine(1))
                .m_group_blocks, 1);
  // Narrower on bigger machines, never wider, both sides; at 64 threads (256 units wanted of 32
  // row blocks x 16 column blocks) two row blocks a unit, one column block.
  int64_t m_prev = p.m_group_blocks, n_prev = p.n_group_blocks;
  for (int32_t threads : {4, 8, 16, 32, 64, 128}) {
    SCOPED_TRACE(threads);
    const auto q = MakeGroupedMatmulPlan(mixtral, Machine(threads));
    EXPECT_EQ(q.k_blocks, p.k_blocks);
    EXPECT_TRUE((q.m_group_blocks == 1 && q.n_group_blocks == 1) ||
                q.units >= kGroupedMatmulStreamUnitsPerThread * threads);
    EXPECT_LE(q.m_group_blocks, m_prev);
    EXPECT_LE(q.n_group_blocks, n_prev);
    m_prev = q.m_group_blocks, n_prev = q.n_group_blocks;
    EXPECT_EQ(q.units, q.MGroups() * q.NGroups());
    EXPECT_EQ(q.c_tile_elems, q.m_group_blocks * q.n_group_blocks * 256 * 256);
  }
  const auto at64 = MakeGroupedMatmulPlan(mixtral, Machine(64));
  EXPECT_EQ(at64.m_group_blocks, 2);
  EXPECT_EQ(at64.n_group_blocks, 1);
  EXPECT_EQ(MakeGroupedMatmulPlan(mixtral, Machine(128)).m_group_blocks, 1);
  // The api test's k_block_row_groups case (BitIdenticalAcrossRunsAndThreadCounts): two row
  // blocks a unit at 1 thread, one at 2.
  const auto row_groups = Shape(GroupedMatmulOp::kForward, 1560, kGroupedMatmulMaxWholeK + 100, 40, 3);
  EXPECT_EQ(MakeGroupedMatmulPlan(row_groups, Machine(1)).m_group_blocks, 2);
  EXPECT_EQ(MakeGroupedMatmulPlan(row_groups, Machine(2)).m_group_blocks, 1);
  // Without k-blocks, and in the weight gradient: one row block a unit.
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kForward, 8192, 2048, 1408, 8), Machine(2))
                .m_group_blocks, 1);
  EXPECT_EQ(MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 8192, past, 1408, 8), Machine(2))
                .m_group_blocks, 1);
}

// A float32 or float16 forward's tiles stop growing with K past kGroupedMatmulMaxWholeK, in
// every form (plain, gathered, [G, N, K] weights) and with one piece or several an expert: a
// thread's bytes are those of one k-block, the same at K = 4352 and at K = 65536.
TEST(grouped_matmul_plan, Float32ThreadBytesBoundedPastTheWholeK) {
  for (int64_t m : {int64_t{2048}, int64_t{8192}}) {  // 256 and 1024 rows an expert
    for (int form = 0; form < 6; ++form) {
      SCOPED_TRACE("M " + std::to_string(m) + " form " + std::to_string(form));
      const auto at = [&](int64_t k) {
        auto s = Shape(GroupedMatmulOp::kForward, m, k, 4096, 8, form < 3 ? DType::kF32 : DType::kF16);
        s.gather_fused = form % 3 == 1;
        s.weight_nk = form % 3 == 2;
        return MakeGroupedMatmulPlan(s, Machine(64));
      };
      const auto first = at(kGroupedMatmulMaxWholeK + kGroupedMatmulStreamBaseK);
      EXPECT_GT(first.k_blocks, 1);
      for (int64_t k : {int64_t{7168}, int64_t{14336}, int64_t{65536}}) {
        const auto p = at(k);
        EXPECT_EQ(p.k_blocks, k / kGroupedMatmulStreamBaseK) << k;
        EXPECT_EQ(p.thread_bytes, first.thread_bytes) << k;
      }
      // One k-block of the unit's pieces, its C tiles, at most one k-block of B: 0.8-1.5 MiB
      // here (64 threads narrow the units to one or two row blocks and column blocks), 5.3 MiB
      // at 2 threads (four row blocks by four column blocks, at 1024 rows an expert).
      EXPECT_LE(first.thread_bytes, uint64_t{3} << 20);
    }
  }
}

// Plans depend on the shape and the machine only; workspace per thread, index tables per M and G.
TEST(grouped_matmul_plan, WorkspaceScalesWithThreads) {
  const auto s = Shape(GroupedMatmulOp::kForward, 4096, 512, 1024, 8);
  const auto one = MakeGroupedMatmulPlan(s, Machine(1));
  const auto many = MakeGroupedMatmulPlan(s, Machine(64));
  EXPECT_EQ(one, MakeGroupedMatmulPlan(s, Machine(1)));
  EXPECT_EQ(one.thread_bytes, many.thread_bytes);
  EXPECT_EQ(many.threads, 64);
  EXPECT_EQ(many.layout.c_tiles.bytes, 64 * one.layout.c_tiles.bytes);
  EXPECT_EQ(many.layout.group_offsets.bytes, one.layout.group_offsets.bytes);
  EXPECT_GE(many.workspace_bytes, 64 * one.thread_bytes);
  for (const auto* p : {&one, &many}) {
    const auto& l = p->layout;
    for (const auto& r : {l.c_tiles, l.a_tiles, l.b_tiles, l.system, l.group_offsets, l.row_token}) {
      EXPECT_EQ(r.offset % kGroupedMatmulAlignment, 0u);
      EXPECT_LE(r.offset + r.bytes, l.end);
    }
  }
}

TEST(grouped_matmul_plan, Json) {
  auto s = Shape(GroupedMatmulOp::kForward, 1000, 300, 600, 8, DType::kF16);  // k-blocks everywhere
  s.gather_fused = true;
  s.routing.batch = 500, s.routing.top_k = 2, s.routing.l = 1000;
  const std::string json = GroupedMatmulPlanToJson(MakeGroupedMatmulPlan(s, Machine(4)));
  for (const char* field : {"\"op\": \"grouped_matmul\"", "\"dtype\": \"float16\"",
                            "\"x\": \"tokens\"", "\"topK\": 2", "\"weight_layout\": \"GKN\"",
                            "\"order\": \"row_block_first\"", "\"k_blocks\": 2", "\"last_k\": 44",
                            "\"units\": 12", "\"a_stage_rows\": 256", "\"workspace_bytes\""}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " missing from " << json;
  }
  EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
  const std::string wg = GroupedMatmulPlanToJson(
      MakeGroupedMatmulPlan(Shape(GroupedMatmulOp::kWeightGrad, 100, 30, 60, 2), Machine(4)));
  EXPECT_NE(wg.find("\"op\": \"grouped_matmul_weight_grad\""), std::string::npos) << wg;
  EXPECT_EQ(wg.find("weight_layout"), std::string::npos) << wg;
}

}  // namespace
}  // namespace gk
