// gradkit elu-grad | plan elu-grad | bench elu-grad
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "bench/bench_util.h"
#include "bench/elu_grad_v2_bench.h"
#include "bench/torch_peer.h"
#include "core/cpu_info.h"
#include "ops/elu_grad_v2/elu_grad_v2_plan.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"

namespace gk::cli {
namespace {

struct EluGradOptions {
  std::string dy_path, x_path, out_path;
  double alpha = 1.0, scale = 1.0, input_scale = 1.0;
  bool is_result = false, quiet = false;
  std::string dtype, out_dtype;
  int32_t threads = 0;
};

// The C API's argument names -> the options of `gradkit elu-grad`.
constexpr OptionName kEluOptionNames[] = {
    {"gradOutput", "--dy"},      {"x", "--x"},       {"gradInput", "--out"},
    {"alpha", "--alpha"},        {"scale", "--scale"}, {"inputScale", "--input-scale"},
    {"isResult", "--is-result"}, {"numThreads", "--threads"}};

void RunEluGrad(const EluGradOptions& o) {
  CheckThreadsOption(o.threads, "--threads");
  CheckOutputPath(o.out_path, "--out");
  if (o.is_result && o.alpha < 0.0) {
    throw CliError(fmt::format(
        "--alpha is {} with --is-result: from the forward's output the gradient needs alpha >= 0 "
        "(with a negative alpha the output does not tell which branch x took); pass the "
        "forward's input as --x, without --is-result",
        o.alpha));
  }
  NpyArray dy_npy = ReadNpy(o.dy_path);
  NpyArray x_npy = ReadNpy(o.x_path);
  const DType dy_file = NpyFloatDType(dy_npy, "--dy");
  const DType x_file = NpyFloatDType(x_npy, "--x");
  const DType dtype = !o.dtype.empty()        ? ParseFloatDType(o.dtype, "--dtype")
                      : dy_file == DType::kF64 ? DType::kF32
                                               : dy_file;
  const DType out_dtype = o.out_dtype.empty() ? dtype : ParseFloatDType(o.out_dtype, "--out-dtype");
  if (out_dtype != dtype && out_dtype != DType::kF32) {
    throw CliError(fmt::format(
        "--out-dtype is {}, but the inputs are computed as {} ({}); the output can be {} or f32",
        ShortDTypeName(out_dtype), ShortDTypeName(dtype),
        o.dtype.empty() ? "the dtype of --dy's file; --dtype changes it" : "--dtype",
        ShortDTypeName(dtype)));
  }
  if (o.dtype.empty() && dy_file != x_file) {
    Warn(fmt::format("--dy holds {} and --x {}; both are computed as {} (--dtype sets it)",
                     DTypeName(dy_file), DTypeName(x_file), ShortDTypeName(dtype)));
  }

  auto dy = TakeAsDType(dy_npy, dtype, "--dy");
  auto x = TakeAsDType(x_npy, dtype, "--x");
  std::vector<uint8_t> y(static_cast<size_t>(dy_npy.elems() * ElementBytes(out_dtype)));
  TensorHandle dy_t = MakeTensor(dy_npy.shape, dtype, dy.data());
  TensorHandle x_t = MakeTensor(x_npy.shape, dtype, x.data());
  TensorHandle y_t = MakeTensor(dy_npy.shape, out_dtype, y.data());

  ThrowIfFailed(gkSetNumThreads(o.threads), kEluOptionNames);
  uint64_t workspace_size = 0;
  gkOpExecutor* raw_executor = nullptr;
  ThrowIfFailed(gkEluGradV2GetWorkspaceSize(dy_t.get(), x_t.get(), o.alpha, o.scale,
                                            o.input_scale, o.is_result, y_t.get(),
                                            &workspace_size, &raw_executor),
                kEluOptionNames);
  ExecutorHandle executor(raw_executor);
  std::vector<uint8_t> workspace(workspace_size);
  ThrowIfFailed(gkEluGradV2(workspace.data(), workspace_size, executor.get(), nullptr),
                kEluOptionNames);
  WriteNpyFromBuffer(o.out_path, y.data(), dy_npy.elems(), out_dtype, dy_npy.shape);
  if (out_dtype == DType::kBF16 && !o.quiet) {
    Note(fmt::format("{} holds the bfloat16 results widened to float32 (exactly; NumPy has no "
                     "bfloat16)",
                     o.out_path));
  }
}

struct EluPlanOptions {
  std::vector<int64_t> shape{1 << 20};
  std::string dtype = "f32", out_dtype;
  bool is_result = false, strided = false;
  double alpha = 1.0, scale = 1.0, input_scale = 1.0;
  int32_t threads = 0;
};

void PrintEluPlan(const EluPlanOptions& o) {
  CheckThreadsOption(o.threads, "--threads");
  int64_t elems = 1;
  for (int64_t d : o.shape) {
    if (d < 0 || __builtin_mul_overflow(elems, d, &elems)) {
      throw CliError(fmt::format("--shape {} is invalid", fmt::join(o.shape, ",")));
    }
  }
  const DType dtype = ParseFloatDType(o.dtype, "--dtype");
  const DType out_dtype = o.out_dtype.empty() ? dtype : ParseFloatDType(o.out_dtype, "--out-dtype");
  if (out_dtype != dtype && out_dtype != DType::kF32) {
    throw CliError(fmt::format("--out-dtype is {}, but --dtype is {}; the output can be {} or f32",
                               o.out_dtype, o.dtype, o.dtype));
  }
  EluGradV2Machine machine = DetectEluGradV2Machine();
  if (o.threads > 0) machine.threads = o.threads;
  const EluGradV2Problem problem{elems, dtype, out_dtype, o.is_result, !o.strided,
                                 FoldEluGradV2Coefficients(o.alpha, o.scale, o.input_scale)};
  std::printf("%s\n", EluGradV2PlanToJson(MakeEluGradV2Plan(problem, machine)).c_str());
}

struct EluBenchOptions {
  std::optional<int64_t> elems;
  std::string dtype;
  bool is_result = false, json = false;
  int32_t threads = 0;
  double min_seconds = 0.5;
};

void RunEluBench(const EluBenchOptions& o) {
  if (o.elems) CheckPositiveOption(*o.elems, "--elems");
  CheckThreadsOption(o.threads, "--threads");
  if (!(o.min_seconds > 0.0 && o.min_seconds <= 3600.0)) {
    throw CliError(fmt::format("--min-time is {}, it must be in (0, 3600] seconds", o.min_seconds));
  }
  const std::optional<DType> dtype =
      o.dtype.empty() ? std::nullopt : std::optional<DType>(ParseFloatDType(o.dtype, "--dtype"));
  const bool filtered = o.elems || dtype || o.is_result;
  const int32_t threads = o.threads > 0 ? o.threads : gkGetNumThreads();
  const auto cases = bench::EluGradV2BenchCases(
      o.elems, dtype, filtered ? std::optional<bool>(o.is_result) : std::nullopt, threads);
  if (!o.json) {
    std::printf("EluGradV2 on CPU (%s), %d threads; GB/s = bytes read + written per second\n",
                ChosenIsa().c_str(), threads);
    if (!bench::TorchPeerAvailable()) {
      std::printf("libtorch peer: skipped (%s)\n", bench::TorchPeerWhyAbsent().c_str());
    }
    std::printf("%-9s %-7s %10s %-20s %9s %9s %8s %9s %9s %9s %9s\n", "dtype", "mode", "elems",
                "plan", "GB/s", "copy", "vs copy", "torch", "vs torch", "sliced", "vs contig");
  }
  for (const auto& c : cases) {
    const auto r = bench::RunEluGradV2BenchCase(c, o.min_seconds);
    if (o.json) {
      std::printf("%s\n", bench::EluGradV2BenchJson(r).c_str());
    } else {
      std::printf("%-9s %-7s %10lld %-20s %9.2f %9.2f %7.0f%% %9s %9s %9s %9s\n",
                  std::string(DTypeName(c.dtype)).c_str(), c.is_result ? "result" : "exp",
                  static_cast<long long>(c.elems), r.mode.c_str(), r.gbps, r.copy_gbps,
                  100.0 * r.gbps / r.copy_gbps,
                  r.torch_gbps ? fmt::format("{:.2f}", *r.torch_gbps).c_str() : "-",
                  r.torch_gbps ? fmt::format("{:.2f}x", r.gbps / *r.torch_gbps).c_str() : "-",
                  r.sliced_gbps ? fmt::format("{:.2f}", *r.sliced_gbps).c_str() : "-",
                  r.sliced_gbps ? fmt::format("{:.0f}%", 100.0 * *r.sliced_gbps / r.gbps).c_str()
                                : "-");
    }
    std::fflush(stdout);
  }
}

}  // namespace

void RegisterEluGradV2Commands(CommandSet& commands) {
  auto run = std::make_shared<EluGradOptions>();
  auto* cmd = commands.app.add_subcommand("elu-grad", "EluGradV2: y = elu_backward(dy, x)");
  cmd->add_option("--dy", run->dy_path, "Upstream gradient (.npy)")->required();
  cmd->add_option("--x", run->x_path, "Forward input, or output with --is-result (.npy)")->required();
  cmd->add_option("--out", run->out_path,
                  "Output .npy, written whole or not at all: float16 stays float16, bfloat16 is "
                  "saved widened to float32 (NumPy has no bfloat16)")
      ->required();
  cmd->add_option("--alpha", run->alpha, "alpha (SELU: 1.6733)")->capture_default_str();
  cmd->add_option("--scale", run->scale, "scale (SELU: 1.0507)")->capture_default_str();
  cmd->add_option("--input-scale", run->input_scale, "input_scale")->capture_default_str();
  cmd->add_flag("--is-result", run->is_result, "--x holds the forward's output (needs alpha >= 0)");
  cmd->add_option("--dtype", run->dtype,
                  "Compute dtype f32|f16|bf16 (default: --dy's file; float64 files: f32)");
  cmd->add_option("--out-dtype", run->out_dtype, "Output dtype: --dtype's (default) or f32");
  cmd->add_option("--threads", run->threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", run->quiet, "No notes on stderr (warnings and errors remain)");
  cmd->callback([run] { RunEluGrad(*run); });

  auto plan = std::make_shared<EluPlanOptions>();
  auto* plan_cmd = commands.plan.add_subcommand("elu-grad", "Print the EluGradV2 plan as JSON");
  plan_cmd->add_option("--shape", plan->shape, "Dimensions, e.g. 4096,1024 (default 1048576)")
      ->delimiter(',');
  plan_cmd->add_option("--dtype", plan->dtype, "f32|f16|bf16");
  plan_cmd->add_option("--out-dtype", plan->out_dtype, "Output dtype");
  plan_cmd->add_flag("--is-result", plan->is_result, "isResult mode");
  plan_cmd->add_flag("--strided", plan->strided, "Plan for non-contiguous views");
  plan_cmd->add_option("--alpha", plan->alpha, "alpha");
  plan_cmd->add_option("--scale", plan->scale, "scale");
  plan_cmd->add_option("--input-scale", plan->input_scale, "input_scale");
  plan_cmd->add_option("--threads", plan->threads, "Threads");
  plan_cmd->callback([plan] { PrintEluPlan(*plan); });

  auto bench = std::make_shared<EluBenchOptions>();
  auto* bench_cmd = commands.bench.add_subcommand("elu-grad", "EluGradV2 GB/s vs copy and libtorch");
  bench_cmd->add_option("--elems", bench->elems,
                        "Only this element count (default: 4K, 64K, 1M, 16M, 64M)");
  bench_cmd->add_option("--dtype", bench->dtype, "Only this dtype (f32|f16|bf16)");
  bench_cmd->add_flag("--is-result", bench->is_result,
                      "With a filter: the isResult mode (else the exp mode)");
  bench_cmd->add_option("--threads", bench->threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
  bench_cmd->add_option("--min-time", bench->min_seconds, "Seconds per case, all candidates together (default 0.5)");
  bench_cmd->add_flag("--json", bench->json, "One JSON object per case and line");
  bench_cmd->callback([bench] { RunEluBench(*bench); });
}

}  // namespace gk::cli
