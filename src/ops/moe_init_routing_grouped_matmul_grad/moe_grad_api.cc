// MoeInitRoutingGroupedMatmulGrad two-phase C API: phase 1 checks (index values included) and
// plans, phase 2 builds the routing tables in the workspace and runs the fused tiles.
#include <array>
#include <cstring>
#include <new>

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/error.h"
#include "core/executor.h"
#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "gradkit/moe_init_routing_grouped_matmul_grad.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16amx.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_f32bcast.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"

namespace gk {
namespace {

constexpr std::string_view kPhase1 = "gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize";
constexpr std::string_view kPhase2 = "gkMoeInitRoutingGroupedMatmulGrad";

// The workspace regions of a plan, resolved to pointers.
struct MoeGradWorkspace {
  float* ring;
  char* a_tiles;
  char* b_tiles;
  char* system;
  int64_t* group_offsets;
  int64_t* row_token;
  int64_t* chunk_starts;
  int64_t* chunk_rows;
};

class MoeGradExecutor final : public gkOpExecutor {
 public:
  MoeGradExecutor(const MoeGradPlan& plan, std::unique_ptr<MoeTileGemm> gemm, const gkTensor& dy,
                  const gkTensor& w, const gkTensor& idx, const gkTensor& groups,
                  const gkTensor& dx)
      : plan_(plan), gemm_(std::move(gemm)), dy_(dy), w_(w), idx_(idx), groups_(groups), dx_(dx) {
    // Decided here, in phase 1 (the GEMM may check its rows once, see rows_independent); with
    // one chunk the whole range is the chunk's anyway.
    if (plan_.token_chunks > 1 && plan_.WholeBlocks() && plan_.col_blocks > 0) {
      whole_base_ = gemm_->rows_independent(plan_.base_n);
      whole_last_ = gemm_->rows_independent(plan_.last_block_cols);
    }
    broadcast_on_amx_ = plan_.broadcast_max_rows > 0 && gemm_->broadcast_on_amx();
  }

  std::string_view op_name() const override { return kMoeGradName; }
  uint64_t workspace_bytes() const override { return plan_.workspace_bytes; }

  gkStatus Run(void* workspace) const override {
    char* base = static_cast<char*>(AlignUp(workspace, kMoeGradAlignment));
    const MoeGradLayout& l = plan_.layout;
    const auto at = [&](const MoeGradRegion& r) { return r.bytes ? base + r.offset : nullptr; };
    const MoeGradWorkspace ws{reinterpret_cast<float*>(at(l.matmul_out_ring)), at(l.a_tiles),
           at(l.b_tiles), at(l.system),
           reinterpret_cast<int64_t*>(at(l.group_offsets)),
           reinterpret_cast<int64_t*>(at(l.row_token)),
           reinterpret_cast<int64_t*>(at(l.chunk_starts)),
           reinterpret_cast<int64_t*>(at(l.chunk_rows))};
    // The index data may have changed since phase 1 (repeatable executors): the tables are
    // rebuilt with the same checks before any byte of gradX is written.
    const MoeGradShape& s = plan_.shape;
    GK_RETURN_IF_ERROR(BuildGroupOffsets(kPhase2, groups_, s, ws.group_offsets));
    GK_RETURN_IF_ERROR(BuildRowTokens(kPhase2, idx_, s, ws.row_token));
    if (s.row_idx_type == RowIdxType::kGather) {
      GK_RETURN_IF_ERROR(CheckDistinctSlots(kPhase2, idx_, s));
    }
    if (plan_.token_chunks > 1) {
      BuildChunkRows(ws.group_offsets, ws.row_token, s.g, plan_.token_chunks,
                     plan_.tokens_per_chunk, ws.chunk_starts, ws.chunk_rows);
    }
    ParallelFor(plan_.threads, plan_.threads,
                [&](int64_t t) { RunThread(static_cast<int32_t>(t), ws); });
    return GK_SUCCESS;
  }

 private:
  // A weight block to fetch (rows of row_bytes, stride apart) over the multiply-adds of the calls
  // before the next PrepareB (MoeTileGemm::Worker::PrefetchDuringRuns).
  struct NextWeights {
    const char* base = nullptr;
    int64_t rows = 0, row_bytes = 0, stride = 0, macs = 0;
  };

