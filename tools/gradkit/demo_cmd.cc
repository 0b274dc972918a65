// gradkit demo | gradkit info
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/bench_util.h"
#include "bench/elu_grad_v2_bench.h"
#include "bench/torch_peer.h"
#include "core/cpu_info.h"
#include "ops/elu_grad_v2/elu_grad_v2_ref.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"
#include "tools/gradkit/demo.h"

namespace gk::cli {
namespace {

// Runs EluGradV2 on random data and checks every element against the float64 reference.
struct EluDemoRow {
  DType dtype;
  bool is_result;
  int64_t elems;
  int64_t within;  // elements within the accuracy contract
};

EluDemoRow CheckEluGradV2(DType dtype, bool is_result, int64_t elems) {
  constexpr double kAlpha = 1.6733, kScale = 1.0507, kInputScale = 1.0;
  std::vector<float> dy_f(elems), x_f(elems);
  bench::FillUniform(dy_f.data(), elems, -3.0f, 3.0f, 11);
  bench::FillUniform(x_f.data(), elems, -6.0f, 3.0f, 12);
  std::vector<uint8_t> dy(elems * ElementBytes(dtype)), x(elems * ElementBytes(dtype)),
      y(elems * ElementBytes(dtype));
  for (int64_t i = 0; i < elems; ++i) {
    StoreFromF32(dy.data(), i, dtype, dy_f[i]);
    StoreFromF32(x.data(), i, dtype, is_result ? std::fmax(x_f[i], -1.75f) : x_f[i]);
  }
  const std::vector<int64_t> shape{elems};
  TensorHandle dy_t = MakeTensor(shape, dtype, dy.data()), x_t = MakeTensor(shape, dtype, x.data()),
               y_t = MakeTensor(shape, dtype, y.data());
  uint64_t workspace_size = 0;
  gkOpExecutor* raw = nullptr;
  ThrowIfFailed(gkEluGradV2GetWorkspaceSize(dy_t.get(), x_t.get(), kAlpha, kScale, kInputScale,
                                            is_result, y_t.get(), &workspace_size, &raw));
  ExecutorHandle executor(raw);
  std::vector<uint8_t> workspace(workspace_size);
  ThrowIfFailed(gkEluGradV2(workspace.data(), workspace_size, executor.get(), nullptr));

  const auto coef = FoldEluGradV2Coefficients(kAlpha, kScale, kInputScale);
  EluDemoRow row{dtype, is_result, elems, 0};
  for (int64_t i = 0; i < elems; ++i) {
    const float dyi = LoadAsF32(dy.data(), i, dtype), xi = LoadAsF32(x.data(), i, dtype);
    const double ref = EluGradV2ReferenceF64(dyi, xi, coef, is_result);
    const double got = LoadAsF32(y.data(), i, dtype);
    if (std::fabs(got - ref) <= EluGradV2Tolerance(ref, dyi, xi, coef, is_result, dtype)) {
      ++row.within;
    }
  }
  return row;
}

void RunDemo() {
  std::printf("gradkit %s demo on CPU (%s, %d threads)\n\n", gkGetVersion(), gkGetCpuIsa(),
              gkGetNumThreads());
  std::printf("EluGradV2 (SELU backward: alpha 1.6733, scale 1.0507), 1 M random elements each,\n"
              "checked element by element against a float64 evaluation, then timed beside a "
              "plain copy:\n\n");
  std::printf("  %-9s %-7s %-26s %9s %10s %8s %9s\n", "dtype", "mode", "accuracy", "GB/s",
              "copy GB/s", "vs copy", "vs torch");
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool is_result : {false, true}) {
      const auto row = CheckEluGradV2(dtype, is_result, 1 << 20);
      const auto perf = bench::RunEluGradV2BenchCase({16 << 20, dtype, is_result, gkGetNumThreads()},
                                                     0.05);
      std::printf("  %-9s %-7s %-26s %9.2f %10.2f %7.0f%% %9s\n",
                  std::string(DTypeName(dtype)).c_str(), is_result ? "result" : "exp",
                  fmt::format("{}/{} within contract", row.within, row.elems).c_str(), perf.gbps,
                  perf.copy_gbps, 100.0 * perf.gbps / perf.copy_gbps,
                  perf.torch_gbps ? fmt::format("{:.1f}x", perf.gbps / *perf.torch_gbps).c_str()
                                  : "-");
      std::fflush(stdout);
      if (row.within != row.elems) throw CliError("EluGradV2 demo: accuracy contract broken");
    }
  }
  std::printf("\n  (timed at 16 M elements; `gradkit bench elu-grad` measures every size)\n");
  RunMoeGradDemo();
}

void PrintInfo() {
  std::printf("gradkit %s\n", gkGetVersion());
  std::printf("backends:   cpu\n");
  std::printf("cpu isa:    %s (available: %s)\n", gkGetCpuIsa(),
              fmt::format("{}", fmt::join(AvailableIsas(), ", ")).c_str());
  std::printf("threads:    %d\n", gkGetNumThreads());
  const CacheInfo caches = DetectCaches();
  std::printf("caches:     L1d %lld KiB, L2 %lld KiB per core; last level %lld MiB (what plans see)\n",
              static_cast<long long>(caches.l1d_bytes_per_core >> 10),
              static_cast<long long>(caches.l2_bytes_per_core >> 10),
              static_cast<long long>(caches.llc_bytes >> 20));
  std::printf("libtorch:   %s\n",
              bench::TorchPeerAvailable()
                  ? fmt::format("{} (benchmark peer, loaded by `gradkit bench` only)",
                                bench::TorchPeerVersion()).c_str()
                  : fmt::format("{} (peer benchmarks skipped)", bench::TorchPeerWhyAbsent()).c_str());
  PrintMoeGradInfo();
}

}  // namespace

void RegisterDemoAndInfoCommands(CommandSet& commands) {
  commands.app.add_subcommand("demo", "Run every operator once, check it, and time it")
      ->callback(RunDemo);
  commands.app.add_subcommand("info", "Version, SIMD target, threads, and which libraries were found")
      ->callback(PrintInfo);
}

}  // namespace gk::cli
