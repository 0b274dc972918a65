// MoeFinalizeRouting and MoeFinalizeRoutingGrad two-phase C API: phase 1 checks (the values of
// expandedRowIdx included) and plans; phase 2 rebuilds the slot -> row table in the workspace,
// then runs the tokens' units.
#include <algorithm>

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/cpu/stream_copy.h"
#include "core/cpu_info.h"
#include "core/error.h"
#include "core/executor.h"
#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "gradkit/moe_finalize_routing.h"
#include "ops/moe_finalize_routing/cpu/moe_finalize_routing_kernels.h"
#include "ops/moe_finalize_routing/moe_finalize_routing_def.h"
#include "ops/moe_finalize_routing/moe_finalize_routing_plan.h"

namespace gk {
namespace {

constexpr std::string_view kForward1 = "gkMoeFinalizeRoutingGetWorkspaceSize";
constexpr std::string_view kForward2 = "gkMoeFinalizeRouting";
constexpr std::string_view kBackward1 = "gkMoeFinalizeRoutingGradGetWorkspaceSize";
constexpr std::string_view kBackward2 = "gkMoeFinalizeRoutingGrad";

// Both ops: the tensors, the plan, the table and the per-thread rows; Token() is the op.
class MoeFinalizeExecutor final : public gkOpExecutor {
 public:
  MoeFinalizeExecutor(const MoeFinalizePlan& plan, const MoeFinalizeArgs& a)
      : plan_(plan), y_(*a.expanded_y), probs_(*a.probs), idx_(*a.expanded_row_idx) {
    if (plan.shape.backward) {
      grad_out_ = *a.grad_out;
      grad_y_ = *a.grad_expanded_y;
      grad_probs_ = *a.grad_probs;
    } else {
      out_ = *a.out;
    }
  }

  std::string_view op_name() const override {
    return plan_.shape.backward ? kMoeFinalizeRoutingGradName : kMoeFinalizeRoutingName;
  }
  uint64_t workspace_bytes() const override { return plan_.workspace_bytes; }

  gkStatus Run(void* workspace) const override {
    char* base = static_cast<char*>(AlignUp(workspace, kMoeFinalizeAlignment));
    const auto* slot_row = reinterpret_cast<int64_t*>(base + plan_.slot_row_offset);
    // expandedRowIdx may have changed since phase 1 (repeatable executors): checked again
    // before any output byte is written.
    GK_RETURN_IF_ERROR(BuildMoeFinalizeSlotRows(
        plan_.shape.backward ? kBackward2 : kForward2, idx_, plan_.shape,
        reinterpret_cast<int64_t*>(base + plan_.slot_row_offset),
        reinterpret_cast<int64_t*>(base + plan_.row_token_offset)));
    ParallelFor(plan_.threads, plan_.threads, [&](int64_t t) {
      auto* acc_row = reinterpret_cast<float*>(base + plan_.thread_rows_offset +
                                               static_cast<uint64_t>(t) * plan_.thread_row_bytes);
      for (int64_t unit = t; unit < plan_.units; unit += plan_.threads) {
        const int64_t begin = unit * plan_.tokens_per_unit;
        const int64_t end = std::min(plan_.shape.batch, begin + plan_.tokens_per_unit);
        for (int64_t b = begin; b < end; ++b) {
          if (plan_.shape.backward) {
            BackwardToken(b, end, slot_row);
          } else {
            ForwardToken(b, end, slot_row, acc_row);
          }
        }
      }
      if (plan_.streaming_stores) FlushStreamingStores();
    });
    return GK_SUCCESS;
  }

 private:
  char* Row(const gkTensor& t, int64_t row) const {
    return TensorBase(t) + row * plan_.shape.n * ElementBytes(t.dtype);
  }
  float Prob(int64_t slot) const { return LoadAsF32(TensorBase(probs_), slot, probs_.dtype); }

