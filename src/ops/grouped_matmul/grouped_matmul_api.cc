// GroupedMatmul and GroupedMatmulWeightGrad two-phase C API: phase 1 checks (index values
// included) and plans, phase 2 rebuilds the routing tables in the workspace and runs the tiles.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/cpu/stream_copy.h"
#include "core/error.h"
#include "core/executor.h"
#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "gradkit/grouped_matmul.h"
#include "ops/grouped_matmul/cpu/grouped_matmul_kernels.h"
#include "ops/grouped_matmul/grouped_matmul_def.h"
#include "ops/grouped_matmul/grouped_matmul_plan.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"

namespace gk {
namespace {

constexpr std::string_view kForward1 = "gkGroupedMatmulGetWorkspaceSize";
constexpr std::string_view kForward2 = "gkGroupedMatmul";
constexpr std::string_view kWeightGrad1 = "gkGroupedMatmulWeightGradGetWorkspaceSize";
constexpr std::string_view kWeightGrad2 = "gkGroupedMatmulWeightGrad";
constexpr std::string_view kWeightGradAdd1 = "gkGroupedMatmulWeightGradAddGetWorkspaceSize";
constexpr std::string_view kWeightGradAdd2 = "gkGroupedMatmulWeightGradAdd";

// What one thread owns in the workspace, and the routing tables all threads read.
struct ThreadSlots {
  float* c_tile;
  char* a_tile;
  char* b_tile;
  MoeTileGemm::Worker* gemm;
  // Forward: what the A and B tiles hold, kept across the thread's grabs of units.
  int64_t a_block = -1;                 // the row block gathered in the A tile
  int64_t b_expert = -1, b_col = -1;    // the weight block in the B tile, prepared
  const void* b_ready = nullptr;        // that block as the GEMM takes it (Worker::PrepareB)
};
struct Tables {
  const int64_t* group_offsets;
  const int64_t* row_token;  // gather-fused only
};

// Shared by both executors: the plan, the prepared GEMM, the routing tables rebuilt (and
// re-checked, as index data may have changed since phase 1) before any output byte is written,
// then one task per thread over its contiguous range of units.
class GroupedMatmulExecutorBase : public gkOpExecutor {
 public:
  GroupedMatmulExecutorBase(const GroupedMatmulPlan& plan, std::unique_ptr<MoeTileGemm> gemm,
                            const gkTensor& x, const gkTensor& operand, const gkTensor& groups,
                            const gkTensor* idx, const gkTensor& out)
      : plan_(plan), gemm_(std::move(gemm)), x_(x), operand_(operand), groups_(groups),
        idx_(idx ? *idx : gkTensor{}), out_(out) {}

  std::string_view op_name() const override { return GroupedMatmulOpName(plan_.shape); }
  uint64_t workspace_bytes() const override { return plan_.workspace_bytes; }

  gkStatus Run(void* workspace) const override {
    const GroupedMatmulPlan& p = plan_;
    const GroupedMatmulShape& s = p.shape;
    const std::string_view api = s.op == GroupedMatmulOp::kForward ? kForward2
                                 : s.accumulate                   ? kWeightGradAdd2
                                                                  : kWeightGrad2;
    char* base = static_cast<char*>(AlignUp(workspace, kGroupedMatmulAlignment));
    const GroupedMatmulLayout& l = p.layout;
    const auto at = [&](const GroupedMatmulRegion& r) { return r.bytes ? base + r.offset : nullptr; };
    auto* group_offsets = reinterpret_cast<int64_t*>(at(l.group_offsets));
    auto* row_token = reinterpret_cast<int64_t*>(at(l.row_token));
    GK_RETURN_IF_ERROR(
        BuildGroupOffsets(api, groups_, s.routing, group_offsets, GroupedMatmulRowsOf(s)));
    if (s.gather_fused) {
      GK_RETURN_IF_ERROR(BuildRowTokens(api, idx_, s.routing, row_token));
      if (s.routing.row_idx_type == RowIdxType::kGather) {
        GK_RETURN_IF_ERROR(CheckDistinctSlots(api, idx_, s.routing));
      }
    }
    const Tables tables{group_offsets, row_token};
    const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
    const uint64_t c_tile = AlignUp(static_cast<uint64_t>(p.c_tile_elems) * 4, kGroupedMatmulAlignment);
    const uint64_t a_tile = AlignUp(static_cast<uint64_t>(p.a_tile_elems * gemm_elem), kGroupedMatmulAlignment);
    const uint64_t b_tile = AlignUp(static_cast<uint64_t>(p.b_tile_elems * gemm_elem), kGroupedMatmulAlignment);
    // One task per thread slot (its share of the workspace); each takes grabs of consecutive
    // units while any remain. Which slot runs a unit changes no output byte.
    std::atomic<int64_t> next_grab{0};
    ParallelFor(p.threads, p.threads, [&](int64_t task) {
      const auto t = static_cast<uint64_t>(task);
      const GemmSequentialScope sequential;
      char* system = at(l.system);
      const auto worker = gemm_->MakeWorker(system ? system + t * p.gemm_scratchpad_bytes : nullptr);
      ThreadSlots slots{reinterpret_cast<float*>(at(l.c_tiles) + t * c_tile),
                        l.a_tiles.bytes ? at(l.a_tiles) + t * a_tile : nullptr,
                        l.b_tiles.bytes ? at(l.b_tiles) + t * b_tile : nullptr, worker.get()};
      for (int64_t grab = next_grab.fetch_add(1); grab < p.Grabs(); grab = next_grab.fetch_add(1)) {
        RunUnits(grab * p.units_per_grab, std::min(p.units, (grab + 1) * p.units_per_grab), tables,
                 slots);
      }
      if (p.stream_out) FlushStreamingStores();  // before the caller reads what it streamed
    });
    return GK_SUCCESS;
  }

