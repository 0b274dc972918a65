// GroupedMatmul and GroupedMatmulWeightGrad plans (CPU tiling): plain data, computed once in phase
// 1 from shapes only (never from index values, which may change between repeated runs).
//
// GroupedMatmul: y is cut into units of (block of base_m rows) x (block of base_n columns). Each
// expert's rows are cut into pieces of base_m rows counted from its first row (the last one
// shorter), and a piece belongs to the row block holding its first row, so it may run up to
// base_m - 1 rows past that block: no expert is cut where row blocks meet, and each piece's GEMM
// reads its B block once for as many rows as it can. A unit owns the y elements of its pieces:
// for each (ascending experts, at most one per expert) one tile GEMM over the whole K,
//   C[rows, cols] = x(rows)[:, 0:K] * W[g][0:K, cols]                       (float32)
// then rounds C into y. A is x's rows read in place (plain float32 / bfloat16 x) or copied into
// the thread's A tile (gather-fused: the token rows; float16: converted): a piece at a time, in
// stages of a_stage_rows (float32 GEMMs), when units run column block first, else the pieces of
// the row block once for its column blocks;
// B is the weight block read in place ([G, N, K] storage, float32 / bfloat16) or copied into the
// thread's B tile (float16: converted; [G, K, N] storage: transposed, unless the GEMM library
// packs straight from [K, N] rows, as oneDNN 2.x does), then packed by the GEMM library once
// (Worker::PrepareB / PrepareBFromKN) for as long as the thread's units use it (float32 weights
// on CPUs of MoeF32InPlaceKNOutrunsPackedBrgemm: [K, N] rows read in place by the library's
// gemm:jit on every call, nothing kept, so row block first; [N, K] blocks copied into the B
// tile as [K, N] rows first, b_kn_tile, column block first). When B is copied
// or packed, units run column block first, so a thread prepares each (expert, column block) once
// for all the row blocks it runs in a row (a gathered A is then gathered again per unit: one pass
// over the rows of x, where B's pass serves only one expert's rows); otherwise row block first,
// so a gathered A serves every column block.
// Streamed weights (k_blocks > 1, the rule in ChooseTiles): K is cut into k-blocks of base_k and
// a unit is (m_group_blocks row blocks) x (n_group_blocks column blocks), row group first; it
// runs the pieces whose first row it holds, expert by expert. For each expert and each k-block
// in ascending order, the k-block of each of the expert's pieces is copied dense into the A tile
// once, then for each of the unit's column blocks B's k-block is prepared (packed: it stays in
// L2) once for all those pieces and
//   C_piece,nb[rows, cols] (+)= x(rows)[:, k0:k0+kr] * W[g][k0:k0+kr, cols]   (float32)
// (the first k-block writes); after the last one the expert's C tiles are rounded into y.
// Float32 k-blocks name the block prepared next to the GEMM while the current one's calls run
// (MoeTileGemmShape::streamed_b: the micro-kernel fetches it meanwhile).
// Nothing is kept across experts or units. How many row and column blocks a unit spans changes
// no output bit (each piece's C tile sums the same calls in the same order), so units narrow on
// machines with many threads.
//
// GroupedMatmulWeightGrad: gradWeight is cut into tiles of (expert g) x (block of base_m of K) x
// (block of base_n of N). Each tile sums its expert's rows in chunks of base_r rows, ascending
// (the first chunk writes, the rest add), each chunk one GEMM:
//   C[k, n] (+)= sum over the chunk's rows i of x(i)[k] * gradY[i, n]        (float32)
// The expert's last chunk reduces over its rows padded to reduce_granule (zeros past them), not to
// base_r; a remainder of at most reduce_fold rows joins the last full chunk instead of making a
// chunk of its own. A is x's chunk transposed; B is gradY's chunk rows packed by the GEMM library straight
// from gradY (b_from_kn, chunks that need no padding) or from a transposed, zero-padded copy. Then C is rounded
// into gradWeight; an expert without rows gets zeros. A unit is a group of tiles of one expert,
// k_group_blocks x n_group_blocks of them, run chunk by chunk: each chunk's x and gradY columns
// are transposed once for the whole group (not once per tile) and each column block's B packed
// once for the group's K blocks; the float32 sums stay in the thread's C tiles between chunks.
//
// Determinism by construction: pieces, k-blocks, chunks and GEMM shapes depend on the problem
// only (units too, but for the streamed forward's column groups, which change no bit),
// each GEMM runs single-threaded, and every output element is written by one unit. Threads only
// decide which units run where: each takes the next units_per_grab consecutive units while any
// remain (skewed routing makes some units far heavier than others; a static split would wait for
// the thread that drew them).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "ops/grouped_matmul/grouped_matmul_def.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"

