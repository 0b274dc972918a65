// Stand-ins used when libtorch is not installed.
#include "bench/torch_peer.h"

namespace gk::bench {

bool TorchPeerAvailable() { return false; }
std::string TorchPeerVersion() { return ""; }

std::optional<std::function<void()>> MakeTorchEluBackward(const void*, const void*, void*, int64_t,
                                                          DType, double, double, double, bool,
                                                          int32_t, std::string* why) {
  if (why != nullptr) *why = "libtorch is not installed";
  return std::nullopt;
}

}  // namespace gk::bench
