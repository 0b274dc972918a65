/* EluGradV2: the backward of ELU / SELU / CELU, parity with torch.ops.aten.elu_backward.
 *
 *   negcoef = alpha * scale, poscoef = scale, negiptcoef = inputScale (folded once in float32)
 *   x > 0:                gradInput = gradOutput * poscoef
 *   x <= 0, !isResult:    gradInput = gradOutput * negiptcoef * negcoef * exp(x * negiptcoef)
 *   x <= 0,  isResult:    gradInput = gradOutput * negiptcoef * (x + negcoef)
 * (isResult: x holds the forward's output instead of its input.) A NaN in x gives NaN.
 *
 * gradOutput and x: same dtype (GK_FLOAT, GK_FLOAT16, GK_BF16) and shape, rank <= 8, any strides.
 * gradInput: same shape; dtype equal to the input's, or GK_FLOAT. In place: it may be exactly
 * the same view as gradOutput or as x (same data, offset, dtype and strides); any other overlap
 * with them is refused.
 * 16-bit inputs are computed in float32 and rounded once, to nearest even.
 * isResult requires alpha >= 0. alpha, scale and inputScale must be finite in float32. */
#ifndef GRADKIT_ELU_GRAD_V2_H_
#define GRADKIT_ELU_GRAD_V2_H_

#include "gradkit/base.h"

#ifdef __cplusplus
extern "C" {
#endif

GK_API gkStatus gkEluGradV2GetWorkspaceSize(const gkTensor* gradOutput, const gkTensor* x,
                                            double alpha, double scale, double inputScale,
                                            bool isResult, gkTensor* gradInput,
                                            uint64_t* workspaceSize, gkOpExecutor** executor);

/* stream is reserved for device backends; the CPU backend ignores it. */
GK_API gkStatus gkEluGradV2(void* workspace, uint64_t workspaceSize, gkOpExecutor* executor,
                            void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRADKIT_ELU_GRAD_V2_H_ */
