#include "bench/moe_grad_bench.h"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "bench/bench_util.h"
#include "bench/torch_peer_moe.h"
#include "core/thread_pool.h"
#include "gradkit/gradkit.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_ref.h"

namespace gk::bench {

std::vector<MoeGradBenchCase> MoeGradBenchCases(const std::optional<std::string>& shape,
                                                std::optional<DType> dtype, int32_t threads) {
  const MoeGradBenchCase shapes[] = {
      {"S1", 4096, 2, 8, 2048, 1408, 0.0, 0, DType::kF32, threads},
      {"S2", 2048, 8, 64, 2048, 768, 0.0, 0, DType::kF32, threads},
      {"S3", 1024, 8, 60, 7168, 2048, 0.0, 0, DType::kF32, threads},
      {"S4", 4096, 2, 8, 2048, 1408, 0.9, 3, DType::kF32, threads},
  };
  std::vector<MoeGradBenchCase> cases;
  for (const auto& s : shapes) {
    if (shape && *shape != s.shape) continue;
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      if (dtype && *dtype != d) continue;
      MoeGradBenchCase c = s;
      c.dtype = d;
      cases.push_back(c);
    }
  }
  return cases;
}

MoeGradRouting MoeGradBenchRouting(const MoeGradBenchCase& c) {
  MoeGradRoutingSpec spec;
  spec.batch = c.batch;
  spec.top_k = c.top_k;
  spec.g = c.g;
  spec.skew = c.skew;
  spec.empty_experts = c.empty_experts;
  spec.seed = 7;
  return MakeMoeGradRouting(spec);
}

MoeGradBenchResult RunMoeGradBenchCase(const MoeGradBenchCase& c, double min_seconds) {
  const int32_t threads = c.threads;
  const MoeGradRouting routing = MoeGradBenchRouting(c);
  const int64_t m = routing.m, n = c.n, k = c.k, g = c.g;
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto rate = [&](double seconds) { return flop / seconds / 1e9; };

  const auto dy = HashedBuffer(m * n, c.dtype, 1, threads);
  const auto w = HashedBuffer(g * k * n, c.dtype, 2, threads);
  std::vector<float> dx(static_cast<size_t>(c.batch * k));

  // The fused operator, planned once, run repeatedly.
  Check(gkSetNumThreads(threads));
  TensorHandle dy_t({m, n}, c.dtype, dy.data());
  TensorHandle w_t({g, k, n}, c.dtype, w.data());
  TensorHandle idx_t({m}, DType::kI64, routing.gather_idx.data());
  TensorHandle groups_t({g}, DType::kI64, routing.group_counts.data());
  TensorHandle dx_t({c.batch, k}, DType::kF32, dx.data());
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  Check(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(dy_t.t, w_t.t, idx_t.t, groups_t.t, c.batch,
                                                          c.top_k, GK_ROW_IDX_GATHER, GK_GROUP_LIST_COUNT, dx_t.t,
                                                          &workspace_size, &executor));
  Check(gkSetExecutorRepeatable(executor));
  std::vector<uint8_t> workspace(workspace_size);
  std::vector<std::function<void()>> candidates;
  candidates.push_back(
      [&] { Check(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), workspace_size, executor, nullptr)); });

  // The ceiling: one dense GEMM of the same M, N, K (expert 0's weight), same library. The
  // library has no float16 GEMM: float16 inputs are measured against the float32 GEMM.
  const DType gemm_dtype = c.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  std::vector<float> dy_f32, w_f32;
  if (c.dtype == DType::kF16) {
    dy_f32 = ToF32(dy, c.dtype, threads);
    w_f32 = ToF32(w, c.dtype, threads);
  }
  const void* dy_gemm = c.dtype == DType::kF16 ? static_cast<const void*>(dy_f32.data()) : dy.data();
  const void* w_gemm = c.dtype == DType::kF16 ? static_cast<const void*>(w_f32.data()) : w.data();
  std::vector<float> expanded(static_cast<size_t>(m * k));  // [M, K]: dense output / unfused buffer
  const auto dense = MoeDenseGemm::Create(gemm_dtype, m, n, k, threads);
  candidates.push_back([&] { dense->Run(dy_gemm, w_gemm, expanded.data(), k); });

  // The unfused composite: grouped GEMM into [M, K], then scatter-add (float16: convert first).
  std::vector<std::unique_ptr<MoeDenseGemm>> expert_gemms(static_cast<size_t>(g));
  for (int64_t e = 0; e < g; ++e) {
    if (routing.group_counts[e] > 0) {
      expert_gemms[e] = MoeDenseGemm::Create(gemm_dtype, routing.group_counts[e], n, k, threads);
    }
  }
  std::vector<float> dy_conv, w_conv;
  if (c.dtype == DType::kF16) {
    dy_conv.resize(dy_f32.size());
    w_conv.resize(w_f32.size());
  }
  candidates.push_back([&] {
    const void* a = dy.data();
    const void* b = w.data();
    if (c.dtype == DType::kF16) {
      constexpr int64_t kBlock = 1 << 18;
      const auto convert = [&](const AlignedBytes& from, std::vector<float>& to) {
        const int64_t elems = static_cast<int64_t>(to.size());
        ParallelFor(threads, (elems + kBlock - 1) / kBlock, [&](int64_t blk) {
          const int64_t begin = blk * kBlock, count = std::min(kBlock, elems - begin);
          MoeConvertF16ToF32(reinterpret_cast<const uint16_t*>(from.data()) + begin,
                             to.data() + begin, count);
        });
      };
      convert(dy, dy_conv);
      convert(w, w_conv);
      a = dy_conv.data();
      b = w_conv.data();
    }
    const int64_t elem = ElementBytes(gemm_dtype);
    int64_t row = 0;
    for (int64_t e = 0; e < g; ++e) {
      if (expert_gemms[e]) {
        expert_gemms[e]->Run(static_cast<const char*>(a) + row * n * elem,
                             static_cast<const char*>(b) + e * k * n * elem,
                             expanded.data() + row * k, k);
      }
      row += routing.group_counts[e];
    }
    constexpr int64_t kCols = 256;
    ParallelFor(threads, (k + kCols - 1) / kCols, [&](int64_t block) {
      const int64_t col0 = block * kCols, cols = std::min(kCols, k - col0);
      for (int64_t b = 0; b < c.batch; ++b) std::memset(&dx[b * k + col0], 0, cols * sizeof(float));
      for (int64_t i = 0; i < m; ++i) {
        MoeAddRowF32(&dx[routing.row_token[i] * k + col0], &expanded[i * k + col0], cols);
      }
    });
  });

  MoeGradBenchResult r{c, m, "", "", 0, std::nullopt, std::nullopt, std::nullopt, "", workspace_size,
                       static_cast<uint64_t>(m) * static_cast<uint64_t>(k) * 4u};
  r.gemm_backend = dense->name();
  {
    // The GEMM the executor's plan runs its tiles on (the dense ceiling may run on another).
    const MoeGradShape s = MoeGradGatherCountShape(c.batch, c.top_k, m, g, k, n, c.dtype);
    const MoeGradMachine machine = DetectMoeGradMachine(s);
    r.tile_gemm = machine.gemm_backend;
    if (!machine.gemm_impls.empty()) r.tile_gemm += ": " + machine.gemm_impls.front().second;
    if (const int64_t rows = MakeMoeGradPlan(s, machine).broadcast_max_rows; rows > 0) {
      r.tile_gemm += fmt::format("; experts of at most {} rows in the weights-broadcast form", rows);
    }
  }
  std::vector<uint8_t> torch_dx(static_cast<size_t>(c.batch * k * ElementBytes(c.dtype)));
  if (auto torch_run = MakeTorchMoeGradComposite(dy.data(), w.data(), torch_dx.data(), c.dtype, m,
                                                 n, k, c.batch, routing.group_counts,
                                                 routing.row_token, threads, &r.torch_note)) {
    candidates.push_back(*torch_run);
  }
  const std::vector<double> seconds = BestSecondsInterleaved(candidates, min_seconds, 3);
  r.gflops = rate(seconds[0]);
  r.dense_gflops = rate(seconds[1]);
  r.unfused_gflops = rate(seconds[2]);
  if (seconds.size() > 3) r.torch_gflops = rate(seconds[3]);

  gkDestroyExecutor(executor);
  gkSetNumThreads(0);
  return r;
}

