// `gradkit bench moe-grad`: GFLOP/s (2 M N K) of the fused MoeInitRoutingGroupedMatmulGrad beside,
// in the same run, a dense GEMM of the same M, N, K through the same library (the ceiling), the
// unfused composite (grouped GEMM into a full [M, K] float32 buffer, then scatter-add) and
// libtorch's composite (per-expert at::mm + index_add_), with the workspace against [M, K].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_ref.h"

namespace gk::bench {

struct MoeGradBenchCase {
  std::string shape;  // "S1" .. "S4"
  int64_t batch, top_k, g, k, n;
  double skew;            // fraction of slots on expert 0
  int64_t empty_experts;  // the last experts receive nothing
  DType dtype;
  int32_t threads;
};

struct MoeGradBenchResult {
  MoeGradBenchCase c;
  int64_t m;
  std::string gemm_backend;              // the dense ceiling's library
  std::string tile_gemm;                 // the fused op's tile GEMM, as its plan names it
  double gflops;                         // fused operator, phase 2
  std::optional<double> dense_gflops;    // one M x N x K GEMM (float32 GEMM for float16 inputs)
  std::optional<double> unfused_gflops;  // grouped GEMM into [M, K] + scatter-add
  std::optional<double> torch_gflops;    // at::mm per expert + index_add_
  std::string torch_note;
  uint64_t workspace_bytes;
  uint64_t unfused_bytes;                // the [M, K] float32 buffer of the unfused path
};

// The shapes S1..S4 x {f32, f16, bf16}, filtered.
std::vector<MoeGradBenchCase> MoeGradBenchCases(const std::optional<std::string>& shape,
                                                std::optional<DType> dtype, int32_t threads);
// The case's routing (seed 7), shared by the benchmarks that take these presets.
MoeGradRouting MoeGradBenchRouting(const MoeGradBenchCase& c);
MoeGradBenchResult RunMoeGradBenchCase(const MoeGradBenchCase& c, double min_seconds);
std::string MoeGradBenchJson(const MoeGradBenchResult& r);

}  // namespace gk::bench
