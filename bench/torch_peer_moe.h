// libtorch as a peer of MoeInitRoutingGroupedMatmulGrad: the composite PyTorch autograd runs,
// per-expert at::mm into a full d_expanded_x, then index_add_ into gradX. Loaded on first use, like
// every peer (torch_peer_abi.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace gk::bench {

// A callable computing gradX (dtype, [batch, K]) from dy ([M, N]) and w ([G, K, N]) in `dtype`
// with `threads` intra-op threads, or nullopt (with `why`) when libtorch is absent.
std::optional<std::function<void()>> MakeTorchMoeGradComposite(
    const void* dy, const void* w, void* dx, DType dtype, int64_t m, int64_t n, int64_t k,
    int64_t batch, const std::vector<int64_t>& group_counts, const std::vector<int64_t>& row_token,
    int32_t threads, std::string* why);

}  // namespace gk::bench