 protected:
  virtual void RunUnits(int64_t begin, int64_t end, const Tables& tables,
                        ThreadSlots& slots) const = 0;

  // The row of x that expanded row i reads.
  const char* XRow(const Tables& tables, int64_t i) const {
    const int64_t row = plan_.shape.gather_fused ? tables.row_token[i] : i;
    return TensorBase(x_) + row * plan_.shape.k * ElementBytes(plan_.shape.dtype);
  }
  int64_t BlockCols(int64_t block) const {
    return block == plan_.col_blocks - 1 ? plan_.last_block_cols : plan_.base_n;
  }
  // The column blocks [first, end) of a unit's column group n_group (both ops).
  std::pair<int64_t, int64_t> ColumnGroup(int64_t n_group) const {
    const int64_t first = n_group * plan_.n_group_blocks;
    return {first, std::min(plan_.col_blocks, first + plan_.n_group_blocks)};
  }
  int64_t PaddedRows(int64_t rows) const {
    return (rows + plan_.row_granule - 1) / plan_.row_granule * plan_.row_granule;
  }

  GroupedMatmulPlan plan_;
  std::unique_ptr<MoeTileGemm> gemm_;
  gkTensor x_, operand_, groups_, idx_, out_;  // copies: the caller may release its descriptors
};

// ---- GroupedMatmul ------------------------------------------------------------------------------
class GroupedMatmulExecutor final : public GroupedMatmulExecutorBase {
 public:
  using GroupedMatmulExecutorBase::GroupedMatmulExecutorBase;

 private:
  void RunUnits(int64_t begin, int64_t end, const Tables& tables,
                ThreadSlots& slots) const override {
    const GroupedMatmulPlan& p = plan_;
    for (int64_t u = begin; u < end; ++u) {
      if (p.k_blocks > 1) {
        RunKBlockedUnit(u / p.NGroups(), u % p.NGroups(), tables, slots);
        continue;
      }
      const int64_t row_block = p.column_block_first ? u % p.row_blocks : u / p.col_blocks;
      const int64_t col_block = p.column_block_first ? u / p.row_blocks : u % p.col_blocks;
      RunUnit(row_block, col_block, tables, slots);
    }
  }

  // x's row i, columns [k0, k0 + kr), as the GEMM takes it (gathered, or converted from
  // float16), to `dst`.
  void CopyARow(const Tables& tables, int64_t i, int64_t k0, int64_t kr, char* dst) const {
    const GroupedMatmulShape& s = plan_.shape;
    const char* src = XRow(tables, i) + k0 * ElementBytes(s.dtype);
    if (s.dtype == DType::kF16) {
      MoeConvertF16ToF32(reinterpret_cast<const uint16_t*>(src), reinterpret_cast<float*>(dst), kr);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(kr * ElementBytes(s.dtype)));
    }
  }

