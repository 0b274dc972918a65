// libtorch as a peer in the benchmarks. The peer lives in a module loaded on first use
// (torch_peer_abi.h, torch_peer_loader.cc); these report why it is absent when it cannot be loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace gk::bench {

bool TorchPeerAvailable();          // loads the module on first call
std::string TorchPeerVersion();     // "" when absent
std::string TorchPeerWhyAbsent();   // "" when available

// A callable running at::elu_backward_out on the given contiguous buffers with `threads` intra-op
// threads, or nullopt (with `why`) when libtorch is absent or rejects the dtype.
std::optional<std::function<void()>> MakeTorchEluBackward(const void* dy, const void* x, void* y,
                                                          int64_t elems, DType dtype, double alpha,
                                                          double scale, double input_scale,
                                                          bool is_result, int32_t threads,
                                                          std::string* why);

}  // namespace gk::bench
