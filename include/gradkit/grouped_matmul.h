/* GroupedMatmul and GroupedMatmulWeightGrad: the two expert matmuls of an MoE layer, for the
 * forward (y = x @ weight[g]) and the weight gradient (gradWeight[g] = x_g^T @ gradY_g).
 *
 * Rows are grouped by expert: groupList gives G consecutive row ranges of the M expanded rows,
 * in expert order (GK_GROUP_LIST_COUNT: rows per expert; GK_GROUP_LIST_CUMSUM: running total).
 * g(i) is the expert whose range holds row i.
 *
 *   GroupedMatmul:            y[i, n] = sum over k of x(i)[k] * W[g(i), k, n]
 *   GroupedMatmulWeightGrad:  gradWeight[g, k, n] = sum over rows i of expert g, ascending, of
 *                                                   x(i)[k] * gradY[i, n]    (0 for empty experts)
 *   GroupedMatmulWeightGradAdd: gradWeightRef[g, k, n] += that sum (aclnnGroupedMatmulAdd's role:
 *     a weight gradient accumulated into the caller's gradient buffer, so no temporary of a
 *     weight's size exists). Each element becomes (its value as float32 + the float32 sum that
 *     GroupedMatmulWeightGrad computes) rounded once to its dtype; an empty expert's slice keeps
 *     its bits. gradWeightRef may be float32 or the input dtype, like gradWeight.
 *
 * x(i), the expanded row i of x, is read in one of two ways:
 *   plain (expandedRowIdx NULL): x is [M, K] and x(i) = x[i]; rowIdxType and topK are ignored.
 *   gather-fused (expandedRowIdx given): x is the token matrix [batch, K] and x(i) = x[token(i)],
 *     token(i) = p / topK for the slot p = b * topK + j of row i, as the MoE routing operators
 *     define it (see gradkit/moe_init_routing_grouped_matmul_grad.h: rowIdxType 0, gather,
 *     expandedRowIdx[i] = slot of row i, L >= M, no slot twice; rowIdxType 1, scatter,
 *     expandedRowIdx[p] = row of slot p or -1, L = batch * topK, each row once). The kernels read
 *     the token rows directly: the [M, K] expanded x never exists.
 *
 * weight (GroupedMatmul): W[g] is [K, N]. transposeWeight = false: weight is [G, K, N];
 * transposeWeight = true: weight is [G, N, K] (nn.Linear's layout, aclnn's transposed weight) and
 * W[g] = weight[g]^T. Either way, weight is C-contiguous or the transposed view of a C-contiguous
 * buffer of the other layout (last two strides swapped: strides (K*N, 1, K) for a [G, K, N] view
 * of [G, N, K] storage, (K*N, 1, N) for a [G, N, K] view of [G, K, N] storage); every form gives
 * the same result bits. When x's K fits the other dim, the error says K and N look swapped.
 *
 * Dtypes: x, weight and gradY share one of GK_FLOAT, GK_FLOAT16, GK_BF16; y and gradWeight are
 * GK_FLOAT or that dtype (rounded once, to nearest even, from the float32 result). Accumulation
 * is float32. expandedRowIdx and groupList are GK_INT64 or GK_INT32. Every tensor other than
 * weight is C-contiguous; outputs share no byte with any input and are fully written.
 * G >= 1, K >= 1, N >= 1, M >= 0; gather-fused: batch >= 1, topK >= 1, M <= batch * topK.
 *
 * Phase 1 checks every rule, including the values of groupList and expandedRowIdx; nothing is
 * written on error. Results are bit-for-bit identical across runs and thread counts: each output
 * element is computed by one tile GEMM whose shape and reduction order depend on the problem
 * only (the weight gradient sums each expert's rows in fixed chunks, in ascending order). */
#ifndef GRADKIT_GROUPED_MATMUL_H_
#define GRADKIT_GROUPED_MATMUL_H_

#include "gradkit/base.h"
#include "gradkit/moe_init_routing_grouped_matmul_grad.h" /* gkRowIdxType, gkGroupListType */

#ifdef __cplusplus
extern "C" {
#endif

/* x [M, K] (or [batch, K] gather-fused), weight [G, K, N] (or [G, N, K] with transposeWeight),
 * groupList [G] -> y [M, N]. */
GK_API gkStatus gkGroupedMatmulGetWorkspaceSize(
    const gkTensor* x, const gkTensor* weight, const gkTensor* groupList,
    gkGroupListType groupListType, bool transposeWeight, const gkTensor* expandedRowIdx,
    gkRowIdxType rowIdxType, int64_t topK, gkTensor* y, uint64_t* workspaceSize,
    gkOpExecutor** executor);

/* stream is reserved for device backends; the CPU backend ignores it. */
GK_API gkStatus gkGroupedMatmul(void* workspace, uint64_t workspaceSize, gkOpExecutor* executor,
                                void* stream);

/* x [M, K] (or [batch, K] gather-fused), gradY [M, N], groupList [G] -> gradWeight [G, K, N]. */
GK_API gkStatus gkGroupedMatmulWeightGradGetWorkspaceSize(
    const gkTensor* x, const gkTensor* gradY, const gkTensor* groupList,
    gkGroupListType groupListType, const gkTensor* expandedRowIdx, gkRowIdxType rowIdxType,
    int64_t topK, gkTensor* gradWeight, uint64_t* workspaceSize, gkOpExecutor** executor);

GK_API gkStatus gkGroupedMatmulWeightGrad(void* workspace, uint64_t workspaceSize,
                                          gkOpExecutor* executor, void* stream);

/* As gkGroupedMatmulWeightGrad, adding into gradWeightRef [G, K, N], which is read and written.
 * Phase 1 reads no value of it; a failed call leaves it untouched. */
GK_API gkStatus gkGroupedMatmulWeightGradAddGetWorkspaceSize(
    const gkTensor* x, const gkTensor* gradY, const gkTensor* groupList,
    gkGroupListType groupListType, const gkTensor* expandedRowIdx, gkRowIdxType rowIdxType,
    int64_t topK, gkTensor* gradWeightRef, uint64_t* workspaceSize, gkOpExecutor** executor);

GK_API gkStatus gkGroupedMatmulWeightGradAdd(void* workspace, uint64_t workspaceSize,
                                             gkOpExecutor* executor, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRADKIT_GROUPED_MATMUL_H_ */
