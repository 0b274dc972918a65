#include "tests/fuzz/c_caller.h"

gkTensor* gkFuzzCreateTensor(const int64_t* dims, uint64_t ndims, int32_t dtype,
                             const int64_t* strides, int64_t offset, void* data) {
  return gkCreateTensor(dims, ndims, (gkDataType)dtype, strides, offset, data);
}

gkStatus gkFuzzMoeGradGetWorkspaceSize(const gkTensor* gradY, const gkTensor* weight,
                                       const gkTensor* expandedRowIdx, const gkTensor* groupList,
                                       int64_t batch, int64_t topK, int32_t rowIdxType,
                                       int32_t groupListType, gkTensor* gradX,
                                       uint64_t* workspaceSize, gkOpExecutor** executor) {
  return gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
      gradY, weight, expandedRowIdx, groupList, batch, topK, (gkRowIdxType)rowIdxType,
      (gkGroupListType)groupListType, gradX, workspaceSize, executor);
}

gkStatus gkFuzzGroupedMatmulGetWorkspaceSize(const gkTensor* x, const gkTensor* weight,
                                             const gkTensor* groupList, int32_t groupListType,
                                             bool transposeWeight, const gkTensor* expandedRowIdx,
                                             int32_t rowIdxType, int64_t topK, gkTensor* y,
                                             uint64_t* workspaceSize, gkOpExecutor** executor) {
  return gkGroupedMatmulGetWorkspaceSize(x, weight, groupList, (gkGroupListType)groupListType,
                                         transposeWeight, expandedRowIdx, (gkRowIdxType)rowIdxType,
                                         topK, y, workspaceSize, executor);
}

gkStatus gkFuzzGroupedMatmulWeightGradGetWorkspaceSize(
    const gkTensor* x, const gkTensor* gradY, const gkTensor* groupList, int32_t groupListType,
    const gkTensor* expandedRowIdx, int32_t rowIdxType, int64_t topK, gkTensor* gradWeight,
    bool accumulate, uint64_t* workspaceSize, gkOpExecutor** executor) {
  if (accumulate) {
    return gkGroupedMatmulWeightGradAddGetWorkspaceSize(
        x, gradY, groupList, (gkGroupListType)groupListType, expandedRowIdx,
        (gkRowIdxType)rowIdxType, topK, gradWeight, workspaceSize, executor);
  }
  return gkGroupedMatmulWeightGradGetWorkspaceSize(x, gradY, groupList,
                                                   (gkGroupListType)groupListType, expandedRowIdx,
                                                   (gkRowIdxType)rowIdxType, topK, gradWeight,
                                                   workspaceSize, executor);
}

gkStatus gkFuzzMoeInitRoutingGetWorkspaceSize(const gkTensor* x, const gkTensor* expertIdx,
                                              int64_t expertCapacity, int64_t expertNum,
                                              int32_t groupListType, int32_t rowIdxType,
                                              gkTensor* expandedX, gkTensor* expandedRowIdx,
                                              gkTensor* groupList, uint64_t* workspaceSize,
                                              gkOpExecutor** executor) {
  return gkMoeInitRoutingGetWorkspaceSize(x, expertIdx, expertCapacity, expertNum,
                                          (gkGroupListType)groupListType,
                                          (gkRowIdxType)rowIdxType, expandedX, expandedRowIdx,
                                          groupList, workspaceSize, executor);
}

gkStatus gkFuzzMoeFinalizeRoutingGetWorkspaceSize(const gkTensor* expandedY, const gkTensor* probs,
                                                  const gkTensor* expandedRowIdx,
                                                  int32_t rowIdxType, gkTensor* out,
                                                  uint64_t* workspaceSize,
                                                  gkOpExecutor** executor) {
  return gkMoeFinalizeRoutingGetWorkspaceSize(expandedY, probs, expandedRowIdx,
                                              (gkRowIdxType)rowIdxType, out, workspaceSize,
                                              executor);
}

gkStatus gkFuzzMoeFinalizeRoutingGradGetWorkspaceSize(
    const gkTensor* gradOut, const gkTensor* expandedY, const gkTensor* probs,
    const gkTensor* expandedRowIdx, int32_t rowIdxType, gkTensor* gradExpandedY,
    gkTensor* gradProbs, uint64_t* workspaceSize, gkOpExecutor** executor) {
  return gkMoeFinalizeRoutingGradGetWorkspaceSize(gradOut, expandedY, probs, expandedRowIdx,
                                                  (gkRowIdxType)rowIdxType, gradExpandedY,
                                                  gradProbs, workspaceSize, executor);
}