  // B of (expert g, column block), k-block [k0, k0 + kr): copied into the B tile when needed
  // (rows of stride K; with b_kn_tile, [K, N] rows of stride GroupedMatmulKNTileStride), then
  // prepared by the library (packed, for oneDNN, or read in place); valid until the thread's
  // next PrepareB.
  const void* PrepareWeights(int64_t g, int64_t col_block, int64_t k0, int64_t kr,
                             ThreadSlots& slots) const {
    const GroupedMatmulPlan& p = plan_;
    const GroupedMatmulShape& s = p.shape;
    const int64_t elem = ElementBytes(s.dtype);
    const int64_t n0 = col_block * p.base_n;
    const int64_t cols = BlockCols(col_block);
    const char* w = TensorBase(operand_);
    if (p.b_from_kn) {  // [K, N] rows, packed by the library in one pass
      return slots.gemm->PrepareBFromKN(cols, kr, w + ((g * s.k + k0) * s.n + n0) * elem);
    }
    const void* b = w + ((g * s.n + n0) * s.k + k0) * elem;  // [N, K] rows of expert g, in place
    if (p.b_kn_tile) {  // float32 [N, K] rows copied into [K, N] rows, which the GEMM reads in place
      GroupedMatmulTransposeBlock(s.dtype, b, s.k, cols, kr, slots.b_tile, p.b_tile_ld);
      return slots.gemm->PrepareBFromKN(cols, kr, slots.b_tile);
    }
    if (p.b_copied) {
      if (s.weight_nk) {  // float16 [N, K] rows: converted
        for (int64_t c = 0; c < cols; ++c) {
          MoeConvertF16ToF32(reinterpret_cast<const uint16_t*>(w + ((g * s.n + n0 + c) * s.k + k0) * elem),
                             reinterpret_cast<float*>(slots.b_tile) + c * p.b_tile_ld, kr);
        }
      } else {  // [K, N]: the block's columns become the B tile's rows
        GroupedMatmulTransposeBlock(s.dtype, w + ((g * s.k + k0) * s.n + n0) * elem, s.n, kr, cols,
                                    slots.b_tile, p.b_tile_ld);
      }
      b = slots.b_tile;
    }
    return slots.gemm->PrepareB(cols, kr, b);
  }

  // Asks the GEMM to fetch the weights of (expert g, column block, k-block kb), read where they
  // are ([K, N] rows, or [N, K] rows), while the calls after it run, about `macs` multiply-adds
  // (a hint: the own kernel spreads the loads over its arithmetic, so that the block is in the
  // caches when it is prepared).
  void PrefetchWeights(int64_t g, int64_t col_block, int64_t kb, int64_t macs,
                       ThreadSlots& slots) const {
    const GroupedMatmulPlan& p = plan_;
    const GroupedMatmulShape& s = p.shape;
    const int64_t elem = ElementBytes(s.dtype);
    const int64_t k0 = kb * p.base_k, n0 = col_block * p.base_n;
    const int64_t kr = kb == p.k_blocks - 1 ? p.last_k : p.base_k;
    const int64_t cols = BlockCols(col_block);
    const char* w = TensorBase(operand_);
    if (p.b_from_kn) {
      slots.gemm->PrefetchDuringRuns(w + ((g * s.k + k0) * s.n + n0) * elem, kr, cols * elem,
                                     s.n * elem, macs);
    } else {
      slots.gemm->PrefetchDuringRuns(w + ((g * s.n + n0) * s.k + k0) * elem, cols, kr * elem,
                                     s.k * elem, macs);
    }
  }

