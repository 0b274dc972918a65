// The CLI's side of the libtorch peer: finds libgradkit_torch_peer.so and loads it once, on the
// first call that needs it (see torch_peer_abi.h for why it is a module). Where the module is:
// $GRADKIT_TORCH_PEER when set, else the build tree's library folder seen from the executable's
// (bin/../lib). The module is not installed: an installed gradkit benchmarks without the peer.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "bench/torch_peer.h"
#include "bench/torch_peer_abi.h"
#include "bench/torch_peer_moe.h"

namespace gk::bench {
namespace {

struct LoadedPeer {
  const TorchPeerAbi* abi = nullptr;
  std::string why_absent;
};

#ifdef GRADKIT_TORCH_PEER_FILE
std::string ModulePath() {
  if (const char* path = std::getenv("GRADKIT_TORCH_PEER"); path != nullptr && *path != '\0') {
    return path;
  }
  char exe[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) return GRADKIT_TORCH_PEER_FILE;  // leave the search to dlopen
  std::string dir(exe, static_cast<size_t>(len));
  dir.resize(dir.rfind('/') + 1);
  return dir + GRADKIT_TORCH_PEER_RELDIR "/" GRADKIT_TORCH_PEER_FILE;
}
#endif

LoadedPeer Load() {
  LoadedPeer peer;
#ifndef GRADKIT_TORCH_PEER_FILE
  peer.why_absent = "libtorch was not found when gradkit was built";
#else
  const std::string path = ModulePath();
  // The OpenBLAS behind Debian's libtorch (its pthread build) keeps its workers spinning for 2^28
  // cycles after each call, on the cores the next candidate of an interleaved benchmark needs:
  // the fused MoE d_x, timed right after the peer, took 180-200 ms instead of 145 (S2 float32,
  // 2 threads), one core's worth of CPU burned while the process slept 100 ms after the peer.
  // 2^4 cycles, then they sleep; read when the library loads, so set before the module (and
  // OpenBLAS with it) is. A value the user set is kept. bench/torch_moe_bench.py does the same.
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", /*overwrite=*/0);
  // Never closed: the callables it returns run its code until the process ends.
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) {
    const char* err = dlerror();
    peer.why_absent = "cannot load the libtorch peer " + path + ": " + (err ? err : "unknown");
    return peer;
  }
  using Entry = const TorchPeerAbi* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(module, kTorchPeerAbiSymbol));
  const TorchPeerAbi* abi = entry != nullptr ? entry() : nullptr;
  if (abi == nullptr || abi->abi_version != kTorchPeerAbiVersion) {
    peer.why_absent = path + " is not this gradkit's libtorch peer (rebuild it)";
    return peer;
  }
  peer.abi = abi;
#endif
  return peer;
}

const LoadedPeer& Peer() {
  static const LoadedPeer peer = Load();  // thread-safe, once
  return peer;
}

}  // namespace

bool TorchPeerAvailable() { return Peer().abi != nullptr; }

std::string TorchPeerVersion() { return Peer().abi ? Peer().abi->torch_version : ""; }

std::string TorchPeerWhyAbsent() { return Peer().why_absent; }

PeerRun MakeTorchEluBackward(const void* dy, const void* x, void* y, int64_t elems, DType dtype,
                             double alpha, double scale, double input_scale, bool is_result,
                             int32_t threads, std::string* why) {
  if (const TorchPeerAbi* abi = Peer().abi) {
    return abi->make_elu_backward(dy, x, y, elems, dtype, alpha, scale, input_scale, is_result,
                                  threads, why);
  }
  if (why != nullptr) *why = Peer().why_absent;
  return std::nullopt;
}

PeerRun MakeTorchMoeGradComposite(const void* dy, const void* w, void* dx, DType dtype, int64_t m,
                                  int64_t n, int64_t k, int64_t batch,
                                  const std::vector<int64_t>& group_counts,
                                  const std::vector<int64_t>& row_token, int32_t threads,
                                  std::string* why) {
  if (const TorchPeerAbi* abi = Peer().abi) {
    return abi->make_moe_grad_composite(dy, w, dx, dtype, m, n, k, batch, group_counts, row_token,
                                        threads, why);
  }
  if (why != nullptr) *why = Peer().why_absent;
  return std::nullopt;
}

}  // namespace gk::bench