  // Everything one thread owns in the workspace.
  struct ThreadSlots {
    float* ring;
    char* a_tile;
    char* b_tile;  // null unless plan.b_copied
    MoeTileGemm::Worker* gemm;
    const void* b = nullptr;  // the current B as the GEMM takes it (Worker::PrepareB)
    NextWeights next_weights{};  // the thread's next step's weight block (RunThread)
    std::array<float*, kMoeGradBestBaseM> dx_rows{};  // a tile's rows of gradX (base_m <= this)
    const int64_t* row_map = nullptr;  // the current RowSet's (RunExpert)
    // Rows [begin, end) of gradY packed in a_tile as token panels (RunExpertBroadcast), until
    // something else is written there.
    int64_t tokens_begin = -1, tokens_end = -1;
  };

  // Rows one RunExpert call runs: expert g's are positions [starts[g], starts[g + 1]) of row_map
  // (a chunk's row list), or rows themselves where row_map is null.
  struct RowSet {
    const int64_t* starts;
    const int64_t* row_map;
  };

  void RunThread(int32_t t, const MoeGradWorkspace& ws) const {
    const GemmSequentialScope sequential;
    const MoeGradPlan& p = plan_;
    const auto worker =
        gemm_->MakeWorker(ws.system ? ws.system + t * p.gemm_scratchpad_bytes : nullptr);
    ThreadSlots slots{ws.ring + t * p.parall_num * p.base_m * p.base_n,
                      ws.a_tiles + t * p.a_tile_bytes,
                      ws.b_tiles ? ws.b_tiles + t * p.base_n * p.base_k * ElementBytes(p.gemm_dtype)
                                  : nullptr,
                      worker.get()};
    // The thread's units (round robin), all zeroed first, then run expert by expert: for each
    // of its column blocks the unit of every chunk in turn, so that the expert's weight block is
    // packed (float16: converted) once for all of them, and the expert's rows of gradY, read
    // once per column block, stay in cache from one block to the next (column blocks outermost
    // read every row of gradY again from memory for each block: S3 float32 81-85% of dense,
    // against 88% this way). Units own disjoint gradX elements and each still adds its terms in
    // ascending expert and row, so the interleaving changes no sum.
    const auto mine = [&](int64_t chunk, int64_t block) { return p.ThreadOfUnit(chunk, block) == t; };
    for (int64_t block = 0; block < p.col_blocks; ++block) {
      for (int64_t chunk = 0; chunk < p.token_chunks; ++chunk) {
        if (mine(chunk, block)) ZeroUnit(chunk, block);
      }
    }
    // Steps (expert g, column block) with rows of the thread's units, in order. Each names the
    // next step's weight block to the GEMM, fetched during its calls by a kernel that streams
    // (MoeTileGemmShape::streamed_b; elsewhere a no-op), so that packing finds it in cache.
    const auto rows_of = [&](int64_t g, int64_t block) {
      int64_t rows = 0;
      for (int64_t chunk = 0; chunk < p.token_chunks; ++chunk) {
        if (mine(chunk, block)) rows += ChunkRows(ws, chunk, g);
      }
      return rows;
    };
    const auto next_step = [&](int64_t& g, int64_t& block) {
      do {
        if (++block == p.col_blocks) block = 0, ++g;
      } while (g < p.shape.g && rows_of(g, block) == 0);
    };
    if (p.col_blocks == 0) return;
    int64_t g = 0, block = -1;
    next_step(g, block);
    while (g < p.shape.g) {
      int64_t next_g = g, next_block = block;
      next_step(next_g, next_block);
      const int64_t macs_per_reduce = rows_of(g, block) * BlockCols(block);
      slots.next_weights = next_g < p.shape.g ? NextWeightsOf(next_g, next_block, macs_per_reduce)
                                              : NextWeights{};
      bool b_ready = false;
      // Where the thread owns the block's unit of every chunk (MoeGradPlan::WholeBlocks), expert
      // g's rows of all of them run as one range, the expert's own rows of gradY in order,
      // instead of chunk by chunk: fewer and taller GEMM calls (S2, 2 threads: one call of about
      // 256 rows instead of 8 of about 32). One-process harness, random routing, 2 threads,
      // Zen 5, median of per-round ratios: float32 S1 1.06, S2 1.11, S3 1.01, S4 1.04;
      // bfloat16 1.07, 1.04, 1.00, 1.02. Each gradX element still takes its terms in ascending
      // expert and row (its token's rows are all in one chunk); the grouping of rows into calls
      // now depends on the thread count, so only on a GEMM whose rows get the same bits in any
      // grouping (MoeTileGemm::rows_independent: gradkit's kernels; oneDNN's brgemm where a
      // check found it so; not gemm:jit, which a narrow last column block may run on).
      if (block == p.col_blocks - 1 ? whole_last_ : whole_base_) {
        RunExpert({ws.group_offsets, nullptr}, block, g, b_ready, ws, slots);
      } else {
        for (int64_t chunk = 0; chunk < p.token_chunks; ++chunk) {
          if (mine(chunk, block)) {
            RunExpert({ChunkStarts(ws, chunk), ws.chunk_rows}, block, g, b_ready, ws, slots);
          }
        }
      }
      g = next_g, block = next_block;
    }
  }

