// Google Benchmark over the EluGradV2 kernel table x every SIMD target this CPU runs, on
// in-cache sizes: the compute rate of each kernel, apart from memory. Bytes/s = read + written.
//   build/release/bin/gradkit_microbench --benchmark_filter=bf16
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "core/cpu_info.h"
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.h"

namespace gk {
namespace {

void RunKernel(benchmark::State& state, const std::string& isa, const EluGradV2KernelEntry& entry) {
  SelectIsa(isa);
  const int64_t n = state.range(0);
  std::vector<uint8_t> dy(n * ElementBytes(entry.input)), x(n * ElementBytes(entry.input)),
      y(n * ElementBytes(entry.output));
  for (int64_t i = 0; i < n; ++i) {
    StoreFromF32(dy.data(), i, entry.input, 0.001f * static_cast<float>(i % 2000) - 1.0f);
    StoreFromF32(x.data(), i, entry.input, 0.004f * static_cast<float>(i % 2000) - 6.0f);
  }
  const auto coef = FoldEluGradV2Coefficients(1.6733, 1.0507, 1.0);
  for (auto _ : state) {
    entry.kernel(dy.data(), x.data(), y.data(), n, coef, false);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(dy.size() + x.size() + y.size()));
  state.SetItemsProcessed(state.iterations() * n);
  SelectIsa("");
}

const bool registered = [] {
  for (const auto& isa : AvailableIsas()) {
    for (const auto& entry : EluGradV2Kernels()) {
      benchmark::RegisterBenchmark(("elu_grad_v2__" + isa + "_" + entry.name).c_str(),
                                   [isa, entry](benchmark::State& s) { RunKernel(s, isa, entry); })
          ->Arg(16 << 10);
    }
  }
  return true;
}();

}  // namespace
}  // namespace gk

BENCHMARK_MAIN();