  // Streamed weights: the unit's column blocks [nb0, nb1) for the pieces whose first row is in
  // its row group, expert by expert, K in k-blocks summed in ascending order into one C tile per
  // (piece, column block). Each k-block of the expert's pieces is copied once (dense, as the GEMM
  // takes it) for all the unit's column blocks, and each B k-block prepared once for all the
  // pieces.
  void RunKBlockedUnit(int64_t row_group, int64_t n_group, const Tables& tables,
                       ThreadSlots& slots) const {
    const GroupedMatmulPlan& p = plan_;
    const GroupedMatmulShape& s = p.shape;
    const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
    const int64_t out_elem = ElementBytes(s.out_dtype);
    const int64_t r0 = row_group * p.m_group_blocks * p.base_m;
    const int64_t r1 = std::min(s.m, r0 + p.m_group_blocks * p.base_m);
    const int64_t nb0 = ColumnGroup(n_group).first, nb1 = ColumnGroup(n_group).second;
    const int64_t tile_elems = p.base_m * p.base_n;
    const int64_t group_tiles = nb1 - nb0;
    ForEachPieces(r0, r1, tables.group_offsets, [&](int64_t g, int64_t q0, int64_t q1) {
      const int64_t pieces = (q1 - q0 + p.base_m - 1) / p.base_m;
      // Piece j: rows [q0 + j base_m, ...), its A k-block at row j base_m of the A tile.
      const auto piece_rows = [&](int64_t j) { return std::min(p.base_m, q1 - q0 - j * p.base_m); };
      int64_t gemm_rows = 0;  // of each column block's calls
      for (int64_t j = 0; j < pieces; ++j) gemm_rows += PaddedRows(piece_rows(j));
      for (int64_t kb = 0; kb < p.k_blocks; ++kb) {
        const int64_t k0 = kb * p.base_k;
        const int64_t kr = kb == p.k_blocks - 1 ? p.last_k : p.base_k;
        for (int64_t j = 0; j < pieces; ++j) {
          char* a = slots.a_tile + j * p.base_m * kr * gemm_elem;
          const int64_t rows = piece_rows(j);
          for (int64_t i = 0; i < rows; ++i) {
            CopyARow(tables, q0 + j * p.base_m + i, k0, kr, a + i * kr * gemm_elem);
          }
          std::memset(a + rows * kr * gemm_elem, 0,
                      static_cast<size_t>((PaddedRows(rows) - rows) * kr * gemm_elem));
        }
        for (int64_t nb = nb0; nb < nb1; ++nb) {
          const void* b = PrepareWeights(g, nb, k0, kr, slots);
          if (p.b_from_kn || !(p.b_copied || p.b_kn_tile)) {  // the next block, fetched meanwhile
            const bool last_col = nb + 1 == nb1;
            if (!last_col || kb + 1 < p.k_blocks) {
              PrefetchWeights(g, last_col ? nb0 : nb + 1, last_col ? kb + 1 : kb,
                              gemm_rows * BlockCols(nb) * kr, slots);
            }
          }
          for (int64_t j = 0; j < pieces; ++j) {
            slots.gemm->Run(PaddedRows(piece_rows(j)), BlockCols(nb), kr, /*accumulate=*/kb > 0,
                            slots.a_tile + j * p.base_m * kr * gemm_elem, b,
                            slots.c_tile + (j * group_tiles + nb - nb0) * tile_elems);
          }
        }
      }
      char* y = TensorBase(out_);
      for (int64_t j = 0; j < pieces; ++j) {
        for (int64_t nb = nb0; nb < nb1; ++nb) {
          const float* c = slots.c_tile + (j * group_tiles + nb - nb0) * tile_elems;
          for (int64_t i = 0; i < piece_rows(j); ++i) {
            GroupedMatmulStoreRow(c + i * p.base_n,
                                  y + ((q0 + j * p.base_m + i) * s.n + nb * p.base_n) * out_elem,
                                  s.out_dtype, BlockCols(nb));
          }
        }
      }
    });
  }

  // Expert g's rows are cut into pieces of base_m rows from its first row (the last one shorter),
  // and each piece belongs to the row block holding its first row: a piece may run up to
  // base_m - 1 rows past its block, but no expert's rows are cut where blocks meet, so each
  // piece's GEMM reads its B block once for as many rows as it can (an expert of 136 rows cut
  // by a block boundary would read its weights twice, for 136 rows in all). The pieces whose
  // first row is in [r0, r1) (whole row blocks), expert by expert, ascending: for each expert
  // with any, visit(g, q0, q1), its rows [q0, q1) cut into pieces of base_m from q0 (where one
  // of its pieces starts), at most one piece for each row block; one piece for one row block.
  template <class Visit>
  void ForEachPieces(int64_t r0, int64_t r1, const int64_t* off, Visit visit) const {
    const GroupedMatmulPlan& p = plan_;
    const GroupedMatmulShape& s = p.shape;
    // Only the expert holding r0 starts before the range and may have pieces in it.
    for (int64_t g = std::upper_bound(off, off + s.g + 1, r0) - off - 1; g < s.g && off[g] < r1; ++g) {
      const int64_t behind = std::max<int64_t>(0, r0 - off[g]);
      const int64_t q0 = off[g] + (behind + p.base_m - 1) / p.base_m * p.base_m;
      if (q0 >= r1 || q0 >= off[g + 1]) continue;
      const int64_t last = q0 + (r1 - 1 - q0) / p.base_m * p.base_m;  // the last piece starting < r1
      visit(g, q0, std::min(last + p.base_m, off[g + 1]));
    }
  }

