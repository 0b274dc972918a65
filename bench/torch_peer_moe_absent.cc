// Stand-in used when libtorch is not installed.
#include "bench/torch_peer_moe.h"

namespace gk::bench {

std::optional<std::function<void()>> MakeTorchMoeGradComposite(
    const void*, const void*, void*, DType, int64_t, int64_t, int64_t, int64_t,
    const std::vector<int64_t>&, const std::vector<int64_t>&, int32_t, std::string* why) {
  if (why != nullptr) *why = "libtorch is not installed";
  return std::nullopt;
}

}  // namespace gk::bench
