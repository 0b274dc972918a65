// MoeInitRoutingGroupedMatmulGrad two-phase C API: phase 1 checks (index values included) and
// plans, phase 2 builds the routing tables in the workspace and runs the fused tiles.
#include <cstring>
#include <new>

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/error.h"
#include "core/executor.h"
#include "core/thread_pool.h"
#include "gradkit/moe_init_routing_grouped_matmul_grad.h"
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
  float* b_tiles;
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
      : plan_(plan), gemm_(std::move(gemm)), dy_(dy), w_(w), idx_(idx), groups_(groups), dx_(dx) {}

  std::string_view op_name() const override { return kMoeGradName; }
  uint64_t workspace_bytes() const override { return plan_.workspace_bytes; }

  gkStatus Run(void* workspace) const override {
    char* base = static_cast<char*>(AlignUp(workspace, kMoeGradAlignment));
    const MoeGradLayout& l = plan_.layout;
    const auto at = [&](const MoeGradRegion& r) { return r.bytes ? base + r.offset : nullptr; };
    const MoeGradWorkspace ws{reinterpret_cast<float*>(at(l.matmul_out_ring)), at(l.a_tiles),
           reinterpret_cast<float*>(at(l.b_tiles)), at(l.system),
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
  static char* Base(const gkTensor& t) {
    return static_cast<char*>(t.data) + t.offset * ElementBytes(t.dtype);
  }

  // Everything one thread owns in the workspace.
  struct ThreadSlots {
    float* ring;
    char* a_tile;
    float* b_tile;
    void* scratchpad;
    int64_t tiles_done;
  };

  void RunThread(int32_t t, const MoeGradWorkspace& ws) const {
    const GemmSequentialScope sequential;
    const MoeGradPlan& p = plan_;
    ThreadSlots slots{
        ws.ring + t * p.parall_num * p.base_m * p.base_n,
        ws.a_tiles + t * p.base_m * p.shape.n * ElementBytes(p.gemm_dtype),
        ws.b_tiles ? ws.b_tiles + t * p.base_n * p.shape.n : nullptr,
        ws.system ? ws.system + t * p.gemm_scratchpad_bytes : nullptr,
        0};
    for (int64_t unit = t; unit < p.units; unit += p.threads) RunUnit(unit, ws, slots);
  }

  // One unit: tokens [token_begin, token_end) x gradX columns [col0, col0 + cols).
  void RunUnit(int64_t unit, const MoeGradWorkspace& ws, ThreadSlots& slots) const {
    const MoeGradPlan& p = plan_;
    const MoeGradShape& s = p.shape;
    const int64_t chunk = unit / p.col_blocks, block = unit % p.col_blocks;
    const int64_t col0 = block * p.base_n;
    const int64_t cols = block == p.col_blocks - 1 ? p.last_block_cols : p.base_n;
    const int64_t token_begin = chunk * p.tokens_per_chunk;
    const int64_t token_end = std::min(s.batch, token_begin + p.tokens_per_chunk);
    float* dx = reinterpret_cast<float*>(Base(dx_));
    for (int64_t b = token_begin; b < token_end; ++b) {
      std::memset(dx + b * s.k + col0, 0, static_cast<size_t>(cols) * sizeof(float));
    }
    const int64_t elem = ElementBytes(s.dtype);
    for (int64_t g = 0; g < s.g; ++g) {
      int64_t begin, end;  // positions in the chunk's row list (or rows, with one chunk)
      if (p.token_chunks > 1) {
        begin = ws.chunk_starts[chunk * s.g + g];
        end = ws.chunk_starts[chunk * s.g + g + 1];
      } else {
        begin = ws.group_offsets[g];
        end = ws.group_offsets[g + 1];
      }
      if (begin == end) continue;  // an empty expert, or none of its rows in this chunk
      const void* weight_block = Base(w_) + (g * s.k + col0) * s.n * elem;
      if (s.dtype == DType::kF16) {
        MoeConvertF16ToF32(static_cast<const uint16_t*>(weight_block), slots.b_tile, cols * s.n);
        weight_block = slots.b_tile;
      }
      for (int64_t r0 = begin; r0 < end; r0 += p.base_m) {
        const int64_t rows = std::min(p.base_m, end - r0);
        RunTile(r0, rows, weight_block, col0, cols, ws, slots);
      }
    }
  }

  int64_t RowAt(const MoeGradWorkspace& ws, int64_t position) const {
    return plan_.token_chunks > 1 ? ws.chunk_rows[position] : position;
  }

  // One GEMM tile into the next ring slot, then its rows added into gradX while still hot.
  void RunTile(int64_t position, int64_t rows, const void* weight_block, int64_t col0,
               int64_t cols, const MoeGradWorkspace& ws, ThreadSlots& slots) const {
    const MoeGradPlan& p = plan_;
    const MoeGradShape& s = p.shape;
    const int64_t elem = ElementBytes(s.dtype);
    const int64_t padded_rows = (rows + p.row_granule - 1) / p.row_granule * p.row_granule;
    const int64_t first_row = RowAt(ws, position);
    const bool in_place = s.dtype != DType::kF16 && padded_rows == rows &&
                          RowAt(ws, position + rows - 1) - first_row == rows - 1;
    const void* a;
    if (in_place) {
      a = Base(dy_) + first_row * s.n * elem;  // consecutive rows of gradY, read where they are
    } else {
      const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
      for (int64_t r = 0; r < rows; ++r) {
        const char* source = Base(dy_) + RowAt(ws, position + r) * s.n * elem;
        char* target = slots.a_tile + r * s.n * gemm_elem;
        if (s.dtype == DType::kF16) {
          MoeConvertF16ToF32(reinterpret_cast<const uint16_t*>(source),
                             reinterpret_cast<float*>(target), s.n);
        } else {
          std::memcpy(target, source, static_cast<size_t>(s.n * elem));
        }
      }
      std::memset(slots.a_tile + rows * s.n * gemm_elem, 0,
                  static_cast<size_t>((padded_rows - rows) * s.n * gemm_elem));
      a = slots.a_tile;
    }
    float* tile = slots.ring + (slots.tiles_done++ % p.parall_num) * p.base_m * p.base_n;
    gemm_->Run(padded_rows, cols, a, weight_block, tile, slots.scratchpad);
    float* dx = reinterpret_cast<float*>(Base(dx_));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t token = ws.row_token[RowAt(ws, position + r)];
      MoeAddRowF32(dx + token * s.k + col0, tile + r * p.base_n, cols);
    }
  }

  MoeGradPlan plan_;
  std::unique_ptr<MoeTileGemm> gemm_;
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
    // A C caller may pass any int: read the enums' bits, not their values (loading an enum
    // outside its range is undefined in C++); the checks then name the bad value.
    int32_t row_idx_type, group_list_type;
    static_assert(sizeof row_idx_type == sizeof rowIdxType);
    static_assert(sizeof group_list_type == sizeof groupListType);
    std::memcpy(&row_idx_type, &rowIdxType, sizeof row_idx_type);
    std::memcpy(&group_list_type, &groupListType, sizeof group_list_type);
    const MoeGradArgs args{gradY, weight, expandedRowIdx, groupList, batch, topK, row_idx_type,
                           group_list_type, gradX};
    MoeGradShape shape{};
    GK_RETURN_IF_ERROR(CheckMoeGrad(kPhase1, args, &shape));
    auto gemm = MoeTileGemm::Create(MoeGradTileGemmShape(shape));
    const MoeGradMachine machine{ConfiguredThreads(), gemm->scratchpad_bytes(), gemm->name()};
    const MoeGradPlan plan = MakeMoeGradPlan(shape, machine);
    *executor = new MoeGradExecutor(plan, std::move(gemm), *gradY, *weight, *expandedRowIdx,
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
