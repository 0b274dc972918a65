// Shared by the torch_peer*.cc translation units (the only ones that include libtorch).
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace gk::bench {

inline at::ScalarType TorchScalarType(DType dtype) {
  switch (dtype) {
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

// Runs the peer once; returns it when libtorch accepts it, else nullopt with libtorch's reason
// (e.g. no float16 kernel on CPU) in `why`.
inline std::optional<std::function<void()>> TryTorchPeer(std::function<void()> run,
                                                         std::string* why) {
  try {
    run();
  } catch (const std::exception& e) {
    if (why != nullptr) *why = std::string(e.what()).substr(0, 120);
    return std::nullopt;
  }
  return run;
}

}  // namespace gk::bench