namespace gk {

inline constexpr int64_t kGroupedMatmulBaseM = 256;    // rows per tile GEMM (forward: of x)
inline constexpr int64_t kGroupedMatmulBaseN = 256;    // output columns per tile
inline constexpr int64_t kGroupedMatmulBaseR = 256;    // weight grad: rows reduced per GEMM call
inline constexpr int64_t kGroupedMatmulRowGranule = 16;  // GEMM rows are padded to this
// Weight grad: an expert's rows past its last full chunk of `reduce` join that chunk when at most
// this many, so that a chunk of a few rows does not read and write the unit's whole block of
// float32 gradWeight (or C tiles) once more for a few percent of its arithmetic (S2: 64 experts
// of about 256 rows, half of them a few rows over). Zen 5, S2, percent of dense: bfloat16 85,
// 83, 85 -> 92, 99, 96 (three rounds); float32 plain GFLOP/s mean 295 -> 314 over five
// (docs/benchmarks.md, session 31). The chunk's tiles grow by as much (a quarter), and the tile
// GEMM is prepared for reductions up to reduce + this.
inline int64_t GroupedMatmulReduceFold(int64_t reduce) { return reduce / 4; }
// Weight grad: the rows of the chunk that starts `left` rows before the end of an expert's rows,
// chunks of `reduce` rows from its first row on: `reduce`, or all `left` when that leaves at most
// `fold` rows (the last full chunk takes the remainder) or fewer than `reduce` are left. At most
// reduce + fold, what the plan sizes the tiles and the tile GEMM's reductions for. The one rule
// the executor cuts by and the tests read.
inline int64_t GroupedMatmulChunkRows(int64_t left, int64_t reduce, int64_t fold) {
  return left - reduce <= fold ? left : reduce;
}
// Weight grad, bfloat16 on AMX CPUs: an expert's last chunk padded to this many rows (its
// reduction), not 16: oneDNN 2.6 runs an AMX brgemm only on reductions of whole 32-row blocks.
inline constexpr int64_t kGroupedMatmulBf16ReduceGranule = 32;
// Weight grad unit: at most this many K blocks, its columns at most kGroupedMatmulGradGroupCols,
// and its float32 C tiles at most kGroupedMatmulGradGroupElems elements (4 MiB) per thread.
inline constexpr int64_t kGroupedMatmulGradGroupBlocks = 4;
inline constexpr int64_t kGroupedMatmulGradGroupCols = 2048;
inline constexpr int64_t kGroupedMatmulGradGroupElems = int64_t{1} << 20;
inline constexpr uint64_t kGroupedMatmulAlignment = 512;  // every workspace region starts aligned
// Forward k-blocks (streamed weights, see ChooseTiles): K cut into k-blocks of this length, a
// unit spanning up to kGroupedMatmulStreamGroupCols columns, fewer where that leaves under
// kGroupedMatmulStreamUnitsPerThread units a thread.
inline constexpr int64_t kGroupedMatmulStreamBaseK = 256;
// bfloat16 x on CPUs without AMX (oneDNN's AVX512-BF16 brgemm, or the micro-kernel) streams
// k-blocks of this length whenever K is longer, whatever its experts' rows: deep enough that the
// float32 C tiles are read and written only K / 1024 times, and its tiles stay bounded in K.
// Zen 5, 2 threads, GFLOP/s plain / gathered, whole K (S1, S4; S3 in k-blocks of 256) ->
// k-blocks of 1024, three rounds: S1 672-704 / 624-663 -> 704-734 / 669-722, three more (two
// binaries) 663-716 / 628-649 -> 659-686 / 647-670 (plain within the noise, gathered / plain
// 91-95 -> 97-98%); S4 711-735 / 715-731 -> 723-743 / 730-747; two rounds S2 607-625 -> 631-657,
// S3 540-555 -> 555-594; one round Mixtral's down projection (K 14336) 697 / 660 -> 680 / 662,
// its workspace 29.4 -> 13.3 MiB at 2 threads, 940 -> 134 MiB at 64 (docs/benchmarks.md,
// session 29). k-blocks of 512 read between.
inline constexpr int64_t kGroupedMatmulBf16StreamBaseK = 1024;
inline constexpr int64_t kGroupedMatmulStreamGroupCols = 2048;
// ... and up to this many row blocks, as many as the pieces of an average expert (each B k-block
// is then prepared once for all of them, as the whole K prepares a B block once for an expert's
// row blocks), while the unit's float32 C tiles stay within kGroupedMatmulGradGroupElems.
inline constexpr int64_t kGroupedMatmulStreamGroupRowBlocks = 4;
// The longest K a float32 or float16 forward multiplies whole; past it K is always streamed in
// k-blocks, so that a thread's tiles (a whole-K A tile of a row block, a packed or converted B
// block of base_n x K, the library's scratchpad for it) stay bounded whatever K. Mixtral's down
// projection (K 14336, 1024 rows an expert, 2 threads, Zen 5, docs/benchmarks.md, session 26),
// percent of dense, two rounds: float32 [G, K, N] 84, 86 with units of one row block -> 91, 92
// with units of an expert's four (kGroupedMatmulStreamGroupRowBlocks), [G, N, K] 82, 87 -> 83,
// 95 (whole K, session 24: 84-86 and 93); float16 whole K 74, 72 (60 MiB of workspace) -> 81,
// 82 (11 MiB). bfloat16 x measured 100, 96 whole -> 90, 85 in k-blocks of 256 (29 -> 9 MiB); off
// AMX it now streams k-blocks of kGroupedMatmulBf16StreamBaseK (on AMX, 256). Up to it, CPUs that read float32 weights in place
// (MoeF32InPlaceKNOutrunsPackedBrgemm) keep the in-place kernel where others would stream.
// Measured on Zen 5 (session 23, percent of dense, in place against streamed): S2 (K 2048)
// [G, K, N] 98, 97, 92, 93 against 88, 84, 82, 85 ([G, N, K] 83, 81, 85, 88 against 88, 87, 83,
// 87); S3 (K 7168) 79, 78, 83 against 81, 81, 83, where the gathered form's A tile (a whole row
// block of the whole K, units row block first) took the workspace from 5.1 to 29.4 MiB.
inline constexpr int64_t kGroupedMatmulMaxWholeK = 4096;
inline constexpr int64_t kGroupedMatmulStreamUnitsPerThread = 4;
// Forward, A through the A tile one piece at a time (gather-fused or float16 x with units column
// block first, and plain pieces whose padded rows would run past x's end in either order): a
// piece is copied and multiplied in stages of at most this many bytes of A
// (whole granules of rows, at least one), so that a stage stays in L2 beside the packed B block.
// Float32 GEMMs only (float32 and float16 x): the plain form multiplies the same piece whole,
// so the forms give the same bytes only where each row of C comes out the same whatever the
// call's row count. oneDNN's float32 brgemm and gradkit's micro-kernel do (the forms' byte
// tests compare staged and whole pieces); oneDNN 2.6's AMX bfloat16 brgemm does not always (a
// trial that ran the fused op's rows of a whole expert in one tile instead of one tile per token
// chunk changed the bits of a bfloat16 case with two k-blocks, session 22), so bfloat16 pieces
// stay whole.
inline constexpr int64_t kGroupedMatmulAStageBytes = int64_t{512} << 10;

// The B tile's [K, N] row stride (elements) where float32 [G, N, K] weights are copied into
// [K, N] rows for a GEMM that reads them in place (b_kn_tile): 16 past base_n, so that no
// block's rows are dense (oneDNN runs dense ones on brgemm, strided ones on gemm:jit, as the
// [G, K, N] form's rows of stride N).
inline int64_t GroupedMatmulKNTileStride(int64_t base_n) { return base_n + 16; }

struct GroupedMatmulMachine {
  int32_t threads;
  uint64_t gemm_scratchpad_bytes;
  std::string gemm_backend;
  std::vector<std::pair<int64_t, std::string>> gemm_impls;  // per column width
  bool packs_b = false;          // the GEMM packs each prepared B once (Worker::PrepareB)
  bool packs_b_from_kn = false;  // ... and packs [K, N] weight rows itself (no transposed copy)
  int64_t gemm_row_granule = kGroupedMatmulRowGranule;  // GEMM rows padded to this (MoeTileGemm)
  bool streams_grad_weight = false;  // GroupedMatmulStreamsGradWeight of this CPU
  bool reads_b_in_place = false;     // MoeTileGemm::reads_b_in_place: float32 B^T rows, no pack
  int64_t gemm_ldc = 0;              // MoeTileGemmShape::ldc the GEMM was made for
};

// CPUs whose weight gradient runs faster storing gradWeight by non-temporal stores: Intel's
// (measured on an AMX Xeon; AMD Zen 4 measured slower).
bool GroupedMatmulStreamsGradWeight(const CpuIdentity& cpu);

// Whether the weight grad's GEMMs write gradWeight themselves (C of row stride N) instead of
// float32 C tiles that a pass then stores: float32 gradWeight (a tile stored to it is a plain
// copy, so the bits are the same either way) summed by float32 GEMMs, not Add (whose sum would
// change order), K a multiple of the row granule (the padded rows of K's last block stay inside
// the expert's rows), on CPUs that do not stream gradWeight (GroupedMatmulStreamsGradWeight). The
// GEMM's stores then overlap its arithmetic where the pass after it did not: Zen 5, float32, two
// rounds, percent of dense, S2 78, 78 -> 85, 93; S3 81, 78 -> 94, 93 (docs/benchmarks.md,
// session 27). oneDNN 2.6 has no brgemm for such a strided C: the shape runs on gradkit's
// micro-kernel (MoeTileGemm auto), which without direct writes ran S2 82, 78 and S3 86, 80 there;
// with GRADKIT_GEMM=onednn the GEMM keeps C tiles.
// bfloat16 GEMMs write gradWeight direct only where N <= kGroupedMatmulGradGroupCols: on oneDNN's
// brgemm through GroupedMatmulWholeRowTiles, on gradkit's dot-product kernel (where the weight
// grad's experts take several chunks, Zen 5) in column blocks of whole panels.
bool GroupedMatmulWritesGradWeightDirect(const GroupedMatmulShape& shape, bool streams_grad_weight);
// bfloat16 weight grad writing gradWeight direct: its tiles span all N (base_n = N, one column
// block), so C's row stride N is the GEMM's own width and oneDNN 2.6 runs it on brgemm (a strided
// C of 256 columns would go to gemm:jit); the packed B of a chunk is then N x base_r (1 MiB at
// N = 2048, the bound). On CPUs that stream gradWeight (Intel) tiles stay as they were. The
// GEMMs' stores overlap their arithmetic, the C tiles and the store pass go (Zen 5, two rounds,
// percent of dense: S3 66, 70 -> 87, 81; S2 80, 79 -> 83, 83; S4 84, 86 -> 91, 94; S1 80, 81 ->
// 75, 79, within its noise; docs/benchmarks.md, session 29).
bool GroupedMatmulWholeRowTiles(const GroupedMatmulShape& shape, bool streams_grad_weight);

struct GroupedMatmulRegion {
  uint64_t offset;  // from the 512-byte aligned start of the workspace
  uint64_t bytes;
  bool operator==(const GroupedMatmulRegion&) const = default;
};

struct GroupedMatmulLayout {
  GroupedMatmulRegion c_tiles;        // threads x [base_m, base_n] float32
  GroupedMatmulRegion a_tiles;        // threads x A tile (gemm dtype), see a_tile_elems
  GroupedMatmulRegion b_tiles;        // threads x B tile (gemm dtype), see b_tile_elems
  GroupedMatmulRegion system;         // threads x the GEMM library's scratchpad
  GroupedMatmulRegion group_offsets;  // G + 1 int64
  GroupedMatmulRegion row_token;      // M int64, gather-fused only
  uint64_t end;
  bool operator==(const GroupedMatmulLayout&) const = default;
};

struct GroupedMatmulPlan {
  GroupedMatmulShape shape;
  DType gemm_dtype;  // float32 for float32 and float16 inputs, bfloat16 for bfloat16
  std::string gemm_backend;
  std::vector<std::pair<int64_t, std::string>> gemm_impls;
  int64_t base_m;        // forward: x rows per row block; weight grad: K rows per block
  int64_t base_n;        // output columns per block
  int64_t reduce;        // the reduction of one unit's GEMM calls: forward K, weight grad base_r
  // Forward: K cut into k_blocks of base_k (the last last_k), summed in ascending order into
  // C (streamed weights); one k-block of K otherwise. Weight grad: 1 (base_k = last_k = reduce).
  int64_t base_k;
  int64_t k_blocks;
  int64_t last_k;
  int64_t row_granule;
  int64_t reduce_granule;  // weight grad: an expert's last chunk padded to this (1: not padded)
  // Weight grad: a remainder of at most this many rows past an expert's last full chunk is
  // reduced with that chunk (GroupedMatmulReduceFold; forward: 0).
  int64_t reduce_fold;
  int64_t row_blocks;    // forward: ceil(M / base_m); weight grad: ceil(K / base_m)
  int64_t last_block_rows;
  int64_t col_blocks;    // ceil(N / base_n)
  int64_t last_block_cols;
  int64_t k_group_blocks;  // weight grad: K blocks per unit (forward: 1)
  int64_t n_group_blocks;  // column blocks per unit (forward: 1 but with k-blocks)
  int64_t m_group_blocks;  // forward with k-blocks: row blocks per unit (otherwise 1)
  int64_t units;         // forward: m groups * n groups; weight grad: G * k groups * n groups
  bool column_block_first;  // forward: units ordered (column block, row block): B copied or packed
  bool a_copied;         // forward: A always goes through the A tile (gather-fused or float16)
  // Forward: rows of a piece copied and multiplied at a time where the piece goes through the A
  // tile by itself (kGroupedMatmulAStageBytes); base_m otherwise, and for the weight grad.
  int64_t a_stage_rows;
  bool b_copied;         // forward: B always goes through the B tile ([G, K, N], float16, b_kn_tile)
  // B packed by the GEMM straight from [reduce, width] rows of stride N (PrepareBFromKN): the
  // forward's [G, K, N] weights; the weight grad's gradY rows for every chunk that needs no zero
  // padding (a chunk whose rows are not a multiple of reduce_granule goes through the B tile).
  bool b_from_kn;
  // Forward, float32 [G, N, K] weights where the GEMM reads B in place (machine
  // reads_b_in_place): each block copied into the B tile as [K, N] rows of stride
  // GroupedMatmulKNTileStride, so that every weight form runs the one kernel [K, N] rows run on.
  bool b_kn_tile;
  // Weight grad (not Add): gradWeight stored by non-temporal stores (GroupedMatmulStreamTiles).
  bool stream_out;
  // Weight grad: the GEMMs write (and accumulate an expert's chunks) straight into gradWeight,
  // rows of stride N: no C tiles, no store pass (GroupedMatmulWritesGradWeightDirect).
  bool out_direct;
  int64_t c_tile_elems;  // per thread: float32 tiles of [base_m, base_n] (one, or a unit's)
  int64_t a_tile_elems;  // per thread
  int64_t b_tile_elems;  // per thread
  // Forward: the B tile's row stride (elements): GroupedMatmulKNTileStride with b_kn_tile; with
  // k-blocks, base_k where B always goes through the tile or is packed from [K, N] rows (float16,
  // [G, K, N]); K otherwise. Weight grad: 0 (its tiles are [width, reduce] chunks).
  int64_t b_tile_ld;
  int32_t threads;       // at most one per unit
  int32_t machine_threads;
  uint64_t gemm_scratchpad_bytes;
  uint64_t thread_bytes;
  GroupedMatmulLayout layout;
  uint64_t workspace_bytes;  // layout.end + kGroupedMatmulAlignment

