// gradkit moe-init-routing | moe-finalize-routing | moe-finalize-routing-grad: the MoE layer's
// routing operators on .npy files. Indices are read as int32 or int64 (as stored) and written as
// int64; float outputs as in every command (float16 stays, bfloat16 is widened to float32).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "bench/moe_routing_bench.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"

namespace gk::cli {
namespace {

gkGroupListType ParseGroupListType(const std::string& text) {
  if (text == "count") return GK_GROUP_LIST_COUNT;
  if (text == "cumsum") return GK_GROUP_LIST_CUMSUM;
  throw CliError(fmt::format("--group-list-type is '{}', it must be count or cumsum", text));
}

gkRowIdxType ParseRowIdxType(int64_t value) {
  if (value == 0) return GK_ROW_IDX_GATHER;
  if (value == 1) return GK_ROW_IDX_SCATTER;
  throw CliError(fmt::format(
      "--row-idx-type is {}, it must be 0 (gather: entry i is the slot of row i) or 1 (scatter: "
      "entry p is the row of slot p, -1 when dropped)",
      value));
}

// The dtype of an index .npy, used as stored.
DType IndexFileDType(const NpyArray& array, const std::string& option) {
  if (array.descr == "<i8") return DType::kI64;
  if (array.descr == "<i4") return DType::kI32;
  throw CliError(fmt::format("{} holds {} values; <i8 or <i4 is required", option, array.descr));
}

// The compute dtype: --dtype, else the file's (float64 files: f32).
DType ComputeDType(const std::string& flag, DType file) {
  if (!flag.empty()) return ParseFloatDType(flag, "--dtype");
  return file == DType::kF64 ? DType::kF32 : file;
}

DType OutputDType(const std::string& flag, DType dtype) {
  if (flag.empty()) return dtype;
  const DType out = ParseFloatDType(flag, "--out-dtype");
  if (out != dtype && out != DType::kF32) {
    throw CliError(fmt::format("--out-dtype is {}, but the inputs are computed as {}; the output "
                               "can be {} or f32",
                               ShortDTypeName(out), ShortDTypeName(dtype), ShortDTypeName(dtype)));
  }
  return out;
}

int64_t Dim(const NpyArray& array, size_t d) { return array.shape.size() > d ? array.shape[d] : 0; }

// A buffer the library writes, refused up front when its size overflows or exceeds memory.
std::vector<uint8_t> OutputBuffer(int64_t elems, DType dtype, const std::string& what) {
  int64_t bytes;
  if (elems < 0 || __builtin_mul_overflow(elems, ElementBytes(dtype), &bytes)) {
    throw CliError(fmt::format("{}: {} elements overflow 64 bits of bytes", what, elems));
  }
  try {
    return std::vector<uint8_t>(static_cast<size_t>(bytes));
  } catch (const std::bad_alloc&) {
    throw CliError(fmt::format("{}: cannot allocate {} bytes", what, bytes));
  }
}

void WriteIndexNpy(const std::string& path, const int64_t* data, int64_t count) {
  NpyArray array{"<i8", {count}, {}};
  const auto* bytes = reinterpret_cast<const uint8_t*>(data);
  array.bytes.assign(bytes, bytes + count * sizeof(int64_t));
  WriteNpyAtomic(path, array);
}

void Run(gkStatus planned, gkOpExecutor* raw, uint64_t workspace_size,
         gkStatus (*phase2)(void*, uint64_t, gkOpExecutor*, void*),
         std::span<const OptionName> names) {
  ThrowIfFailed(planned, names);
  ExecutorHandle executor(raw);
  std::vector<uint8_t> workspace(workspace_size);
  ThrowIfFailed(phase2(workspace.data(), workspace_size, executor.get(), nullptr), names);
}

// ---- moe-init-routing ------------------------------------------------------------------------

struct InitRoutingOptions {
  std::string x_path, expert_idx_path, out_x, out_row_idx, out_group_list;
  int64_t num_experts = 0, capacity = 0, row_idx_type = 0;
  std::string group_list_type = "count", dtype;
  int32_t threads = 0;
  bool quiet = false;
};

constexpr OptionName kInitRoutingNames[] = {
    {"x", "--x"},
    {"expertIdx", "--expert-idx"},
    {"expertNum", "--num-experts"},
    {"expertCapacity", "--capacity"},
    {"rowIdxType", "--row-idx-type"},
    {"groupListType", "--group-list-type"},
    {"expandedX", "--out-x"},
    {"expandedRowIdx", "--out-row-idx"},
    {"groupList", "--out-group-list"},
    {"numThreads", "--threads"}};

void RunInitRouting(const InitRoutingOptions& o) {
  CheckThreadsOption(o.threads, "--threads");
  CheckPositiveOption(o.num_experts, "--num-experts");
  if (o.num_experts > INT32_MAX) {
    throw CliError(fmt::format("--num-experts is {}, it must be below 2^31", o.num_experts));
  }
  if (o.capacity < 0) {
    throw CliError(fmt::format("--capacity is {}, it must be >= 0 (0 keeps every slot)",
                               o.capacity));
  }
  const gkRowIdxType row_idx_type = ParseRowIdxType(o.row_idx_type);
  const gkGroupListType group_list_type = ParseGroupListType(o.group_list_type);
  CheckOutputPath(o.out_x, "--out-x");
  CheckOutputPath(o.out_row_idx, "--out-row-idx");
  CheckOutputPath(o.out_group_list, "--out-group-list");
  NpyArray x_npy = ReadNpy(o.x_path);
  NpyArray e_npy = ReadNpy(o.expert_idx_path);
  const DType dtype = ComputeDType(o.dtype, NpyFloatDType(x_npy, "--x"));
  const DType e_dtype = IndexFileDType(e_npy, "--expert-idx");
  const auto x = TakeAsDType(x_npy, dtype, "--x");
  const auto experts = TakeAsIndex(e_npy, e_dtype, "--expert-idx");

  // expandedX for the worst case (the library checks the shapes themselves); M comes back in
  // groupList.
  const int64_t batch = Dim(e_npy, 0), top_k = Dim(e_npy, 1), h = Dim(x_npy, 1);
  int64_t slots = 0, x_elems = 0;
  if (__builtin_mul_overflow(batch, top_k, &slots)) slots = 0;  // the library names it
  const int64_t rows = o.capacity > 0 && o.capacity <= slots / o.num_experts
                           ? o.num_experts * o.capacity
                           : slots;
  if (__builtin_mul_overflow(rows, h, &x_elems)) {
    throw CliError(fmt::format("--x rows of {} x {} expanded rows overflow 64 bits", h, rows));
  }
  auto expanded_x = OutputBuffer(x_elems, dtype, "--out-x");
  const int64_t idx_len = row_idx_type == GK_ROW_IDX_GATHER ? rows : slots;
  std::vector<int64_t> idx(static_cast<size_t>(idx_len));
  std::vector<int64_t> groups(static_cast<size_t>(o.num_experts));

  TensorHandle x_t = MakeTensor(x_npy.shape, dtype, const_cast<uint8_t*>(x.data()));
  TensorHandle e_t = MakeTensor(e_npy.shape, e_dtype, const_cast<uint8_t*>(experts.data()));
  TensorHandle ex_t = MakeTensor({rows, h}, dtype, expanded_x.data());
  TensorHandle idx_t = MakeTensor({idx_len}, DType::kI64, idx.data());
  TensorHandle g_t = MakeTensor({o.num_experts}, DType::kI64, groups.data());
  ThrowIfFailed(gkSetNumThreads(o.threads), kInitRoutingNames);
  uint64_t workspace_size = 0;
  gkOpExecutor* raw = nullptr;
  const gkStatus planned = gkMoeInitRoutingGetWorkspaceSize(
      x_t.get(), e_t.get(), o.capacity, o.num_experts, group_list_type, row_idx_type, ex_t.get(),
      idx_t.get(), g_t.get(), &workspace_size, &raw);
  Run(planned, raw, workspace_size, gkMoeInitRouting, kInitRoutingNames);

  int64_t m = 0;
  for (int64_t c : groups) m = group_list_type == GK_GROUP_LIST_CUMSUM ? c : m + c;
  WriteNpyFromBuffer(o.out_x, expanded_x.data(), m * h, dtype, {m, h});
  const int64_t idx_written = row_idx_type == GK_ROW_IDX_GATHER ? m : slots;
  WriteIndexNpy(o.out_row_idx, idx.data(), idx_written);
  WriteIndexNpy(o.out_group_list, groups.data(), o.num_experts);
  if (!o.quiet) {
    Note(fmt::format("routing: {} tokens x topk {} = {} slots -> M = {} rows, {} dropped{}", batch,
                     top_k, slots, m, slots - m,
                     dtype == DType::kBF16 ? "; --out-x holds bfloat16 widened to float32" : ""));
  }
}

// ---- moe-finalize-routing and its grad -------------------------------------------------------

struct FinalizeOptions {
  std::string grad_out_path, y_path, probs_path, idx_path;
  std::string out_path, out_grad_y, out_grad_probs;
  int64_t row_idx_type = -1;
  std::string dtype, out_dtype;
  int32_t threads = 0;
  bool quiet = false;
};

constexpr OptionName kFinalizeNames[] = {
    {"expandedY", "--expanded-y"},       {"probs", "--probs"},
    {"expandedRowIdx", "--expanded-row-idx"}, {"rowIdxType", "--row-idx-type"},
    {"out", "--out"},                    {"gradOut", "--grad-out"},
    {"gradExpandedY", "--out-grad-y"},   {"gradProbs", "--out-grad-probs"},
    {"numThreads", "--threads"}};

// The inputs both commands read: expandedY in the compute dtype, probs as float32 (exact for
// float16/bfloat16 files; the library takes float32 probs with any dtype).
struct FinalizeInputs {
  NpyArray y_npy, probs_npy, idx_npy;
  DType dtype, idx_dtype;
  std::vector<uint8_t> y, probs, idx;
};

FinalizeInputs ReadFinalizeInputs(const FinalizeOptions& o) {
  FinalizeInputs in;
  in.y_npy = ReadNpy(o.y_path);
  in.probs_npy = ReadNpy(o.probs_path);
  in.idx_npy = ReadNpy(o.idx_path);
  in.dtype = ComputeDType(o.dtype, NpyFloatDType(in.y_npy, "--expanded-y"));
  NpyFloatDType(in.probs_npy, "--probs");
  in.idx_dtype = IndexFileDType(in.idx_npy, "--expanded-row-idx");
  in.y = TakeAsDType(in.y_npy, in.dtype, "--expanded-y");
  in.probs = TakeAsDType(in.probs_npy, DType::kF32, "--probs");
  in.idx = TakeAsIndex(in.idx_npy, in.idx_dtype, "--expanded-row-idx");
  return in;
}

void RunFinalize(const FinalizeOptions& o) {
  CheckThreadsOption(o.threads, "--threads");
  const gkRowIdxType row_idx_type = ParseRowIdxType(o.row_idx_type);
  CheckOutputPath(o.out_path, "--out");
  FinalizeInputs in = ReadFinalizeInputs(o);
  const DType out_dtype = OutputDType(o.out_dtype, in.dtype);
  const int64_t batch = Dim(in.probs_npy, 0), n = Dim(in.y_npy, 1);
  int64_t elems = 0;
  if (__builtin_mul_overflow(batch, n, &elems)) elems = 0;
  auto out = OutputBuffer(elems, out_dtype, "--out");
  TensorHandle y_t = MakeTensor(in.y_npy.shape, in.dtype, in.y.data());
  TensorHandle p_t = MakeTensor(in.probs_npy.shape, DType::kF32, in.probs.data());
  TensorHandle i_t = MakeTensor(in.idx_npy.shape, in.idx_dtype, in.idx.data());
  TensorHandle out_t = MakeTensor({batch, n}, out_dtype, out.data());
  ThrowIfFailed(gkSetNumThreads(o.threads), kFinalizeNames);
  uint64_t workspace_size = 0;
  gkOpExecutor* raw = nullptr;
  const gkStatus planned = gkMoeFinalizeRoutingGetWorkspaceSize(
      y_t.get(), p_t.get(), i_t.get(), row_idx_type, out_t.get(), &workspace_size, &raw);
  Run(planned, raw, workspace_size, gkMoeFinalizeRouting, kFinalizeNames);
  WriteNpyFromBuffer(o.out_path, out.data(), elems, out_dtype, {batch, n});
  if (out_dtype == DType::kBF16 && !o.quiet) {
    Note(fmt::format("{} holds the bfloat16 results widened to float32", o.out_path));
  }
}

void RunFinalizeGrad(const FinalizeOptions& o) {
  CheckThreadsOption(o.threads, "--threads");
  const gkRowIdxType row_idx_type = ParseRowIdxType(o.row_idx_type);
  CheckOutputPath(o.out_grad_y, "--out-grad-y");
  CheckOutputPath(o.out_grad_probs, "--out-grad-probs");
  NpyArray grad_out_npy = ReadNpy(o.grad_out_path);
  NpyFloatDType(grad_out_npy, "--grad-out");
  FinalizeInputs in = ReadFinalizeInputs(o);
  const DType out_dtype = OutputDType(o.out_dtype, in.dtype);
  const auto grad_out = TakeAsDType(grad_out_npy, in.dtype, "--grad-out");
  const int64_t m = Dim(in.y_npy, 0), n = Dim(in.y_npy, 1);
  const int64_t batch = Dim(in.probs_npy, 0), top_k = Dim(in.probs_npy, 1);
  int64_t y_elems = 0, p_elems = 0;
  if (__builtin_mul_overflow(m, n, &y_elems)) y_elems = 0;
  if (__builtin_mul_overflow(batch, top_k, &p_elems)) p_elems = 0;
  auto grad_y = OutputBuffer(y_elems, out_dtype, "--out-grad-y");
  auto grad_probs = OutputBuffer(p_elems, DType::kF32, "--out-grad-probs");
  TensorHandle go_t = MakeTensor(grad_out_npy.shape, in.dtype, const_cast<uint8_t*>(grad_out.data()));
  TensorHandle y_t = MakeTensor(in.y_npy.shape, in.dtype, in.y.data());
  TensorHandle p_t = MakeTensor(in.probs_npy.shape, DType::kF32, in.probs.data());
  TensorHandle i_t = MakeTensor(in.idx_npy.shape, in.idx_dtype, in.idx.data());
  TensorHandle gy_t = MakeTensor({m, n}, out_dtype, grad_y.data());
  TensorHandle gp_t = MakeTensor({batch, top_k}, DType::kF32, grad_probs.data());
  ThrowIfFailed(gkSetNumThreads(o.threads), kFinalizeNames);
  uint64_t workspace_size = 0;
  gkOpExecutor* raw = nullptr;
  const gkStatus planned = gkMoeFinalizeRoutingGradGetWorkspaceSize(
      go_t.get(), y_t.get(), p_t.get(), i_t.get(), row_idx_type, gy_t.get(), gp_t.get(),
      &workspace_size, &raw);
  Run(planned, raw, workspace_size, gkMoeFinalizeRoutingGrad, kFinalizeNames);
  WriteNpyFromBuffer(o.out_grad_y, grad_y.data(), y_elems, out_dtype, {m, n});
  WriteNpyFromBuffer(o.out_grad_probs, grad_probs.data(), p_elems, DType::kF32, {batch, top_k});
}

void AddCommonOptions(CLI::App* cmd, FinalizeOptions& o) {
  cmd->add_option("--expanded-y", o.y_path, "Expert outputs [M, N] (.npy)")->required();
  cmd->add_option("--probs", o.probs_path, "Routing weights [batch, topK] (.npy; used as f32)")
      ->required();
  cmd->add_option("--expanded-row-idx", o.idx_path, "Row index (.npy, int32 or int64)")->required();
  cmd->add_option("--row-idx-type", o.row_idx_type,
                  "0: gather (entry i = slot of row i), 1: scatter (entry p = row of slot p or -1)")
      ->required();
  cmd->add_option("--dtype", o.dtype, "Compute dtype f32|f16|bf16 (default: --expanded-y's file)");
  cmd->add_option("--out-dtype", o.out_dtype, "Output dtype: --dtype's (default) or f32");
  cmd->add_option("--threads", o.threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", o.quiet, "No notes on stderr (warnings and errors remain)");
}

struct RoutingBenchOptions {
  std::optional<std::string> preset;
  std::string dtype;
  int32_t threads = 0;
  double min_seconds = 0.5;
  bool json = false;
};

void RunRoutingBench(const RoutingBenchOptions& o) {
  CheckThreadsOption(o.threads, "--threads");
  if (o.preset && *o.preset != "S1" && *o.preset != "S2" && *o.preset != "S3" && *o.preset != "S4") {
    throw CliError(fmt::format("--preset is '{}', it must be S1..S4", *o.preset));
  }
  if (!(o.min_seconds > 0)) throw CliError(fmt::format("--min-time is {}, it must be > 0", o.min_seconds));
  std::optional<DType> dtype;
  if (!o.dtype.empty()) dtype = ParseFloatDType(o.dtype, "--dtype");
  const int32_t threads = o.threads > 0 ? o.threads : gkGetNumThreads();
  if (!o.json) {
    std::printf("MoE routing operators, %d threads; GB/s = bytes read + written per second, beside "
                "a parallel copy of the same bytes in the same run\n",
                threads);
    std::printf("%-4s %-9s %-14s %8s %6s %10s %9s %8s\n", "", "dtype", "op", "M", "H", "GB/s",
                "copy", "vs copy");
  }
  for (const auto& c : bench::MoeRoutingBenchCases(o.preset, dtype, threads)) {
    for (const auto& r : bench::RunMoeRoutingBenchCase(c, o.min_seconds)) {
      if (o.json) {
        std::printf("%s\n", bench::MoeRoutingBenchJson(r).c_str());
      } else {
        std::printf("%-4s %-9s %-14s %8lld %6lld %10.2f %9.2f %7.0f%%\n", c.shape.c_str(),
                    std::string(DTypeName(c.dtype)).c_str(), r.op.c_str(),
                    static_cast<long long>(r.m), static_cast<long long>(c.h), r.gbps, r.copy_gbps,
                    100.0 * r.gbps / r.copy_gbps);
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace

void RegisterMoeRoutingCommands(CommandSet& commands) {
  auto bench = std::make_shared<RoutingBenchOptions>();
  auto* bench_cmd = commands.bench.add_subcommand(
      "moe-routing", "MoeInitRouting, MoeFinalizeRouting(Grad): GB/s vs a copy of the same bytes");
  bench_cmd->add_option("--preset", bench->preset,
                        "Only this shape: S1..S4, the moe-grad presets with H = their K");
  bench_cmd->add_option("--dtype", bench->dtype, "Only this dtype (f32|f16|bf16)");
  bench_cmd->add_option("--threads", bench->threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
  bench_cmd->add_option("--min-time", bench->min_seconds, "Seconds per operator (default 0.5)");
  bench_cmd->add_flag("--json", bench->json, "One JSON object per operator and line");
  bench_cmd->callback([bench] { RunRoutingBench(*bench); });

  auto init = std::make_shared<InitRoutingOptions>();
  auto* cmd = commands.app.add_subcommand(
      "moe-init-routing", "MoeInitRouting: tokens -> expanded rows grouped by expert");
  cmd->add_option("--x", init->x_path, "Tokens [batch, H] (.npy)")->required();
  cmd->add_option("--expert-idx", init->expert_idx_path, "Experts of each token [batch, topK] (.npy, int32 or int64)")
      ->required();
  cmd->add_option("--num-experts", init->num_experts, "G, the number of experts")->required();
  cmd->add_option("--capacity", init->capacity, "Keep each expert's first C slots (0: all)")
      ->capture_default_str();
  cmd->add_option("--row-idx-type", init->row_idx_type, "0: gather (default), 1: scatter")
      ->capture_default_str();
  cmd->add_option("--group-list-type", init->group_list_type, "count (default) or cumsum");
  cmd->add_option("--dtype", init->dtype, "Dtype f32|f16|bf16 (default: --x's file)");
  cmd->add_option("--out-x", init->out_x, "expandedX [M, H] (.npy)")->required();
  cmd->add_option("--out-row-idx", init->out_row_idx,
                  "expandedRowIdx (.npy int64): [M] (gather) or [batch * topK] (scatter)")
      ->required();
  cmd->add_option("--out-group-list", init->out_group_list, "groupList [G] (.npy int64)")->required();
  cmd->add_option("--threads", init->threads, "Threads, 0: GRADKIT_NUM_THREADS or all cores")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", init->quiet, "No notes on stderr (warnings and errors remain)");
  cmd->callback([init] { RunInitRouting(*init); });

  auto fin = std::make_shared<FinalizeOptions>();
  auto* fin_cmd = commands.app.add_subcommand(
      "moe-finalize-routing", "MoeFinalizeRouting: out[b] = sum_j probs[b, j] * expandedY[row]");
  AddCommonOptions(fin_cmd, *fin);
  fin_cmd->add_option("--out", fin->out_path, "out [batch, N] (.npy)")->required();
  fin_cmd->callback([fin] { RunFinalize(*fin); });

  auto grad = std::make_shared<FinalizeOptions>();
  auto* grad_cmd = commands.app.add_subcommand(
      "moe-finalize-routing-grad", "MoeFinalizeRoutingGrad: gradExpandedY and gradProbs");
  grad_cmd->add_option("--grad-out", grad->grad_out_path, "Gradient of out [batch, N] (.npy)")
      ->required();
  AddCommonOptions(grad_cmd, *grad);
  grad_cmd->add_option("--out-grad-y", grad->out_grad_y, "gradExpandedY [M, N] (.npy)")->required();
  grad_cmd->add_option("--out-grad-probs", grad->out_grad_probs,
                       "gradProbs [batch, topK] (.npy float32)")
      ->required();
  grad_cmd->callback([grad] { RunFinalizeGrad(*grad); });
}

}  // namespace gk::cli
