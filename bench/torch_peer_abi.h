// The boundary between the CLI and its libtorch peer. The peer is a module of its own,
// libgradkit_torch_peer.so (built when libtorch is found), that the CLI loads with dlopen the first
// time a benchmark asks for it. libtorch maps ~160 MiB at startup; loaded on demand it costs
// nothing to `gradkit moe-grad`, `elu-grad` and the other commands whose peak memory is part of
// their contract (tests/python/test_cli_memory.py).
//
// Both sides are built by the same CMake run with the same compiler, so the table may use C++
// types; kTorchPeerAbiVersion guards against a stale module left in a build tree.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace gk::bench {

inline constexpr int32_t kTorchPeerAbiVersion = 1;
inline constexpr char kTorchPeerAbiSymbol[] = "gradkit_torch_peer_abi";

using PeerRun = std::optional<std::function<void()>>;

struct TorchPeerAbi {
  int32_t abi_version;
  const char* torch_version;
  // The peers of bench/torch_peer.h and bench/torch_peer_moe.h, same arguments.
  PeerRun (*make_elu_backward)(const void* dy, const void* x, void* y, int64_t elems, DType dtype,
                               double alpha, double scale, double input_scale, bool is_result,
                               int32_t threads, std::string* why);
  PeerRun (*make_moe_grad_composite)(const void* dy, const void* w, void* dx, DType dtype,
                                     int64_t m, int64_t n, int64_t k, int64_t batch,
                                     const std::vector<int64_t>& group_counts,
                                     const std::vector<int64_t>& row_token, int32_t threads,
                                     std::string* why);
};

// Defined in the module (torch_peer_elu.cc, torch_peer_moe.cc); the CLI never links them.
namespace torch_module {
PeerRun MakeEluBackward(const void* dy, const void* x, void* y, int64_t elems, DType dtype,
                        double alpha, double scale, double input_scale, bool is_result,
                        int32_t threads, std::string* why);
PeerRun MakeMoeGradComposite(const void* dy, const void* w, void* dx, DType dtype, int64_t m,
                             int64_t n, int64_t k, int64_t batch,
                             const std::vector<int64_t>& group_counts,
                             const std::vector<int64_t>& row_token, int32_t threads,
                             std::string* why);
}  // namespace torch_module

}  // namespace gk::bench
