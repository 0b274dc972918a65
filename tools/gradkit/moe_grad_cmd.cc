// gradkit moe-grad | plan moe-grad | bench moe-grad, and the operator's part of `gradkit demo`.
#include <fmt/format.h>

#include <new>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>

#include "bench/moe_grad_bench.h"
#include "core/cpu_info.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_ref.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"
#include "tools/gradkit/demo.h"

namespace gk::cli {
namespace {

gkGroupListType ParseGroupListType(const std::string& text) {
  if (text == "count") return GK_GROUP_LIST_COUNT;
  if (text == "cumsum") return GK_GROUP_LIST_CUMSUM;
  throw CliError(fmt::format("--group-list-type is '{}', it must be count or cumsum", text));
}

// Runs the operator through its C API on contiguous buffers; returns gradX and the workspace size.
struct MoeGradRun {
  std::vector<float> grad_x;
  uint64_t workspace_bytes;
};
MoeGradRun RunMoeGradOp(const void* dy, const std::vector<int64_t>& dy_shape, const void* w,
                        const std::vector<int64_t>& w_shape, DType dtype, const void* idx,
                        const std::vector<int64_t>& idx_shape, DType idx_dtype,
                        const int64_t* groups, const std::vector<int64_t>& groups_shape,
                        int64_t batch, int64_t top_k, int64_t row_idx_type,
                        gkGroupListType group_list_type) {
  const int64_t k = w_shape.size() == 3 ? w_shape[1] : 0;
  // gradX is allocated before the library sees the arguments: refuse what cannot be allocated
  // here, as a user error (exit 2), rather than overflowing or dying of bad_alloc.
  int64_t out_bytes;
  if (__builtin_mul_overflow(std::max<int64_t>(batch, 0), k, &out_bytes) ||
      __builtin_mul_overflow(out_bytes, int64_t{4}, &out_bytes)) {
    throw CliError(fmt::format("--batch {} x K {} floats of gradX overflow 64 bits", batch, k));
  }
  // Refuse up front what cannot fit in memory (an allocator under a sanitizer aborts rather than
  // throw); bad_alloc below covers the rest.
  const int64_t memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (memory_bytes > 0 && out_bytes > memory_bytes) {
    throw CliError(fmt::format("--batch {} x K {}: gradX needs {} bytes, more than this machine's "
                               "{} bytes of memory",
                               batch, k, out_bytes, memory_bytes));
  }
  MoeGradRun run{{}, 0};
  try {
    run.grad_x.resize(static_cast<size_t>(out_bytes / 4));
  } catch (const std::bad_alloc&) {
    throw CliError(fmt::format("--batch {} x K {}: cannot allocate the {} bytes of gradX", batch,
                               k, out_bytes));
  }
  TensorHandle dy_t = MakeTensor(dy_shape, dtype, const_cast<void*>(dy));
  TensorHandle w_t = MakeTensor(w_shape, dtype, const_cast<void*>(w));
  TensorHandle idx_t = MakeTensor(idx_shape, idx_dtype, const_cast<void*>(idx));
  TensorHandle groups_t = MakeTensor(groups_shape, DType::kI64, const_cast<int64_t*>(groups));
  TensorHandle dx_t = MakeTensor({std::max<int64_t>(batch, 0), k}, DType::kF32, run.grad_x.data());
  gkOpExecutor* raw = nullptr;
  ThrowIfFailed(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
      dy_t.get(), w_t.get(), idx_t.get(), groups_t.get(), batch, top_k, static_cast<gkRowIdxType>(row_idx_type),
      group_list_type, dx_t.get(), &run.workspace_bytes, &raw));
  ExecutorHandle executor(raw);
  std::vector<uint8_t> workspace(run.workspace_bytes);
  ThrowIfFailed(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), run.workspace_bytes,
                                                  executor.get(), nullptr));
  return run;
}

struct MoeGradOptions {
  std::string dy_path, w_path, idx_path, groups_path, out_path;
  int64_t batch = 0, top_k = 0, row_idx_type = 0;
  std::string group_list_type = "count", dtype;
  int32_t threads = 0;
};

