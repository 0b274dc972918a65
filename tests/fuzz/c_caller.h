// Entry points called the way a C program may call them: enum arguments hold any int. (In C++
// an out-of-range enum value is undefined before it reaches gradkit, so the fuzz targets pass
// such values through these C functions.)
#pragma once

#include <stdint.h>

#include "gradkit/gradkit.h"

#ifdef __cplusplus
extern "C" {
#endif

gkTensor* gkFuzzCreateTensor(const int64_t* dims, uint64_t ndims, int32_t dtype,
                             const int64_t* strides, int64_t offset, void* data);

gkStatus gkFuzzMoeGradGetWorkspaceSize(const gkTensor* gradY, const gkTensor* weight,
                                       const gkTensor* expandedRowIdx, const gkTensor* groupList,
                                       int64_t batch, int64_t topK, int32_t rowIdxType,
                                       int32_t groupListType, gkTensor* gradX,
                                       uint64_t* workspaceSize, gkOpExecutor** executor);

gkStatus gkFuzzGroupedMatmulGetWorkspaceSize(const gkTensor* x, const gkTensor* weight,
                                             const gkTensor* groupList, int32_t groupListType,
                                             bool transposeWeight, const gkTensor* expandedRowIdx,
                                             int32_t rowIdxType, int64_t topK, gkTensor* y,
                                             uint64_t* workspaceSize, gkOpExecutor** executor);

gkStatus gkFuzzGroupedMatmulWeightGradGetWorkspaceSize(
    const gkTensor* x, const gkTensor* gradY, const gkTensor* groupList, int32_t groupListType,
    const gkTensor* expandedRowIdx, int32_t rowIdxType, int64_t topK, gkTensor* gradWeight,
    bool accumulate, uint64_t* workspaceSize, gkOpExecutor** executor);

gkStatus gkFuzzMoeInitRoutingGetWorkspaceSize(const gkTensor* x, const gkTensor* expertIdx,
                                              int64_t expertCapacity, int64_t expertNum,
                                              int32_t groupListType, int32_t rowIdxType,
                                              gkTensor* expandedX, gkTensor* expandedRowIdx,
                                              gkTensor* groupList, uint64_t* workspaceSize,
                                              gkOpExecutor** executor);

gkStatus gkFuzzMoeFinalizeRoutingGetWorkspaceSize(const gkTensor* expandedY, const gkTensor* probs,
                                                  const gkTensor* expandedRowIdx,
                                                  int32_t rowIdxType, gkTensor* out,
                                                  uint64_t* workspaceSize,
                                                  gkOpExecutor** executor);

gkStatus gkFuzzMoeFinalizeRoutingGradGetWorkspaceSize(
    const gkTensor* gradOut, const gkTensor* expandedY, const gkTensor* probs,
    const gkTensor* expandedRowIdx, int32_t rowIdxType, gkTensor* gradExpandedY,
    gkTensor* gradProbs, uint64_t* workspaceSize, gkOpExecutor** executor);

#ifdef __cplusplus
}
#endif
