// MoeInitRoutingGroupedMatmulGrad plan (the seed's tiling, for CPU): plain data, computed once in
// phase 1 from shapes only (never from index values, which may change between repeated runs).
//
// The work: gradX is cut into units, (token chunk) x (block of base_n gradX columns). A unit
// owns its gradX elements outright: it zeroes them, then for each expert g in ascending order
// and each group of at most parall_num tiles of at most base_m of the chunk's rows of g, runs
// for each k-block kb of base_k reduction columns, in ascending order, one GEMM per tile
//   tile[rows, cols] (+)= gradY[rows, kb] * weight[g, cols, kb]^T        (fp32, first kb writes)
// into the tile's slot of its thread's matmul-out ring, then adds the tiles' rows into gradX
// while they are still in cache. No [M, K] buffer exists, and no per-thread buffer grows with N.
//
// Determinism by construction: units, tiles, k-blocks and GEMM shapes depend on the shape (and
// the GEMM library) only, never on the thread count, each GEMM runs single-threaded, and every
// gradX element receives its terms in ascending expanded row. Threads only decide which unit runs
// where (round robin, the seed's curr_abs_block_num = coreIdx, += coreNum); a thread zeroes its
// units, then runs them expert by expert, each of its column blocks and chunks in turn, which
// interleaves whole units' expert steps only.
//
// Units are planned for kMoeGradPlannedThreads threads whatever machine runs them: the column
// width and the token chunks are chosen by an estimate of the time on 1, 2, 4, ... up to that many
// threads (padded GEMM rows plus the operand traffic that thin units repeat), so one split serves
// this 2-core machine and a 128-core one alike.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"

