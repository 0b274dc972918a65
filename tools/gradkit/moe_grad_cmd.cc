// gradkit moe-grad | plan moe-grad | bench moe-grad, and the operator's part of `gradkit demo`.
#include <fmt/format.h>

#include <new>

#include <unistd.h>

#include <algorithm>
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
#include "tools/gradkit/bench_cases.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"
#include "tools/gradkit/demo.h"

namespace gk::cli {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

gkGroupListType ParseGroupListType(const std::string& text) {
  if (text == "count") return GK_GROUP_LIST_COUNT;
  if (text == "cumsum") return GK_GROUP_LIST_CUMSUM;
  throw CliError(fmt::format("--group-list-type is '{}', it must be count or cumsum", text));
}

// The C API's argument names -> the options of `gradkit moe-grad`.
constexpr OptionName kMoeOptionNames[] = {
    {"gradY", "--grad-y"},
    {"weight", "--weight"},
    {"expandedRowIdx", "--expanded-row-idx"},
    {"groupList", "--group-list"},
    {"batch", "--batch"},
    {"topK", "--topk"},
    {"rowIdxType", "--row-idx-type"},
    {"groupListType", "--group-list-type"},
    {"gradX", "--out"},
    {"numThreads", "--threads"}};

// Runs the operator through its C API on contiguous buffers; returns gradX and the workspace size.
struct MoeGradRun {
  std::vector<float> grad_x;
  uint64_t workspace_bytes;
};
// w_strides: empty for a C-contiguous weight.
MoeGradRun RunMoeGradOp(const void* dy, const std::vector<int64_t>& dy_shape, const void* w,
                        const std::vector<int64_t>& w_shape, const std::vector<int64_t>& w_strides,
                        DType dtype, const void* idx,
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
  TensorHandle w_t = MakeTensor(w_shape, dtype, const_cast<void*>(w), w_strides);
  TensorHandle idx_t = MakeTensor(idx_shape, idx_dtype, const_cast<void*>(idx));
  TensorHandle groups_t = MakeTensor(groups_shape, DType::kI64, const_cast<int64_t*>(groups));
  TensorHandle dx_t = MakeTensor({std::max<int64_t>(batch, 0), k}, DType::kF32, run.grad_x.data());
  gkOpExecutor* raw = nullptr;
  ThrowIfFailed(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
      dy_t.get(), w_t.get(), idx_t.get(), groups_t.get(), batch, top_k,
      static_cast<gkRowIdxType>(row_idx_type), group_list_type, dx_t.get(), &run.workspace_bytes,
      &raw),
      kMoeOptionNames);
  ExecutorHandle executor(raw);
  std::vector<uint8_t> workspace(run.workspace_bytes);
  ThrowIfFailed(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), run.workspace_bytes,
                                                  executor.get(), nullptr),
                kMoeOptionNames);
  return run;
}

struct MoeGradOptions {
  std::string dy_path, w_path, idx_path, groups_path, out_path;
  int64_t batch = 0, top_k = 0, row_idx_type = 0;
  std::string group_list_type = "count", dtype;
  int32_t threads = 0;
  bool quiet = false;
  bool transpose_weight = false;  // the file holds [G, N, K]
};

// One line that makes a routing mix-up visible even when every check passes (a --topk other
// than the router's, a gather index declared as scatter where the sizes happen to fit): how the
// slots became rows, how many tokens receive nothing, how evenly the experts are loaded.
// Called after phase 1 accepted the arrays, so every index is in range.
std::string RoutingSummary(const MoeGradOptions& o, const void* idx, DType idx_dtype, int64_t l,
                           const int64_t* groups, int64_t g, int64_t m) {
  const auto index = [&](int64_t i) {
    return idx_dtype == DType::kI32 ? int64_t{static_cast<const int32_t*>(idx)[i]}
                                    : static_cast<const int64_t*>(idx)[i];
  };
  std::vector<bool> has_row(static_cast<size_t>(o.batch));
  if (o.row_idx_type == 0) {
    for (int64_t i = 0; i < m; ++i) has_row[static_cast<size_t>(index(i) / o.top_k)] = true;
  } else {
    for (int64_t p = 0; p < l; ++p) {
      if (index(p) != -1) has_row[static_cast<size_t>(p / o.top_k)] = true;
    }
  }
  const int64_t idle_tokens = std::count(has_row.begin(), has_row.end(), false);
  int64_t min_rows = 0, max_rows = 0, min_expert = 0, max_expert = 0;
  for (int64_t e = 0; e < g; ++e) {
    const int64_t rows =
        o.group_list_type == "cumsum" ? groups[e] - (e > 0 ? groups[e - 1] : 0) : groups[e];
    if (e == 0 || rows < min_rows) min_rows = rows, min_expert = e;
    if (e == 0 || rows > max_rows) max_rows = rows, max_expert = e;
  }
  const int64_t slots = o.batch * o.top_k;
  return fmt::format(
      "routing: {} tokens x topk {} = {} slots -> {} rows, {} slots dropped, {} tokens without "
      "a row; rows per expert: min {} (expert {}), max {} (expert {}) over {} experts",
      o.batch, o.top_k, slots, m, slots - m, idle_tokens, min_rows, min_expert, max_rows,
      max_expert, g);
}