  // A chunk's row list by expert: expert g's rows are positions [starts[g], starts[g + 1]) of it
  // (rows themselves, with one chunk).
  const int64_t* ChunkStarts(const MoeGradWorkspace& ws, int64_t chunk) const {
    return plan_.token_chunks > 1 ? ws.chunk_starts + chunk * plan_.shape.g : ws.group_offsets;
  }
  int64_t ChunkRows(const MoeGradWorkspace& ws, int64_t chunk, int64_t g) const {
    const int64_t* starts = ChunkStarts(ws, chunk);
    return starts[g + 1] - starts[g];
  }

  // Column `block * base_n` of expert g: that row of its [K, N] matrix, or that column of its
  // [N, K] one.
  const char* WeightBlock(int64_t g, int64_t block) const {
    const MoeGradShape& s = plan_.shape;
    const int64_t col0 = block * plan_.base_n;
    return TensorBase(w_) +
           (s.weight_nk ? g * s.k * s.n + col0 : (g * s.k + col0) * s.n) * ElementBytes(s.dtype);
  }

  // (expert g, column block)'s weights as rows to fetch: macs_per_reduce = rows x columns of the
  // calls to spread their fetch over.
  NextWeights NextWeightsOf(int64_t g, int64_t block, int64_t macs_per_reduce) const {
    const MoeGradShape& s = plan_.shape;
    const int64_t elem = ElementBytes(s.dtype);
    const int64_t cols = BlockCols(block);
    const int64_t macs = macs_per_reduce * s.n;
    if (s.weight_nk) {  // [N, K]: N rows, the block's columns of each
      return {WeightBlock(g, block), s.n, cols * elem, s.k * elem, macs};
    }
    return {WeightBlock(g, block), cols, s.n * elem, s.n * elem, macs};
  }

  int64_t BlockCols(int64_t block) const {
    return block == plan_.col_blocks - 1 ? plan_.last_block_cols : plan_.base_n;
  }

  void ZeroUnit(int64_t chunk, int64_t block) const {
    const MoeGradPlan& p = plan_;
    const int64_t token_begin = chunk * p.tokens_per_chunk;
    const int64_t token_end = std::min(p.shape.batch, token_begin + p.tokens_per_chunk);
    float* dx = reinterpret_cast<float*>(TensorBase(dx_));
    for (int64_t b = token_begin; b < token_end; ++b) {
      std::memset(dx + b * p.shape.k + block * p.base_n, 0,
                  static_cast<size_t>(BlockCols(block)) * sizeof(float));
    }
  }