void RunMoeGrad(const MoeGradOptions& o) {
  const NpyArray dy_npy = ReadNpy(o.dy_path);
  const NpyArray w_npy = ReadNpy(o.w_path);
  const NpyArray idx_npy = ReadNpy(o.idx_path);
  const NpyArray groups_npy = ReadNpy(o.groups_path);
  const gkGroupListType group_list_type = ParseGroupListType(o.group_list_type);
  const DType file_dtype = NpyFloatDType(dy_npy, "--grad-y");
  NpyFloatDType(w_npy, "--weight");
  const DType dtype = !o.dtype.empty()             ? ParseFloatDType(o.dtype, "--dtype")
                      : file_dtype == DType::kF64 ? DType::kF32
                                                  : file_dtype;
  if (idx_npy.descr != "<i8" && idx_npy.descr != "<i4") {
    throw CliError(fmt::format("--expanded-row-idx holds {} values; <i8 or <i4 is required",
                               idx_npy.descr));
  }
  const DType idx_dtype = idx_npy.descr == "<i4" ? DType::kI32 : DType::kI64;
  const auto dy = ConvertNpyToDType(dy_npy, dtype, "--grad-y");
  const auto w = ConvertNpyToDType(w_npy, dtype, "--weight");
  const auto idx = ConvertNpyToIndex(idx_npy, idx_dtype, "--expanded-row-idx");
  const auto groups = ConvertNpyToIndex(groups_npy, DType::kI64, "--group-list");

  ThrowIfFailed(gkSetNumThreads(o.threads));
  const MoeGradRun run = RunMoeGradOp(
      dy.data(), dy_npy.shape, w.data(), w_npy.shape, dtype, idx.data(), idx_npy.shape, idx_dtype,
      reinterpret_cast<const int64_t*>(groups.data()), groups_npy.shape, o.batch, o.top_k,
      o.row_idx_type, group_list_type);
  const int64_t k = w_npy.shape[1];
  WriteNpyAtomic(o.out_path, NpyFromBuffer(run.grad_x.data(), o.batch * k, DType::kF32, {o.batch, k}));
}

// The benchmark shapes, also the defaults of `plan moe-grad`.
struct MoeShapePreset {
  const char* name;
  int64_t batch, top_k, g, k, n;
};
constexpr MoeShapePreset kPresets[] = {{"S1", 4096, 2, 8, 2048, 1408},
                                       {"S2", 2048, 8, 64, 2048, 768},
                                       {"S3", 1024, 8, 60, 7168, 2048},
                                       {"S4", 4096, 2, 8, 2048, 1408}};

struct MoePlanOptions {
  std::string shape = "S1", dtype = "f32", group_list_type = "count";
  std::optional<int64_t> batch, top_k, g, k, n, m;
  int64_t row_idx_type = 0;
  int32_t threads = 0;
};

void PrintMoePlan(const MoePlanOptions& o) {
  const MoeShapePreset* preset = nullptr;
  for (const auto& p : kPresets) {
    if (o.shape == p.name) preset = &p;
  }
  if (preset == nullptr) throw CliError(fmt::format("--shape is '{}', it must be S1..S4", o.shape));
  MoeGradShape s{};
  s.batch = o.batch.value_or(preset->batch);
  s.top_k = o.top_k.value_or(preset->top_k);
  s.g = o.g.value_or(preset->g);
  s.k = o.k.value_or(preset->k);
  s.n = o.n.value_or(preset->n);
  const struct {
    const char* option;
    int64_t value;
  } positive[] = {{"--batch", s.batch}, {"--topk", s.top_k}, {"--experts", s.g}, {"--k", s.k},
                  {"--n", s.n}};
  for (const auto& [option, value] : positive) {
    if (value <= 0) throw CliError(fmt::format("{} is {}, it must be > 0", option, value));
  }
  if (__builtin_mul_overflow(s.batch, s.top_k, &s.m)) {
    throw CliError(fmt::format("--batch {} * --topk {} overflows int64", s.batch, s.top_k));
  }
  s.m = o.m.value_or(s.m);
  if (s.m < 0 || s.m > s.batch * s.top_k) {
    throw CliError(fmt::format("--m is {}, it must be in [0, batch * topK = {}]", s.m,
                               s.batch * s.top_k));
  }
  if (o.row_idx_type != 0 && o.row_idx_type != 1) {
    throw CliError(fmt::format("--row-idx-type is {}, it must be 0 or 1", o.row_idx_type));
  }
  s.dtype = ParseFloatDType(o.dtype, "--dtype");
  s.index_dtype = DType::kI64;
  s.row_idx_type = static_cast<RowIdxType>(o.row_idx_type);
  s.group_list_type = static_cast<GroupListType>(ParseGroupListType(o.group_list_type));
  s.l = s.row_idx_type == RowIdxType::kGather ? s.m : s.batch * s.top_k;
  if (o.threads < 0) throw CliError(fmt::format("--threads is {}, it must be >= 0", o.threads));
  MoeGradMachine machine = DetectMoeGradMachine(s);
  if (o.threads > 0) machine.threads = o.threads;
  std::printf("%s\n", MoeGradPlanToJson(MakeMoeGradPlan(s, machine)).c_str());
}

