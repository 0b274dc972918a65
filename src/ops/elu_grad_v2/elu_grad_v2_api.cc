// EluGradV2 two-phase C API: phase 1 checks and plans, phase 2 only runs the plan.
#include <cstring>
#include <new>
#include <type_traits>

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/error.h"
#include "core/executor.h"
#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "gradkit/elu_grad_v2.h"
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.h"
#include "ops/elu_grad_v2/elu_grad_v2_def.h"
#include "ops/elu_grad_v2/elu_grad_v2_layout.h"
#include "ops/elu_grad_v2/elu_grad_v2_plan.h"

namespace gk {
namespace {

constexpr std::string_view kPhase1 = "gkEluGradV2GetWorkspaceSize";
constexpr std::string_view kPhase2 = "gkEluGradV2";

class EluGradV2Executor final : public gkOpExecutor {
 public:
  EluGradV2Executor(const EluGradV2Plan& plan, const EluGradV2Layout& layout,
                    EluGradV2Kernel kernel)
      : plan_(plan), layout_(layout), kernel_(kernel) {}

  std::string_view op_name() const override { return kEluGradV2Name; }
  uint64_t workspace_bytes() const override { return plan_.workspace_bytes; }

  gkStatus Run(void* workspace) const override {
    if (plan_.total_elems == 0) return GK_SUCCESS;
    auto* scratch = static_cast<char*>(AlignUp(workspace, kEluGradV2WorkspaceAlignment));
    ParallelFor(plan_.threads, plan_.threads, [&](int64_t share) {
      const auto s = static_cast<int32_t>(share);
      if (plan_.contiguous) {
        RunContiguousShare(plan_.ShareBegin(s), plan_.ShareElems(s));
      } else if (!plan_.gather) {
        RunRowsShare(plan_.ShareBegin(s), plan_.ShareElems(s));
      } else {
        RunGatherShare(plan_.ShareBegin(s), plan_.ShareElems(s),
                       scratch + share * plan_.scratch_bytes_per_thread);
      }
    });
    return GK_SUCCESS;
  }

 private:
  void RunContiguousShare(int64_t begin, int64_t elems) const {
    const int64_t in_bytes = ElementBytes(plan_.input_dtype);
    const int64_t out_bytes = ElementBytes(plan_.output_dtype);
    const char* dy = TensorBase(layout_.dy);
    const char* x = TensorBase(layout_.x);
    char* y = TensorBase(layout_.y);
    for (int64_t i = begin; i < begin + elems; i += plan_.tile_elems) {
      const int64_t n = std::min(plan_.tile_elems, begin + elems - i);
      kernel_(dy + i * in_bytes, x + i * in_bytes, y + i * out_bytes, n, plan_.coef,
              plan_.streaming_stores);
    }
    if (plan_.streaming_stores) FlushStreamingStores();
  }

  // Strided views made of contiguous rows (after merging dims): the same kernel as contiguous
  // views, once per row (or the part of a row in this share), so every element gets the same
  // bits as in a contiguous copy.
  void RunRowsShare(int64_t begin, int64_t elems) const {
    const int64_t row = plan_.row_elems;
    for (int64_t i = begin; i < begin + elems;) {
      const int64_t n = std::min(row - i % row, begin + elems - i);
      kernel_(ElementAt(layout_.dy, i), ElementAt(layout_.x, i),
              const_cast<void*>(ElementAt(layout_.y, i)), n, plan_.coef,
              /*stream_output=*/false);
      i += n;
    }
  }

