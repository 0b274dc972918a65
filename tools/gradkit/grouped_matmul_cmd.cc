// gradkit grouped-matmul | grouped-matmul-weight-grad, and their entries under `plan` (and
// `bench`, in bench/grouped_matmul_bench.cc's terms).
#include <algorithm>
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "bench/grouped_matmul_bench.h"
#include "core/cpu_info.h"
#include "gradkit/grouped_matmul.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/grouped_matmul/grouped_matmul_plan.h"
#include "tools/gradkit/bench_cases.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"


namespace gk::cli {
namespace {

// The C API's argument names -> the options of the two commands.
constexpr OptionName kForwardNames[] = {
    {"x", "--x"},
    {"weight", "--weight"},
    {"groupList", "--group-list"},
    {"groupListType", "--group-list-type"},
    {"transposeWeight", "--transpose-weight"},
    {"expandedRowIdx", "--expanded-row-idx"},
    {"rowIdxType", "--row-idx-type"},
    {"topK", "--topk"},
    {"y", "--out"},
    {"numThreads", "--threads"}};
constexpr OptionName kWeightGradNames[] = {
    {"x", "--x"},
    {"gradY", "--grad-y"},
    {"groupList", "--group-list"},
    {"groupListType", "--group-list-type"},
    {"expandedRowIdx", "--expanded-row-idx"},
    {"rowIdxType", "--row-idx-type"},
    {"topK", "--topk"},
    {"gradWeight", "--out"},
    {"gradWeightRef", "--add-to"},
    {"numThreads", "--threads"}};

gkGroupListType ParseGroupListType(const std::string& text) {
  if (text == "count") return GK_GROUP_LIST_COUNT;
  if (text == "cumsum") return GK_GROUP_LIST_CUMSUM;
  throw CliError(fmt::format("--group-list-type is '{}', it must be count or cumsum", text));
}

struct GroupedMatmulOptions {
  bool weight_grad = false;
  std::string x_path, operand_path, groups_path, idx_path, out_path;
  std::string add_to_path;  // weight grad: GroupedMatmulWeightGradAdd into this gradient
  std::string group_list_type = "count", dtype, out_dtype;
  bool transpose_weight = false;
  std::optional<int64_t> row_idx_type, top_k;
  int32_t threads = 0;
};

void RunGroupedMatmulCommand(const GroupedMatmulOptions& o) {
  const std::span<const OptionName> names =
      o.weight_grad ? std::span<const OptionName>(kWeightGradNames)
                    : std::span<const OptionName>(kForwardNames);
  const char* operand_option = o.weight_grad ? "--grad-y" : "--weight";
  CheckThreadsOption(o.threads, "--threads");
  CheckOutputPath(o.out_path, "--out");
  const gkGroupListType group_list_type = ParseGroupListType(o.group_list_type);
  const bool gather_fused = !o.idx_path.empty();
  if (!gather_fused && (o.row_idx_type || o.top_k)) {
    throw CliError(fmt::format("{} is given without --expanded-row-idx; it describes the "
                               "expanded-row index of a gather-fused --x (the token matrix)",
                               o.top_k ? "--topk" : "--row-idx-type"));
  }
  if (gather_fused && !o.top_k) {
    throw CliError("--expanded-row-idx needs --topk (experts per token): the slot p of token b "
                   "and its j-th expert is b * topk + j");
  }
  const int64_t row_idx_type = o.row_idx_type.value_or(0);
  if (row_idx_type != 0 && row_idx_type != 1) {
    throw CliError(fmt::format("--row-idx-type is {}, it must be 0 (gather: row -> slot) or 1 "
                               "(scatter: slot -> row, -1 when dropped)",
                               row_idx_type));
  }
  NpyArray x_npy = ReadNpy(o.x_path);
  NpyArray operand_npy = ReadNpy(o.operand_path);
  NpyArray groups_npy = ReadNpy(o.groups_path);
  std::optional<NpyArray> idx_npy;
  if (gather_fused) idx_npy = ReadNpy(o.idx_path);
  const DType x_file = NpyFloatDType(x_npy, "--x");
  const DType operand_file = NpyFloatDType(operand_npy, operand_option);
  const DType dtype = !o.dtype.empty()        ? ParseFloatDType(o.dtype, "--dtype")
                      : x_file == DType::kF64 ? DType::kF32
                                              : x_file;
  if (o.dtype.empty() && x_file != operand_file) {
    Warn(fmt::format("--x holds {} and {} {}; both are computed as {} (--dtype sets it)",
                     DTypeName(x_file), operand_option, DTypeName(operand_file),
                     ShortDTypeName(dtype)));
  }
  // Forward: the result in the compute dtype unless asked; weight grad: float32 unless asked.
  DType out_dtype = o.weight_grad ? DType::kF32 : dtype;
  if (!o.out_dtype.empty()) {
    out_dtype = ParseFloatDType(o.out_dtype, "--out-dtype");
    if (out_dtype != DType::kF32 && out_dtype != dtype) {
      throw CliError(fmt::format("--out-dtype is {}; it must be f32 or the compute dtype, {}",
                                 o.out_dtype, ShortDTypeName(dtype)));
    }
  }
  DType idx_dtype = DType::kI64;
  if (idx_npy) {
    if (idx_npy->descr != "<i8" && idx_npy->descr != "<i4") {
      throw CliError(fmt::format("--expanded-row-idx holds {} values; <i8 or <i4 is required",
                                 idx_npy->descr));
    }
    idx_dtype = idx_npy->descr == "<i4" ? DType::kI32 : DType::kI64;
  }
  const auto x = TakeAsDType(x_npy, dtype, "--x");
  const auto operand = TakeAsDType(operand_npy, dtype, operand_option);
  const auto groups = TakeAsIndex(groups_npy, DType::kI64, "--group-list");
  std::vector<uint8_t> idx;
  if (idx_npy) idx = TakeAsIndex(*idx_npy, idx_dtype, "--expanded-row-idx");

  // The output's shape, from the inputs' (the library checks them all; a shape it would refuse
  // only needs to be allocatable here).
  std::vector<int64_t> out_shape;
  const auto dim = [](const NpyArray& a, size_t d) { return d < a.shape.size() ? a.shape[d] : 0; };
  if (o.weight_grad) {
    out_shape = {groups_npy.shape.empty() ? 0 : groups_npy.shape[0], dim(x_npy, 1), dim(operand_npy, 1)};
  } else {
    // Gather-fused: y has the group list's total rows (a list the library refuses gives no y).
    int64_t m = dim(x_npy, 0);
    if (gather_fused) {
      const auto* g = reinterpret_cast<const int64_t*>(groups.data());
      m = 0;
      for (int64_t e = 0; e < groups_npy.elems(); ++e) {
        if (group_list_type == GK_GROUP_LIST_CUMSUM) {
          m = g[e];
        } else if (__builtin_add_overflow(m, g[e], &m)) {
          throw CliError("--group-list: the row counts overflow int64");
        }
      }
    }
    out_shape = {std::max<int64_t>(m, 0), dim(operand_npy, o.transpose_weight ? 1 : 2)};
  }
  int64_t out_elems = 1;
  for (int64_t d : out_shape) {
    if (d < 0 || __builtin_mul_overflow(out_elems, d, &out_elems) || out_elems > (int64_t{1} << 40)) {
      throw CliError(fmt::format("--out would have shape [{}]: too large to allocate",
                                 fmt::join(out_shape, ", ")));
    }
  }
  const bool add = o.weight_grad && !o.add_to_path.empty();
  std::vector<uint8_t> out;
  if (add) {  // the gradient added into, in the output dtype, with its own shape (checked there)
    NpyArray add_npy = ReadNpy(o.add_to_path);
    NpyFloatDType(add_npy, "--add-to");  // refuses a file that is not float
    out = TakeAsDType(add_npy, out_dtype, "--add-to");
    out_shape = add_npy.shape;
    out_elems = add_npy.elems();
  } else {
    out.resize(static_cast<size_t>(out_elems * ElementBytes(out_dtype)));
  }

  TensorHandle x_t = MakeTensor(x_npy.shape, dtype, const_cast<uint8_t*>(x.data()));
  TensorHandle operand_t = MakeTensor(operand_npy.shape, dtype, const_cast<uint8_t*>(operand.data()));
  TensorHandle groups_t = MakeTensor(groups_npy.shape, DType::kI64, const_cast<uint8_t*>(groups.data()));
  TensorHandle idx_t;
  if (idx_npy) idx_t = MakeTensor(idx_npy->shape, idx_dtype, idx.data());
  TensorHandle out_t = MakeTensor(out_shape, out_dtype, out.data());
  ThrowIfFailed(gkSetNumThreads(o.threads), names);
  uint64_t workspace_bytes = 0;
  gkOpExecutor* raw = nullptr;
  const auto row_type = static_cast<gkRowIdxType>(row_idx_type);
  if (o.weight_grad) {
    const auto plan = add ? gkGroupedMatmulWeightGradAddGetWorkspaceSize
                          : gkGroupedMatmulWeightGradGetWorkspaceSize;
    ThrowIfFailed(plan(x_t.get(), operand_t.get(), groups_t.get(), group_list_type, idx_t.get(),
                       row_type, o.top_k.value_or(1), out_t.get(), &workspace_bytes, &raw),
                  names);
  } else {
    ThrowIfFailed(gkGroupedMatmulGetWorkspaceSize(x_t.get(), operand_t.get(), groups_t.get(),
                                                  group_list_type, o.transpose_weight, idx_t.get(),
                                                  row_type, o.top_k.value_or(1), out_t.get(),
                                                  &workspace_bytes, &raw),
                  names);
  }
  ExecutorHandle executor(raw);
  std::vector<uint8_t> workspace(workspace_bytes);
  const auto run = add              ? gkGroupedMatmulWeightGradAdd
                   : o.weight_grad ? gkGroupedMatmulWeightGrad
                                   : gkGroupedMatmul;
  ThrowIfFailed(run(workspace.data(), workspace_bytes, executor.get(), nullptr), names);
  WriteNpyFromBuffer(o.out_path, out.data(), out_elems, out_dtype, out_shape);
}

// The fused op's benchmark shapes, also the defaults of `plan grouped-matmul`.
struct ShapePreset {
  const char* name;
  int64_t batch, top_k, g, k, n;
};
constexpr ShapePreset kPresets[] = {{"S1", 4096, 2, 8, 2048, 1408},
                                    {"S2", 2048, 8, 64, 2048, 768},
                                    {"S3", 1024, 8, 60, 7168, 2048},
                                    {"S4", 4096, 2, 8, 2048, 1408}};

struct PlanOptions {
  bool weight_grad = false;
  std::string preset = "S1", dtype = "f32", out_dtype, group_list_type = "count";
  std::optional<int64_t> batch, top_k, g, k, n, m;
  std::optional<int64_t> row_idx_type;  // given: gather-fused
  bool transpose_weight = false;
  int32_t threads = 0;
};

void PrintPlan(const PlanOptions& o) {
  const ShapePreset* preset = nullptr;
  for (const auto& p : kPresets) {
    if (o.preset == p.name) preset = &p;
  }
  if (preset == nullptr) throw CliError(fmt::format("--preset is '{}', it must be S1..S4", o.preset));
  GroupedMatmulShape s{};
  s.op = o.weight_grad ? GroupedMatmulOp::kWeightGrad : GroupedMatmulOp::kForward;
  const int64_t batch = o.batch.value_or(preset->batch), top_k = o.top_k.value_or(preset->top_k);
  s.g = o.g.value_or(preset->g);
  s.k = o.k.value_or(preset->k);
  s.n = o.n.value_or(preset->n);
  const struct {
    const char* option;
    int64_t value;
  } positive[] = {{"--batch", batch}, {"--topk", top_k}, {"--experts", s.g}, {"--k", s.k}, {"--n", s.n}};
  for (const auto& [option, value] : positive) {
    if (value <= 0 || value > (int64_t{1} << 31)) {
      throw CliError(fmt::format("{} is {}, it must be in [1, 2^31]", option, value));
    }
  }
  s.m = o.m.value_or(batch * top_k);
  if (s.m < 0 || s.m > batch * top_k) {
    throw CliError(fmt::format("--m is {}, it must be in [0, batch * topK = {}]", s.m, batch * top_k));
  }
  s.dtype = ParseFloatDType(o.dtype, "--dtype");
  s.out_dtype = o.out_dtype.empty() ? (o.weight_grad ? DType::kF32 : s.dtype)
                                    : ParseFloatDType(o.out_dtype, "--out-dtype");
  s.gather_fused = o.row_idx_type.has_value();
  s.weight_nk = !o.weight_grad && o.transpose_weight;
  s.x_rows = s.gather_fused ? batch : s.m;
  MoeGradShape& r = s.routing;
  r.m = s.m, r.g = s.g, r.k = s.k, r.n = s.n, r.dtype = s.dtype;
  r.group_list_type = static_cast<GroupListType>(ParseGroupListType(o.group_list_type));
  r.index_dtype = DType::kI64;
  if (s.gather_fused) {
    if (*o.row_idx_type != 0 && *o.row_idx_type != 1) {
      throw CliError(fmt::format("--row-idx-type is {}, it must be 0 or 1", *o.row_idx_type));
    }
    r.batch = batch, r.top_k = top_k;
    r.row_idx_type = static_cast<RowIdxType>(*o.row_idx_type);
    r.l = r.row_idx_type == RowIdxType::kGather ? s.m : batch * top_k;
  } else {
    r.batch = std::max<int64_t>(s.m, 1), r.top_k = 1, r.row_idx_type = RowIdxType::kGather;
  }
  CheckThreadsOption(o.threads, "--threads");
  GroupedMatmulMachine machine = DetectGroupedMatmulMachine(s);
  if (o.threads > 0) machine.threads = o.threads;
  std::printf("%s\n", GroupedMatmulPlanToJson(MakeGroupedMatmulPlan(s, machine)).c_str());
}

void AddCommonOptions(CLI::App& cmd, GroupedMatmulOptions& o) {
  cmd.add_option("--group-list", o.groups_path,
                 "groupList [G] (.npy, integer): rows per expert (count) or their running total "
                 "(cumsum), e.g. bincount(topk_ids.flatten())")
      ->required();
  cmd.add_option("--group-list-type", o.group_list_type, "count | cumsum")->capture_default_str();
  cmd.add_option("--expanded-row-idx", o.idx_path,
                 "Gather-fused: --x is the token matrix [batch, K] and this index (.npy, <i8 or "
                 "<i4) maps the expanded rows to it (see --row-idx-type)");
  cmd.add_option("--row-idx-type", o.row_idx_type,
                 "0: gather (row -> slot token * topk + j; default), 1: scatter (slot -> row, -1 "
                 "for a dropped slot)");
  cmd.add_option("--topk", o.top_k, "Experts per token (with --expanded-row-idx)");
  cmd.add_option("--dtype", o.dtype,
                 "Compute dtype f32|f16|bf16 (default: --x's file; float64 files: f32)");
  cmd.add_option("--threads", o.threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
}

void AddPlanOptions(CLI::App& cmd, PlanOptions& o) {
  cmd.add_option("--preset", o.preset,
                 "Shape preset S1..S4 (the fused MoE backward's benchmark shapes); the options "
                 "below override its dimensions")
      ->capture_default_str();
  cmd.add_option("--batch", o.batch, "Tokens");
  cmd.add_option("--topk", o.top_k, "Experts per token");
  cmd.add_option("--experts", o.g, "G");
  cmd.add_option("--k", o.k, "K (x's columns)");
  cmd.add_option("--n", o.n, "N");
  cmd.add_option("--m", o.m, "M expanded rows (default batch * topK)");
  cmd.add_option("--dtype", o.dtype, "f32|f16|bf16")->capture_default_str();
  cmd.add_option("--out-dtype", o.out_dtype, "f32 or the dtype");
  cmd.add_option("--row-idx-type", o.row_idx_type, "Gather-fused x with this index type (0 | 1)");
  cmd.add_option("--group-list-type", o.group_list_type, "count | cumsum")->capture_default_str();
  cmd.add_option("--threads", o.threads, "Threads to plan for (default: configured)");
}

struct BenchOptions {
  bool weight_grad = false;
  bool transpose_weight = false;
  BenchShapeOptions shape;
  std::string dtype;
  int32_t threads = 0;
  bool json = false;
  double min_seconds = 0.5;
};

void RunBench(const BenchOptions& o) {
  const std::optional<DType> dtype =
      o.dtype.empty() ? std::nullopt : std::optional<DType>(ParseFloatDType(o.dtype, "--dtype"));
  CheckThreadsOption(o.threads, "--threads");
  if (!(o.min_seconds > 0.0 && o.min_seconds <= 3600.0)) {
    throw CliError(fmt::format("--min-time is {}, it must be in (0, 3600] seconds", o.min_seconds));
  }
  const int32_t threads = o.threads > 0 ? o.threads : gkGetNumThreads();
  const auto cases = BenchCases(o.shape, dtype, threads);
  if (!o.json) {
    std::printf("%s on CPU (%s, %s), %d threads; GFLOP/s = 2 M N K per second; gathered: x read "
                "from the token matrix through expandedRowIdx%s\n",
                o.weight_grad ? "GroupedMatmulWeightGrad" : "GroupedMatmul", ChosenIsa().c_str(),
                MoeGemmLibraryName().c_str(), threads,
                o.transpose_weight ? "; weight stored [G, N, K]" : "");
    std::printf("%-4s %-9s %6s %9s %9s %9s %9s %10s %11s\n", "", "dtype", "M", "plain", "gathered",
                "dense", "vs dense", "gath/plain", "workspace");
  }
  for (const auto& c : cases) {
    const auto r = bench::RunGroupedMatmulBenchCase(c, o.weight_grad, o.min_seconds, o.transpose_weight);
    if (o.json) {
      std::printf("%s\n", bench::GroupedMatmulBenchJson(r).c_str());
    } else {
      std::printf("%-4s %-9s %6lld %9.1f %9.1f %9.1f %8.0f%% %9.0f%% %7.1f MiB\n", c.shape.c_str(),
                  std::string(DTypeName(c.dtype)).c_str(), static_cast<long long>(r.m),
                  r.plain_gflops, r.gathered_gflops, r.dense_gflops,
                  100.0 * r.plain_gflops / r.dense_gflops,
                  100.0 * r.gathered_gflops / r.plain_gflops, r.workspace_bytes / 1048576.0);
    }
    std::fflush(stdout);
  }
}

void AddBenchCommand(CLI::App& bench, bool weight_grad) {
  auto o = std::make_shared<BenchOptions>();
  o->weight_grad = weight_grad;
  auto* cmd = bench.add_subcommand(
      weight_grad ? "grouped-matmul-weight-grad" : "grouped-matmul",
      weight_grad ? "GroupedMatmulWeightGrad GFLOP/s, plain and gathered x, vs a dense GEMM"
                  : "GroupedMatmul GFLOP/s, plain and gathered x, vs a dense GEMM");
  AddBenchShapeOptions(*cmd, o->shape, "K (x's columns)",
                       weight_grad ? "N (gradY's columns)" : "N (y's columns)");
  cmd->add_option("--dtype", o->dtype, "Only this dtype (f32|f16|bf16)");
  cmd->add_option("--threads", o->threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
  cmd->add_option("--min-time", o->min_seconds, "Seconds per case (default 0.5)");
  cmd->add_flag("--json", o->json, "One JSON object per case and line");
  if (!weight_grad) {
    cmd->add_flag("--transpose-weight", o->transpose_weight,
                  "Weight stored [G, N, K] (nn.Linear's layout) instead of [G, K, N]");
  }
  cmd->callback([o] { RunBench(*o); });
}

}  // namespace

void RegisterGroupedMatmulCommands(CommandSet& commands) {
  auto fwd = std::make_shared<GroupedMatmulOptions>();
  auto* cmd = commands.app.add_subcommand(
      "grouped-matmul", "GroupedMatmul: y[i] = x[i] @ weight[g(i)], rows grouped by expert");
  cmd->add_option("--x", fwd->x_path,
                  "x [M, K] (.npy, float), or the token matrix [batch, K] with --expanded-row-idx")
      ->required();
  cmd->add_option("--weight", fwd->operand_path,
                  "weight [G, K, N] (.npy, float), or [G, N, K] with --transpose-weight")
      ->required();
  cmd->add_flag("--transpose-weight", fwd->transpose_weight,
                "--weight holds [G, N, K] (nn.Linear's layout): y[i] = x[i] @ weight[g(i)]^T");
  AddCommonOptions(*cmd, *fwd);
  cmd->add_option("--out-dtype", fwd->out_dtype, "y's dtype: f32 or the compute dtype (default)");
  cmd->add_option("--out", fwd->out_path,
                  "Output y [M, N] (.npy: float16 stays <f2, bfloat16 is saved as <f4)")
      ->required();
  cmd->callback([fwd] { RunGroupedMatmulCommand(*fwd); });

  auto wg = std::make_shared<GroupedMatmulOptions>();
  wg->weight_grad = true;
  auto* wg_cmd = commands.app.add_subcommand(
      "grouped-matmul-weight-grad",
      "GroupedMatmulWeightGrad: gradWeight[g] = x_g^T @ gradY_g (zeros for empty experts)");
  wg_cmd->add_option("--x", wg->x_path,
                     "x [M, K] (.npy, float), or the token matrix [batch, K] with "
                     "--expanded-row-idx")
      ->required();
  wg_cmd->add_option("--grad-y", wg->operand_path, "gradY [M, N] (.npy, float)")->required();
  AddCommonOptions(*wg_cmd, *wg);
  wg_cmd->add_option("--out-dtype", wg->out_dtype,
                     "gradWeight's dtype: f32 (default) or the compute dtype");
  wg_cmd->add_option("--add-to", wg->add_to_path,
                     "A gradient [G, K, N] (.npy) the result is added into "
                     "(GroupedMatmulWeightGradAdd: each element once rounded to --out-dtype; "
                     "empty experts keep theirs); --out gets the sum");
  wg_cmd->add_option("--out", wg->out_path, "Output gradWeight [G, K, N] (.npy)")->required();
  wg_cmd->callback([wg] { RunGroupedMatmulCommand(*wg); });

  auto plan = std::make_shared<PlanOptions>();
  auto* plan_cmd = commands.plan.add_subcommand("grouped-matmul", "Print the GroupedMatmul plan as JSON");
  AddPlanOptions(*plan_cmd, *plan);
  plan_cmd->add_flag("--transpose-weight", plan->transpose_weight, "weight stored [G, N, K]");
  plan_cmd->callback([plan] { PrintPlan(*plan); });
  auto wg_plan = std::make_shared<PlanOptions>();
  wg_plan->weight_grad = true;
  auto* wg_plan_cmd = commands.plan.add_subcommand("grouped-matmul-weight-grad",
                                                   "Print the GroupedMatmulWeightGrad plan as JSON");
  AddPlanOptions(*wg_plan_cmd, *wg_plan);
  wg_plan_cmd->callback([wg_plan] { PrintPlan(*wg_plan); });

  AddBenchCommand(commands.bench, /*weight_grad=*/false);
  AddBenchCommand(commands.bench, /*weight_grad=*/true);
}

}  // namespace gk::cli