  // Expert g's share of one unit, or of all of a block's units (RowSet): its rows x the block's
  // gradX columns.
  // b_ready: slots.b holds (block, g)'s weights as the GEMM takes them (one k-block only).
  void RunExpert(const RowSet& set, int64_t block, int64_t g, bool& b_ready,
                 const MoeGradWorkspace& ws, ThreadSlots& slots) const {
    const MoeGradPlan& p = plan_;
    const MoeGradShape& s = p.shape;
    const int64_t col0 = block * p.base_n;
    const int64_t cols = BlockCols(block);
    const int64_t elem = ElementBytes(s.dtype);
    const int64_t group_rows = p.parall_num * p.base_m;
    const int64_t* starts = set.starts;
    slots.row_map = set.row_map;
    const int64_t begin = starts[g], end = starts[g + 1];
    if (set.row_map == nullptr && end - begin <= p.broadcast_max_rows) {
      RunExpertBroadcast(begin, end, block, g, ws, slots);
      return;
    }
    const char* weight_block = WeightBlock(g, block);
    // Up to parall_num tiles at a time: each k-block of the weights is copied (float16:
    // converted; [N, K] storage: transposed) once for all of them, and their sums stay in the
    // ring until the last k-block.
    for (int64_t g0 = begin; g0 < end; g0 += group_rows) {
      const int64_t g1 = std::min(end, g0 + group_rows);
      for (int64_t kb = 0; kb < p.k_blocks; ++kb) {
        const int64_t k0 = kb * p.base_k;
        const int64_t reduce = kb == p.k_blocks - 1 ? p.last_k : p.base_k;
        // With one k-block, (block, g)'s B stays ready (copied, packed) for all its chunks.
        if (!(b_ready && p.k_blocks == 1)) {
          if (slots.b_tile != nullptr) {
            CopyWeightBlock(weight_block, k0, reduce, cols, slots.b_tile);
            slots.b = slots.gemm->PrepareB(cols, reduce, slots.b_tile);
          } else if (p.gemm_any_stride) {  // packed from the weights in place, either layout
            slots.b = s.weight_nk
                          ? slots.gemm->PrepareBStrided(cols, reduce, weight_block + k0 * s.k * elem,
                                                        s.k, /*kn=*/true)
                          : slots.gemm->PrepareBStrided(cols, reduce, weight_block + k0 * elem,
                                                        s.n, /*kn=*/false);
          } else {
            slots.b = slots.gemm->PrepareB(cols, reduce, weight_block + k0 * elem);
          }
          b_ready = true;
          const NextWeights& next = slots.next_weights;
          if (p.k_blocks == 1 && next.base != nullptr) {
            slots.gemm->PrefetchDuringRuns(next.base, next.rows, next.row_bytes, next.stride,
                                           next.macs);
          }
        }
        int64_t slot = 0;
        for (int64_t r0 = g0; r0 < g1; r0 += p.base_m, ++slot) {
          RunTile(r0, std::min(p.base_m, g1 - r0), k0, reduce, kb > 0, slots.b, cols,
                  slots.ring + slot * p.base_m * p.base_n, ws, slots);
        }
      }
      int64_t slot = 0;
      for (int64_t r0 = g0; r0 < g1; r0 += p.base_m, ++slot) {
        AddTileIntoGradX(r0, std::min(p.base_m, g1 - r0), col0, cols,
                         slots.ring + slot * p.base_m * p.base_n, ws, slots);
      }
    }
  }

  // A tile of `rows` rows from position r0 (its ring slot) added into their tokens' gradX rows,
  // columns [col0, col0 + cols).
  void AddTileIntoGradX(int64_t r0, int64_t rows, int64_t col0, int64_t cols, const float* tile,
                        const MoeGradWorkspace& ws, ThreadSlots& slots) const {
    float* dx = reinterpret_cast<float*>(TensorBase(dx_));
    const int64_t k = plan_.shape.k;
    for (int64_t r = 0; r < rows; ++r) {
      slots.dx_rows[r] = dx + ws.row_token[RowAt(slots, r0 + r)] * k + col0;
    }
    MoeAddRowsF32(slots.dx_rows.data(), tile, plan_.base_n, rows, cols);
  }