  // Views without long contiguous rows: gather a tile of dy and x into scratch (their own
  // dtype, whole elements: no conversion), run the same kernel there, scatter y's elements.
  void RunGatherShare(int64_t begin, int64_t elems, char* scratch) const {
    const int64_t in_bytes = ElementBytes(plan_.input_dtype);
    const int64_t out_bytes = ElementBytes(plan_.output_dtype);
    char* dy_tile = scratch;
    char* x_tile = dy_tile + plan_.tile_elems * in_bytes;
    char* y_tile = x_tile + plan_.tile_elems * in_bytes;
    StridedCursor dy_at(layout_.dy, begin), x_at(layout_.x, begin), y_at(layout_.y, begin);
    const auto next = [](const gkTensor& t, StridedCursor& at, int64_t bytes) {
      char* p = static_cast<char*>(t.data) + at.offset() * bytes;
      at.Next();
      return p;
    };
    for (int64_t i = begin; i < begin + elems; i += plan_.tile_elems) {
      const int64_t n = std::min(plan_.tile_elems, begin + elems - i);
      CopyElements(in_bytes, n, [&](int64_t j) { return dy_tile + j * in_bytes; },
                   [&](int64_t) { return next(layout_.dy, dy_at, in_bytes); });
      CopyElements(in_bytes, n, [&](int64_t j) { return x_tile + j * in_bytes; },
                   [&](int64_t) { return next(layout_.x, x_at, in_bytes); });
      kernel_(dy_tile, x_tile, y_tile, n, plan_.coef, /*stream_output=*/false);
      CopyElements(out_bytes, n, [&](int64_t) { return next(layout_.y, y_at, out_bytes); },
                   [&](int64_t j) { return y_tile + j * out_bytes; });
    }
  }

  // n element copies of `bytes` bytes each, from from(j) to to(j), with the size known to the
  // compiler (a 2- or 4-byte move, not a call per element).
  template <class To, class From>
  static void CopyElements(int64_t bytes, int64_t n, To to, From from) {
    const auto copy = [&](auto size) {
      for (int64_t j = 0; j < n; ++j) {
        char* target = to(j);
        std::memcpy(target, from(j), size);
      }
    };
    if (bytes == 2) {
      copy(std::integral_constant<size_t, 2>());
    } else {
      copy(std::integral_constant<size_t, 4>());
    }
  }

  EluGradV2Plan plan_;
  EluGradV2Layout layout_;  // copies: the caller may release its descriptors after phase 1
  EluGradV2Kernel kernel_;  // the plan's dtype pair and mode
};

}  // namespace
}  // namespace gk

extern "C" gkStatus gkEluGradV2GetWorkspaceSize(const gkTensor* gradOutput, const gkTensor* x,
                                                double alpha, double scale, double inputScale,
                                                bool isResult, gkTensor* gradInput,
                                                uint64_t* workspaceSize,
                                                gkOpExecutor** executor) {
  using namespace gk;
  return GuardCApi(kPhase1, [&] {
    if (executor != nullptr) *executor = nullptr;
    GK_RETURN_IF_ERROR(CheckNotNull(kPhase1, workspaceSize, "workspaceSize"));
    GK_RETURN_IF_ERROR(CheckNotNull(kPhase1, executor, "executor"));
    const EluGradV2Args args{gradOutput, x, alpha, scale, inputScale, isResult, gradInput};
    GK_RETURN_IF_ERROR(CheckEluGradV2(kPhase1, args));

    const EluGradV2Layout layout = MergeEluGradV2Dims(*gradOutput, *x, *gradInput);
    const EluGradV2Problem problem{
        *NumElements(*gradOutput),
        gradOutput->dtype,
        gradInput->dtype,
        isResult,
        IsContiguous(*gradOutput) && IsContiguous(*x) && IsContiguous(*gradInput),
        FoldEluGradV2Coefficients(alpha, scale, inputScale),
        layout.row_elems};
    const EluGradV2Plan plan = MakeEluGradV2Plan(problem, DetectEluGradV2Machine());
    const EluGradV2Kernel kernel = FindEluGradV2Kernel(plan.input_dtype, plan.output_dtype,
                                                       plan.is_result);
    if (kernel == nullptr) {
      return Fail(GK_ERROR_INTERNAL, kPhase1, "no kernel for {} -> {}", DTypeName(plan.input_dtype),
                  DTypeName(plan.output_dtype));
    }
    auto* planned = new (std::nothrow) EluGradV2Executor(plan, layout, kernel);
    if (planned == nullptr) return Fail(GK_ERROR_RUNTIME, kPhase1, "out of memory");
    *workspaceSize = plan.workspace_bytes;
    *executor = planned;
    ClearRecentError();
    return GK_SUCCESS;
  });
}

extern "C" gkStatus gkEluGradV2(void* workspace, uint64_t workspaceSize, gkOpExecutor* executor,
                                void* stream) {
  (void)stream;
  return gk::GuardCApi(gk::kPhase2, [&] {
    return gk::RunExecutor(gk::kPhase2, gk::kEluGradV2Name, workspace, workspaceSize, executor);
  });
}
