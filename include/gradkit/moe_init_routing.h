/* MoeInitRouting: the forward routing of an MoE layer. Every token's topK expert choices become
 * expanded rows, grouped by expert:
 *
 *   slot p = b * topK + j   (token b, its j-th choice, expert expertIdx[b, j])
 *   expanded rows hold the kept slots ordered by expert ascending, then by slot ascending
 *   expandedX[i] = x[token(i)], token(i) = slot(i) / topK
 *
 * Capacity: expertCapacity C = 0 keeps every slot (M = batch * topK). C > 0 keeps only the first
 * C slots of each expert (in slot order) and drops the rest, so M = sum over g of
 * min(count(g), C) depends on the data. Phase 1 does not return M: as in Ascend's
 * aclnnMoeInitRoutingV3, the outputs are sized by the caller from the shapes, and the data's
 * counts come back in groupList (M = the sum of the counts = the last cumsum entry):
 *   expandedX has R rows with M <= R <= Rmax, Rmax = min(batch * topK, G * C) (C > 0) or
 *   batch * topK (C = 0); Rmax is always enough. Rows [M, R) are written as zeros.
 * Outputs feed gkMoeInitRoutingGroupedMatmulGrad and the other MoE operators unchanged (their
 * M-row tensors are the first M rows of expandedX's shape).
 *
 * Shapes and types:
 *   x [batch, H]               GK_FLOAT, GK_FLOAT16 or GK_BF16; rows may be strided (the last
 *                              dim must be contiguous)
 *   expertIdx [batch, topK]    GK_INT32 or GK_INT64, values in [0, expertNum)
 *   expandedX [R, H]           x's dtype, contiguous; or NULL for index-only routing: only
 *                              expandedRowIdx and groupList are written (R is then
 *                              expandedRowIdx's length for rowIdxType 0), and the layer's matmuls
 *                              read x through the indices (gkGroupedMatmul gather-fused).
 *                              NULL is not an error here: check gkCreateTensor's result
 *                              before passing it, or a failed expandedX routes index-only
 *   expandedRowIdx             GK_INT32 or GK_INT64 (GK_INT32 needs batch * topK < 2^31), contiguous:
 *     rowIdxType GK_ROW_IDX_GATHER (0): [R]; entry i < M is the slot of row i, entries past M are -1
 *     rowIdxType GK_ROW_IDX_SCATTER (1): [batch * topK]; entry p is the row of slot p, -1 if dropped
 *   groupList [expertNum]      GK_INT64: rows per expert (GK_GROUP_LIST_COUNT) or their running
 *                              total (GK_GROUP_LIST_CUMSUM)
 * batch, topK, H >= 1; 1 <= expertNum < 2^31; expertCapacity >= 0. Outputs share no byte with
 * each other or with the inputs.
 *
 * Phase 1 reads expertIdx (its values and the resulting M are checked before anything is
 * written); a repeatable executor checks them again in phase 2, before writing. expandedX is a
 * copy of x's bytes: the result is the same bits for any thread count. */
#ifndef GRADKIT_MOE_INIT_ROUTING_H_
#define GRADKIT_MOE_INIT_ROUTING_H_

#include "gradkit/base.h"
#include "gradkit/moe_init_routing_grouped_matmul_grad.h" /* gkRowIdxType, gkGroupListType */

#ifdef __cplusplus
extern "C" {
#endif

GK_API gkStatus gkMoeInitRoutingGetWorkspaceSize(
    const gkTensor* x, const gkTensor* expertIdx, int64_t expertCapacity, int64_t expertNum,
    gkGroupListType groupListType, gkRowIdxType rowIdxType, gkTensor* expandedX,
    gkTensor* expandedRowIdx, gkTensor* groupList, uint64_t* workspaceSize,
    gkOpExecutor** executor);

/* stream is reserved for device backends; the CPU backend ignores it. */
GK_API gkStatus gkMoeInitRouting(void* workspace, uint64_t workspaceSize, gkOpExecutor* executor,
                                 void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRADKIT_MOE_INIT_ROUTING_H_ */