  // Expert g's rows [begin, end) of gradY (consecutive, at most plan.broadcast_max_rows) x the
  // block's columns in the weights-broadcast form (MoeGradBroadcastRows): the rows packed into
  // token panels in the A tile once for all of the expert's blocks on this thread, each block's
  // weights read in place, C transposed in the ring's second slot and turned into the first
  // slot's tile, then added into gradX as RunExpert's tiles are. The same bits as RunExpert's
  // form (MoeBf16DotGemmBroadcastB, MoeF32GemmBroadcastB, MoeBf16AmxGemmBroadcastB where the
  // GEMM's check found it so); the next step's weight rows are fetched meanwhile.
  void RunExpertBroadcast(int64_t begin, int64_t end, int64_t block, int64_t g,
                          const MoeGradWorkspace& ws, ThreadSlots& slots) const {
    const MoeGradPlan& p = plan_;
    const MoeGradShape& s = p.shape;
    const int64_t rows = end - begin, cols = BlockCols(block);
    if (rows == 0) return;
    const bool f32 = s.dtype == DType::kF32;
    const char* dy_rows = TensorBase(dy_) + begin * s.n * ElementBytes(s.dtype);
    if (slots.tokens_begin != begin || slots.tokens_end != end) {
      if (f32) {
        MoeF32PackTokens(rows, s.n, reinterpret_cast<const float*>(dy_rows), s.n,
                         reinterpret_cast<float*>(slots.a_tile));
      } else {
        MoeBf16DotPackTokens(rows, s.n, dy_rows, s.n, slots.a_tile);
      }
      slots.tokens_begin = begin, slots.tokens_end = end;
    }
    float* tile = slots.ring;
    float* transposed = slots.ring + p.base_m * p.base_n;
    const NextWeights& next = slots.next_weights;
    if (f32) {
      MoeF32GemmBroadcastB(rows, cols, s.n, reinterpret_cast<const float*>(slots.a_tile),
                           reinterpret_cast<const float*>(WeightBlock(g, block)), s.n, tile, p.base_n,
                           transposed, reinterpret_cast<const float*>(next.base), next.rows);
    } else if (broadcast_on_amx_) {
      // In calls of whole token groups of the panels (past base_m rows an expert), each added
      // into gradX before the next: the ring's slots hold one call's C and its transpose.
      const int64_t call_rows = MoeGradBroadcastCallRows(p.base_m);
      for (int64_t r0 = 0; r0 < rows; r0 += call_rows) {
        const int64_t n_rows = std::min(call_rows, rows - r0);
        const bool last = r0 + n_rows == rows;
        MoeBf16AmxGemmBroadcastB(n_rows, cols, s.n, slots.a_tile + r0 * s.n * 2, WeightBlock(g, block), s.n,
                                 tile, p.base_n, transposed, last ? next.base : nullptr, last ? next.rows : 0);
        AddTileIntoGradX(begin + r0, n_rows, block * p.base_n, cols, tile, ws, slots);
      }
      return;
    } else {
      MoeBf16DotGemmBroadcastB(rows, cols, s.n, slots.a_tile, WeightBlock(g, block), s.n, tile,
                               p.base_n, transposed, next.base, next.rows);
    }
    AddTileIntoGradX(begin, rows, block * p.base_n, cols, tile, ws, slots);
  }

  // k-block [k0, k0 + reduce) of the weight block's `cols` columns into the B tile, dense
  // [cols, base_k] in the GEMM dtype: float16 converted, [N, K] storage transposed.
  void CopyWeightBlock(const char* weight_block, int64_t k0, int64_t reduce, int64_t cols,
                       char* b_tile) const {
    const MoeGradPlan& p = plan_;
    const MoeGradShape& s = p.shape;
    const int64_t elem = ElementBytes(s.dtype);
    if (s.weight_nk) {
      MoeTransposeWeightBlock(s.dtype, weight_block + k0 * s.k * elem, s.k, reduce, cols, b_tile,
                              p.base_k);
      return;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const char* source = weight_block + (c * s.n + k0) * elem;
      if (s.dtype == DType::kF16) {
        MoeConvertF16ToF32(reinterpret_cast<const uint16_t*>(source),
                           reinterpret_cast<float*>(b_tile) + c * p.base_k, reduce);
      } else {
        std::memcpy(b_tile + c * p.base_k * elem, source, static_cast<size_t>(reduce * elem));
      }
    }
  }

  int64_t RowAt(const ThreadSlots& slots, int64_t position) const {
    return slots.row_map != nullptr ? slots.row_map[position] : position;
  }

