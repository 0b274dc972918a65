// The cases a `gradkit bench` command over the MoE shapes measures: every preset S1..S4, one of
// them, or one shape of the user's (--batch --topk --experts --k --n over a preset's dimensions).
// Shared by `bench moe-grad` and `bench grouped-matmul[-weight-grad]`; defined in moe_grad_cmd.cc.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/moe_grad_bench.h"

namespace gk::cli {

struct BenchShapeOptions {
  std::string preset;
  std::optional<int64_t> batch, top_k, g, k, n;
};

// Adds --preset, --batch, --topk, --experts, --k and --n to `cmd`; k_help and n_help say what K
// and N are for that operator.
void AddBenchShapeOptions(CLI::App& cmd, BenchShapeOptions& o, const std::string& k_help,
                          const std::string& n_help);

// The cases, or CliError naming the option: an unknown preset, a dimension out of range, a
// shape whose buffers would take more than 3/4 of this machine's memory.
std::vector<bench::MoeGradBenchCase> BenchCases(const BenchShapeOptions& o, std::optional<DType> dtype,
                                                int32_t threads);

}  // namespace gk::cli