struct MoeBenchOptions {
  std::string shape, dtype;
  int32_t threads = 0;
  bool json = false;
  double min_seconds = 0.5;
};

std::string MiB(uint64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

void RunMoeBench(const MoeBenchOptions& o) {
  const std::optional<std::string> shape =
      o.shape.empty() ? std::nullopt : std::optional<std::string>(o.shape);
  if (shape && *shape != "S1" && *shape != "S2" && *shape != "S3" && *shape != "S4") {
    throw CliError(fmt::format("--shape is '{}', it must be S1..S4", *shape));
  }
  const std::optional<DType> dtype =
      o.dtype.empty() ? std::nullopt : std::optional<DType>(ParseFloatDType(o.dtype, "--dtype"));
  if (o.threads < 0) throw CliError(fmt::format("--threads is {}, it must be >= 0", o.threads));
  const int32_t threads = o.threads > 0 ? o.threads : gkGetNumThreads();
  if (!o.json) {
    std::printf("MoeInitRoutingGroupedMatmulGrad on CPU (%s, %s), %d threads; GFLOP/s = 2 M N K "
                "per second\n",
                ChosenIsa().c_str(), MoeGemmLibraryName().c_str(), threads);
    std::printf("%-3s %-9s %6s %9s %9s %7s %9s %8s %9s %8s %11s %11s\n", "", "dtype", "M", "fused",
                "dense", "vs dense", "unfused", "vs unf.", "torch", "vs torch", "workspace",
                "[M,K] f32");
  }
  for (const auto& c : bench::MoeGradBenchCases(shape, dtype, threads)) {
    const auto r = bench::RunMoeGradBenchCase(c, o.min_seconds);
    if (o.json) {
      std::printf("%s\n", bench::MoeGradBenchJson(r).c_str());
    } else {
      const auto opt = [](std::optional<double> v) {
        return v ? fmt::format("{:.1f}", *v) : std::string("-");
      };
      const auto ratio = [&](std::optional<double> v) {
        return v ? fmt::format("{:.0f}%", 100.0 * r.gflops / *v) : std::string("-");
      };
      std::printf("%-3s %-9s %6lld %9.1f %9s %7s %9s %8s %9s %8s %11s %11s\n", c.shape.c_str(),
                  std::string(DTypeName(c.dtype)).c_str(), static_cast<long long>(r.m), r.gflops,
                  opt(r.dense_gflops).c_str(), ratio(r.dense_gflops).c_str(),
                  opt(r.unfused_gflops).c_str(), ratio(r.unfused_gflops).c_str(),
                  opt(r.torch_gflops).c_str(), ratio(r.torch_gflops).c_str(),
                  MiB(r.workspace_bytes).c_str(), MiB(r.unfused_bytes).c_str());
    }
    std::fflush(stdout);
  }
}

}  // namespace