  // One GEMM of a tile's k-block into its ring slot (the first k-block writes, the rest add).
  void RunTile(int64_t position, int64_t rows, int64_t k0, int64_t reduce, bool accumulate,
               const void* b, int64_t cols, float* tile, const MoeGradWorkspace& ws,
               ThreadSlots& slots) const {
    const MoeGradPlan& p = plan_;
    const MoeGradShape& s = p.shape;
    const int64_t elem = ElementBytes(s.dtype);
    const int64_t padded_rows = (rows + p.row_granule - 1) / p.row_granule * p.row_granule;
    const int64_t first_row = RowAt(slots, position);
    // Consecutive rows of gradY are read where they are, unless float16 (converted) or the
    // reduction is cut into k-blocks and the GEMM takes a dense A only (see moe_grad_gemm.h).
    // A tail tile's padding rows are then gradY's next rows where gradY has them: their sums
    // land in the ring's padding rows, which are never added into gradX, and each row of a GEMM
    // depends on its own A row only, so the rows used get the same bits as with zero padding.
    const bool in_place = s.dtype != DType::kF16 && (p.k_blocks == 1 || p.gemm_any_stride) &&
                          first_row + padded_rows <= s.m &&
                          RowAt(slots, position + rows - 1) - first_row == rows - 1;
    const void* a;
    if (in_place) {
      a = TensorBase(dy_) + (first_row * s.n + k0) * elem;
    } else {
      const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
      slots.tokens_begin = slots.tokens_end = -1;  // the token panels there are overwritten
      for (int64_t r = 0; r < rows; ++r) {
        const char* source = TensorBase(dy_) + (RowAt(slots, position + r) * s.n + k0) * elem;
        char* target = slots.a_tile + r * p.base_k * gemm_elem;
        if (s.dtype == DType::kF16) {
          MoeConvertF16ToF32(reinterpret_cast<const uint16_t*>(source),
                             reinterpret_cast<float*>(target), reduce);
        } else {
          std::memcpy(target, source, static_cast<size_t>(reduce * elem));
        }
      }
      for (int64_t r = rows; r < padded_rows; ++r) {
        std::memset(slots.a_tile + r * p.base_k * gemm_elem, 0,
                    static_cast<size_t>(reduce * gemm_elem));
      }
      a = slots.a_tile;
    }
    if (p.gemm_any_stride) {
      slots.gemm->RunStrided(padded_rows, cols, reduce, accumulate, a, in_place ? s.n : p.base_k,
                             b, tile);
    } else {
      slots.gemm->Run(padded_rows, cols, reduce, accumulate, a, b, tile);
    }
  }

  MoeGradPlan plan_;
  std::unique_ptr<MoeTileGemm> gemm_;
  // Whether a step runs the expert's rows of all chunks as one range (RunThread): for the
  // column blocks of base_n columns, and for the last one.
  bool whole_base_ = false, whole_last_ = false;
  bool broadcast_on_amx_ = false;  // bfloat16's weights-broadcast form on AMX tiles (phase 1)
  gkTensor dy_, w_, idx_, groups_, dx_;  // copies: the caller may release its descriptors
};

}  // namespace
}  // namespace gk

extern "C" gkStatus gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
    const gkTensor* gradY, const gkTensor* weight, const gkTensor* expandedRowIdx,
    const gkTensor* groupList, int64_t batch, int64_t topK, gkRowIdxType rowIdxType,
    gkGroupListType groupListType, gkTensor* gradX, uint64_t* workspaceSize,
    gkOpExecutor** executor) {
  using namespace gk;
  return GuardCApi(kPhase1, [&] {
    if (executor != nullptr) *executor = nullptr;
    GK_RETURN_IF_ERROR(CheckNotNull(kPhase1, workspaceSize, "workspaceSize"));
    GK_RETURN_IF_ERROR(CheckNotNull(kPhase1, executor, "executor"));
    const int32_t row_idx_type = EnumBits(rowIdxType), group_list_type = EnumBits(groupListType);
    const MoeGradArgs args{gradY, weight, expandedRowIdx, groupList, batch, topK, row_idx_type,
                           group_list_type, gradX};
    MoeGradShape shape{};
    GK_RETURN_IF_ERROR(CheckMoeGrad(kPhase1, args, &shape));
    MoeGradGemm made = CreateMoeGradGemm(shape);
    const MoeGradPlan plan = MakeMoeGradPlan(shape, MoeGradMachineOf(*made.gemm, made.shape));
    *executor = new MoeGradExecutor(plan, std::move(made.gemm), *gradY, *weight, *expandedRowIdx,
                                    *groupList, *gradX);
    *workspaceSize = plan.workspace_bytes;
    ClearRecentError();
    return GK_SUCCESS;
  });
}

extern "C" gkStatus gkMoeInitRoutingGroupedMatmulGrad(void* workspace, uint64_t workspaceSize,
                                                      gkOpExecutor* executor, void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kPhase2, [&] {
    return gk::RunExecutor(gk::kPhase2, gk::kMoeGradName, workspace, workspaceSize, executor);
  });
}
