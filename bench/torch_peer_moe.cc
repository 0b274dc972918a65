// Part of the libtorch peer module (see torch_peer_abi.h): the MoE backward as PyTorch composes it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "bench/torch_peer_abi.h"
#include "bench/torch_peer_util.h"

namespace gk::bench::torch_module {

PeerRun MakeMoeGradComposite(
    const void* dy, const void* w, void* dx, DType dtype, int64_t m, int64_t n, int64_t k,
    int64_t batch, const std::vector<int64_t>& group_counts, const std::vector<int64_t>& row_token,
    int32_t threads, std::string* why) {
  const auto options = at::TensorOptions().dtype(TorchScalarType(dtype));
  const int64_t g = static_cast<int64_t>(group_counts.size());
  auto dy_t = at::from_blob(const_cast<void*>(dy), {m, n}, options);
  auto w_t = at::from_blob(const_cast<void*>(w), {g, k, n}, options);
  auto dx_t = at::from_blob(dx, {batch, k}, options);
  auto tokens = at::from_blob(const_cast<int64_t*>(row_token.data()), {m}, at::kLong).clone();
  auto expanded = at::empty({m, k}, options);  // d_expanded_x: what the fused operator avoids
  at::set_num_threads(threads);
  auto run = [=]() mutable {
    int64_t row = 0;
    for (int64_t e = 0; e < g; ++e) {
      const int64_t rows = group_counts[e];
      if (rows > 0) {
        auto out = expanded.narrow(0, row, rows);
        at::mm_out(out, dy_t.narrow(0, row, rows), w_t[e].t());
      }
      row += rows;
    }
    dx_t.zero_();
    dx_t.index_add_(0, tokens, expanded);
  };
  return TryTorchPeer(run, why);
}

}  // namespace gk::bench::torch_module