  void RunUnit(int64_t row_block, int64_t col_block, const Tables& tables,
               ThreadSlots& slots) const {
    const GroupedMatmulPlan& p = plan_;
    const GroupedMatmulShape& s = p.shape;
    const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
    const int64_t r0 = row_block * p.base_m;
    const int64_t r1 = std::min(s.m, r0 + p.base_m);
    const int64_t n0 = col_block * p.base_n;
    const int64_t cols = BlockCols(col_block);
    const int64_t* off = tables.group_offsets;
    // Copies x's row i to row `to` of the A tile.
    const auto copy_row = [&](int64_t i, int64_t to) {
      CopyARow(tables, i, 0, s.k, slots.a_tile + to * s.k * gemm_elem);
    };
    // A copied with units row block first: the A tile holds the rows of the block's pieces,
    // [r0, r_end), once for all the column blocks the thread runs in a row, then zeros for the
    // padded rows the last GEMM reads. (Column block first, each unit is a new row block: the
    // pieces are copied one at a time, a stage of a_stage_rows at a time, below.)
    const bool a_whole_block = p.a_copied && !p.column_block_first;
    if (a_whole_block && slots.a_block != row_block) {
      int64_t r_end = r0;
      ForEachPieces(r0, r1, off, [&](int64_t, int64_t, int64_t q1) { r_end = std::max(r_end, q1); });
      for (int64_t i = r0; i < r_end; ++i) copy_row(i, i - r0);
      std::memset(slots.a_tile + (r_end - r0) * s.k * gemm_elem, 0,
                  static_cast<size_t>(p.row_granule * s.k * gemm_elem));
      slots.a_block = row_block;
    }
    ForEachPieces(r0, r1, off, [&](int64_t g, int64_t s0, int64_t s1) {
      // B of (expert g, column block), prepared once for all the row blocks the thread runs in
      // a row.
      if (slots.b_expert != g || slots.b_col != col_block) {
        slots.b_ready = PrepareWeights(g, col_block, 0, s.k, slots);
        slots.b_expert = g;
        slots.b_col = col_block;
      }
      // A: x's rows in place, unless copied, or unless the piece's padded GEMM rows would run
      // past x's end (then the piece goes through the A tile, zero padded, too). A piece copied
      // by itself goes in stages of a_stage_rows: each stage copied, multiplied and stored
      // before the next, so it is still in L2 for its GEMM (float32 GEMMs, whose rows give the
      // same bits whatever the call's row count: kGroupedMatmulAStageBytes).
      const bool in_place = !a_whole_block && !p.a_copied && s0 + PaddedRows(s1 - s0) <= s.m;
      const int64_t stage = a_whole_block || in_place ? s1 - s0 : p.a_stage_rows;
      char* y = TensorBase(out_);
      const int64_t out_elem = ElementBytes(s.out_dtype);
      for (int64_t t0 = s0; t0 < s1; t0 += stage) {
        const int64_t t1 = std::min(s1, t0 + stage);
        const void* a = nullptr;
        if (a_whole_block) {
          a = slots.a_tile + (t0 - r0) * s.k * gemm_elem;
        } else if (in_place) {
          a = XRow(tables, t0);
        } else {
          for (int64_t i = t0; i < t1; ++i) copy_row(i, i - t0);
          std::memset(slots.a_tile + (t1 - t0) * s.k * gemm_elem, 0,
                      static_cast<size_t>((PaddedRows(t1 - t0) - (t1 - t0)) * s.k * gemm_elem));
          a = slots.a_tile;
        }
        slots.gemm->Run(PaddedRows(t1 - t0), cols, s.k, /*accumulate=*/false, a, slots.b_ready,
                        slots.c_tile);
        for (int64_t i = t0; i < t1; ++i) {
          GroupedMatmulStoreRow(slots.c_tile + (i - t0) * p.base_n, y + (i * s.n + n0) * out_elem,
                                s.out_dtype, cols);
        }
      }
    });
  }
};

// ---- GroupedMatmulWeightGrad --------------------------------------------------------------------
class GroupedMatmulWeightGradExecutor final : public GroupedMatmulExecutorBase {
 public:
  using GroupedMatmulExecutorBase::GroupedMatmulExecutorBase;

 private:
  void RunUnits(int64_t begin, int64_t end, const Tables& tables,
                ThreadSlots& slots) const override {
    const GroupedMatmulPlan& p = plan_;
    std::vector<const void*> rows(static_cast<size_t>(p.reduce + p.reduce_fold));
    const int64_t per_expert = p.KGroups() * p.NGroups();
    for (int64_t u = begin; u < end; ++u) {
      RunUnit(u / per_expert, u % per_expert / p.NGroups(), u % p.NGroups(), tables, slots, rows);
    }
  }

