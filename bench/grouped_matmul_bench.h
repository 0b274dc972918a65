// `gradkit bench grouped-matmul` / `grouped-matmul-weight-grad`: GFLOP/s (2 M N K) of the
// operator with plain x and with gather-fused x, beside a dense GEMM of the same M, N, K through
// the same library (the ceiling), all measured interleaved in the same run, at the fused MoE
// backward's shapes S1..S4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "bench/moe_grad_bench.h"  // MoeGradBenchCase, the shared presets

namespace gk::bench {

struct GroupedMatmulBenchResult {
  MoeGradBenchCase c;
  bool weight_grad;
  bool transpose_weight;  // forward: weight stored [G, N, K]
  int64_t m;
  std::string gemm_backend;
  double plain_gflops;     // x [M, K]
  double gathered_gflops;  // x [batch, K] read through expandedRowIdx (gather form)
  double dense_gflops;     // one M x N x K GEMM (float32 GEMM for float16 inputs)
  uint64_t workspace_bytes;
};

// transpose_weight (forward only): the weights stored [G, N, K] (nn.Linear's layout).
GroupedMatmulBenchResult RunGroupedMatmulBenchCase(const MoeGradBenchCase& c, bool weight_grad,
                                                   double min_seconds, bool transpose_weight = false);
std::string GroupedMatmulBenchJson(const GroupedMatmulBenchResult& r);

}  // namespace gk::bench
