/* gradkit from C: both operators through the two-phase API, each result checked against the
 * formula in gradkit's headers. Exits 0 when every value matches. */
#include <gradkit/gradkit.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs phase 2 with a workspace of the size phase 1 asked for; releases the executor. */
typedef gkStatus (*RunFn)(void*, uint64_t, gkOpExecutor*, void*);
static int Run(RunFn run, uint64_t workspace_size, gkOpExecutor* executor) {
  void* workspace = workspace_size ? malloc(workspace_size) : NULL;
  const gkStatus status = run(workspace, workspace_size, executor, NULL);
  if (status != GK_SUCCESS) fprintf(stderr, "%s\n", gkGetRecentErrMsg());
  free(workspace);
  gkDestroyExecutor(executor);
  return status == GK_SUCCESS;
}

/* EluGradV2, float32, ELU with alpha 1: gradInput = gradOutput * (x > 0 ? 1 : exp(x)). */
static int EluGradExample(void) {
  float dy[6] = {1.0f, -2.0f, 0.5f, 3.0f, -1.5f, 2.0f};
  float x[6] = {-3.0f, -1.0f, -0.25f, 0.0f, 0.5f, 2.0f};
  float dx[6];
  const int64_t shape[2] = {2, 3};
  gkTensor* dy_t = gkCreateTensor(shape, 2, GK_FLOAT, NULL /* contiguous */, 0, dy);
  gkTensor* x_t = gkCreateTensor(shape, 2, GK_FLOAT, NULL, 0, x);
  gkTensor* dx_t = gkCreateTensor(shape, 2, GK_FLOAT, NULL, 0, dx);
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = NULL;
  int ok = gkEluGradV2GetWorkspaceSize(dy_t, x_t, 1.0, 1.0, 1.0, false, dx_t, &workspace_size,
                                       &executor) == GK_SUCCESS;
  if (!ok) fprintf(stderr, "%s\n", gkGetRecentErrMsg()); /* names the argument, value, rule */
  ok = ok && Run(gkEluGradV2, workspace_size, executor);
  for (int i = 0; ok && i < 6; ++i) {
    const double expected = x[i] > 0 ? dy[i] : dy[i] * exp((double)x[i]);
    if (fabs(dx[i] - expected) > 1e-6 * fabs(expected)) {
      fprintf(stderr, "EluGradV2: gradInput[%d] is %.9g, expected %.9g\n", i, dx[i], expected);
      ok = 0;
    }
  }
  gkDestroyTensor(dy_t);
  gkDestroyTensor(x_t);
  gkDestroyTensor(dx_t);
  if (ok) printf("EluGradV2: 6 values match\n");
  return ok;
}

/* MoeInitRoutingGroupedMatmulGrad: 3 tokens, topK 2 (slots 0..5, token = slot / 2), 2 experts,
 * K 3, N 2. Expert 0 got slots 0, 2, 5 (rows 0-2), expert 1 slots 1, 3 (rows 3-4); slot 4 was
 * dropped. Small integers make every float sum exact. */
static int MoeGradExample(void) {
  enum { kBatch = 3, kTopK = 2, kG = 2, kK = 3, kN = 2, kM = 5 };
  float dy[kM * kN] = {1, 2, -1, 0, 3, 1, 2, -2, 0, 1};
  float w[kG * kK * kN] = {1, 0, 0, 1, 1, 1, /* expert 1: */ 2, -1, 1, 1, 0, 3};
  int64_t row_idx[kM] = {0, 2, 5, 1, 3}; /* row -> slot (MoeInitRouting's expandedRowIdx) */
  int32_t group_list[kG] = {3, 2};       /* rows per expert; GK_INT32 or GK_INT64 */
  float dx[kBatch * kK];
  const int64_t dy_shape[2] = {kM, kN}, w_shape[3] = {kG, kK, kN}, idx_shape[1] = {kM};
  const int64_t groups_shape[1] = {kG}, dx_shape[2] = {kBatch, kK};
  gkTensor* dy_t = gkCreateTensor(dy_shape, 2, GK_FLOAT, NULL, 0, dy);
  gkTensor* w_t = gkCreateTensor(w_shape, 3, GK_FLOAT, NULL, 0, w);
  gkTensor* idx_t = gkCreateTensor(idx_shape, 1, GK_INT64, NULL, 0, row_idx);
  gkTensor* groups_t = gkCreateTensor(groups_shape, 1, GK_INT32, NULL, 0, group_list);
  gkTensor* dx_t = gkCreateTensor(dx_shape, 2, GK_FLOAT, NULL, 0, dx);
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = NULL;
  int ok = gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
               dy_t, w_t, idx_t, groups_t, kBatch, kTopK, GK_ROW_IDX_GATHER, GK_GROUP_LIST_COUNT,
               dx_t, &workspace_size, &executor) == GK_SUCCESS;
  if (!ok) fprintf(stderr, "%s\n", gkGetRecentErrMsg());
  ok = ok && Run(gkMoeInitRoutingGroupedMatmulGrad, workspace_size, executor);

  /* The header's formula: gradX[b, k] = sum over rows i of token b of
   * sum over n of gradY[i, n] * weight[expert(i), k, n]. */
  float expected[kBatch * kK] = {0};
  for (int i = 0; i < kM; ++i) {
    const int expert = i < group_list[0] ? 0 : 1;
    const int64_t token = row_idx[i] / kTopK;
    for (int k = 0; k < kK; ++k) {
      for (int n = 0; n < kN; ++n) {
        expected[token * kK + k] += dy[i * kN + n] * w[(expert * kK + k) * kN + n];
      }
    }
  }
  for (int i = 0; ok && i < kBatch * kK; ++i) {
    if (dx[i] != expected[i]) {
      fprintf(stderr, "MoE: gradX[%d] is %g, expected %g\n", i, dx[i], expected[i]);
      ok = 0;
    }
  }
  gkDestroyTensor(dy_t);
  gkDestroyTensor(w_t);
  gkDestroyTensor(idx_t);
  gkDestroyTensor(groups_t);
  gkDestroyTensor(dx_t);
  if (ok) printf("MoeInitRoutingGroupedMatmulGrad: %d values match\n", kBatch * kK);
  return ok;
}

int main(void) {
  /* The headers this program was compiled with must be the library it runs with. */
  char headers[32];
  snprintf(headers, sizeof headers, "%d.%d.%d", GRADKIT_VERSION_MAJOR, GRADKIT_VERSION_MINOR,
           GRADKIT_VERSION_PATCH);
  printf("gradkit %s (headers %s), SIMD target %s\n", gkGetVersion(), headers, gkGetCpuIsa());
  int ok = strcmp(headers, gkGetVersion()) == 0 && strcmp(headers, GRADKIT_VERSION_STRING) == 0;
  if (!ok) fprintf(stderr, "headers %s, library %s\n", headers, gkGetVersion());
  ok = EluGradExample() && ok;
  ok = MoeGradExample() && ok;
  return ok ? 0 : 1;
}
