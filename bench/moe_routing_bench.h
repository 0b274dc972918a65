// `gradkit bench moe-routing`: the MoE layer's data-movement operators (MoeInitRouting,
// MoeFinalizeRouting, MoeFinalizeRoutingGrad) in GB/s beside, in the same run, a plain parallel
// copy of the same number of bytes (their ceiling: each op reads and writes every byte once).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace gk::bench {

struct MoeRoutingBenchCase {
  std::string shape;      // "S1" .. "S4": the fused op's presets, H = their K (the model dim)
  int64_t batch, top_k, g, h;
  DType dtype;
  int32_t threads;
};

struct MoeRoutingBenchResult {
  MoeRoutingBenchCase c;
  std::string op;         // "init" | "finalize" | "finalize_grad"
  int64_t m;
  int64_t bytes;          // read + written by the op
  double gbps, copy_gbps;
};

std::vector<MoeRoutingBenchCase> MoeRoutingBenchCases(const std::optional<std::string>& shape,
                                                      std::optional<DType> dtype, int32_t threads);
// The three operators of one case, each interleaved with its copy.
std::vector<MoeRoutingBenchResult> RunMoeRoutingBenchCase(const MoeRoutingBenchCase& c,
                                                          double min_seconds);
std::string MoeRoutingBenchJson(const MoeRoutingBenchResult& r);

}  // namespace gk::bench
