#include "bindings/torch/torch_call.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace gk::torch_ext {
namespace {

gkDataType ToGradkit(std::string_view op, const at::Tensor& t, std::string_view name) {
  switch (t.scalar_type()) {
    case at::kFloat: return GK_FLOAT;
    case at::kHalf: return GK_FLOAT16;
    case at::kBFloat16: return GK_BF16;
    case at::kInt: return GK_INT32;
    case at::kLong: return GK_INT64;
    case at::kDouble: return GK_DOUBLE;
    default:
      TORCH_CHECK(false, "gradkit.", op, ": ", name, " has dtype ", t.scalar_type(),
                  "; gradkit takes float32, float16, bfloat16, int32, int64 (each operator "
                  "names its own subset)");
  }
}

}  // namespace

void AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (data == nullptr || bytes < 2 * kHuge) return;
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = (begin + bytes) & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

at::Tensor EmptyOutput(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty(sizes, options);
  static const bool enabled = [] {
    const char* v = std::getenv("GRADKIT_TORCH_HUGEPAGES");
    return v == nullptr || std::string_view(v) != "0";
  }();
  if (enabled && t.device().is_cpu()) AdviseHugePages(t.data_ptr(), t.nbytes());
  return t;
}

void ThrowStatus(std::string_view op, gkStatus status) {
  const char* message = gkGetRecentErrMsg();
  TORCH_CHECK(false, "gradkit.", op, ": ",
              message != nullptr && *message != '\0' ? message : "failed without a message",
              " (status ", static_cast<int>(status), ")");
}

void CheckCpu(std::string_view op, const at::Tensor& t, std::string_view name) {
  TORCH_CHECK(t.defined(), "gradkit.", op, ": ", name, " is an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "gradkit.", op, ": ", name, " is on ", t.device(),
              "; gradkit's torch operators run on CPU tensors");
}

Descriptor::Descriptor(std::string_view op, const at::Tensor& t, std::string_view name) {
  CheckCpu(op, t, name);
  const gkDataType dtype = ToGradkit(op, t, name);
  // data_ptr() already holds the storage offset (an empty tensor's may be NULL: gradkit takes it).
  desc_ = gkCreateTensor(t.sizes().data(), static_cast<uint64_t>(t.dim()), dtype,
                         t.strides().data(), 0, t.data_ptr());
  if (desc_ == nullptr) {
    TORCH_CHECK(false, "gradkit.", op, ": ", name, ": ", gkGetRecentErrMsg());
  }
}

int64_t GroupListRows(std::string_view op, const at::Tensor& group_list, int64_t group_list_type) {
  CheckCpu(op, group_list, "group_list");
  if (group_list.dim() != 1 || group_list.numel() == 0 ||
      !at::isIntegralType(group_list.scalar_type(), /*includeBool=*/false)) {
    return 0;  // gradkit refuses it with the full rule
  }
  const int64_t rows = group_list_type == GK_GROUP_LIST_CUMSUM
                           ? group_list[-1].item<int64_t>()
                           : group_list.sum().item<int64_t>();
  return rows > 0 ? rows : 0;
}

at::Tensor WeightAsGradkitReads(const at::Tensor& t) {
  if (t.is_contiguous() || (t.dim() == 3 && t.transpose(1, 2).is_contiguous())) return t;
  return t.contiguous();
}

}  // namespace gk::torch_ext