void RunMoeGrad(const MoeGradOptions& o) {
  CheckThreadsOption(o.threads, "--threads");
  CheckOutputPath(o.out_path, "--out");
  const gkGroupListType group_list_type = ParseGroupListType(o.group_list_type);
  NpyArray dy_npy = ReadNpy(o.dy_path);
  NpyArray w_npy = ReadNpy(o.w_path);
  NpyArray idx_npy = ReadNpy(o.idx_path);
  NpyArray groups_npy = ReadNpy(o.groups_path);
  const DType dy_file = NpyFloatDType(dy_npy, "--grad-y");
  const DType w_file = NpyFloatDType(w_npy, "--weight");
  const DType dtype = !o.dtype.empty()        ? ParseFloatDType(o.dtype, "--dtype")
                      : dy_file == DType::kF64 ? DType::kF32
                                               : dy_file;
  if (idx_npy.descr != "<i8" && idx_npy.descr != "<i4") {
    throw CliError(fmt::format("--expanded-row-idx holds {} values; <i8 or <i4 is required",
                               idx_npy.descr));
  }
  if (o.dtype.empty() && dy_file != w_file) {
    Warn(fmt::format("--grad-y holds {} and --weight {}; both are computed as {} (--dtype sets it)",
                     DTypeName(dy_file), DTypeName(w_file), ShortDTypeName(dtype)));
  }
  const DType idx_dtype = idx_npy.descr == "<i4" ? DType::kI32 : DType::kI64;
  // Inputs already in the compute dtype are used where they were read: no copy.
  const auto dy = TakeAsDType(dy_npy, dtype, "--grad-y");
  const auto w = TakeAsDType(w_npy, dtype, "--weight");
  const auto idx = TakeAsIndex(idx_npy, idx_dtype, "--expanded-row-idx");
  const auto groups = TakeAsIndex(groups_npy, DType::kI64, "--group-list");

  // The operator's weight is [G, K, N]; a [G, N, K] file is handed over as its transposed view.
  std::vector<int64_t> w_shape = w_npy.shape, w_strides;
  if (w_shape.size() == 3 && dy_npy.shape.size() == 2) {
    const int64_t cols = dy_npy.shape[1];
    if (o.transpose_weight) {
      if (w_shape[1] != cols && w_shape[2] == cols) {
        throw CliError(fmt::format("--weight has shape {} and --grad-y {} columns: with "
                                   "--transpose-weight the weight must be [G, N, K] (N = {}); "
                                   "this one looks [G, K, N] already: drop --transpose-weight",
                                   ShapeText(w_shape), cols, cols));
      }
      w_shape = {w_npy.shape[0], w_npy.shape[2], w_npy.shape[1]};
      w_strides = {w_npy.shape[1] * w_npy.shape[2], 1, w_npy.shape[2]};
    } else if (w_shape[2] != cols && w_shape[1] == cols) {
      throw CliError(fmt::format("--weight has shape {} and --grad-y {} columns (N): K and N look "
                                 "swapped; the weight must be [G, K, N], or pass "
                                 "--transpose-weight for nn.Linear's [G, N, K] layout",
                                 ShapeText(w_shape), cols));
    }
  }
  ThrowIfFailed(gkSetNumThreads(o.threads), kMoeOptionNames);
  const MoeGradRun run = RunMoeGradOp(
      dy.data(), dy_npy.shape, w.data(), w_shape, w_strides, dtype, idx.data(), idx_npy.shape,
      idx_dtype, reinterpret_cast<const int64_t*>(groups.data()), groups_npy.shape, o.batch,
      o.top_k, o.row_idx_type, group_list_type);
  const int64_t k = w_shape[1];
  WriteNpyFromBuffer(o.out_path, run.grad_x.data(), o.batch * k, DType::kF32, {o.batch, k});
  if (!o.quiet) {
    Note(RoutingSummary(o, idx.data(), idx_dtype, idx_npy.shape[0],
                        reinterpret_cast<const int64_t*>(groups.data()), w_shape[0],
                        dy_npy.shape[0]));
  }
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
  std::string preset = "S1", dtype = "f32", group_list_type = "count";
  std::optional<int64_t> batch, top_k, g, k, n, m;
  int64_t row_idx_type = 0;
  int32_t threads = 0;
};