  int64_t units_per_grab;  // consecutive units a thread takes at a time (keeps its copied tiles warm)
  int64_t Grabs() const { return (units + units_per_grab - 1) / units_per_grab; }
  int64_t KGroups() const { return (row_blocks + k_group_blocks - 1) / k_group_blocks; }
  int64_t MGroups() const { return (row_blocks + m_group_blocks - 1) / m_group_blocks; }
  int64_t NGroups() const { return (col_blocks + n_group_blocks - 1) / n_group_blocks; }
  bool operator==(const GroupedMatmulPlan&) const = default;
};

// The tile GEMM shapes of a problem (every call the plan makes), from the shape only.
MoeTileGemmShape GroupedMatmulTileGemmShape(const GroupedMatmulShape& shape);
GroupedMatmulMachine DetectGroupedMatmulMachine(const GroupedMatmulShape& shape);
// The same from a tile GEMM already made (phase 1 makes it once, for the executor).
GroupedMatmulMachine GroupedMatmulMachineOf(const MoeTileGemm& gemm, const MoeTileGemmShape& shape,
                                            int32_t threads);
GroupedMatmulPlan MakeGroupedMatmulPlan(const GroupedMatmulShape& shape,
                                        const GroupedMatmulMachine& machine);
std::string GroupedMatmulPlanToJson(const GroupedMatmulPlan& plan);

}  // namespace gk
