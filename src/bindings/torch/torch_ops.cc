// torch.ops.gradkit.*: gradkit's operators as PyTorch operators (CPU), through the C API.
//
// Each op sizes and allocates its outputs with torch, makes an input contiguous only where the C
// API needs it, and raises gradkit's own message as a RuntimeError. Arguments follow the C API's
// order, in snake_case. Autograd lives in Python (python/gradkit/torch), on top of these ops.
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <tuple>
#include <utility>

#include "bindings/torch/torch_call.h"

namespace gk::torch_ext {
namespace {

gkRowIdxType RowIdxType(int64_t v) { return static_cast<gkRowIdxType>(v); }
gkGroupListType GroupListType(int64_t v) { return static_cast<gkGroupListType>(v); }

// Enum arguments reach gradkit unchanged when they fit its enum, so gradkit names a wrong value;
// one past int32 is refused here, before the cast could hide it.
void CheckEnumRange(std::string_view op, int64_t v, std::string_view name) {
  TORCH_CHECK(v >= INT32_MIN && v <= INT32_MAX, "gradkit.", op, ": ", name, " is ", v,
              "; it must be 0 or 1");
}

at::Tensor EluGradV2(const at::Tensor& dy, const at::Tensor& x, double alpha, double scale,
                     double input_scale, bool is_result) {
  constexpr std::string_view op = "elu_grad_v2";
  // gradkit takes any strides: no copy. The result keeps dy's layout where torch can.
  at::Tensor dx = at::empty_like(dy);
  const Descriptor dy_d(op, dy, "dy"), x_d(op, x, "x"), dx_d(op, dx, "result");
  CallTwoPhase(
      op,
      [&](uint64_t* ws, gkOpExecutor** ex) {
        return gkEluGradV2GetWorkspaceSize(dy_d.get(), x_d.get(), alpha, scale, input_scale,
                                           is_result, dx_d.get(), ws, ex);
      },
      gkEluGradV2);
  return dx;
}

at::Tensor MoeInitRoutingGroupedMatmulGrad(const at::Tensor& grad_y, const at::Tensor& weight,
                                           const at::Tensor& expanded_row_idx,
                                           const at::Tensor& group_list, int64_t batch,
                                           int64_t topk, int64_t row_idx_type,
                                           int64_t group_list_type) {
  constexpr std::string_view op = "moe_init_routing_grouped_matmul_grad";
  CheckEnumRange(op, row_idx_type, "row_idx_type");
  CheckEnumRange(op, group_list_type, "group_list_type");
  CheckCpu(op, weight, "weight");
  TORCH_CHECK(weight.dim() == 3, "gradkit.", op, ": weight has shape ", weight.sizes(),
              "; it must be [G, K, N] (or the transposed view of a [G, N, K] buffer)");
  const at::Tensor dy = grad_y.contiguous(), w = WeightAsGradkitReads(weight);
  const at::Tensor idx = expanded_row_idx.contiguous(), groups = group_list.contiguous();
  at::Tensor dx = EmptyOutput({std::max<int64_t>(batch, 0), w.size(1)}, w.options().dtype(at::kFloat));
  const Descriptor dy_d(op, dy, "grad_y"), w_d(op, w, "weight"),
      idx_d(op, idx, "expanded_row_idx"), g_d(op, groups, "group_list"), dx_d(op, dx, "result");
  CallTwoPhase(
      op,
      [&](uint64_t* ws, gkOpExecutor** ex) {
        return gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
            dy_d.get(), w_d.get(), idx_d.get(), g_d.get(), batch, topk, RowIdxType(row_idx_type),
            GroupListType(group_list_type), dx_d.get(), ws, ex);
      },
      gkMoeInitRoutingGroupedMatmulGrad);
  return dx;
}

// The routing of MoeInitRouting, with (expand_x) or without the expanded copy of x. M, the kept
// rows, comes back in group_list; the results are cut to M rows (a scatter index keeps its
// batch * topk entries).
std::tuple<at::Tensor, at::Tensor, at::Tensor> InitRouting(std::string_view op, const at::Tensor& x,
                                                           const at::Tensor& expert_idx,
                                                           int64_t expert_capacity,
                                                           int64_t expert_num,
                                                           int64_t group_list_type,
                                                           int64_t row_idx_type, bool expand_x) {
  CheckEnumRange(op, row_idx_type, "row_idx_type");
  CheckEnumRange(op, group_list_type, "group_list_type");
  CheckCpu(op, x, "x");
  CheckCpu(op, expert_idx, "expert_idx");
  TORCH_CHECK(x.dim() == 2 && expert_idx.dim() == 2, "gradkit.", op, ": x has shape ", x.sizes(),
              " and expert_idx ", expert_idx.sizes(), "; they must be [batch, H] and [batch, topK]");
  // x's rows may be strided, not its elements.
  const at::Tensor xs = x.size(1) <= 1 || x.stride(1) == 1 ? x : x.contiguous();
  const at::Tensor experts = expert_idx.contiguous();
  const int64_t slots = experts.numel();
  const int64_t max_rows = expert_capacity > 0 && expert_num > 0 && expert_capacity <= slots / expert_num
                               ? expert_num * expert_capacity
                               : slots;
  const bool gather = row_idx_type == GK_ROW_IDX_GATHER;
  // The index keeps expert_idx's integer type while it can hold every slot.
  const auto idx_type = experts.scalar_type() == at::kInt && slots <= INT32_MAX ? at::kInt : at::kLong;
  at::Tensor ex = expand_x ? EmptyOutput({max_rows, xs.size(1)}, xs.options())
                           : at::Tensor();
  at::Tensor idx = at::empty({gather ? max_rows : slots}, experts.options().dtype(idx_type));
  at::Tensor groups = at::empty({std::max<int64_t>(expert_num, 0)}, experts.options().dtype(at::kLong));
  const Descriptor x_d(op, xs, "x"), e_d(op, experts, "expert_idx"),
      idx_d(op, idx, "expanded_row_idx"), g_d(op, groups, "group_list");
  const OptionalDescriptor ex_d(op, expand_x ? c10::optional<at::Tensor>(ex) : c10::nullopt,
                                "expanded_x");
  CallTwoPhase(
      op,
      [&](uint64_t* ws, gkOpExecutor** exec) {
        return gkMoeInitRoutingGetWorkspaceSize(
            x_d.get(), e_d.get(), expert_capacity, expert_num, GroupListType(group_list_type),
            RowIdxType(row_idx_type), ex_d.get(), idx_d.get(), g_d.get(), ws, exec);
      },
      gkMoeInitRouting);
  const int64_t m = GroupListRows(op, groups, group_list_type);
  if (expand_x) ex = ex.narrow(0, 0, m);
  if (gather) idx = idx.narrow(0, 0, m);
  return {ex, idx, groups};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> MoeInitRouting(
    const at::Tensor& x, const at::Tensor& expert_idx, int64_t expert_capacity,
    int64_t expert_num, int64_t group_list_type, int64_t row_idx_type) {
  return InitRouting("moe_init_routing", x, expert_idx, expert_capacity, expert_num,
                     group_list_type, row_idx_type, /*expand_x=*/true);
}

std::tuple<at::Tensor, at::Tensor> MoeInitRoutingIndex(const at::Tensor& x,
                                                       const at::Tensor& expert_idx,
                                                       int64_t expert_capacity, int64_t expert_num,
                                                       int64_t group_list_type,
                                                       int64_t row_idx_type) {
  auto [ex, idx, groups] = InitRouting("moe_init_routing_index", x, expert_idx, expert_capacity,
                                       expert_num, group_list_type, row_idx_type,
                                       /*expand_x=*/false);
  return {idx, groups};
}

// Rows of the expanded matrix: x's own (plain) or the routing's M (gather-fused).
int64_t ExpandedRows(std::string_view op, const at::Tensor& x, const at::Tensor& group_list,
                     int64_t group_list_type, const c10::optional<at::Tensor>& expanded_row_idx) {
  return expanded_row_idx.has_value() ? GroupListRows(op, group_list, group_list_type)
                                      : x.size(0);
}

// `out` as an operator's result: the caller's tensor, written in place. It must be dense (the
// C API writes whole rows); its shape and dtype are checked by gradkit like any result's.
void CheckOut(std::string_view op, const at::Tensor& out, const char* name = "out") {
  CheckCpu(op, out, name);
  TORCH_CHECK(out.is_contiguous(), "gradkit.", op, ": ", name, " has strides ", out.strides(),
              "; it must be contiguous (a row or expert slice of a contiguous tensor is)");
}

// GroupedMatmul into `out` when given, else into a new tensor of out_dtype; returns the result.
at::Tensor RunGroupedMatmul(std::string_view op, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& group_list, int64_t group_list_type,
                            bool transpose_weight,
                            const c10::optional<at::Tensor>& expanded_row_idx,
                            int64_t row_idx_type, int64_t topk, const at::Tensor* out,
                            c10::optional<at::ScalarType> out_dtype) {
  CheckEnumRange(op, row_idx_type, "row_idx_type");
  CheckEnumRange(op, group_list_type, "group_list_type");
  CheckCpu(op, x, "x");
  CheckCpu(op, weight, "weight");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 3, "gradkit.", op, ": x has shape ", x.sizes(),
              " and weight ", weight.sizes(), "; they must be [M, K] and [G, K, N] (",
              "[G, N, K] with transpose_weight)");
  const at::Tensor xs = x.contiguous(), w = WeightAsGradkitReads(weight);
  const at::Tensor groups = group_list.contiguous();
  c10::optional<at::Tensor> idx;
  if (expanded_row_idx.has_value()) idx = expanded_row_idx->contiguous();
  at::Tensor y;
  if (out != nullptr) {
    CheckOut(op, *out);
    y = *out;
  } else {
    const int64_t m = ExpandedRows(op, xs, groups, group_list_type, idx);
    const int64_t n = transpose_weight ? w.size(1) : w.size(2);
    y = EmptyOutput({m, n}, xs.options().dtype(out_dtype.value_or(xs.scalar_type())));
  }
  const Descriptor x_d(op, xs, "x"), w_d(op, w, "weight"), g_d(op, groups, "group_list"),
      y_d(op, y, out != nullptr ? "out" : "result");
  const OptionalDescriptor idx_d(op, idx, "expanded_row_idx");
  CallTwoPhase(
      op,
      [&](uint64_t* ws, gkOpExecutor** ex) {
        return gkGroupedMatmulGetWorkspaceSize(x_d.get(), w_d.get(), g_d.get(),
                                               GroupListType(group_list_type), transpose_weight,
                                               idx_d.get(), RowIdxType(row_idx_type), topk,
                                               y_d.get(), ws, ex);
      },
      gkGroupedMatmul);
  return y;
}

at::Tensor GroupedMatmul(const at::Tensor& x, const at::Tensor& weight,
                         const at::Tensor& group_list, int64_t group_list_type,
                         bool transpose_weight, const c10::optional<at::Tensor>& expanded_row_idx,
                         int64_t row_idx_type, int64_t topk,
                         c10::optional<at::ScalarType> out_dtype) {
  return RunGroupedMatmul("grouped_matmul", x, weight, group_list, group_list_type,
                          transpose_weight, expanded_row_idx, row_idx_type, topk, nullptr,
                          out_dtype);
}

at::Tensor& GroupedMatmulOut(const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& group_list, int64_t group_list_type,
                             bool transpose_weight,
                             const c10::optional<at::Tensor>& expanded_row_idx,
                             int64_t row_idx_type, int64_t topk, at::Tensor& out) {
  RunGroupedMatmul("grouped_matmul.out", x, weight, group_list, group_list_type,
                   transpose_weight, expanded_row_idx, row_idx_type, topk, &out, c10::nullopt);
  return out;
}

// GroupedMatmulWeightGrad into `out` when given, else into a new tensor; returns the result.
// accumulate: GroupedMatmulWeightGradAdd, adding into `out` (required).
at::Tensor RunGroupedMatmulWeightGrad(std::string_view op, const at::Tensor& x,
                                      const at::Tensor& grad_y, const at::Tensor& group_list,
                                      int64_t group_list_type,
                                      const c10::optional<at::Tensor>& expanded_row_idx,
                                      int64_t row_idx_type, int64_t topk, const at::Tensor* out,
                                      c10::optional<at::ScalarType> out_dtype,
                                      bool accumulate = false) {
  CheckEnumRange(op, row_idx_type, "row_idx_type");
  CheckEnumRange(op, group_list_type, "group_list_type");
  CheckCpu(op, x, "x");
  CheckCpu(op, grad_y, "grad_y");
  CheckCpu(op, group_list, "group_list");
  TORCH_CHECK(x.dim() == 2 && grad_y.dim() == 2 && group_list.dim() == 1, "gradkit.", op,
              ": x has shape ", x.sizes(), ", grad_y ", grad_y.sizes(), ", group_list ",
              group_list.sizes(), "; they must be [M, K], [M, N] and [G]");
  const at::Tensor xs = x.contiguous(), dy = grad_y.contiguous(), groups = group_list.contiguous();
  c10::optional<at::Tensor> idx;
  if (expanded_row_idx.has_value()) idx = expanded_row_idx->contiguous();
  at::Tensor dw;
  if (out != nullptr) {
    CheckOut(op, *out, accumulate ? "self" : "out");
    dw = *out;
  } else {
    dw = EmptyOutput({groups.size(0), xs.size(1), dy.size(1)},
                   xs.options().dtype(out_dtype.value_or(xs.scalar_type())));
  }
  const Descriptor x_d(op, xs, "x"), dy_d(op, dy, "grad_y"), g_d(op, groups, "group_list"),
      dw_d(op, dw, accumulate ? "self" : out != nullptr ? "out" : "result");
  const OptionalDescriptor idx_d(op, idx, "expanded_row_idx");
  const auto plan = accumulate ? gkGroupedMatmulWeightGradAddGetWorkspaceSize
                               : gkGroupedMatmulWeightGradGetWorkspaceSize;
  CallTwoPhase(
      op,
      [&](uint64_t* ws, gkOpExecutor** ex) {
        return plan(x_d.get(), dy_d.get(), g_d.get(), GroupListType(group_list_type), idx_d.get(),
                    RowIdxType(row_idx_type), topk, dw_d.get(), ws, ex);
      },
      accumulate ? gkGroupedMatmulWeightGradAdd : gkGroupedMatmulWeightGrad);
  return dw;
}

at::Tensor GroupedMatmulWeightGrad(const at::Tensor& x, const at::Tensor& grad_y,
                                   const at::Tensor& group_list, int64_t group_list_type,
                                   const c10::optional<at::Tensor>& expanded_row_idx,
                                   int64_t row_idx_type, int64_t topk,
                                   c10::optional<at::ScalarType> out_dtype) {
  return RunGroupedMatmulWeightGrad("grouped_matmul_weight_grad", x, grad_y, group_list,
                                    group_list_type, expanded_row_idx, row_idx_type, topk,
                                    nullptr, out_dtype);
}

at::Tensor& GroupedMatmulWeightGradOut(const at::Tensor& x, const at::Tensor& grad_y,
                                       const at::Tensor& group_list, int64_t group_list_type,
                                       const c10::optional<at::Tensor>& expanded_row_idx,
                                       int64_t row_idx_type, int64_t topk, at::Tensor& out) {
  RunGroupedMatmulWeightGrad("grouped_matmul_weight_grad.out", x, grad_y, group_list,
                             group_list_type, expanded_row_idx, row_idx_type, topk, &out,
                             c10::nullopt);
  return out;
}

// self += the weight gradient (GroupedMatmulWeightGradAdd): float32 or x's dtype, contiguous.
at::Tensor& GroupedMatmulWeightGradAdd_(at::Tensor& self, const at::Tensor& x,
                                        const at::Tensor& grad_y, const at::Tensor& group_list,
                                        int64_t group_list_type,
                                        const c10::optional<at::Tensor>& expanded_row_idx,
                                        int64_t row_idx_type, int64_t topk) {
  RunGroupedMatmulWeightGrad("grouped_matmul_weight_grad_add_", x, grad_y, group_list,
                             group_list_type, expanded_row_idx, row_idx_type, topk, &self,
                             c10::nullopt, /*accumulate=*/true);
  return self;
}

at::Tensor MoeFinalizeRouting(const at::Tensor& expanded_y, const at::Tensor& probs,
                              const at::Tensor& expanded_row_idx, int64_t row_idx_type,
                              c10::optional<at::ScalarType> out_dtype) {
  constexpr std::string_view op = "moe_finalize_routing";
  CheckEnumRange(op, row_idx_type, "row_idx_type");
  CheckCpu(op, expanded_y, "expanded_y");
  CheckCpu(op, probs, "probs");
  TORCH_CHECK(expanded_y.dim() == 2 && probs.dim() == 2, "gradkit.", op, ": expanded_y has shape ",
              expanded_y.sizes(), " and probs ", probs.sizes(), "; they must be [M, N] and [batch, topK]");
  const at::Tensor ey = expanded_y.contiguous(), p = probs.contiguous();
  const at::Tensor idx = expanded_row_idx.contiguous();
  at::Tensor out = EmptyOutput({p.size(0), ey.size(1)},
                             ey.options().dtype(out_dtype.value_or(ey.scalar_type())));
  const Descriptor ey_d(op, ey, "expanded_y"), p_d(op, p, "probs"),
      idx_d(op, idx, "expanded_row_idx"), out_d(op, out, "result");
  CallTwoPhase(
      op,
      [&](uint64_t* ws, gkOpExecutor** ex) {
        return gkMoeFinalizeRoutingGetWorkspaceSize(ey_d.get(), p_d.get(), idx_d.get(),
                                                    RowIdxType(row_idx_type), out_d.get(), ws, ex);
      },
      gkMoeFinalizeRouting);
  return out;
}

std::tuple<at::Tensor, at::Tensor> MoeFinalizeRoutingGrad(const at::Tensor& grad_out,
                                                          const at::Tensor& expanded_y,
                                                          const at::Tensor& probs,
                                                          const at::Tensor& expanded_row_idx,
                                                          int64_t row_idx_type) {
  constexpr std::string_view op = "moe_finalize_routing_grad";
  CheckEnumRange(op, row_idx_type, "row_idx_type");
  const at::Tensor dout = grad_out.contiguous(), ey = expanded_y.contiguous(),
                   p = probs.contiguous(), idx = expanded_row_idx.contiguous();
  at::Tensor dey = EmptyOutput(ey.sizes(), ey.options()), dp = at::empty_like(p);
  const Descriptor dout_d(op, dout, "grad_out"), ey_d(op, ey, "expanded_y"), p_d(op, p, "probs"),
      idx_d(op, idx, "expanded_row_idx"), dey_d(op, dey, "grad_expanded_y"),
      dp_d(op, dp, "grad_probs");
  CallTwoPhase(
      op,
      [&](uint64_t* ws, gkOpExecutor** ex) {
        return gkMoeFinalizeRoutingGradGetWorkspaceSize(dout_d.get(), ey_d.get(), p_d.get(),
                                                        idx_d.get(), RowIdxType(row_idx_type),
                                                        dey_d.get(), dp_d.get(), ws, ex);
      },
      gkMoeFinalizeRoutingGrad);
  return {dey, dp};
}

std::string Version() { return gkGetVersion(); }
std::string CpuIsa() { return gkGetCpuIsa(); }

int64_t SetNumThreads(int64_t threads) {
  TORCH_CHECK(threads >= 0 && threads <= INT32_MAX, "gradkit.set_num_threads: threads is ",
              threads, "; it must be >= 0 (0: the default)");
  if (gkStatus s = gkSetNumThreads(static_cast<int32_t>(threads)); s != GK_SUCCESS) {
    ThrowStatus("set_num_threads", s);
  }
  return gkGetNumThreads();
}

int64_t GetNumThreads() { return gkGetNumThreads(); }

// torch's CPU allocator with every block of 4 MiB or more advised for transparent huge pages
// (AdviseHugePages), what PyTorch 2.1+ does under THP_MEM_ALLOC_ENABLE=1 and torch 1.13 lacks:
// the activations and autograd buffers torch allocates itself, which EmptyOutput does not reach,
// are then faulted in 2 MiB at a time (docs/torch.md, "Memory allocator"). Blocks come from the
// allocator that was in place when it was first enabled, with that allocator's deleter, so
// tensors made before or after a switch free alike.
//
// c10::Allocator's interface moved between torch versions (1.13: `allocate` const; 2.x: not const,
// and `copy_data` pure virtual), so each member is defined in both forms without `override`:
// whichever the base declares is the override, the other an unused overload.
class HugePageCpuAllocator final : public c10::Allocator {
 public:
  explicit HugePageCpuAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t bytes) const {
    c10::DataPtr block = base_->allocate(bytes);
    AdviseHugePages(block.get(), bytes);
    return block;
  }
  c10::DataPtr allocate(size_t bytes) { return std::as_const(*this).allocate(bytes); }
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const { return base_->raw_deleter(); }
  c10::Allocator* base() const { return base_; }