void PrintMoePlan(const MoePlanOptions& o) {
  const MoeShapePreset* preset = nullptr;
  for (const auto& p : kPresets) {
    if (o.preset == p.name) preset = &p;
  }
  if (preset == nullptr) throw CliError(fmt::format("--preset is '{}', it must be S1..S4", o.preset));
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
  BenchShapeOptions shape;
  std::string dtype;
  int32_t threads = 0;
  bool json = false;
  double min_seconds = 0.5;
};

std::string MiB(uint64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

void RunMoeBench(const MoeBenchOptions& o) {
  const std::optional<DType> dtype =
      o.dtype.empty() ? std::nullopt : std::optional<DType>(ParseFloatDType(o.dtype, "--dtype"));
  CheckThreadsOption(o.threads, "--threads");
  if (!(o.min_seconds > 0.0 && o.min_seconds <= 3600.0)) {
    throw CliError(fmt::format("--min-time is {}, it must be in (0, 3600] seconds", o.min_seconds));
  }
  const int32_t threads = o.threads > 0 ? o.threads : gkGetNumThreads();
  const auto cases = BenchCases(o.shape, dtype, threads);
  if (!o.json) {
    std::printf("MoeInitRoutingGroupedMatmulGrad on CPU (%s, %s), %d threads; GFLOP/s = 2 M N K "
                "per second\n",
                ChosenIsa().c_str(), MoeGemmLibraryName().c_str(), threads);
    std::printf("%-4s %-9s %6s %9s %9s %7s %9s %8s %9s %8s %11s %11s\n", "", "dtype", "M", "fused",
                "dense", "vs dense", "unfused", "vs unf.", "torch", "vs torch", "workspace",
                "[M,K] f32");
  }
  for (const auto& c : cases) {
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
      std::printf("%-4s %-9s %6lld %9.1f %9s %7s %9s %8s %9s %8s %11s %11s\n", c.shape.c_str(),
                  std::string(DTypeName(c.dtype)).c_str(), static_cast<long long>(r.m), r.gflops,
                  opt(r.dense_gflops).c_str(), ratio(r.dense_gflops).c_str(),
                  opt(r.unfused_gflops).c_str(), ratio(r.unfused_gflops).c_str(),
                  opt(r.torch_gflops).c_str(), ratio(r.torch_gflops).c_str(),
                  MiB(r.workspace_bytes).c_str(), MiB(r.unfused_bytes).c_str());
    }
    std::fflush(stdout);
  }
}

// --shape means dimensions everywhere (plan elu-grad); here it gets a pointer to what does.
void AddShapeMisuse(CLI::App& command) {
  command
      .add_option_function<std::string>(
          "--shape",
          [](const std::string& value) {
            throw CliError(fmt::format("--shape {}: moe-grad takes a shape as --preset S1..S4 or "
                                       "--batch --topk --experts --k --n",
                                       value));
          })
      ->group("");
}

