/* MoeInitRoutingGroupedMatmulGrad: the input gradient of an MoE layer whose forward was
 *   expanded_x = Permute(x) (MoeInitRouting), y = GroupedMatmul(expanded_x, weight),
 * computed without materialising d_expanded_x = d_y @ weight^T ([M, K]):
 *
 *   gradX[b, k] = sum over expanded rows i with token(i) = b of
 *                 sum over n of gradY[i, n] * weight[g(i), k, n]
 *
 * g(i): the expert whose group holds row i (groups are consecutive row ranges, in expert order).
 * token(i) = p / topK, where p = b * topK + j is row i's original slot.
 *
 * Shapes: gradY [M, N] and weight [G, K, N], same dtype (GK_FLOAT, GK_FLOAT16, GK_BF16);
 * expandedRowIdx [L] and groupList [G], each GK_INT64 or GK_INT32; gradX [batch, K] GK_FLOAT,
 * fully written (rows that receive nothing are 0). All tensors C-contiguous, except that weight
 * may instead be the transposed view of a C-contiguous [G, N, K] buffer (nn.Linear's layout,
 * aclnn's transposed weight): shape [G, K, N], strides (K*N, 1, K). It is read in place, with
 * the same result bits as its contiguous [G, K, N] copy. gradX shares no byte with any input.
 * batch > 0, topK > 0, M <= batch * topK (less when slots were dropped).
 *
 * groupList: GK_GROUP_LIST_COUNT: groupList[g] rows for expert g (>= 0, total M);
 *            GK_GROUP_LIST_CUMSUM: the running total (non-decreasing, >= 0, last = M).
 * rowIdxType GK_ROW_IDX_GATHER (0, expanded -> original): L >= M; expandedRowIdx[i] for i < M
 *            is the slot of row i, in [0, batch * topK), no slot twice; entries past M are ignored.
 * rowIdxType GK_ROW_IDX_SCATTER (1, original -> expanded): L = batch * topK; expandedRowIdx[p]
 *            is the expanded row of slot p, in [0, M), or -1 for a dropped slot; each row once.
 * Both enum arguments are checked: another value is refused with GK_ERROR_PARAM_INVALID.
 *
 * Phase 1 checks every rule, including the values of groupList and expandedRowIdx (it reads
 * those two arrays, not gradY or weight). Accumulation is in float32 for every dtype; the result
 * is bit-for-bit identical across runs and thread counts. */
#ifndef GRADKIT_MOE_INIT_ROUTING_GROUPED_MATMUL_GRAD_H_
#define GRADKIT_MOE_INIT_ROUTING_GROUPED_MATMUL_GRAD_H_

#include "gradkit/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gkRowIdxType {
  GK_ROW_IDX_GATHER = 0,  /* expandedRowIdx[row] = original slot (MoeInitRouting's output) */
  GK_ROW_IDX_SCATTER = 1, /* expandedRowIdx[slot] = expanded row, or -1 when dropped */
} gkRowIdxType;

typedef enum gkGroupListType {
  GK_GROUP_LIST_COUNT = 0,  /* rows per expert */
  GK_GROUP_LIST_CUMSUM = 1, /* running total of rows per expert */
} gkGroupListType;

GK_API gkStatus gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
    const gkTensor* gradY, const gkTensor* weight, const gkTensor* expandedRowIdx,
    const gkTensor* groupList, int64_t batch, int64_t topK, gkRowIdxType rowIdxType,
    gkGroupListType groupListType, gkTensor* gradX, uint64_t* workspaceSize,
    gkOpExecutor** executor);

/* stream is reserved for device backends; the CPU backend ignores it. */
GK_API gkStatus gkMoeInitRoutingGroupedMatmulGrad(void* workspace, uint64_t workspaceSize,
                                                  gkOpExecutor* executor, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRADKIT_MOE_INIT_ROUTING_GROUPED_MATMUL_GRAD_H_ */