namespace gk {

// Tile sizes (the seed's BEST_BASE_M / BEST_BASE_N), measured on Sapphire Rapids with oneDNN.
inline constexpr int64_t kMoeGradBestBaseM = 256;     // rows per GEMM tile
inline constexpr int64_t kMoeGradBestBaseN = 256;     // widest gradX column block (the seed's n = dk)
inline constexpr int64_t kMoeGradMinBaseN = 32;       // narrowest one the work split may choose
// The split's row unit: base_m is a multiple of it, and chunks keep this many rows of each expert.
inline constexpr int64_t kMoeGradRowGranule = 16;
// On a GEMM prepared per row count (oneDNN): kernels for every multiple of this up to base_m,
// and for 1 .. this - 1 rows, a tail tile running as a multiple and a short call
// (MoeTileGemmShape::tail_calls; four rounds, bfloat16 S2 and S3 +4 points of dense on the
// mean, float32 within the noise, session 30).
// Where the short kernels are dropped, tail tiles are padded to it (gradY's next rows or
// zeros): 8, not 16, measured faster for bfloat16 then (S1 86 -> 91-95% of dense, S3 79-86 ->
// 85-86, S2 +2 points; session 14's benchmarks).
inline constexpr int64_t kMoeGradGemmRowGranule = 8;
inline constexpr int64_t kMoeGradParallNum = 2;       // ring slots per thread (the seed's CV_PARALL_NUM)
inline constexpr int32_t kMoeGradPlannedThreads = 128;  // the largest machine a split is made for
inline constexpr double kMoeGradMaxImbalance = 1.15;  // max over mean units per thread, wanted
inline constexpr uint64_t kMoeGradMinThreadFlop = uint64_t{1} << 27;  // work worth another thread
// Per-thread bytes of GEMM operands (A tile, B copies) per k-block: bounds base_k.
inline constexpr uint64_t kMoeGradThreadOperandBytes = 3u << 20;
inline constexpr uint64_t kMoeGradAlignment = 512;    // every workspace region starts aligned
// Where the next weight block is fetched during the GEMMs (MoeGradStreamsWeights): the bytes an
// expert's gradY rows and two weight blocks (packed, and the next one fetched) may take, the L2
// of a core of the Zen 5 this was measured on.
inline constexpr uint64_t kMoeGradStreamedBytes = 1u << 20;

// The machine's share of the decision.
struct MoeGradMachine {
  int32_t threads;
  uint64_t gemm_scratchpad_bytes;  // the GEMM library's per-thread scratch (the seed's system area)
  std::string gemm_backend;        // the library, e.g. "onednn"
  std::vector<std::pair<int64_t, std::string>> gemm_impls;  // per column width: its implementation
  int64_t gemm_row_granule = kMoeGradGemmRowGranule;  // GEMM rows are padded to this (MoeTileGemm; 1: none)
  bool gemm_any_stride = false;  // the GEMM reads A and B at any stride (MoeTileGemm::takes_any_stride)
  bool gemm_broadcast_form = false;  // the weights-broadcast form gives its bits (MoeTileGemm::has_broadcast_form)
  bool gemm_broadcast_amx = false;   // ... on AMX tiles (MoeTileGemm::broadcast_on_amx)
};

struct MoeGradRegion {
  uint64_t offset;  // from the 512-byte aligned start of the workspace
  uint64_t bytes;
  bool operator==(const MoeGradRegion&) const = default;
};

// Workspace layout, each region 512-byte aligned. The first four scale with threads and tile
// sizes only; the index tables scale with M and G (8 bytes per entry).
struct MoeGradLayout {
  MoeGradRegion matmul_out_ring;      // threads x parall_num x [base_m, base_n] float32
  MoeGradRegion a_tiles;              // threads x a_tile_bytes: gathered / padded gradY, or token panels
  MoeGradRegion b_tiles;              // threads x [base_n, base_k] gemm dtype: weight k-block (b_copied)
  MoeGradRegion system;               // threads x gemm_scratchpad_bytes (the GEMM library's scratch)
  MoeGradRegion group_offsets;        // G + 1 int64: expert g owns rows [off[g], off[g + 1])
  MoeGradRegion row_token;            // M int64: token of each expanded row (inverse permutation)
  MoeGradRegion chunk_starts;         // chunks x G + 1 int64 (only when token_chunks > 1)
  MoeGradRegion chunk_rows;           // M int64: rows ordered by (chunk, expert, row)
  uint64_t end;                       // bytes from the aligned start
  bool operator==(const MoeGradLayout&) const = default;
};

struct MoeGradPlan {
  MoeGradShape shape;
  DType gemm_dtype;           // float32 for float32 and float16 inputs, bfloat16 for bfloat16
  std::string gemm_backend;
  std::vector<std::pair<int64_t, std::string>> gemm_impls;  // per column width
  int64_t base_m;             // rows per GEMM tile
  int64_t base_n;             // gradX columns per tile (last block: last_block_cols)
  int64_t base_k;             // reduction length per GEMM call (last k-block: last_k)
  int64_t k_blocks;           // ceil(N / base_k), summed in ascending order
  int64_t last_k;             // N - (k_blocks - 1) * base_k
  int64_t row_granule;        // tail tiles rounded up to this many rows (the GEMM's; 1: none)
  // The GEMM reads gradY and the weights in place at their own strides, k-blocks too (A: where
  // a tile's rows are consecutive; else, and for float16, through the A tile).
  bool gemm_any_stride;
  bool b_copied;              // weight k-blocks go through the B tile (MoeGradCopiesB)
  // An expert whose rows run as one range (no row list) and number at most this takes the
  // weights-broadcast form (MoeGradBroadcastRows); 0: none does.
  int64_t broadcast_max_rows;
  int64_t parall_num;         // ring slots per thread (tiles in flight per k-block pass)
  int32_t threads;            // the machine's threads, at most one per unit
  int32_t machine_threads;    // the machine's threads (load_balance counts idle ones)
  int64_t col_blocks;         // ceil(K / base_n)
  int64_t last_block_cols;    // K - (col_blocks - 1) * base_n
  int64_t token_chunks;
  int64_t tokens_per_chunk;   // the last chunk may hold fewer
  int64_t units;              // token_chunks * col_blocks; unit u = (chunk u / col_blocks, block u % col_blocks)
  uint64_t gemm_scratchpad_bytes;
  uint64_t a_tile_bytes;      // a thread's A tile: [base_m, base_k], or more for token panels (AMX)
  uint64_t thread_bytes;      // the workspace each thread owns (ring, A and B tiles, scratchpad)
  MoeGradLayout layout;
  uint64_t workspace_bytes;   // layout.end + kMoeGradAlignment (to align the caller's pointer)

