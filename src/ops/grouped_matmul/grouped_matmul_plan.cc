#include "ops/grouped_matmul/grouped_matmul_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"

namespace gk {
namespace {

class LayoutBuilder {
 public:
  GroupedMatmulRegion Add(uint64_t bytes) {
    if (bytes == 0) return {0, 0};
    const GroupedMatmulRegion region{end_, bytes};
    end_ = AlignUp(end_ + bytes, kGroupedMatmulAlignment);
    return region;
  }
  uint64_t end() const { return end_; }

 private:
  uint64_t end_ = 0;
};

// The tiles of a shape, before the machine is known.
struct Tiles {
  DType gemm_dtype;
  int64_t base_m, base_n, reduce;
  int64_t row_blocks, last_block_rows, col_blocks, last_block_cols;
  int64_t base_k, k_blocks, last_k;  // forward k-blocks (one of K unless streamed)
  int64_t n_group_blocks;            // forward: column blocks per unit
  // Forward float32 B read in place on gemm:jit (MoeTileGemmShape::b_in_place): no k-blocks,
  // more than one column block (so no block's [K, N] rows are dense), a CPU of
  // MoeF32InPlaceKNOutrunsPackedBrgemm.
  bool b_in_place;
  // Forward: the row stride of B's [N, K] rows the GEMM reads (in place, or copied into the B
  // tile): K, or base_k with k-blocks where B is never read from the weights' [N, K] rows
  // (BTileKBlockOnly), so that the B tile holds one k-block. Weight grad: reduce (unused there).
  int64_t ldb;
};

// Whether B may be packed by the GEMM straight from rows of [reduce, width] (row stride N):
// the forward's [K, N] weights, the weight grad's gradY rows. float16 is converted first.
bool MayPackBFromKN(const GroupedMatmulShape& s) {
  return s.dtype != DType::kF16 && (s.op == GroupedMatmulOp::kWeightGrad || !s.weight_nk);
}

// Forward with k-blocks: whether B is never read from [N, K] weight rows where they are (float16
// weights are converted, [G, K, N] ones packed from their rows or transposed), so that the B tile
// holds one k-block of a block, row stride base_k, not the whole K.
bool BTileKBlockOnly(const GroupedMatmulShape& s) { return s.dtype == DType::kF16 || !s.weight_nk; }

// Whether bfloat16 tiles run on AMX here (oneDNN's brgemm; the rules below measured there).
bool Bf16OnAmx(DType gemm_dtype) {
  return gemm_dtype == DType::kBF16 && DetectCpuIdentity().amx_bf16;
}

// Weight grad: the padding of an expert's last chunk on a GEMM with prepared reductions.
int64_t ReduceGranule(DType gemm_dtype) {
  return Bf16OnAmx(gemm_dtype) ? kGroupedMatmulBf16ReduceGranule : kGroupedMatmulRowGranule;
}

// bfloat16 forward tiles that auto runs on the own dot-product kernel (MoeOwnStreamedBf16OnDot:
// the k-blocks below, off AMX). Their column blocks are whole panels of 32 where N allows: S1's
// N = 1408 in blocks of 176 left half a panel to a zero-padded tile (1/12 of the arithmetic
// wasted), in blocks of 128 none (session 35).
bool Bf16ForwardOnDot(const GroupedMatmulShape& s) {
  return s.op == GroupedMatmulOp::kForward && s.dtype == DType::kBF16 && !Bf16OnAmx(DType::kBF16) &&
         s.k > kGroupedMatmulBf16StreamBaseK && MoeOwnStreamedBf16OnDot(DetectCpuIdentity());
}

// The weight grad's rows reduced per GEMM call (a chunk): kGroupedMatmulBaseR, fewer where M is.
int64_t WeightGradReduce(const GroupedMatmulShape& s, DType gemm_dtype) {
  return std::min(kGroupedMatmulBaseR, RoundUp(std::max<int64_t>(s.m, 1), ReduceGranule(gemm_dtype)));
}

// The weight grad in bfloat16 where the average expert's rows take more than one chunk (with the
// fold), so that most calls add into gradWeight rows an earlier chunk wrote: the tile GEMM asks
// for the dot-product kernel (MoeTileGemmShape::bf16_dot_where_faster). A rule of the shape, so
// that every routing of it runs one kernel.
bool Bf16WeightGradAddsChunks(const GroupedMatmulShape& s) {
  if (s.op != GroupedMatmulOp::kWeightGrad || s.dtype != DType::kBF16) return false;
  const int64_t reduce = WeightGradReduce(s, DType::kBF16);
  return s.m > s.g * (reduce + GroupedMatmulReduceFold(reduce));
}

// Where auto then takes the dot-product kernel (MoeOwnStreamedBf16OnDot): its column blocks are
// whole panels of 32 (as Bf16ForwardOnDot's), not whole rows of gradWeight, which only oneDNN's
// brgemm needs (GroupedMatmulWholeRowTiles). S1 (N 1408: 128 columns), one-process harness, 2
// threads, Zen 5, median of per-round ratios over whole rows on the same kernel: 1.044 (S4
// 1.043); 352 columns 1.061 (1.052), not kept for a rule of its own (docs/benchmarks.md,
// session 41).
bool Bf16WeightGradOnDot(const GroupedMatmulShape& s) {
  return Bf16WeightGradAddsChunks(s) && MoeTileGemmChoiceFromEnv() != MoeTileGemmChoice::kOneDnn &&
         MoeOwnStreamedBf16OnDot(DetectCpuIdentity());
}

Tiles ChooseTiles(const GroupedMatmulShape& s) {
  Tiles t{};
  t.gemm_dtype = s.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  const bool forward = s.op == GroupedMatmulOp::kForward;
  const bool weight_grad_on_dot = Bf16WeightGradOnDot(s);
  // Tile rows: x rows (forward) or K (weight grad), as the fused op: min(best, extent) rounded up
  // to the padding granule.
  const int64_t extent = forward ? std::max<int64_t>(s.m, 1) : s.k;
  t.base_m = std::min(kGroupedMatmulBaseM, RoundUp(extent, kGroupedMatmulRowGranule));
  // Output columns: the widest multiple of 16 in [base_n / 2, base_n] that divides N, so that every
  // block has one width (oneDNN runs a narrower tail block, whose C is not dense in the tile, on
  // its slower gemm:jit); else base_n, with a tail. float32 GEMMs look first for a multiple of the
  // micro-kernel's panel width (32 float32 columns on AVX-512, 16 on AVX2), for where they run on
  // it: a block of N = 1408 / 8 = 176 columns is 5.5 panels, and the half panel ran through a
  // zero-padded tile, 1/12 of the multiply-adds wasted. Blocks of 128 instead, Zen 5, 2 threads,
  // percent of dense (docs/benchmarks.md): the weight gradient (micro-kernel by default on Zen
  // 4/5), three rounds in turn, S1 84, 83, 83 -> 92, 91, 90; S4 83, 84, 83 -> 93, 91, 91
  // (session 31); the forward on the micro-kernel (GRADKIT_GEMM=gradkit, or a build without
  // oneDNN), two rounds, S1 90, 87 -> 95, 95 and S4 90, 86 -> 95, 89, while oneDNN's gemm:jit
  // (its default here) took either width alike, S1 100, 104 -> 102, 99 (session 32). oneDNN's
  // brgemm takes either width too (not measured on the Intel CPUs where it runs these tiles).
  // bfloat16 on the dot-product kernel likewise for its 64-column panel (kMoeBf16DotPanel).
  t.base_n = std::min(kGroupedMatmulBaseN, s.n);
  const auto widest_dividing = [&](int64_t step) {
    for (int64_t width = kGroupedMatmulBaseN; width >= kGroupedMatmulBaseN / 2 && s.n > width; width -= step) {
      if (s.n % width == 0) return width;
    }
    return int64_t{0};
  };
  const int64_t panel = t.gemm_dtype == DType::kF32                ? MoeMicroPanelWidth()
                        : Bf16ForwardOnDot(s) || weight_grad_on_dot ? kMoeBf16DotPanel
                                                                      : int64_t{16};
  int64_t width = widest_dividing(panel);
  if (width == 0 && panel != 16) width = widest_dividing(16);
  if (width > 0) t.base_n = width;
  t.reduce = forward ? s.k : WeightGradReduce(s, t.gemm_dtype);
  t.row_blocks = CeilDiv(extent, t.base_m);
  t.last_block_rows = extent - (t.row_blocks - 1) * t.base_m;
  // Weight grad in bfloat16 writing gradWeight direct: one block of all N, so that C's rows (of
  // gradWeight) are dense in the GEMM's own width, which oneDNN 2.6 runs on brgemm (not where the
  // dot-product kernel runs them, which takes any row stride).
  if (GroupedMatmulWholeRowTiles(s, GroupedMatmulStreamsGradWeight(DetectCpuIdentity())) &&
      !weight_grad_on_dot) {
    t.base_n = s.n;
  }
  const MoeTileColumns columns = MoeTileColumnsOf(s.n, t.base_n);
  t.base_n = columns.base;
  t.col_blocks = columns.blocks;
  t.last_block_cols = columns.last;
  t.base_k = t.last_k = t.reduce;
  t.k_blocks = t.n_group_blocks = 1;
  // Streamed weights: K in k-blocks of kGroupedMatmulStreamBaseK, each B k-block prepared (packed
  // into L2) for an expert's pieces in a unit and used at once, their A k-blocks copied once for
  // a unit of many column blocks. Over the whole K, a packed block overflows L2 (S3: 3.7 MiB
  // bfloat16) and the GEMM reads it from L3 again for every few rows; but it is packed once for
  // all the pieces of an expert a thread runs, where k-blocks then (before units spanned row
  // blocks, session 26) packed it once per piece. Measured on an AMX Xeon
  // (docs/benchmarks.md, session 17), percent of dense, two rounds: bfloat16 S1 75-76 -> 86-90,
  // S2 65-66 -> 91-98, S3 39 -> 82-84; float32 S3 66-67 -> 79, S2 unchanged; float16 S3 37-38 ->
  // 60-62. Forced at S1 (1024 rows an expert: four pieces, four packs) float32 ran 90 -> 84 and
  // float16 80 -> 68, one round (not rerun with units of four row blocks, one pack). So: bfloat16 on AMX whenever K
  // spans k-blocks; float32 GEMMs when experts
  // average at most base_m rows (one piece), where k-blocks cost no extra pass; but not float32
  // that the CPU reads in place (MoeF32InPlaceKNOutrunsPackedBrgemm: gemm:jit blocks K itself).
  // And float32 and float16 x past kGroupedMatmulMaxWholeK, whose whole-K tiles would grow with
  // K (units of several row blocks prepare each B k-block once for an expert's pieces there;
  // bfloat16 x off AMX: the deeper k-blocks below). A property of the shape (and
  // those CPU rules) whatever the weights' layout and the thread count: every weight form sums
  // in the same order.
  // bfloat16 without AMX (session 29): k-blocks of kGroupedMatmulBf16StreamBaseK past that K,
  // whatever the experts' rows, which bounds its tiles in K too.
  const bool one_piece_an_expert = s.m <= s.g * t.base_m;
  const bool reads_in_place = forward && s.dtype == DType::kF32 && s.n > t.base_n &&
                              MoeF32InPlaceKNOutrunsPackedBrgemm(DetectCpuIdentity());
  const bool bf16_deep = t.gemm_dtype == DType::kBF16 && !Bf16OnAmx(t.gemm_dtype);
  const int64_t stream_k = bf16_deep ? kGroupedMatmulBf16StreamBaseK : kGroupedMatmulStreamBaseK;
  const bool streams_by_rule =
      !reads_in_place && (Bf16OnAmx(t.gemm_dtype) || bf16_deep || one_piece_an_expert);
  const bool streams_bounded = s.dtype != DType::kBF16 && s.k > kGroupedMatmulMaxWholeK;
  if (forward && s.k > stream_k && (streams_bounded || streams_by_rule)) {
    t.base_k = stream_k;
    t.k_blocks = CeilDiv(s.k, t.base_k);
    t.last_k = s.k - (t.k_blocks - 1) * t.base_k;
    t.n_group_blocks = std::clamp<int64_t>(kGroupedMatmulStreamGroupCols / t.base_n, 1, t.col_blocks);
  }
  t.b_in_place = reads_in_place && t.k_blocks == 1;
  t.ldb = t.k_blocks > 1 && BTileKBlockOnly(s) ? t.base_k : t.reduce;
  return t;
}

}  // namespace

MoeTileGemmShape GroupedMatmulTileGemmShape(const GroupedMatmulShape& s) {
  const Tiles t = ChooseTiles(s);
  MoeTileGemmShape g;
  g.gemm_dtype = t.gemm_dtype;
  g.max_rows = t.base_m;
  g.row_granule = kGroupedMatmulRowGranule;
  g.tail_calls = true;  // forward tiles: no padded rows (weight grad: its own row_counts)
  g.ldc = t.base_n;
  // Both operands dense in their reduction: forward A = x rows and B = [N, K] weight rows (in
  // place or copied), lda = ldb = K; weight grad both transposed copies of base_r columns. (A B
  // with padded rows, which would spare the transposed copy its cache-set conflicts at
  // power-of-two K, runs on oneDNN 2.6's gemm:jit instead of brgemm: measured slower.)
  g.lda = t.reduce;
  g.ldb = t.ldb;
  g.widths = {t.base_n};
  if (t.last_block_cols != t.base_n) g.widths.push_back(t.last_block_cols);
  g.steps = {{t.reduce, false}};
  if (t.k_blocks > 1) {  // forward k-blocks: A copied dense per k-block, B where it is (or one
                         // k-block of it in the B tile, Tiles::ldb)
    g.dense_a_steps = true;
    g.steps = {{t.base_k, false}};
    if (t.k_blocks > 2 || t.last_k == t.base_k) g.steps.push_back({t.base_k, true});
    if (t.last_k != t.base_k) g.steps.push_back({t.last_k, true});
  }
  if (s.op == GroupedMatmulOp::kWeightGrad) {
    // Rows: K blocks, all full but the last. Reduction: full chunks of base_r rows, and an
    // expert's last chunk only as long as its rows padded to the granule (not to base_r: with
    // many experts most have fewer rows than base_r), its copies dense in that length.
    const int64_t last_rows = RoundUp(t.last_block_rows, kGroupedMatmulRowGranule);
    g.row_counts = {last_rows};
    if (last_rows != t.base_m) g.row_counts.push_back(t.base_m);
    g.dense_steps = true;
    g.own_f32_where_faster = true;
    // Not where oneDNN is asked for (GRADKIT_GEMM=onednn): its 2.6 runs such a C on gemm:jit.
    if (MoeTileGemmChoiceFromEnv() != MoeTileGemmChoice::kOneDnn &&
        GroupedMatmulWritesGradWeightDirect(s, GroupedMatmulStreamsGradWeight(DetectCpuIdentity()))) {
      g.ldc = s.n;
    }
    g.steps.clear();
    // Up to a chunk and a folded remainder (GroupedMatmulReduceFold).
    const int64_t longest = t.reduce + GroupedMatmulReduceFold(t.reduce);
    for (int64_t r = ReduceGranule(t.gemm_dtype); r <= longest; r += ReduceGranule(t.gemm_dtype)) {
      g.steps.push_back({r, false});
      g.steps.push_back({r, true});
    }
  }
  // The executors prepare each B once for several calls: the forward per (expert, column block)
  // for its row blocks, the weight grad per (chunk, column block) for its K blocks.
  g.prepared_b = true;
  if (MayPackBFromKN(s)) g.ldb_kn = s.n;
  // Read in place (Tiles::b_in_place): [G, K, N] rows where they are, [G, N, K] blocks from the
  // B tile's [K, N] rows (b_kn_tile), both on gemm:jit.
  g.b_in_place = t.b_in_place;
  if (t.b_in_place && s.weight_nk) g.ldb_kn = GroupedMatmulKNTileStride(t.base_n);
  // Float32 and bfloat16 forward k-blocks: each B block a cold read of weights for an expert's
  // few rows, the next one known (MoeTileGemmShape::streamed_b). Every weight form alike, so that
  // all run on the same kernel (the same bits): [K, N] and [N, K] blocks both fetched ahead where
  // read in place, then packed. (float16 weights go through the B tile, converted.)
  g.streamed_b = s.op == GroupedMatmulOp::kForward && t.k_blocks > 1 && s.dtype != DType::kF16;
  // Weight grad in bfloat16 where the average expert's rows take more than one chunk (S1/S4: 1024
  // rows an expert, 4 chunks of 256): every chunk after an expert's first adds into the float32
  // gradWeight block its first wrote, which oneDNN's brgemm reads slowly (see
  // MoeTileGemmShape::bf16_dot_where_faster). Zen 5, one-process harness, 2 threads, median of
  // per-round ratios, dot kernel over brgemm: S1 1.117, S4 1.097; S2 (256 rows an expert, one
  // chunk each) 0.964, S3 (136) 1.00: those keep brgemm (docs/benchmarks.md, session 41).
  g.bf16_dot_where_faster = Bf16WeightGradAddsChunks(s);
  return g;
}

GroupedMatmulMachine GroupedMatmulMachineOf(const MoeTileGemm& gemm, const MoeTileGemmShape& shape,
                                            int32_t threads) {
  GroupedMatmulMachine machine{threads, gemm.scratchpad_bytes(), gemm.name(), {},
                               gemm.packs_b(), gemm.prepares_b_from_kn(), gemm.row_granule(),
                               GroupedMatmulStreamsGradWeight(DetectCpuIdentity()),
                               gemm.reads_b_in_place(), shape.ldc};
  for (int64_t width : shape.widths) machine.gemm_impls.emplace_back(width, gemm.impl(width));
  return machine;
}

// gradWeight is written once, never read here, and read by its consumer (the optimizer) only
// after the rest of the backward pass: its lines are not worth reading for ownership. Measured
// on an AMX Xeon (docs/benchmarks.md, session 17), percent of dense, two rounds: bfloat16 S2
// 50-51 -> 59-62, S3 31 -> 41-42; float32 S2 73-74 -> 77-78, S3 60-61 -> 66; S1 (92 MB of
// float32 gradWeight) 0 to +2. On Zen 4
// (session 15, whole lines streamed only once the bytes passed the LLC, tile by tile) it measured
// slower: bfloat16 S3 65, 66 -> 56, 61. So Intel's CPUs only.
bool GroupedMatmulStreamsGradWeight(const CpuIdentity& cpu) { return cpu.vendor == "GenuineIntel"; }

bool GroupedMatmulWritesGradWeightDirect(const GroupedMatmulShape& s, bool streams_grad_weight) {
  return s.op == GroupedMatmulOp::kWeightGrad && !s.accumulate && s.out_dtype == DType::kF32 &&
         !streams_grad_weight && s.k % kGroupedMatmulRowGranule == 0 &&
         (s.dtype != DType::kBF16 || s.n <= kGroupedMatmulGradGroupCols);
}

bool GroupedMatmulWholeRowTiles(const GroupedMatmulShape& s, bool streams_grad_weight) {
  return s.dtype == DType::kBF16 && GroupedMatmulWritesGradWeightDirect(s, streams_grad_weight);
}

GroupedMatmulMachine DetectGroupedMatmulMachine(const GroupedMatmulShape& shape) {
  const MoeTileGemmShape gemm_shape = GroupedMatmulTileGemmShape(shape);
  const auto gemm = MoeTileGemm::Create(gemm_shape);
  return GroupedMatmulMachineOf(*gemm, gemm_shape, ConfiguredThreads());
}

GroupedMatmulPlan MakeGroupedMatmulPlan(const GroupedMatmulShape& s,
                                        const GroupedMatmulMachine& machine) {
  GroupedMatmulPlan p{};
  p.shape = s;
  const Tiles t = ChooseTiles(s);
  const bool forward = s.op == GroupedMatmulOp::kForward;
  p.gemm_dtype = t.gemm_dtype;
  p.gemm_backend = machine.gemm_backend;
  p.gemm_impls = machine.gemm_impls;
  p.base_m = t.base_m;
  p.base_n = t.base_n;
  p.reduce = t.reduce;
  p.base_k = t.base_k;
  p.k_blocks = t.k_blocks;
  p.last_k = t.last_k;
  p.row_granule = machine.gemm_row_granule;
  // A GEMM that takes any row count (the own kernel) pads nothing.
  p.reduce_granule = forward || p.row_granule == 1 ? 1 : ReduceGranule(t.gemm_dtype);
  p.reduce_fold = forward ? 0 : GroupedMatmulReduceFold(t.reduce);
  p.row_blocks = t.row_blocks;
  p.last_block_rows = t.last_block_rows;
  p.col_blocks = t.col_blocks;
  p.last_block_cols = t.last_block_cols;
  p.b_from_kn = MayPackBFromKN(s) && machine.packs_b_from_kn;
  if (forward) {
    p.k_group_blocks = 1;
    const bool k_blocked = p.k_blocks > 1;
    // With k-blocks, a unit's column blocks change no output bit (each C tile sums its k-blocks
    // in the same order whichever unit runs it): narrower units where the machine needs more.
    // So do its row blocks: as many as the pieces of an average expert (up to
    // kGroupedMatmulStreamGroupRowBlocks), each B k-block then prepared once for all of them;
    // the column blocks halved while the unit's C tiles pass kGroupedMatmulGradGroupElems; then,
    // while the machine has fewer than kGroupedMatmulStreamUnitsPerThread units a thread, the
    // wider of the two halved, columns on a tie (a column block fewer costs each piece's A
    // k-block one more copy, a row block fewer each B k-block one more preparation; which costs
    // more was not measured).
    p.n_group_blocks = t.n_group_blocks;
    p.m_group_blocks = 1;
    if (k_blocked) {
      p.m_group_blocks = std::clamp<int64_t>(CeilDiv(s.m, std::max<int64_t>(s.g, 1) * p.base_m), 1,
                                             std::min(kGroupedMatmulStreamGroupRowBlocks, p.row_blocks));
      while (p.n_group_blocks > 1 &&
             p.m_group_blocks * p.n_group_blocks * p.base_m * p.base_n > kGroupedMatmulGradGroupElems) {
        p.n_group_blocks = (p.n_group_blocks + 1) / 2;
      }
    }
    while ((p.n_group_blocks > 1 || p.m_group_blocks > 1) &&
           p.MGroups() * p.NGroups() < kGroupedMatmulStreamUnitsPerThread * machine.threads) {
      int64_t& wider = p.n_group_blocks >= p.m_group_blocks ? p.n_group_blocks : p.m_group_blocks;
      wider = (wider + 1) / 2;
    }
    p.units = s.m == 0 ? 0 : p.MGroups() * p.NGroups();
    p.a_copied = s.gather_fused || s.dtype == DType::kF16 || k_blocked;
    p.b_kn_tile = s.weight_nk && machine.reads_b_in_place;
    p.b_copied = s.dtype == DType::kF16 || (!s.weight_nk && !p.b_from_kn) || p.b_kn_tile;
    // A copied or packed B block is worth more than a copied A tile: a pass over a weight block
    // costs about what gathering (or converting) x's rows does, and it serves only the rows of
    // one expert, so it is the one kept across units. With k-blocks no B is kept across units:
    // each B k-block is prepared once for an expert's pieces in the unit, their A k-blocks
    // copied once for the unit's column blocks.
    p.column_block_first = !k_blocked && (p.b_copied || machine.packs_b);
    p.c_tile_elems = p.m_group_blocks * p.n_group_blocks * p.base_m * p.base_n;
    // A: one stage of a piece of an expert's rows (a_stage_rows, at most base_m) and the padding
    // its GEMM reads past it (with k-blocks: one k-block of an expert's pieces in a unit, at most
    // one a row block); copied A with units row block first: the pieces of a row block, which may
    // run up to base_m - 1 rows past it.
    const bool a_whole_block = p.a_copied && !p.column_block_first && !k_blocked;
    // A piece copied by itself (column block first, or a piece whose padded rows would run past
    // x) goes in stages of whole granules, float32 GEMMs only (see kGroupedMatmulAStageBytes).
    // With k-blocks a k-block of the piece is copied at once.
    const int64_t stage_rows =
        kGroupedMatmulAStageBytes / (s.k * ElementBytes(p.gemm_dtype)) / p.row_granule * p.row_granule;
    p.a_stage_rows = a_whole_block || k_blocked || p.gemm_dtype != DType::kF32
                         ? p.base_m
                         : std::clamp(stage_rows, p.row_granule, p.base_m);
    p.a_tile_elems =
        ((a_whole_block ? 2 * p.base_m : p.m_group_blocks * p.a_stage_rows) + p.row_granule) * p.base_k;
    // B: a block's rows of the whole K, stride K (with k-blocks, one k-block of each row); with
    // b_kn_tile, K rows of the block's columns, stride GroupedMatmulKNTileStride.
    p.b_tile_ld = p.b_kn_tile ? GroupedMatmulKNTileStride(p.base_n) : t.ldb;
    p.b_tile_elems = !p.b_copied ? 0 : (p.b_kn_tile ? s.k : p.base_n) * p.b_tile_ld;
  } else {
    p.m_group_blocks = 1;
    p.n_group_blocks = std::max<int64_t>(1, std::min(p.col_blocks, kGroupedMatmulGradGroupCols / p.base_n));
    const int64_t group_cols = std::min(s.n, p.n_group_blocks * p.base_n);
    p.k_group_blocks = std::clamp<int64_t>(kGroupedMatmulGradGroupElems / (p.base_m * group_cols), 1,
                                           std::min(kGroupedMatmulGradGroupBlocks, p.row_blocks));
    p.units = s.g * p.KGroups() * p.NGroups();
    p.a_copied = p.b_copied = true;  // b: at least the chunks that need zero padding
    p.a_stage_rows = p.base_m;
    p.column_block_first = false;
    p.stream_out = machine.streams_grad_weight && !s.accumulate;
    // Only where the GEMM was made for rows of gradWeight (a machine of another ldc keeps tiles).
    p.out_direct = GroupedMatmulWritesGradWeightDirect(s, machine.streams_grad_weight) &&
                   machine.gemm_ldc == s.n;
    p.c_tile_elems = p.out_direct ? 0 : p.k_group_blocks * p.n_group_blocks * p.base_m * p.base_n;
    p.a_tile_elems = s.m == 0 ? 0 : p.k_group_blocks * p.base_m * (p.reduce + p.reduce_fold);
    p.b_tile_elems = s.m == 0 ? 0 : p.n_group_blocks * p.base_n * (p.reduce + p.reduce_fold);
  }
  p.machine_threads = std::max<int32_t>(machine.threads, 1);
  p.threads = static_cast<int32_t>(std::clamp<int64_t>(machine.threads, 1, std::max<int64_t>(p.units, 1)));
  p.gemm_scratchpad_bytes = AlignUp(machine.gemm_scratchpad_bytes, kGroupedMatmulAlignment);
  // About 8 grabs per thread: enough to even out uneven units, few enough that a thread's units
  // are mostly consecutive (the forward keeps its B or A tile across them).
  p.units_per_grab = std::max<int64_t>(1, p.units / (8 * static_cast<int64_t>(p.threads)));

  const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
  const uint64_t c_tile = AlignUp(Bytes(p.c_tile_elems, 4), kGroupedMatmulAlignment);
  const uint64_t a_tile = AlignUp(Bytes(p.a_tile_elems, gemm_elem), kGroupedMatmulAlignment);
  const uint64_t b_tile = AlignUp(Bytes(p.b_tile_elems, gemm_elem), kGroupedMatmulAlignment);
  p.thread_bytes = c_tile + a_tile + b_tile + p.gemm_scratchpad_bytes;
  const uint64_t threads = static_cast<uint64_t>(p.threads);
  LayoutBuilder b;
  GroupedMatmulLayout& l = p.layout;
  l.c_tiles = b.Add(threads * c_tile);
  l.a_tiles = b.Add(threads * a_tile);
  l.b_tiles = b.Add(threads * b_tile);
  l.system = b.Add(threads * p.gemm_scratchpad_bytes);
  l.group_offsets = b.Add(Bytes(s.g + 1, 8));
  l.row_token = b.Add(s.gather_fused ? Bytes(s.m, 8) : 0);
  l.end = b.end();
  p.workspace_bytes = l.end + kGroupedMatmulAlignment;
  return p;
}

std::string GroupedMatmulPlanToJson(const GroupedMatmulPlan& p) {
  const auto region = [](const GroupedMatmulRegion& r) {
    return fmt::format("{{\"offset\": {}, \"bytes\": {}}}", r.offset, r.bytes);
  };
  const GroupedMatmulShape& s = p.shape;
  const GroupedMatmulLayout& l = p.layout;
  const bool forward = s.op == GroupedMatmulOp::kForward;
  std::string impls;
  for (const auto& [width, impl] : p.gemm_impls) {
    impls += fmt::format("{}\"{}\": \"{}\"", impls.empty() ? "" : ", ", width, impl);
  }
  std::string routing = "\"x\": \"expanded\"";
  if (s.gather_fused) {
    routing = fmt::format("\"x\": \"tokens\", \"batch\": {}, \"topK\": {}, \"L\": {}, "
                          "\"row_idx_type\": \"{}\", \"index_dtype\": \"{}\"",
                          s.routing.batch, s.routing.top_k, s.routing.l,
                          RowIdxTypeName(s.routing.row_idx_type), DTypeName(s.routing.index_dtype));
  }
  return fmt::format(
      "{{\"op\": \"{}\", \"dtype\": \"{}\", \"out_dtype\": \"{}\", \"gemm_dtype\": \"{}\", "
      "\"gemm_backend\": \"{}\", \"gemm_impl\": {{{}}}, "
      "\"shape\": {{\"M\": {}, \"K\": {}, \"N\": {}, \"G\": {}}}, {}, \"group_list_type\": \"{}\", "
      "{}\"base_m\": {}, \"base_n\": {}, \"reduce\": {}, \"base_k\": {}, \"k_blocks\": {}, "
      "\"last_k\": {}, \"row_granule\": {}, \"reduce_granule\": {}, \"reduce_fold\": {}, "
      "\"work_split\": {{\"row_blocks\": {}, \"last_block_rows\": {}, \"col_blocks\": {}, "
      "\"last_block_cols\": {}, \"k_group_blocks\": {}, \"m_group_blocks\": {}, \"n_group_blocks\": {}, \"units\": {}, \"order\": \"{}\", \"units_per_grab\": {}}}, "
      "\"a_copied\": {}, \"a_stage_rows\": {}, \"b_copied\": {}, \"b_from_kn\": {}, \"b_kn_tile\": {}, \"b_tile_ld\": {}, \"stream_out\": {}, \"out_direct\": {}, \"threads\": {}, \"machine_threads\": {}, "
      "\"thread_bytes\": {}, \"workspace\": {{\"alignment\": {}, \"c_tiles\": {}, \"a_tiles\": {}, "
      "\"b_tiles\": {}, \"system\": {}, \"group_offsets\": {}, \"row_token\": {}, \"end\": {}}}, "
      "\"workspace_bytes\": {}}}",
      forward ? "grouped_matmul" : "grouped_matmul_weight_grad", DTypeName(s.dtype),
      DTypeName(s.out_dtype), DTypeName(p.gemm_dtype), p.gemm_backend, impls, s.m, s.k, s.n, s.g,
      routing, GroupListTypeName(s.routing.group_list_type),
      forward ? fmt::format("\"weight_layout\": \"{}\", ", s.weight_nk ? "GNK" : "GKN") : "",
      p.base_m, p.base_n, p.reduce, p.base_k, p.k_blocks, p.last_k, p.row_granule, p.reduce_granule, p.reduce_fold, p.row_blocks, p.last_block_rows, p.col_blocks,
      p.last_block_cols, p.k_group_blocks, p.m_group_blocks, p.n_group_blocks, p.units,
      forward ? (p.column_block_first ? "column_block_first" : "row_block_first")
              : "expert_k_group_n_group",
      p.units_per_grab, p.a_copied, p.a_stage_rows, p.b_copied, p.b_from_kn, p.b_kn_tile, p.b_tile_ld, p.stream_out, p.out_direct, p.threads, p.machine_threads, p.thread_bytes,
      kGroupedMatmulAlignment, region(l.c_tiles), region(l.a_tiles), region(l.b_tiles),
      region(l.system), region(l.group_offsets), region(l.row_token), l.end, p.workspace_bytes);
}

}  // namespace gk
