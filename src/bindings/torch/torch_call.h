// gradkit's C API seen from torch: a tensor descriptor that lives as long as the call, and the
// two-phase call itself (plan, a workspace from torch's allocator, run), with every failure raised
// as a c10::Error (RuntimeError in Python) carrying gradkit's own message.
//
// Only the C API (include/gradkit) is used here: the extension sees gradkit as a user would. The
// headers used are those torch 1.13 and 2.x share (ATen, torch/library.h; c10::optional, which
// 2.x keeps as an alias of std::optional).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "gradkit/gradkit.h"

namespace gk::torch_ext {

// Raises c10::Error: "gradkit.<op>: <gradkit's message>".
[[noreturn]] void ThrowStatus(std::string_view op, gkStatus status);

// Tensors come from the caller's CPU memory; a CUDA tensor is refused with a message naming it.
void CheckCpu(std::string_view op, const at::Tensor& t, std::string_view name);

// A descriptor of `t` as it is (sizes, strides, data); the torch tensor must outlive it.
class Descriptor {
 public:
  Descriptor(std::string_view op, const at::Tensor& t, std::string_view name);
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { gkDestroyTensor(desc_); }
  gkTensor* get() const { return desc_; }

 private:
  gkTensor* desc_ = nullptr;
};

// Descriptors for an optional tensor: NULL when absent.
class OptionalDescriptor {
 public:
  OptionalDescriptor(std::string_view op, const c10::optional<at::Tensor>& t,
                     std::string_view name) {
    if (t.has_value()) desc_ = std::make_unique<Descriptor>(op, *t, name);
  }
  gkTensor* get() const { return desc_ ? desc_->get() : nullptr; }

 private:
  std::unique_ptr<Descriptor> desc_;
};

// Phase 1 (plan(&workspace_size, &executor)), then phase 2 (run(workspace, size, executor, stream)).
template <typename Plan, typename Run>
void CallTwoPhase(std::string_view op, Plan&& plan, Run&& run) {
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  if (gkStatus s = plan(&workspace_size, &executor); s != GK_SUCCESS) ThrowStatus(op, s);
  const std::unique_ptr<gkOpExecutor, gkStatus (*)(gkOpExecutor*)> owned(executor,
                                                                          gkDestroyExecutor);
  at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_size)}, at::kByte);
  if (gkStatus s = run(workspace.data_ptr(), workspace_size, executor, nullptr); s != GK_SUCCESS) {
    ThrowStatus(op, s);
  }
}

// at::empty for an output gradkit writes first. On Linux a large one (>= 4 MiB) is advised for
// transparent huge pages (madvise MADV_HUGEPAGE on its 2 MiB-aligned interior, as PyTorch 2.x's
// THP_MEM_ALLOC_ENABLE does for all of its allocations): glibc maps blocks of 32 MiB and more
// afresh on every allocation, and a training step would otherwise fault them in 4 KiB at a time
// (32 MiB: 88 ms against 8 ms on the development VM, docs/torch.md). Advice only: where the
// kernel has THP off, or the call fails, nothing changes. GRADKIT_TORCH_HUGEPAGES=0 turns it off.
at::Tensor EmptyOutput(at::IntArrayRef sizes, const at::TensorOptions& options);

// The advice itself, for `bytes` from `data` (4 MiB or more; else nothing): what EmptyOutput and
// the huge-page CPU allocator (use_huge_pages in torch_ops.cc) give their blocks.
void AdviseHugePages(void* data, size_t bytes);

// The rows a groupList describes: its sum (count) or its last entry (cumsum). Values are not
// checked here (gradkit checks them, with a better message); a negative total gives 0.
int64_t GroupListRows(std::string_view op, const at::Tensor& group_list, int64_t group_list_type);

// `t` itself when it is C-contiguous or the transposed view of a C-contiguous 3-d buffer (the
// two weight layouts gradkit reads in place), else a contiguous copy.
at::Tensor WeightAsGradkitReads(const at::Tensor& t);

}  // namespace gk::torch_ext
