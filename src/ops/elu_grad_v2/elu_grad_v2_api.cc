// EluGradV2 two-phase C API: phase 1 checks and plans, phase 2 only runs the plan.

#include "core/c_api_guard.h"
#include "core/check.h"
#include "core/error.h"
#include "core/executor.h"
#include "core/thread_pool.h"
#include "gradkit/elu_grad_v2.h"
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.h"
#include "ops/elu_grad_v2/elu_grad_v2_def.h"
#include "ops/elu_grad_v2/elu_grad_v2_plan.h"

namespace gk {
namespace {

constexpr std::string_view kPhase1 = "gkEluGradV2GetWorkspaceSize";
constexpr std::string_view kPhase2 = "gkEluGradV2";

class EluGradV2Executor final : public gkOpExecutor {
 public:
  EluGradV2Executor(const EluGradV2Plan& plan, const gkTensor& dy, const gkTensor& x,
                    const gkTensor& y, EluGradV2Kernel kernel)
      : plan_(plan),
        dy_(dy),
        x_(x),
        y_(y),
        kernel_(kernel),
        f32_kernel_(FindEluGradV2Kernel(DType::kF32, DType::kF32, plan.is_result)) {}

  std::string_view op_name() const override { return kEluGradV2Name; }
  uint64_t workspace_bytes() const override { return plan_.workspace_bytes; }

  gkStatus Run(void* workspace) const override {
    if (plan_.total_elems == 0) return GK_SUCCESS;
    auto* scratch = static_cast<float*>(AlignUp(workspace, kEluGradV2WorkspaceAlignment));
    ParallelFor(plan_.threads, plan_.threads, [&](int64_t share) {
      const auto s = static_cast<int32_t>(share);
      if (plan_.contiguous) {
        RunContiguousShare(plan_.ShareBegin(s), plan_.ShareElems(s));
      } else {
        RunStridedShare(plan_.ShareBegin(s), plan_.ShareElems(s),
                        scratch + share * plan_.scratch_elems_per_thread);
      }
    });
    return GK_SUCCESS;
  }

 private:
  static char* Base(const gkTensor& t) {
    return static_cast<char*>(t.data) + t.offset * ElementBytes(t.dtype);
  }

  void RunContiguousShare(int64_t begin, int64_t elems) const {
    const int64_t in_bytes = ElementBytes(plan_.input_dtype);
    const int64_t out_bytes = ElementBytes(plan_.output_dtype);
    for (int64_t i = begin; i < begin + elems; i += plan_.tile_elems) {
      const int64_t n = std::min(plan_.tile_elems, begin + elems - i);
      kernel_(Base(dy_) + i * in_bytes, Base(x_) + i * in_bytes, Base(y_) + i * out_bytes, n,
              plan_.coef, plan_.streaming_stores);
    }
    if (plan_.streaming_stores) FlushStreamingStores();
  }

  // SAFE path for strided views: gather a tile into float32 scratch, run the float32 kernel in
  // place, scatter with one rounding to the output dtype.
  void RunStridedShare(int64_t begin, int64_t elems, float* scratch) const {
    float* dy_tile = scratch;
    float* x_tile = scratch + plan_.tile_elems;
    StridedCursor dy_at(dy_, begin), x_at(x_, begin), y_at(y_, begin);
    for (int64_t i = begin; i < begin + elems; i += plan_.tile_elems) {
      const int64_t n = std::min(plan_.tile_elems, begin + elems - i);
      for (int64_t j = 0; j < n; ++j, dy_at.Next(), x_at.Next()) {
        dy_tile[j] = LoadAsF32(dy_.data, dy_at.offset(), dy_.dtype);
        x_tile[j] = LoadAsF32(x_.data, x_at.offset(), x_.dtype);
      }
      f32_kernel_(dy_tile, x_tile, dy_tile, n, plan_.coef, /*stream_output=*/false);
      for (int64_t j = 0; j < n; ++j, y_at.Next()) {
        StoreFromF32(y_.data, y_at.offset(), y_.dtype, dy_tile[j]);
      }
    }
  }

  EluGradV2Plan plan_;
  gkTensor dy_, x_, y_;  // copies: the caller may release its descriptors after phase 1
  EluGradV2Kernel kernel_;      // the plan's dtype pair, contiguous views
  EluGradV2Kernel f32_kernel_;  // float32 scratch tiles, strided views
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

    const EluGradV2Problem problem{
        *NumElements(*gradOutput),
        gradOutput->dtype,
        gradInput->dtype,
        isResult,
        IsContiguous(*gradOutput) && IsContiguous(*x) && IsContiguous(*gradInput),
        FoldEluGradV2Coefficients(alpha, scale, inputScale)};
    const EluGradV2Plan plan = MakeEluGradV2Plan(problem, DetectEluGradV2Machine());
    const EluGradV2Kernel kernel = FindEluGradV2Kernel(plan.input_dtype, plan.output_dtype,
                                                       plan.is_result);
    if (kernel == nullptr) {
      return Fail(GK_ERROR_INTERNAL, kPhase1, "no kernel for {} -> {}",
                  DTypeName(plan.input_dtype), DTypeName(plan.output_dtype));
    }
    *executor = new EluGradV2Executor(plan, *gradOutput, *x, *gradInput, kernel);
    *workspaceSize = plan.workspace_bytes;
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