std::string MoeGradBenchJson(const MoeGradBenchResult& r) {
  const auto ratio = [](std::optional<double> a, std::optional<double> b) -> std::optional<double> {
    if (!a || !b || *b <= 0) return std::nullopt;
    return *a / *b;
  };
  return fmt::format(
      "{{\"op\": \"moe_init_routing_grouped_matmul_grad\", \"shape\": \"{}\", \"dtype\": \"{}\", "
      "\"threads\": {}, \"batch\": {}, \"topK\": {}, \"G\": {}, \"K\": {}, \"N\": {}, \"M\": {}, "
      "\"gemm\": \"{}\", \"tile_gemm\": \"{}\", \"gflops\": {}, \"dense_gflops\": {}, \"unfused_gflops\": {}, "
      "\"torch_gflops\": {}, \"vs_dense\": {}, \"vs_unfused\": {}, \"vs_torch\": {}, "
      "\"workspace_bytes\": {}, \"unfused_bytes\": {}}}",
      r.c.shape, DTypeName(r.c.dtype), r.c.threads, r.c.batch, r.c.top_k, r.c.g, r.c.k, r.c.n, r.m,
      r.gemm_backend, r.tile_gemm, JsonNumber(r.gflops, 1), JsonNumber(r.dense_gflops, 1),
      JsonNumber(r.unfused_gflops, 1), JsonNumber(r.torch_gflops, 1),
      JsonNumber(ratio(r.gflops, r.dense_gflops), 3), JsonNumber(ratio(r.gflops, r.unfused_gflops), 3),
      JsonNumber(ratio(r.gflops, r.torch_gflops), 3), r.workspace_bytes, r.unfused_bytes);
}

}  // namespace gk::bench
