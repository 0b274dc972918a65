// MoeInitRouting two-phase C API: phase 1 checks (expertIdx's values included) and plans;
// phase 2 builds the routing table in the workspace, then writes groupList, expandedRowIdx and
// the rows of expandedX (a copy of x's bytes: memcpy, or StreamCopy's non-temporal stores once
// the copy outgrows the last-level cache), unless the caller asked for the indices only
// (expandedX NULL).
#include <cstring>

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/cpu/stream_copy.h"
#include "core/cpu_info.h"
#include "core/error.h"
#include "core/executor.h"
#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "gradkit/moe_init_routing.h"
#include "ops/moe_init_routing/moe_init_routing_def.h"
#include "ops/moe_init_routing/moe_init_routing_plan.h"
#include "ops/moe_init_routing/moe_init_routing_table.h"

namespace gk {
namespace {

constexpr std::string_view kPhase1 = "gkMoeInitRoutingGetWorkspaceSize";
constexpr std::string_view kPhase2 = "gkMoeInitRouting";

void StoreIndex(const gkTensor& t, int64_t i, int64_t value) {
  if (t.dtype == DType::kI32) {
    reinterpret_cast<int32_t*>(TensorBase(t))[i] = static_cast<int32_t>(value);
  } else {
    reinterpret_cast<int64_t*>(TensorBase(t))[i] = value;
  }
}

class MoeInitRoutingExecutor final : public gkOpExecutor {
 public:
  MoeInitRoutingExecutor(const MoeInitRoutingPlan& plan, const gkTensor& x,
                         const gkTensor& expert_idx, const gkTensor& expanded_x,
                         const gkTensor& expanded_row_idx, const gkTensor& group_list)
      : plan_(plan), x_(x), experts_(expert_idx), ex_(expanded_x), idx_(expanded_row_idx),
        groups_(group_list) {}

  std::string_view op_name() const override { return kMoeInitRoutingName; }
  uint64_t workspace_bytes() const override { return plan_.workspace_bytes; }

  gkStatus Run(void* workspace) const override {
    char* base = static_cast<char*>(AlignUp(workspace, kMoeInitRoutingAlignment));
    const MoeInitRoutingShape& s = plan_.shape;
    MoeInitRoutingTable table{reinterpret_cast<int64_t*>(base + plan_.group_offsets_offset),
                              reinterpret_cast<int64_t*>(base + plan_.row_slot_offset),
                              reinterpret_cast<int64_t*>(base + plan_.cursor_offset)};
    // expertIdx may have changed since phase 1 (repeatable executors): checked again before
    // any output byte is written.
    GK_RETURN_IF_ERROR(BuildMoeInitRoutingTable(kPhase2, experts_, s, &table));
    const int64_t* offsets = table.group_offsets;
    int64_t* group_list = reinterpret_cast<int64_t*>(TensorBase(groups_));
    for (int64_t g = 0; g < s.g; ++g) {
      group_list[g] = s.group_list_type == GroupListType::kCumsum ? offsets[g + 1]
                                                                  : offsets[g + 1] - offsets[g];
    }
    if (s.row_idx_type == RowIdxType::kScatter) {
      for (int64_t p = 0; p < s.slots(); ++p) StoreIndex(idx_, p, -1);
      for (int64_t i = 0; i < table.m; ++i) StoreIndex(idx_, table.row_slot[i], i);
    }
    ParallelFor(plan_.threads, plan_.threads, [&](int64_t t) {
      for (int64_t unit = t; unit < plan_.units; unit += plan_.threads) CopyUnit(unit, table);
      if (plan_.streaming_stores) FlushStreamingStores();
    });
    return GK_SUCCESS;
  }

 private:
  // Rows [unit * rows_per_unit, ...) of expandedX (and of a gather expandedRowIdx): x's row of
  // the row's token, or zeros past M (and -1 for the index).
  void CopyUnit(int64_t unit, const MoeInitRoutingTable& table) const {
    const MoeInitRoutingShape& s = plan_.shape;
    const int64_t elem = ElementBytes(s.dtype);
    const auto row_bytes = static_cast<size_t>(s.h * elem);
    const int64_t begin = unit * plan_.rows_per_unit;
    const int64_t end = std::min(s.rows, begin + plan_.rows_per_unit);
    const char* x = TensorBase(x_);
    for (int64_t i = begin; i < end; ++i) {
      if (s.expand_x) {
        char* target = TensorBase(ex_) + i * s.h * elem;
        if (i < table.m) {
          const int64_t slot = table.row_slot[i];
          const char* source = x + slot / s.top_k * s.x_row_stride * elem;
          if (plan_.streaming_stores) {
            StreamCopy(target, source, row_bytes);
          } else {
            std::memcpy(target, source, row_bytes);
          }
        } else {
          std::memset(target, 0, row_bytes);
        }
      }
      if (s.row_idx_type == RowIdxType::kGather) {
        StoreIndex(idx_, i, i < table.m ? table.row_slot[i] : -1);
      }
    }
  }

  MoeInitRoutingPlan plan_;
  gkTensor x_, experts_, ex_, idx_, groups_;  // copies: the caller may release its descriptors
                                              // (ex_ is empty for index-only routing)
};

}  // namespace
}  // namespace gk

extern "C" gkStatus gkMoeInitRoutingGetWorkspaceSize(
    const gkTensor* x, const gkTensor* expertIdx, int64_t expertCapacity, int64_t expertNum,
    gkGroupListType groupListType, gkRowIdxType rowIdxType, gkTensor* expandedX,
    gkTensor* expandedRowIdx, gkTensor* groupList, uint64_t* workspaceSize,
    gkOpExecutor** executor) {
  using namespace gk;
  return GuardCApi(kPhase1, [&] {
    if (executor != nullptr) *executor = nullptr;
    GK_RETURN_IF_ERROR(CheckNotNull(kPhase1, workspaceSize, "workspaceSize"));
    GK_RETURN_IF_ERROR(CheckNotNull(kPhase1, executor, "executor"));
    const int32_t row_idx_type = EnumBits(rowIdxType), group_list_type = EnumBits(groupListType);
    const MoeInitRoutingArgs args{x,              expertIdx,      expertCapacity,
                                  expertNum,      group_list_type, row_idx_type,
                                  expandedX,      expandedRowIdx, groupList};
    MoeInitRoutingShape shape{};
    GK_RETURN_IF_ERROR(CheckMoeInitRouting(kPhase1, args, &shape));
    const MoeInitRoutingPlan plan = MakeMoeInitRoutingPlan(shape, ConfiguredThreads(), DetectCaches().llc_bytes);
    *executor = new MoeInitRoutingExecutor(plan, *x, *expertIdx,
                                           expandedX != nullptr ? *expandedX : gkTensor{},
                                           *expandedRowIdx, *groupList);
    *workspaceSize = plan.workspace_bytes;
    ClearRecentError();
    return GK_SUCCESS;
  });
}

extern "C" gkStatus gkMoeInitRouting(void* workspace, uint64_t workspaceSize,
                                     gkOpExecutor* executor, void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kPhase2, [&] {
    return gk::RunExecutor(gk::kPhase2, gk::kMoeInitRoutingName, workspace, workspaceSize,
                           executor);
  });
}
