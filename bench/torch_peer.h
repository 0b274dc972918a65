// libtorch as a peer in the benchmarks. Only torch_peer*.cc include libtorch's headers; without
// libtorch (GRADKIT_HAVE_TORCH undefined) these report that the peer is absent.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace gk::bench {

bool TorchPeerAvailable();
std::string TorchPeerVersion();  // "" when absent

// A callable running at::elu_backward_out on the given contiguous buffers with `threads` intra-op
// threads, or nullopt (with `why`) when libtorch is absent or rejects the dtype.
std::optional<std::function<void()>> MakeTorchEluBackward(const void* dy, const void* x, void* y,
                                                          int64_t elems, DType dtype, double alpha,
                                                          double scale, double input_scale,
                                                          bool is_result, int32_t threads,
                                                          std::string* why);

}  // namespace gk::bench