  // Expert g's tiles of K blocks [k_group * k_group_blocks, ...) x column blocks
  // [n_group * n_group_blocks, ...): C tile (kb, nb) of the group sits at
  // ((kb - first kb) * n_group_blocks + (nb - first nb)) * base_m * base_n in the thread's C tiles.
  void RunUnit(int64_t g, int64_t k_group, int64_t n_group, const Tables& tables,
               ThreadSlots& slots, std::vector<const void*>& rows) const {
    const GroupedMatmulPlan& p = plan_;
    const GroupedMatmulShape& s = p.shape;
    const int64_t elem = ElementBytes(s.dtype);
    const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
    const int64_t kb_begin = k_group * p.k_group_blocks;
    const int64_t kb_end = std::min(p.row_blocks, kb_begin + p.k_group_blocks);
    const int64_t nb_begin = ColumnGroup(n_group).first, nb_end = ColumnGroup(n_group).second;
    const int64_t k0 = kb_begin * p.base_m, k1 = std::min(s.k, kb_end * p.base_m);
    const int64_t n0 = nb_begin * p.base_n, n1 = std::min(s.n, nb_end * p.base_n);
    const int64_t tile_elems = p.base_m * p.base_n;
    // C tile (kb, nb): where out_direct, gradWeight's own block, rows of stride N.
    const auto tile = [&](int64_t kb, int64_t nb) {
      if (p.out_direct) {
        return reinterpret_cast<float*>(TensorBase(out_)) + (g * s.k + kb * p.base_m) * s.n +
               nb * p.base_n;
      }
      return slots.c_tile + ((kb - kb_begin) * p.n_group_blocks + (nb - nb_begin)) * tile_elems;
    };
    const auto k_rows = [&](int64_t kb) {
      return kb == p.row_blocks - 1 ? p.last_block_rows : p.base_m;
    };
    const int64_t begin = tables.group_offsets[g], end = tables.group_offsets[g + 1];
    if (begin == end && s.accumulate) return;  // nothing to add: gradWeightRef[g] keeps its bits
    if (begin == end && p.out_direct) {
      for (int64_t kk = k0; kk < k1; ++kk) {
        std::fill_n(reinterpret_cast<float*>(TensorBase(out_)) + (g * s.k + kk) * s.n + n0, n1 - n0,
                    0.0f);
      }
      return;
    }
    if (begin == end) {
      std::fill(slots.c_tile, slots.c_tile + (kb_end - kb_begin) * p.n_group_blocks * tile_elems,
                0.0f);
    }
    const char* dy = TensorBase(operand_);
    for (int64_t c0 = begin, chunk = 0; c0 < end; c0 += chunk) {
      chunk = GroupedMatmulChunkRows(end - c0, p.reduce, p.reduce_fold);
      const int64_t reduce = (chunk + p.reduce_granule - 1) / p.reduce_granule * p.reduce_granule;
      // The chunk's x columns [k0, k1) and gradY columns [n0, n1), transposed once for the group:
      // A = [k, row] (zero rows up to the last block's padding), B = [n, row], rows of `reduce`
      // (zeros past the chunk).
      for (int64_t r = 0; r < chunk; ++r) rows[r] = XRow(tables, c0 + r) + k0 * elem;
      GroupedMatmulTransposeRows(s.dtype, rows.data(), chunk, k1 - k0, slots.a_tile, reduce);
      const int64_t padded_end = (kb_end - 1 - kb_begin) * p.base_m + PaddedRows(k_rows(kb_end - 1));
      if (padded_end > k1 - k0) {
        std::memset(slots.a_tile + (k1 - k0) * reduce * gemm_elem, 0,
                    static_cast<size_t>((padded_end - (k1 - k0)) * reduce * gemm_elem));
      }
      // B = gradY(chunk)^T: packed straight from the chunk's rows when they need no zero
      // padding, else from a transposed, zero-padded copy. Either way each column block's B is prepared once for the
      // group's K blocks, into the same packed layout (the GEMM's bits do not depend on it).
      const bool b_from_kn = p.b_from_kn && chunk == reduce;
      if (!b_from_kn) {
        for (int64_t r = 0; r < chunk; ++r) rows[r] = dy + ((c0 + r) * s.n + n0) * elem;
        GroupedMatmulTransposeRows(s.dtype, rows.data(), chunk, n1 - n0, slots.b_tile, reduce);
      }
      // The last chunk's GEMMs leave gradWeight's final values (out_direct).
      slots.gemm->SetFinalC(p.out_direct && c0 + chunk == end);
      for (int64_t nb = nb_begin; nb < nb_end; ++nb) {
        const void* b =
            b_from_kn
                ? slots.gemm->PrepareBFromKN(BlockCols(nb), reduce, dy + (c0 * s.n + nb * p.base_n) * elem)
                : slots.gemm->PrepareB(BlockCols(nb), reduce,
                                       slots.b_tile + (nb - nb_begin) * p.base_n * reduce * gemm_elem);
        for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
          const char* a = slots.a_tile + (kb - kb_begin) * p.base_m * reduce * gemm_elem;
          slots.gemm->Run(PaddedRows(k_rows(kb)), BlockCols(nb), reduce,
                          /*accumulate=*/c0 > begin, a, b, tile(kb, nb));
        }
      }
    }
    // The group's tiles rounded into gradWeight, all after the last chunk, in gradWeight's
    // memory order: streamed (below) as runs across the tiles; otherwise (plain stores,
    // WeightGradAdd) a row of gradWeight across the group's column blocks at a time (with
    // streamed stores, row by row had beaten tile after tile: S3 bfloat16 41-42 -> 46-48% of
    // dense, session 17). (Each tile stored right after its last GEMM, while in cache, measured
    // slower on an AMX Xeon: S2 bfloat16 48-50 -> 38-41% of dense, float32 S2/S3 3 points,
    // docs/benchmarks.md, session 16.)
    if (p.out_direct) return;  // the GEMMs wrote gradWeight
    char* dw = TensorBase(out_);
    const int64_t out_elem = ElementBytes(s.out_dtype);
    if (p.stream_out) {  // never with accumulate
      // Streamed: one run for the group's whole block of gradWeight where its rows meet end to
      // end (the group spans N), else one a row, across the tiles (GroupedMatmulStreamTiles).
      // Tile by tile, a gradWeight 16 bytes past a page (malloc's, the benchmark's) began and
      // ended every piece in a partial line, written by plain stores, a read for ownership
      // each: AMX Xeon, two rounds, S3 bfloat16 48-49 -> 54-55% of dense, float32 67 -> 72,
      // S2 bfloat16 61-65 -> 65-71 (session 18).
      const bool whole = n0 == 0 && n1 == s.n;
      const GroupedMatmulTileRun run{whole ? k1 - k0 : 1, n1 - n0, p.base_m,
                                     p.n_group_blocks * tile_elems, p.base_n, p.base_n, tile_elems};
      for (int64_t r = 0; r < k1 - k0; r += run.rows) {
        GroupedMatmulStreamTiles(tile(kb_begin + r / p.base_m, nb_begin) + r % p.base_m * p.base_n, run,
                                 dw + ((g * s.k + k0 + r) * s.n + n0) * out_elem, s.out_dtype);
      }
      return;
    }
    for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
      for (int64_t kk = 0; kk < k_rows(kb); ++kk) {
        for (int64_t nb = nb_begin; nb < nb_end; ++nb) {
          const int64_t kk0 = kb * p.base_m, nn0 = nb * p.base_n;
          const float* sum = tile(kb, nb) + kk * p.base_n;
          char* row = dw + ((g * s.k + kk0 + kk) * s.n + nn0) * out_elem;
          if (s.accumulate) {
            GroupedMatmulAddRow(sum, row, s.out_dtype, BlockCols(nb));
          } else {
            GroupedMatmulStoreRow(sum, row, s.out_dtype, BlockCols(nb));
          }
        }
      }
    }
  }
};

