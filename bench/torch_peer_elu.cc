// The libtorch peer module (libgradkit_torch_peer.so): ELU's peer and the table the CLI loads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include "bench/torch_peer_abi.h"
#include "bench/torch_peer_util.h"

namespace gk::bench::torch_module {

PeerRun MakeEluBackward(const void* dy, const void* x, void* y, int64_t elems, DType dtype,
                        double alpha, double scale, double input_scale, bool is_result,
                        int32_t threads, std::string* why) {
  const auto options = at::TensorOptions().dtype(TorchScalarType(dtype));
  auto dy_t = at::from_blob(const_cast<void*>(dy), {elems}, options);
  auto x_t = at::from_blob(const_cast<void*>(x), {elems}, options);
  auto y_t = at::from_blob(y, {elems}, options);
  at::set_num_threads(threads);
  auto run = [=]() mutable {
    at::elu_backward_out(y_t, dy_t, alpha, scale, input_scale, is_result, x_t);
  };
  return TryTorchPeer(run, why);
}

}  // namespace gk::bench::torch_module

extern "C" __attribute__((visibility("default"))) const gk::bench::TorchPeerAbi*
gradkit_torch_peer_abi() {
  static const gk::bench::TorchPeerAbi abi{gk::bench::kTorchPeerAbiVersion, TORCH_VERSION,
                                           &gk::bench::torch_module::MakeEluBackward,
                                           &gk::bench::torch_module::MakeMoeGradComposite};
  return &abi;
}
