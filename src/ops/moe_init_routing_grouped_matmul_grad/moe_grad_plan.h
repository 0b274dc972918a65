// MoeInitRoutingGroupedMatmulGrad plan (the seed's tiling, for CPU): plain data, computed once in
// phase 1 from shapes only (never from index values, which may change between repeated runs).
//
// The work: gradX is cut into units, (token chunk) x (block of base_n gradX columns). A unit
// owns its gradX elements outright: it zeroes them, then for each expert g in ascending order
// and each tile of at most base_m of the chunk's rows of g (ascending), runs one GEMM
//   tile[rows, base_n] = gradY[rows, :N] * weight[g, cols, :N]^T        (fp32 out)
// into the next slot of its thread's matmul-out ring, and adds the tile's rows into gradX
// right away, while the tile is still in cache. No [M, K] buffer exists.
//
// Determinism by construction: units, tiles and GEMM shapes depend on the data only, never on
// the thread count (chunking is a function of the shapes), each GEMM runs single-threaded, and
// every gradX element receives its terms in ascending expanded row. Threads only decide which
// unit runs where (round robin, the seed's curr_abs_block_num = coreIdx, += coreNum).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"

namespace gk {

// Tile sizes (the seed's BEST_BASE_M / BEST_BASE_N), measured on Sapphire Rapids with oneDNN.
inline constexpr int64_t kMoeGradBestBaseM = 256;     // rows per GEMM tile
inline constexpr int64_t kMoeGradBestBaseN = 256;     // gradX columns per tile (the seed's n = dk)
inline constexpr int64_t kMoeGradRowGranule = 16;     // tail tiles are zero-padded to this
inline constexpr int64_t kMoeGradParallNum = 2;       // ring slots per thread (the seed's CV_PARALL_NUM)
inline constexpr int64_t kMoeGradTargetUnits = 16;    // split tokens until this many units...
inline constexpr int64_t kMoeGradMinRowsPerExpertChunk = 256;  // ...unless chunks get this thin
inline constexpr uint64_t kMoeGradAlignment = 512;    // every workspace region starts aligned

// The machine's share of the decision.
struct MoeGradMachine {
  int32_t threads;
  uint64_t gemm_scratchpad_bytes;  // the GEMM library's per-thread scratch (the seed's system area)
  std::string gemm_backend;        // e.g. "onednn brg:avx512_core_amx_bf16"
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
  MoeGradRegion a_tiles;              // threads x [base_m, N] gemm dtype: gathered / padded gradY rows
  MoeGradRegion b_tiles;              // threads x [base_n, N] float32: weight block (float16 only)
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
  int64_t base_m;             // rows per GEMM tile
  int64_t base_n;             // gradX columns per tile (last block: last_block_cols)
  int64_t base_k;             // reduction length per GEMM call: all of N (blocked inside the library)
  int64_t row_granule;        // tail tiles rounded up to this many rows
  int64_t parall_num;         // ring slots per thread
  int32_t threads;
  int64_t col_blocks;         // ceil(K / base_n)
  int64_t last_block_cols;    // K - (col_blocks - 1) * base_n
  int64_t token_chunks;
  int64_t tokens_per_chunk;   // the last chunk may hold fewer
  int64_t units;              // token_chunks * col_blocks; unit u = (chunk u / col_blocks, block u % col_blocks)
  uint64_t gemm_scratchpad_bytes;
  MoeGradLayout layout;
  uint64_t workspace_bytes;   // layout.end + kMoeGradAlignment (to align the caller's pointer)

  int64_t UnitsOfThread(int32_t t) const { return t < units % threads ? units / threads + 1 : units / threads; }
  bool operator==(const MoeGradPlan&) const = default;
};

MoeGradMachine DetectMoeGradMachine(const MoeGradShape& shape);  // threads + the GEMM library
MoeGradPlan MakeMoeGradPlan(const MoeGradShape& shape, const MoeGradMachine& machine);
std::string MoeGradPlanToJson(const MoeGradPlan& plan);

// Tile sizes of a shape (what the GEMM library is asked to prepare): pure, shape-only.
struct MoeGradTiles {
  DType gemm_dtype;
  int64_t base_m, base_n, last_block_cols;
};
MoeGradTiles ChooseMoeGradTiles(const MoeGradShape& shape);
// The tile GEMM shapes of a problem (see cpu/moe_grad_gemm.h).
MoeTileGemmShape MoeGradTileGemmShape(const MoeGradShape& shape);

}  // namespace gk
