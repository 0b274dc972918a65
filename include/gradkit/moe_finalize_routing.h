/* MoeFinalizeRouting and its gradient: the end of an MoE layer, where each token's expert
 * outputs are weighted by its routing probabilities and summed.
 *
 *   out[b] = sum over j = 0 .. topK-1 (in this order) of probs[b, j] * expandedY[row(b * topK + j)]
 *
 * row(p): the expanded row of slot p = b * topK + j, as expandedRowIdx says; a dropped slot (no
 * row) adds nothing, and a token with every slot dropped gets zeros. The backward:
 *
 *   gradExpandedY[i] = probs[slot(i)] * gradOut[token(i)]            token(i) = slot(i) / topK
 *   gradProbs[b, j]  = sum over n of gradOut[b, n] * expandedY[row(b * topK + j), n]  (0 if dropped)
 *
 * Shapes and types (all contiguous):
 *   expandedY [M, N]           GK_FLOAT, GK_FLOAT16 or GK_BF16 (the dtype); N >= 1, M <= batch * topK
 *   probs [batch, topK]        GK_FLOAT or the dtype; batch, topK >= 1
 *   expandedRowIdx             GK_INT32 or GK_INT64, with the rules of
 *                              gkMoeInitRoutingGroupedMatmulGrad (gkRowIdxType):
 *     GK_ROW_IDX_GATHER (0): [L], L >= M; entry i < M is the slot of row i (no slot twice),
 *                            entries past M are ignored (MoeInitRouting's -1 padding)
 *     GK_ROW_IDX_SCATTER (1): [batch * topK]; entry p is the row of slot p or -1, each row once
 *   out [batch, N]             the dtype or GK_FLOAT
 *   gradOut [batch, N]         the dtype or GK_FLOAT
 *   gradExpandedY [M, N]       the dtype or GK_FLOAT
 *   gradProbs [batch, topK]    probs' dtype or GK_FLOAT
 * Outputs share no byte with the inputs or with each other.
 *
 * Arithmetic: float32 from the inputs' values, one rounding to the output dtype at the end. out
 * adds probs * expandedY (each product rounded to float32, then the sum) in ascending j;
 * gradProbs sums its products in a fixed order that depends on N only. Results are the same
 * bits for any thread count. Phase 1 reads expandedRowIdx (never the float data); a repeatable
 * executor checks it again in phase 2 before writing. */
#ifndef GRADKIT_MOE_FINALIZE_ROUTING_H_
#define GRADKIT_MOE_FINALIZE_ROUTING_H_

#include "gradkit/base.h"
#include "gradkit/moe_init_routing_grouped_matmul_grad.h" /* gkRowIdxType */

#ifdef __cplusplus
extern "C" {
#endif

GK_API gkStatus gkMoeFinalizeRoutingGetWorkspaceSize(const gkTensor* expandedY,
                                                     const gkTensor* probs,
                                                     const gkTensor* expandedRowIdx,
                                                     gkRowIdxType rowIdxType, gkTensor* out,
                                                     uint64_t* workspaceSize,
                                                     gkOpExecutor** executor);
/* stream is reserved for device backends; the CPU backend ignores it. */
GK_API gkStatus gkMoeFinalizeRouting(void* workspace, uint64_t workspaceSize,
                                     gkOpExecutor* executor, void* stream);

GK_API gkStatus gkMoeFinalizeRoutingGradGetWorkspaceSize(
    const gkTensor* gradOut, const gkTensor* expandedY, const gkTensor* probs,
    const gkTensor* expandedRowIdx, gkRowIdxType rowIdxType, gkTensor* gradExpandedY,
    gkTensor* gradProbs, uint64_t* workspaceSize, gkOpExecutor** executor);
GK_API gkStatus gkMoeFinalizeRoutingGrad(void* workspace, uint64_t workspaceSize,
                                         gkOpExecutor* executor, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRADKIT_MOE_FINALIZE_ROUTING_H_ */