void RegisterMoeGradCommands(CommandSet& commands) {
  auto run = std::make_shared<MoeGradOptions>();
  auto* cmd = commands.app.add_subcommand(
      "moe-grad", "MoeInitRoutingGroupedMatmulGrad: gradX = scatter_add(gradY @ weight^T)");
  cmd->add_option("--grad-y", run->dy_path, "gradY [M, N] (.npy, float)")->required();
  cmd->add_option("--weight", run->w_path, "weight [G, K, N] (.npy, float)")->required();
  cmd->add_option("--expanded-row-idx", run->idx_path, "expandedRowIdx [L] (.npy, <i8 or <i4)")
      ->required();
  cmd->add_option("--group-list", run->groups_path, "groupList [G] (.npy, integer)")->required();
  cmd->add_option("--batch", run->batch, "Tokens (rows of gradX)")->required();
  cmd->add_option("--topk", run->top_k, "Experts per token")->required();
  cmd->add_option("--row-idx-type", run->row_idx_type, "0: gather (expanded -> original), 1: scatter");
  cmd->add_option("--group-list-type", run->group_list_type, "count (default) | cumsum");
  cmd->add_option("--dtype", run->dtype, "Compute dtype f32|f16|bf16 (default: gradY's; f64 -> f32)");
  cmd->add_option("--threads", run->threads, "Threads (default: GRADKIT_NUM_THREADS or cores)");
  cmd->add_option("--out", run->out_path, "Output gradX [batch, K] (.npy, float32)")->required();
  cmd->callback([run] { RunMoeGrad(*run); });

  auto plan = std::make_shared<MoePlanOptions>();
  auto* plan_cmd = commands.plan.add_subcommand("moe-grad", "Print the MoE backward plan as JSON");
  plan_cmd->add_option("--shape", plan->shape, "Preset S1..S4 (default S1); the options below override it");
  plan_cmd->add_option("--batch", plan->batch, "Tokens");
  plan_cmd->add_option("--topk", plan->top_k, "Experts per token");
  plan_cmd->add_option("--experts", plan->g, "G");
  plan_cmd->add_option("--k", plan->k, "K (gradX columns)");
  plan_cmd->add_option("--n", plan->n, "N (gradY columns)");
  plan_cmd->add_option("--m", plan->m, "M expanded rows (default batch * topK)");
  plan_cmd->add_option("--dtype", plan->dtype, "f32|f16|bf16");
  plan_cmd->add_option("--row-idx-type", plan->row_idx_type, "0 | 1");
  plan_cmd->add_option("--group-list-type", plan->group_list_type, "count | cumsum");
  plan_cmd->add_option("--threads", plan->threads,
                       "Threads to plan for, any count (default: configured); the plan shows the "
                       "units, their load_balance (max / mean units per thread) and the workspace");
  plan_cmd->callback([plan] { PrintMoePlan(*plan); });

  auto bench = std::make_shared<MoeBenchOptions>();
  auto* bench_cmd = commands.bench.add_subcommand(
      "moe-grad", "MoE backward GFLOP/s vs dense GEMM, the unfused composite and libtorch");
  bench_cmd->add_option("--shape", bench->shape, "Only this shape (S1..S4)");
  bench_cmd->add_option("--dtype", bench->dtype, "Only this dtype (f32|f16|bf16)");
  bench_cmd->add_option("--threads", bench->threads, "Threads (default: configured)");
  bench_cmd->add_option("--min-time", bench->min_seconds, "Seconds per case (default 0.5)");
  bench_cmd->add_flag("--json", bench->json, "One JSON object per case and line");
  bench_cmd->callback([bench] { RunMoeBench(*bench); });
}

