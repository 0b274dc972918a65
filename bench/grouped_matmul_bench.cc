#include "bench/grouped_matmul_bench.h"

#include <algorithm>
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include "bench/bench_util.h"
#include "core/thread_pool.h"
#include "gradkit/gradkit.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_ref.h"

namespace gk::bench {
namespace {

// One planned, repeatable executor and its workspace.
struct PlannedRun {
  gkOpExecutor* executor = nullptr;
  std::vector<uint8_t> workspace;
  bool weight_grad = false;
  ~PlannedRun() { gkDestroyExecutor(executor); }
  void operator()() {
    Check(weight_grad ? gkGroupedMatmulWeightGrad(workspace.data(), workspace.size(), executor, nullptr)
                      : gkGroupedMatmul(workspace.data(), workspace.size(), executor, nullptr));
  }
};

}  // namespace

GroupedMatmulBenchResult RunGroupedMatmulBenchCase(const MoeGradBenchCase& c, bool weight_grad,
                                                   double min_seconds, bool transpose_weight) {
  transpose_weight = transpose_weight && !weight_grad;
  const int32_t threads = c.threads;
  const MoeGradRouting routing = MoeGradBenchRouting(c);
  const int64_t m = routing.m, n = c.n, k = c.k, g = c.g;
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto rate = [&](double seconds) { return flop / seconds / 1e9; };
  const int64_t elem = ElementBytes(c.dtype);

  const auto tokens = HashedBuffer(c.batch * k, c.dtype, 1, threads);
  AlignedBytes expanded(static_cast<size_t>(m * k * elem));
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(expanded.data() + i * k * elem, tokens.data() + routing.row_token[i] * k * elem,
                static_cast<size_t>(k * elem));
  }
  // Forward: weight [G, K, N] (or [G, N, K]) and y [M, N]; weight grad: gradY [M, N] and
  // gradWeight [G, K, N]. Every tensor 64-byte aligned, as torch's (AlignedBytes).
  const auto operand = weight_grad ? HashedBuffer(m * n, c.dtype, 2, threads)
                                   : HashedBuffer(g * k * n, c.dtype, 2, threads);
  AlignedBytes out(static_cast<size_t>(weight_grad ? g * k * n : m * n) * sizeof(float));

  Check(gkSetNumThreads(threads));
  TensorHandle groups_t({g}, DType::kI64, routing.group_counts.data());
  TensorHandle idx_t({m}, DType::kI64, routing.gather_idx.data());
  TensorHandle operand_t(weight_grad        ? std::vector<int64_t>{m, n}
                         : transpose_weight ? std::vector<int64_t>{g, n, k}
                                            : std::vector<int64_t>{g, k, n},
                         c.dtype, operand.data());
  TensorHandle out_t(weight_grad ? std::vector<int64_t>{g, k, n} : std::vector<int64_t>{m, n},
                     DType::kF32, out.data());
  PlannedRun runs[2];
  for (int gathered = 0; gathered < 2; ++gathered) {
    TensorHandle x_t(gathered ? std::vector<int64_t>{c.batch, k} : std::vector<int64_t>{m, k},
                     c.dtype, gathered ? tokens.data() : expanded.data());
    PlannedRun& run = runs[gathered];
    run.weight_grad = weight_grad;
    uint64_t size = 0;
    const gkTensor* idx = gathered ? idx_t.t : nullptr;
    if (weight_grad) {
      Check(gkGroupedMatmulWeightGradGetWorkspaceSize(x_t.t, operand_t.t, groups_t.t,
                                                      GK_GROUP_LIST_COUNT, idx, GK_ROW_IDX_GATHER,
                                                      c.top_k, out_t.t, &size, &run.executor));
    } else {
      Check(gkGroupedMatmulGetWorkspaceSize(x_t.t, operand_t.t, groups_t.t, GK_GROUP_LIST_COUNT,
                                            transpose_weight, idx, GK_ROW_IDX_GATHER, c.top_k, out_t.t, &size,
                                            &run.executor));
    }
    Check(gkSetExecutorRepeatable(run.executor));
    run.workspace.resize(size);
  }

  // The ceiling: one dense GEMM C[M, N] = A[M, K] * B[N, K]^T, same library; float16 inputs are
  // measured against the float32 GEMM (the library has none in float16).
  const DType gemm_dtype = c.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  const auto dense_a = HashedBuffer(m * k, gemm_dtype, 3, threads);
  const auto dense_b = HashedBuffer(n * k, gemm_dtype, 4, threads);
  AlignedBytes dense_c(static_cast<size_t>(m * n) * sizeof(float));
  const auto dense = MoeDenseGemm::Create(gemm_dtype, m, k, n, threads);

  const std::vector<std::function<void()>> candidates = {
      [&] { runs[0](); }, [&] { runs[1](); },
      [&] { dense->Run(dense_a.data(), dense_b.data(), reinterpret_cast<float*>(dense_c.data()), n); }};
  const std::vector<double> seconds = BestSecondsInterleaved(candidates, min_seconds, 3);
  gkSetNumThreads(0);
  return {c, weight_grad, transpose_weight, m, dense->name(), rate(seconds[0]), rate(seconds[1]), rate(seconds[2]),
          static_cast<uint64_t>(runs[1].workspace.size())};
}

std::string GroupedMatmulBenchJson(const GroupedMatmulBenchResult& r) {
  return fmt::format(
      "{{\"op\": \"{}\", \"shape\": \"{}\", \"dtype\": \"{}\", \"threads\": {}, \"batch\": {}, "
      "\"topK\": {}, \"G\": {}, \"K\": {}, \"N\": {}, \"M\": {}, \"weight\": \"{}\", \"gemm\": \"{}\", "
      "\"plain_gflops\": {}, \"gathered_gflops\": {}, \"dense_gflops\": {}, \"vs_dense\": {}, "
      "\"gathered_vs_plain\": {}, \"workspace_bytes\": {}}}",
      r.weight_grad ? "grouped_matmul_weight_grad" : "grouped_matmul", r.c.shape,
      DTypeName(r.c.dtype), r.c.threads, r.c.batch, r.c.top_k, r.c.g, r.c.k, r.c.n, r.m,
      r.weight_grad ? "" : r.transpose_weight ? "GNK" : "GKN", r.gemm_backend, JsonNumber(r.plain_gflops, 1), JsonNumber(r.gathered_gflops, 1),
      JsonNumber(r.dense_gflops, 1), JsonNumber(r.plain_gflops / r.dense_gflops, 3),
      JsonNumber(r.gathered_gflops / r.plain_gflops, 3), r.workspace_bytes);
}

}  // namespace gk::bench