  // The expandedY rows of the first `most` kept slots in [p, p_end): what a kernel call
  // prefetches for the next one. Returns how many.
  int64_t KeptRows(int64_t p, int64_t p_end, const int64_t* slot_row, const void** rows,
                   int64_t most) const {
    int64_t count = 0;
    for (; p < p_end && count < most; ++p) {
      if (slot_row[p] >= 0) rows[count++] = Row(y_, slot_row[p]);
    }
    return count;
  }

  // out[b] = sum over j of probs[b, j] * expandedY[row(b * topK + j)], ascending j: the kept
  // slots in calls of up to kMoeFinalizeForwardSlots, the partial sums between calls in acc_row.
  // The next token's rows (of this unit) are prefetched during the last call.
  void ForwardToken(int64_t b, int64_t end, const int64_t* slot_row, float* acc_row) const {
    const MoeFinalizeShape& s = plan_.shape;
    const void* rows[kMoeFinalizeForwardSlots];
    float probs[kMoeFinalizeForwardSlots];
    const void* next[kMoeFinalizeForwardSlots];
    MoeFinalizeSumArgs args{s.dtype, rows, probs, 0, s.n, nullptr, acc_row, s.token_dtype, nullptr};
    args.stream = plan_.streaming_stores;
    for (int64_t p = b * s.top_k; p < (b + 1) * s.top_k; ++p) {
      const int64_t row = slot_row[p];
      if (row < 0) continue;  // dropped
      if (args.count == kMoeFinalizeForwardSlots) {
        MoeFinalizeWeightedSum(args);
        args.acc_in = acc_row;
        args.count = 0;
      }
      rows[args.count] = Row(y_, row);
      probs[args.count] = Prob(p);
      ++args.count;
    }
    args.out = Row(out_, b);
    if (b + 1 < end) {
      args.next_rows = next;
      args.next_count = KeptRows((b + 1) * s.top_k, (b + 2) * s.top_k, slot_row, next,
                                 kMoeFinalizeForwardSlots);
    }
    MoeFinalizeWeightedSum(args);
  }

  // gradProbs[b, j] = gradOut[b] . expandedY[row]; gradExpandedY[row] = probs[b, j] * gradOut[b]:
  // the kept slots in calls of up to kMoeFinalizeBackwardSlots; dropped slots get 0.
  // Each call prefetches the rows of the next kept slots of the unit (and the next token's
  // gradOut row when they reach into it).
  void BackwardToken(int64_t b, int64_t end, const int64_t* slot_row) const {
    const MoeFinalizeShape& s = plan_.shape;
    const void* y_rows[kMoeFinalizeBackwardSlots];
    void* grad_y_rows[kMoeFinalizeBackwardSlots];
    float probs[kMoeFinalizeBackwardSlots], grad_probs[kMoeFinalizeBackwardSlots];
    int64_t slots[kMoeFinalizeBackwardSlots];
    const void* next[kMoeFinalizeBackwardSlots];
    MoeFinalizeGradArgs args{s.token_dtype, Row(grad_out_, b), s.dtype, y_rows, probs, 0, s.n,
                             s.grad_y_dtype, grad_y_rows, grad_probs};
    args.next_rows = next;
    args.stream = plan_.streaming_stores;
    const int64_t slot_end = end * s.top_k;
    const auto flush = [&] {
      const int64_t after = slots[args.count - 1] + 1;
      args.next_count = KeptRows(after, slot_end, slot_row, next, kMoeFinalizeBackwardSlots);
      // The next call is the next token's when no kept slot of this one is left.
      bool token_done = true;
      for (int64_t p = after; p < (b + 1) * s.top_k; ++p) token_done = token_done && slot_row[p] < 0;
      args.next_grad_out = token_done && b + 1 < end ? Row(grad_out_, b + 1) : nullptr;
      MoeFinalizeGradSlots(args);
      for (int64_t i = 0; i < args.count; ++i) {
        StoreFromF32(TensorBase(grad_probs_), slots[i], s.grad_probs_dtype, grad_probs[i]);
      }
      args.count = 0;
    };
    for (int64_t p = b * s.top_k; p < (b + 1) * s.top_k; ++p) {
      const int64_t row = slot_row[p];
      if (row < 0) {
        StoreFromF32(TensorBase(grad_probs_), p, s.grad_probs_dtype, 0.0f);
        continue;
      }
      slots[args.count] = p;
      y_rows[args.count] = Row(y_, row);
      grad_y_rows[args.count] = Row(grad_y_, row);
      probs[args.count] = Prob(p);
      if (++args.count == kMoeFinalizeBackwardSlots) flush();
    }
    if (args.count > 0) flush();
  }