// The presets, listed from the benchmark's own table.
std::string PresetHelp() {
  std::string text = "Only this preset:";
  for (const auto& c : bench::MoeGradBenchCases(std::nullopt, DType::kF32, 1)) {
    text += fmt::format(" {} (batch {}, topk {}, experts {}, K {}, N {}{});", c.shape, c.batch,
                        c.top_k, c.g, c.k, c.n,
                        c.skew > 0 ? fmt::format(", {:.0f}% of slots on expert 0, {} experts empty",
                                                 100 * c.skew, c.empty_experts)
                                   : "");
  }
  text.back() = '.';
  return text;
}

}  // namespace

// The cases to measure: every preset, one preset, or a user's shape (a preset's dimensions, S1's
// when none is named, with the options given replacing them).
std::vector<bench::MoeGradBenchCase> BenchCases(const BenchShapeOptions& o, std::optional<DType> dtype,
                                                int32_t threads) {
  const std::optional<std::string> preset =
      o.preset.empty() ? std::nullopt : std::optional<std::string>(o.preset);
  auto cases = bench::MoeGradBenchCases(preset, dtype, threads);
  if (preset && cases.empty()) {
    throw CliError(fmt::format("--preset is '{}', it must be S1..S4", *preset));
  }
  if (!(o.batch || o.top_k || o.g || o.k || o.n)) return cases;
  if (!preset) cases = bench::MoeGradBenchCases(std::string("S1"), dtype, threads);
  const struct {
    const char* option;
    std::optional<int64_t> value;
    int64_t limit;
  } dims[] = {{"--batch", o.batch, int64_t{1} << 24}, {"--topk", o.top_k, 1024},
              {"--experts", o.g, 4096}, {"--k", o.k, int64_t{1} << 20}, {"--n", o.n, int64_t{1} << 20}};
  for (const auto& d : dims) {
    if (d.value && (*d.value < 1 || *d.value > d.limit)) {
      throw CliError(fmt::format("{} is {}, it must be in [1, {}]", d.option, *d.value, d.limit));
    }
  }
  for (auto& c : cases) {
    c.shape = "user";
    c.batch = o.batch.value_or(c.batch);
    c.top_k = o.top_k.value_or(c.top_k);
    c.g = o.g.value_or(c.g);
    c.k = o.k.value_or(c.k);
    c.n = o.n.value_or(c.n);
    c.empty_experts = std::min(c.empty_experts, c.g - 1);
    // About the buffers the benchmarks allocate (float32 bytes): M x (N + 2K) (moe-grad: gradY,
    // the unfused [M, K] and the dense A; grouped-matmul: y, the expanded x and the dense A), the
    // weights G x K x N, the token matrix batch x K.
    const double bytes = 4.0 * (static_cast<double>(c.batch) * c.top_k * (c.n + 2.0 * c.k) +
                                static_cast<double>(c.g) * c.k * c.n + static_cast<double>(c.batch) * c.k);
    const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    if (memory > 0 && bytes > 0.75 * memory) {
      throw CliError(fmt::format("--batch {} --topk {} --experts {} --k {} --n {}: the benchmark "
                                 "needs about {:.1f} GiB, more than 3/4 of this machine's {:.1f} GiB",
                                 c.batch, c.top_k, c.g, c.k, c.n, bytes / (1 << 30),
                                 memory / (1 << 30)));
    }
  }
  return cases;
}

void AddBenchShapeOptions(CLI::App& cmd, BenchShapeOptions& o, const std::string& k_help,
                          const std::string& n_help) {
  cmd.add_option("--preset", o.preset, PresetHelp());
  cmd.add_option("--batch", o.batch, "Tokens: with any of these five, one shape of yours (the "
                 "preset's, S1's by default, for the dimensions not given)");
  cmd.add_option("--topk", o.top_k, "Experts per token");
  cmd.add_option("--experts", o.g, "G, the number of experts");
  cmd.add_option("--k", o.k, k_help);
  cmd.add_option("--n", o.n, n_help);
}

void PrintMoeGradInfo() {
  std::printf("oneDNN:     %s\n", MoeGemmHasOneDnn()
                                      ? fmt::format("{} (MoE GEMMs)", MoeGemmLibraryName()).c_str()
                                      : "not found at build time (MoE GEMMs run on gradkit's own "
                                        "micro-kernel)");
  // The GEMM each dtype's tiles run on, as the plan of a small problem picks it.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const MoeGradShape s = MoeGradGatherCountShape(256, 1, 256, 1, 256, 256, dtype);
    const MoeGradPlan plan = MakeMoeGradPlan(s, DetectMoeGradMachine(s));
    std::printf("moe gemm:   %-9s -> %s GEMM on %s\n", std::string(DTypeName(dtype)).c_str(),
                std::string(DTypeName(plan.gemm_dtype)).c_str(), plan.gemm_backend.c_str());
  }
}