// Phase 1 of both operators after the arguments were read.
template <class Executor>
gkStatus PlanGroupedMatmul(std::string_view api, const GroupedMatmulArgs& args,
                           uint64_t* workspace_size, gkOpExecutor** executor) {
  GroupedMatmulShape shape{};
  GK_RETURN_IF_ERROR(CheckGroupedMatmul(api, args, &shape));
  const MoeTileGemmShape gemm_shape = GroupedMatmulTileGemmShape(shape);
  auto gemm = MoeTileGemm::Create(gemm_shape);
  const GroupedMatmulPlan plan = MakeGroupedMatmulPlan(
      shape, GroupedMatmulMachineOf(*gemm, gemm_shape, ConfiguredThreads()));
  const gkTensor& operand = args.op == GroupedMatmulOp::kForward ? *args.weight : *args.grad_y;
  *executor = new Executor(plan, std::move(gemm), *args.x, operand, *args.group_list,
                           args.expanded_row_idx, *args.out);
  *workspace_size = plan.workspace_bytes;
  ClearRecentError();
  return GK_SUCCESS;
}

// Phase 1 of GroupedMatmulWeightGrad (accumulate false) and GroupedMatmulWeightGradAdd.
// The enum arguments arrive as their bits (EnumBits at the C boundary): a C caller may pass any
// int, and passing such a value on as the enum type would load it (undefined in C++; UBSan's
// enum check stopped the fuzzer there).
gkStatus PlanWeightGradCall(std::string_view api, bool accumulate, const gkTensor* x,
                            const gkTensor* grad_y, const gkTensor* group_list,
                            int32_t group_list_type, const gkTensor* expanded_row_idx,
                            int32_t row_idx_type, int64_t top_k, gkTensor* grad_weight,
                            uint64_t* workspace_size, gkOpExecutor** executor) {
  return GuardCApi(api, [&] {
    if (executor != nullptr) *executor = nullptr;
    GK_RETURN_IF_ERROR(CheckNotNull(api, workspace_size, "workspaceSize"));
    GK_RETURN_IF_ERROR(CheckNotNull(api, executor, "executor"));
    const GroupedMatmulArgs args{GroupedMatmulOp::kWeightGrad, x, nullptr, grad_y, group_list,
                                 group_list_type, false, expanded_row_idx,
                                 row_idx_type, top_k, grad_weight, accumulate};
    return PlanGroupedMatmul<GroupedMatmulWeightGradExecutor>(api, args, workspace_size,
                                                              executor);
  });
}

}  // namespace
}  // namespace gk