 private:
  c10::Allocator* base_;
};

// Turns the huge-page allocator on or off for the process; returns whether it was on.
bool UseHugePages(bool enable) {
  static std::mutex mutex;
  static HugePageCpuAllocator* wrapper = nullptr;  // kept for the process: torch may call it late
  const std::lock_guard<std::mutex> lock(mutex);
  c10::Allocator* current = c10::GetCPUAllocator();
  const bool was_on = wrapper != nullptr && current == wrapper;
  if (enable == was_on) return was_on;
  if (enable) {
    if (wrapper == nullptr) wrapper = new HugePageCpuAllocator(current);
    TORCH_CHECK(wrapper->base() == current, "gradkit.use_huge_pages: torch's CPU allocator was "
                "replaced after gradkit's huge-page allocator first wrapped it; turn it on "
                "before installing another allocator");
    c10::SetCPUAllocator(wrapper, /*priority=*/0);
    TORCH_CHECK(c10::GetCPUAllocator() == wrapper, "gradkit.use_huge_pages: torch kept its CPU "
                "allocator (another library installed one at a higher priority)");
  } else {
    c10::SetCPUAllocator(wrapper->base(), /*priority=*/0);
  }
  return was_on;
}

}  // namespace
}  // namespace gk::torch_ext

TORCH_LIBRARY(gradkit, m) {
  using namespace gk::torch_ext;
  m.def("elu_grad_v2(Tensor dy, Tensor x, float alpha=1.0, float scale=1.0, "
        "float input_scale=1.0, bool is_result=False) -> Tensor");
  m.def("moe_init_routing_grouped_matmul_grad(Tensor grad_y, Tensor weight, "
        "Tensor expanded_row_idx, Tensor group_list, int batch, int topk, int row_idx_type, "
        "int group_list_type=0) -> Tensor");
  m.def("moe_init_routing(Tensor x, Tensor expert_idx, int expert_capacity, int expert_num, "
        "int group_list_type=0, int row_idx_type=0) -> (Tensor, Tensor, Tensor)");
  m.def("moe_init_routing_index(Tensor x, Tensor expert_idx, int expert_capacity, "
        "int expert_num, int group_list_type=0, int row_idx_type=0) -> (Tensor, Tensor)");
  m.def("grouped_matmul(Tensor x, Tensor weight, Tensor group_list, int group_list_type=0, "
        "bool transpose_weight=False, Tensor? expanded_row_idx=None, int row_idx_type=0, "
        "int topk=1, ScalarType? out_dtype=None) -> Tensor");
  m.def("grouped_matmul_weight_grad(Tensor x, Tensor grad_y, Tensor group_list, "
        "int group_list_type=0, Tensor? expanded_row_idx=None, int row_idx_type=0, int topk=1, "
        "ScalarType? out_dtype=None) -> Tensor");
  // Into the caller's tensor (a row slice of y, an expert slice of a weight gradient): its
  // dtype is the result's (float32 or the input dtype).
  m.def("grouped_matmul.out(Tensor x, Tensor weight, Tensor group_list, int group_list_type=0, "
        "bool transpose_weight=False, Tensor? expanded_row_idx=None, int row_idx_type=0, "
        "int topk=1, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("grouped_matmul_weight_grad.out(Tensor x, Tensor grad_y, Tensor group_list, "
        "int group_list_type=0, Tensor? expanded_row_idx=None, int row_idx_type=0, int topk=1, "
        "*, Tensor(a!) out) -> Tensor(a!)");
  // self += the weight gradient (aclnnGroupedMatmulAdd's role): each element its value plus the
  // float32 sum, rounded once; an empty expert's slice keeps its bits.
  m.def("grouped_matmul_weight_grad_add_(Tensor(a!) self, Tensor x, Tensor grad_y, "
        "Tensor group_list, int group_list_type=0, Tensor? expanded_row_idx=None, "
        "int row_idx_type=0, int topk=1) -> Tensor(a!)");
  m.def("moe_finalize_routing(Tensor expanded_y, Tensor probs, Tensor expanded_row_idx, "
        "int row_idx_type, ScalarType? out_dtype=None) -> Tensor");
  m.def("moe_finalize_routing_grad(Tensor grad_out, Tensor expanded_y, Tensor probs, "
        "Tensor expanded_row_idx, int row_idx_type) -> (Tensor, Tensor)");
  m.def("version() -> str", &Version);
  m.def("cpu_isa() -> str", &CpuIsa);
  m.def("set_num_threads(int threads) -> int", &SetNumThreads);
  m.def("get_num_threads() -> int", &GetNumThreads);
  m.def("use_huge_pages(bool enable=True) -> bool", &UseHugePages);
}

TORCH_LIBRARY_IMPL(gradkit, CPU, m) {
  using namespace gk::torch_ext;
  m.impl("elu_grad_v2", &EluGradV2);
  m.impl("moe_init_routing_grouped_matmul_grad", &MoeInitRoutingGroupedMatmulGrad);
  m.impl("moe_init_routing", &MoeInitRouting);
  m.impl("moe_init_routing_index", &MoeInitRoutingIndex);
  m.impl("grouped_matmul", &GroupedMatmul);
  m.impl("grouped_matmul_weight_grad", &GroupedMatmulWeightGrad);
  m.impl("grouped_matmul.out", &GroupedMatmulOut);
  m.impl("grouped_matmul_weight_grad.out", &GroupedMatmulWeightGradOut);
  m.impl("grouped_matmul_weight_grad_add_", &GroupedMatmulWeightGradAdd_);
  m.impl("moe_finalize_routing", &MoeFinalizeRouting);
  m.impl("moe_finalize_routing_grad", &MoeFinalizeRoutingGrad);
}