void RegisterMoeGradCommands(CommandSet& commands) {
  auto run = std::make_shared<MoeGradOptions>();
  auto* cmd = commands.app.add_subcommand(
      "moe-grad", "MoeInitRoutingGroupedMatmulGrad: gradX = scatter_add(gradY @ weight^T)");
  cmd->add_option("--grad-y", run->dy_path, "gradY [M, N]: the expanded rows' gradient (.npy, float)")
      ->required();
  cmd->add_option("--weight", run->w_path,
                  "weight [G, K, N] (.npy, float), or [G, N, K] with --transpose-weight")
      ->required();
  cmd->add_flag("--transpose-weight", run->transpose_weight,
                "--weight holds [G, N, K] (nn.Linear's layout): read in place, not copied");
  cmd->add_option("--expanded-row-idx", run->idx_path,
                  "expandedRowIdx (.npy, <i8 or <i4): with --row-idx-type 0 the slot (token * topk "
                  "+ j) of each row, e.g. argsort(topk_ids.flatten(), stable)")
      ->required();
  cmd->add_option("--group-list", run->groups_path,
                  "groupList [G] (.npy, integer): rows per expert, e.g. bincount(topk_ids.flatten())")
      ->required();
  cmd->add_option("--batch", run->batch, "Tokens (rows of gradX)")->required();
  cmd->add_option("--topk", run->top_k, "Experts per token, as the router chose them")->required();
  cmd->add_option("--row-idx-type", run->row_idx_type,
                  "0: gather (row -> slot), 1: scatter (slot -> row, -1 for a dropped slot)")
      ->capture_default_str();
  cmd->add_option("--group-list-type", run->group_list_type, "count | cumsum")
      ->capture_default_str();
  cmd->add_option("--dtype", run->dtype,
                  "Compute dtype f32|f16|bf16 (default: --grad-y's file; float64 files: f32)");
  cmd->add_option("--threads", run->threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
  cmd->add_option("--out", run->out_path, "Output gradX [batch, K] (.npy, float32)")->required();
  cmd->add_flag("-q,--quiet", run->quiet, "No routing summary on stderr (warnings and errors remain)");
  cmd->callback([run] { RunMoeGrad(*run); });

  auto plan = std::make_shared<MoePlanOptions>();
  auto* plan_cmd = commands.plan.add_subcommand("moe-grad", "Print the MoE backward plan as JSON");
  AddShapeMisuse(*plan_cmd);
  plan_cmd->add_option("--preset", plan->preset,
                       "Shape preset S1..S4 (see `gradkit bench moe-grad --help`); the options "
                       "below override its dimensions")
      ->capture_default_str();
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
  AddShapeMisuse(*bench_cmd);
  AddBenchShapeOptions(*bench_cmd, bench->shape, "K (gradX columns, the model dimension)",
                       "N (gradY columns, the expert's hidden dimension)");
  bench_cmd->add_option("--dtype", bench->dtype, "Only this dtype (f32|f16|bf16)");
  bench_cmd->add_option("--threads", bench->threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
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
    const MoeGradRun run = RunMoeGradOp(dy.data(), {m, kN}, w.data(), {kG, kK, kN}, {}, dtype,
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
  // The Ascend design's motivating size, from the plan alone: M = 108 K tokens, K = 7168.
  const MoeGradShape big = MoeGradGatherCountShape(55296, 2, 110592, 60, 7168, 2048, DType::kBF16);
  const MoeGradPlan plan = MakeMoeGradPlan(big, DetectMoeGradMachine(big));
  const uint64_t big_expanded = static_cast<uint64_t>(big.m) * big.k * 4;
  std::printf("  at the Ascend design's own size (M 110592, K 7168, N 2048, G 60, bf16, %d "
              "threads): workspace %.1f MiB instead of %.2f GiB\n",
              plan.threads, plan.workspace_bytes / 1048576.0, big_expanded / 1073741824.0);
}

}  // namespace gk::cli