  int64_t UnitsOfThread(int32_t t) const { return t < units % threads ? units / threads + 1 : units / threads; }
  // The thread of unit (chunk, block): round robin over u = chunk * col_blocks + block.
  int32_t ThreadOfUnit(int64_t chunk, int64_t block) const {
    return static_cast<int32_t>((chunk * col_blocks + block) % threads);
  }
  // Whether one thread owns a column block's unit of every chunk, for every block: one chunk, or
  // threads dividing col_blocks (2, 4 or 8 threads at S1-S4, 16 at S2 and S3). The executor then runs an
  // expert's rows of all chunks as one range (whole_blocks in the plan's JSON).
  bool WholeBlocks() const { return token_chunks == 1 || col_blocks % threads == 0; }
  // Max over mean units per thread of the static schedule on `t` threads (idle threads count).
  double LoadBalance(int32_t t) const;
  bool operator==(const MoeGradPlan&) const = default;
};

MoeGradMachine DetectMoeGradMachine(const MoeGradShape& shape);  // threads + the GEMM library
// The machine with the GEMM the executor will run (made for `shape`, MoeGradTileGemmShape).
MoeGradMachine MoeGradMachineOf(const MoeTileGemm& gemm, const MoeTileGemmShape& shape);
MoeGradPlan MakeMoeGradPlan(const MoeGradShape& shape, const MoeGradMachine& machine);
std::string MoeGradPlanToJson(const MoeGradPlan& plan);

// The work split of a shape (what the GEMM library is asked to prepare): pure, a function of the
// shape and of whether the GEMM takes any stride (k-blocks), never of the thread count.
struct MoeGradTiles {
  DType gemm_dtype;
  int64_t base_m, base_n, last_block_cols, col_blocks;
  int64_t base_k, k_blocks, last_k;
  int64_t token_chunks, tokens_per_chunk;
};
// gemm_any_stride: the GEMM reads operands at any stride (MoeTileGemm::takes_any_stride), which
// sets how long a k-block may be (LongestKBlock in moe_grad_plan.cc).
MoeGradTiles ChooseMoeGradTiles(const MoeGradShape& shape, bool gemm_any_stride);

// Whether the tiles' GEMMs stream their weights (MoeTileGemmShape::streamed_b: auto runs them on
// gradkit's dot-product kernel where MoeOwnStreamedBf16OnDot, which fetches the next weight block
// while it multiplies; oneDNN elsewhere, as before): bfloat16 with one k-block (B prepared once
// per expert and column block), where the gradY rows the kernel holds in L2 (an expert's average
// rows, at most its chunk of A rows, kMoeBf16DotAChunkBytes; the rest stream through) and two
// weight blocks fit in kMoeGradStreamedBytes. With few rows per expert, packing each block from
// memory (on oneDNN a pass of its own, at about 10 GB/s a core) is a large share of the time; the
// dot kernel fetches the block behind the arithmetic instead, which needs the fetched block to
// stay in L2. Measured on Zen 5, percent of dense: S2 (256 rows an expert, 384 KiB + 2 x 192 KiB)
// on oneDNN 78-83, streamed 84-92 (session 36); S3 (137 rows, 256 of 548 KiB + 2 x 256 KiB) on
// the 6 x 64 kernel 1.02-1.07x oneDNN's (session 43; on session 36's 12 x 32 kernel it lost);
// S1 and S4 (704 KiB blocks) equal to oneDNN's, left on it (docs/benchmarks.md).
bool MoeGradStreamsWeights(const MoeGradShape& shape, const MoeGradTiles& tiles);

// The most rows of an expert that run in the weights-broadcast form (its gradY rows packed once
// into token panels in the thread's A tile, each weight block read in place, C transposed in the
// ring's second slot, then added into gradX as the first slot's tile is: moe_grad_bf16dot.h for
// bfloat16, moe_grad_f32bcast.h for float32), 0 where no expert does. Taken where that form gives
// the GEMM's bits (gemm_broadcast_form: so experts may differ in form and the result stays the
// same whatever the thread count), with one k-block, [K, N] weights (a block's rows are its
// reduction), base_n a multiple of 16, and float32 or bfloat16 inputs; bfloat16 with N even, up to
// base_m rows whose panels take at most kMoeGradBroadcastTokensBytes (they stay in L2 while every
// weight block of the expert runs over them); float32 up to base_m rows (its kernel cuts the
// reduction into chunks whose panels stay in L2). Packing each weight block cost the packed
// form 9% of fused S3 bfloat16's samples and 18% of float32's (137 rows an expert); the broadcast
// form packs an expert's gradY once for its 56 blocks a thread instead. One-process harness, Zen
// 5, 2 threads, the same bits: S3 bfloat16 1.01-1.07x, float32 1.07-1.10x, S2 1.00x in both
// (docs/benchmarks.md, session 45).
// With `amx` (the bfloat16 form on AMX tiles, moe_grad_bf16amx.h), up to the rows whose panels
// take kMoeGradBroadcastTokensBytes, past base_m: the expert's rows are packed once and run in
// calls of MoeGradBroadcastCallRows rows each (whole token groups, so that every call reads the
// panels where they lie), which the ring's two slots hold. AMX's packed form pays for packing
// its weights on every expert (a third of fused S2's samples on the AMX Xeon, 256 rows an
// expert): there experts of up to 416 rows take the form (docs/benchmarks.md, session 47).
inline constexpr uint64_t kMoeGradBroadcastTokensBytes = 640u << 10;
int64_t MoeGradBroadcastRows(const MoeGradShape& shape, const MoeGradTiles& tiles, bool gemm_broadcast_form,
                             bool amx = false);
// The rows of one call of the form: base_m, and with more rows per expert than that (AMX) base_m
// rounded down to a whole token group (48).
int64_t MoeGradBroadcastCallRows(int64_t base_m);

// Whether the fused op's float32 tiles ask for the GEMM whose sums the float32 weights-broadcast
// form repeats (MoeTileGemmShape::f32_broadcast): float32 inputs with experts averaging at most
// base_m rows, where MoeGradBroadcastRows would take the form on either GEMM's tiles.
bool MoeGradAsksF32Broadcast(const MoeGradShape& shape);

// Whether each k-block of a weight block is copied into the thread's B tile first. On a GEMM
// that takes the shape's strides only (oneDNN): float16 weights are converted to float32 (the
// GEMM has no float16), and k-blocks of a longer reduction are made dense ([base_n, base_k]), the
// layout oneDNN's brgemm takes without falling back to its slower gemm:jit for a strided B;
// weights stored [G, N, K] are transposed into it. The GEMM then sees the same B tile whatever
// the weight's layout: the same bits. A GEMM that takes any stride packs B from the weights in
// place (either layout), so only float16 is copied.
bool MoeGradCopiesB(const MoeGradShape& shape, const MoeGradTiles& tiles, bool gemm_any_stride);
// The tile GEMM shapes of a problem (see cpu/moe_grad_gemm.h), for a GEMM of any stride or not.
MoeTileGemmShape MoeGradTileGemmShape(const MoeGradShape& shape, bool gemm_any_stride);
// The tile GEMM the executor runs and the shape it is made for. MoeTileGemm::Create chooses the
// library on the tiles of a GEMM of the shape's strides; when it chose one of any stride (gradkit's
// micro-kernel), whose k-blocks may be longer, the tiles are made again for it (and the kernel
// with them, when they differ). MakeMoeGradPlan with MoeGradMachineOf(*gemm, shape) gets the same
// tiles.
struct MoeGradGemm {
  MoeTileGemmShape shape;
  std::unique_ptr<MoeTileGemm> gemm;
};
MoeGradGemm CreateMoeGradGemm(const MoeGradShape& shape);
// Max over mean units per thread when `units` are dealt round robin to `threads`.
double MoeGradLoadBalance(int64_t units, int32_t threads);

}  // namespace gk