extern "C" gkStatus gkGroupedMatmulGetWorkspaceSize(
    const gkTensor* x, const gkTensor* weight, const gkTensor* groupList,
    gkGroupListType groupListType, bool transposeWeight, const gkTensor* expandedRowIdx,
    gkRowIdxType rowIdxType, int64_t topK, gkTensor* y, uint64_t* workspaceSize,
    gkOpExecutor** executor) {
  using namespace gk;
  return GuardCApi(kForward1, [&] {
    if (executor != nullptr) *executor = nullptr;
    GK_RETURN_IF_ERROR(CheckNotNull(kForward1, workspaceSize, "workspaceSize"));
    GK_RETURN_IF_ERROR(CheckNotNull(kForward1, executor, "executor"));
    const GroupedMatmulArgs args{GroupedMatmulOp::kForward, x, weight, nullptr, groupList,
                                 EnumBits(groupListType), transposeWeight, expandedRowIdx,
                                 EnumBits(rowIdxType), topK, y};
    return PlanGroupedMatmul<GroupedMatmulExecutor>(kForward1, args, workspaceSize, executor);
  });
}

extern "C" gkStatus gkGroupedMatmul(void* workspace, uint64_t workspaceSize,
                                    gkOpExecutor* executor, void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kForward2, [&] {
    return gk::RunExecutor(gk::kForward2, gk::kGroupedMatmulName, workspace, workspaceSize,
                           executor);
  });
}

extern "C" gkStatus gkGroupedMatmulWeightGradGetWorkspaceSize(
    const gkTensor* x, const gkTensor* gradY, const gkTensor* groupList,
    gkGroupListType groupListType, const gkTensor* expandedRowIdx, gkRowIdxType rowIdxType,
    int64_t topK, gkTensor* gradWeight, uint64_t* workspaceSize, gkOpExecutor** executor) {
  return gk::PlanWeightGradCall(gk::kWeightGrad1, /*accumulate=*/false, x, gradY, groupList,
                                gk::EnumBits(groupListType), expandedRowIdx,
                                gk::EnumBits(rowIdxType), topK, gradWeight, workspaceSize, executor);
}

extern "C" gkStatus gkGroupedMatmulWeightGradAddGetWorkspaceSize(
    const gkTensor* x, const gkTensor* gradY, const gkTensor* groupList,
    gkGroupListType groupListType, const gkTensor* expandedRowIdx, gkRowIdxType rowIdxType,
    int64_t topK, gkTensor* gradWeightRef, uint64_t* workspaceSize, gkOpExecutor** executor) {
  return gk::PlanWeightGradCall(gk::kWeightGradAdd1, /*accumulate=*/true, x, gradY, groupList,
                                gk::EnumBits(groupListType), expandedRowIdx,
                                gk::EnumBits(rowIdxType), topK, gradWeightRef, workspaceSize, executor);
}

extern "C" gkStatus gkGroupedMatmulWeightGrad(void* workspace, uint64_t workspaceSize,
                                              gkOpExecutor* executor, void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kWeightGrad2, [&] {
    return gk::RunExecutor(gk::kWeightGrad2, gk::kGroupedMatmulWeightGradName, workspace,
                           workspaceSize, executor);
  });
}

extern "C" gkStatus gkGroupedMatmulWeightGradAdd(void* workspace, uint64_t workspaceSize,
                                                 gkOpExecutor* executor, void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kWeightGradAdd2, [&] {
    return gk::RunExecutor(gk::kWeightGradAdd2, gk::kGroupedMatmulWeightGradAddName, workspace,
                           workspaceSize, executor);
  });
}