void RunMoeGradDemo() {
  constexpr int64_t kBatch = 512, kTopK = 4, kG = 16, kK = 384, kN = 256;
  std::printf("\nMoeInitRoutingGroupedMatmulGrad (MoE input gradient, fused scatter-add), batch %lld,"
              " topK %lld, %lld experts, K %lld, N %lld,\nchecked element by element against a "
              "float64 evaluation; gradX must be within 1e-5 x sum|dy * w| of it:\n\n",
              static_cast<long long>(kBatch), static_cast<long long>(kTopK),
              static_cast<long long>(kG), static_cast<long long>(kK), static_cast<long long>(kN));
  MoeGradRoutingSpec spec;
  spec.batch = kBatch;
  spec.top_k = kTopK;
  spec.g = kG;
  spec.keep = 0.95;
  const MoeGradRouting routing = MakeMoeGradRouting(spec);
  const int64_t m = routing.m;
  std::vector<float> dy_f(static_cast<size_t>(m * kN)), w_f(static_cast<size_t>(kG * kK * kN));
  std::mt19937 generator(5);
  std::uniform_real_distribution<float> values(-1.0f, 1.0f);
  for (float& v : dy_f) v = values(generator);
  for (float& v : w_f) v = values(generator);
  std::vector<std::vector<int64_t>> rows_of_token(static_cast<size_t>(kBatch));
  for (int64_t i = 0; i < m; ++i) rows_of_token[routing.row_token[i]].push_back(i);

  std::printf("  %-9s %-24s %10s\n", "dtype", "accuracy", "time");
  uint64_t workspace_bytes = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> dy(dy_f.size() * ElementBytes(dtype)), w(w_f.size() * ElementBytes(dtype));
    std::vector<float> dy_r(dy_f.size()), w_r(w_f.size());  // the values the operator sees
    for (size_t i = 0; i < dy_f.size(); ++i) {
      StoreFromF32(dy.data(), i, dtype, dy_f[i]);
      dy_r[i] = LoadAsF32(dy.data(), i, dtype);
    }
    for (size_t i = 0; i < w_f.size(); ++i) {
      StoreFromF32(w.data(), i, dtype, w_f[i]);
      w_r[i] = LoadAsF32(w.data(), i, dtype);
    }
    const auto start = std::chrono::steady_clock::now();
    const MoeGradRun run = RunMoeGradOp(dy.data(), {m, kN}, w.data(), {kG, kK, kN}, dtype,
                                        routing.gather_idx.data(), {m}, DType::kI64,
                                        routing.group_counts.data(), {kG}, kBatch, kTopK, 0,
                                        GK_GROUP_LIST_COUNT);
    const double ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3;
    workspace_bytes = run.workspace_bytes;
    int64_t within = 0;
    for (int64_t b = 0; b < kBatch; ++b) {
      const auto ref = MoeGradReferenceRow(dy_r.data(), w_r.data(), kN, kK, rows_of_token[b],
                                           routing.row_expert);
      for (int64_t kk = 0; kk < kK; ++kk) {
        within += MoeGradWithinContract(run.grad_x[b * kK + kk], ref.value[kk], ref.magnitude[kk]);
      }
    }
    std::printf("  %-9s %-24s %8.1f ms\n", std::string(DTypeName(dtype)).c_str(),
                fmt::format("{}/{} within contract", within, kBatch * kK).c_str(), ms);
    if (within != kBatch * kK) throw CliError("MoeInitRoutingGroupedMatmulGrad demo: accuracy contract broken");
  }
  const uint64_t expanded_bytes = static_cast<uint64_t>(m) * kK * 4;
  std::printf("\n  memory: workspace %.1f KiB instead of the %.1f KiB [M, K] float32 d_expanded_x "
              "of the unfused path (%.1fx less)\n",
              workspace_bytes / 1024.0, expanded_bytes / 1024.0,
              static_cast<double>(expanded_bytes) / static_cast<double>(workspace_bytes));
  // The seed's motivating size, from the plan alone: M = 108 K tokens, K = 7168.
  MoeGradShape big{};
  big.batch = 55296, big.top_k = 2, big.m = 110592, big.g = 60, big.k = 7168, big.n = 2048;
  big.l = big.m, big.dtype = DType::kBF16, big.index_dtype = DType::kI64;
  big.row_idx_type = RowIdxType::kGather, big.group_list_type = GroupListType::kCount;
  const MoeGradPlan plan = MakeMoeGradPlan(big, DetectMoeGradMachine(big));
  const uint64_t big_expanded = static_cast<uint64_t>(big.m) * big.k * 4;
  std::printf("  at the seed's size (M 110592, K 7168, N 2048, G 60, bf16, %d threads): workspace "
              "%.1f MiB instead of %.2f GiB\n",
              plan.threads, plan.workspace_bytes / 1048576.0, big_expanded / 1073741824.0);
}

}  // namespace gk::cli
