#include "ops/elu_grad_v2/elu_grad_v2_def.h"

#include <algorithm>

#include "core/check.h"

namespace gk {
namespace {

gkStatus CheckOutputDType(std::string_view api, const gkTensor& grad_output,
                          const gkTensor& grad_input) {
  const bool supported =
      std::any_of(std::begin(kEluGradV2DTypeSupport), std::end(kEluGradV2DTypeSupport),
                  [&](const EluGradV2DTypePair& p) {
                    return p.input == grad_output.dtype && p.output == grad_input.dtype;
                  });
  if (supported) return GK_SUCCESS;
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "gradInput has dtype {} for {} inputs; it must be {} or float32",
              DTypeName(grad_input.dtype), DTypeName(grad_output.dtype),
              DTypeName(grad_output.dtype));
}

gkStatus CheckAlphaForResult(std::string_view api, double alpha, bool is_result) {
  if (!is_result || alpha >= 0.0) return GK_SUCCESS;
  // PyTorch's message for the same rule, so that users of both see one explanation.
  return Fail(GK_ERROR_PARAM_INVALID, api,
              "alpha is {} with isResult true, it must be >= 0: In-place elu backward calculation "
              "is triggered with a negative slope which is not supported. This is caused by "
              "calling in-place forward function with a negative slope, please call out-of-place "
              "version instead.",
              alpha);
}

}  // namespace

gkStatus CheckEluGradV2(std::string_view api, const EluGradV2Args& args) {
  GK_RETURN_IF_ERROR(CheckTensor(api, args.grad_output, "gradOutput"));
  GK_RETURN_IF_ERROR(CheckTensor(api, args.x, "x"));
  GK_RETURN_IF_ERROR(CheckTensor(api, args.grad_input, "gradInput"));
  const gkTensor& dy = *args.grad_output;
  const gkTensor& x = *args.x;
  const gkTensor& y = *args.grad_input;

  GK_RETURN_IF_ERROR(CheckDTypeIn(api, dy, "gradOutput", {DType::kF32, DType::kF16, DType::kBF16}));
  GK_RETURN_IF_ERROR(CheckSameDType(api, x, "x", dy, "gradOutput"));
  GK_RETURN_IF_ERROR(CheckOutputDType(api, dy, y));

  GK_RETURN_IF_ERROR(CheckMaxRank(api, dy, "gradOutput", kEluGradV2MaxRank));
  GK_RETURN_IF_ERROR(CheckMaxRank(api, x, "x", kEluGradV2MaxRank));
  GK_RETURN_IF_ERROR(CheckMaxRank(api, y, "gradInput", kEluGradV2MaxRank));
  GK_RETURN_IF_ERROR(CheckSameShape(api, x, "x", dy, "gradOutput"));
  GK_RETURN_IF_ERROR(CheckSameShape(api, y, "gradInput", dy, "gradOutput"));

  GK_RETURN_IF_ERROR(CheckAddressable(api, dy, "gradOutput"));
  GK_RETURN_IF_ERROR(CheckAddressable(api, x, "x"));
  GK_RETURN_IF_ERROR(CheckAddressable(api, y, "gradInput"));
  GK_RETURN_IF_ERROR(CheckNoSelfOverlap(api, y, "gradInput"));
  GK_RETURN_IF_ERROR(CheckAliasOrDisjoint(api, y, "gradInput", dy, "gradOutput"));
  GK_RETURN_IF_ERROR(CheckAliasOrDisjoint(api, y, "gradInput", x, "x"));

  GK_RETURN_IF_ERROR(CheckFiniteF32(api, args.alpha, "alpha"));
  GK_RETURN_IF_ERROR(CheckFiniteF32(api, args.scale, "scale"));
  GK_RETURN_IF_ERROR(CheckFiniteF32(api, args.input_scale, "inputScale"));
  GK_RETURN_IF_ERROR(CheckAlphaForResult(api, args.alpha, args.is_result));
  return GK_SUCCESS;
}

}  // namespace gk