  MoeFinalizePlan plan_;
  gkTensor y_, probs_, idx_;  // copies: the caller may release its descriptors
  gkTensor out_{}, grad_out_{}, grad_y_{}, grad_probs_{};
};

gkStatus Plan(std::string_view api, const MoeFinalizeArgs& args, uint64_t* workspace_size,
              gkOpExecutor** executor) {
  if (executor != nullptr) *executor = nullptr;
  GK_RETURN_IF_ERROR(CheckNotNull(api, workspace_size, "workspaceSize"));
  GK_RETURN_IF_ERROR(CheckNotNull(api, executor, "executor"));
  MoeFinalizeShape shape{};
  GK_RETURN_IF_ERROR(CheckMoeFinalize(api, args, &shape));
  const MoeFinalizePlan plan =
      MakeMoeFinalizePlan(shape, ConfiguredThreads(), DetectCaches().llc_bytes);
  *executor = new MoeFinalizeExecutor(plan, args);
  *workspace_size = plan.workspace_bytes;
  ClearRecentError();
  return GK_SUCCESS;
}


}  // namespace
}  // namespace gk

extern "C" gkStatus gkMoeFinalizeRoutingGetWorkspaceSize(const gkTensor* expandedY,
                                                         const gkTensor* probs,
                                                         const gkTensor* expandedRowIdx,
                                                         gkRowIdxType rowIdxType, gkTensor* out,
                                                         uint64_t* workspaceSize,
                                                         gkOpExecutor** executor) {
  using namespace gk;
  return GuardCApi(kForward1, [&] {
    const MoeFinalizeArgs args{false,   nullptr, expandedY, probs, expandedRowIdx,
                               EnumBits(rowIdxType), out, nullptr, nullptr};
    return Plan(kForward1, args, workspaceSize, executor);
  });
}

extern "C" gkStatus gkMoeFinalizeRouting(void* workspace, uint64_t workspaceSize,
                                         gkOpExecutor* executor, void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kForward2, [&] {
    return gk::RunExecutor(gk::kForward2, gk::kMoeFinalizeRoutingName, workspace, workspaceSize,
                           executor);
  });
}

extern "C" gkStatus gkMoeFinalizeRoutingGradGetWorkspaceSize(
    const gkTensor* gradOut, const gkTensor* expandedY, const gkTensor* probs,
    const gkTensor* expandedRowIdx, gkRowIdxType rowIdxType, gkTensor* gradExpandedY,
    gkTensor* gradProbs, uint64_t* workspaceSize, gkOpExecutor** executor) {
  using namespace gk;
  return GuardCApi(kBackward1, [&] {
    const MoeFinalizeArgs args{true,          gradOut,   expandedY,
                               probs,         expandedRowIdx, EnumBits(rowIdxType),
                               nullptr,       gradExpandedY,  gradProbs};
    return Plan(kBackward1, args, workspaceSize, executor);
  });
}

extern "C" gkStatus gkMoeFinalizeRoutingGrad(void* workspace, uint64_t workspaceSize,
                                             gkOpExecutor* executor, void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kBackward2, [&] {
    return gk::RunExecutor(gk::kBackward2, gk::kMoeFinalizeRoutingGradName, workspace,
                           workspaceSize, executor);
  });
}
