// MoeFinalizeRouting and MoeFinalizeRoutingGrad two-phase C API: phase 1 checks (the values of
// expandedRowIdx included) and plans; phase 2 rebuilds the slot -> row table in the workspace,
// then runs the tokens' units.
#include <cstring>

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/error.h"
#include "core/executor.h"
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

char* Base(const gkTensor& t) {
  return static_cast<char*>(t.data) + t.offset * ElementBytes(t.dtype);
}

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
      auto* rows = reinterpret_cast<float*>(base + plan_.thread_rows_offset +
                                            static_cast<uint64_t>(t) * plan_.thread_row_bytes);
      const int64_t row_floats =
          static_cast<int64_t>(plan_.thread_row_bytes / kMoeFinalizeRowsPerThread / sizeof(float));
      float* scratch[kMoeFinalizeRowsPerThread] = {rows, rows + row_floats, rows + 2 * row_floats};
      for (int64_t unit = t; unit < plan_.units; unit += plan_.threads) {
        const int64_t begin = unit * plan_.tokens_per_unit;
        const int64_t end = std::min(plan_.shape.batch, begin + plan_.tokens_per_unit);
        for (int64_t b = begin; b < end; ++b) {
          if (plan_.shape.backward) {
            BackwardToken(b, slot_row, scratch);
          } else {
            ForwardToken(b, slot_row, scratch);
          }
        }
      }
    });
    return GK_SUCCESS;
  }

 private:
  // Row `row` of a [rows, N] float tensor as float32: in place for float32, else converted.
  const float* RowF32(const gkTensor& t, int64_t row, float* scratch) const {
    const int64_t n = plan_.shape.n;
    const char* source = Base(t) + row * n * ElementBytes(t.dtype);
    if (t.dtype == DType::kF32) return reinterpret_cast<const float*>(source);
    MoeFinalizeRowToF32(t.dtype, source, scratch, n);
    return scratch;
  }
  float Prob(int64_t slot) const { return LoadAsF32(Base(probs_), slot, probs_.dtype); }

  // out[b] = sum over j of probs[b, j] * expandedY[row(b * topK + j)], ascending j.
  void ForwardToken(int64_t b, const int64_t* slot_row, float* const* scratch) const {
    const MoeFinalizeShape& s = plan_.shape;
    float* acc = scratch[0];
    std::fill(acc, acc + s.n, 0.0f);
    for (int64_t p = b * s.top_k; p < (b + 1) * s.top_k; ++p) {
      const int64_t row = slot_row[p];
      if (row < 0) continue;  // dropped
      MoeFinalizeAddScaled(Prob(p), RowF32(y_, row, scratch[1]), acc, s.n);
    }
    MoeFinalizeRowFromF32(s.token_dtype, acc, Base(out_) + b * s.n * ElementBytes(s.token_dtype),
                          s.n);
  }

  // gradProbs[b, j] = gradOut[b] . expandedY[row]; gradExpandedY[row] = probs[b, j] * gradOut[b].
  void BackwardToken(int64_t b, const int64_t* slot_row, float* const* scratch) const {
    const MoeFinalizeShape& s = plan_.shape;
    const float* grad_out = RowF32(grad_out_, b, scratch[0]);
    const int64_t grad_y_elem = ElementBytes(s.grad_y_dtype);
    for (int64_t p = b * s.top_k; p < (b + 1) * s.top_k; ++p) {
      const int64_t row = slot_row[p];
      float grad_prob = 0.0f;
      if (row >= 0) {
        grad_prob = MoeFinalizeDot(grad_out, RowF32(y_, row, scratch[1]), s.n);
        char* target = Base(grad_y_) + row * s.n * grad_y_elem;
        if (s.grad_y_dtype == DType::kF32) {
          MoeFinalizeScale(Prob(p), grad_out, reinterpret_cast<float*>(target), s.n);
        } else {
          MoeFinalizeScale(Prob(p), grad_out, scratch[2], s.n);
          MoeFinalizeRowFromF32(s.grad_y_dtype, scratch[2], target, s.n);
        }
      }
      StoreFromF32(Base(grad_probs_), p, s.grad_probs_dtype, grad_prob);
    }
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
  const MoeFinalizePlan plan = MakeMoeFinalizePlan(shape, ConfiguredThreads());
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
