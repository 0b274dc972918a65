// EluGradV2: arguments, the dtype support table and every check phase 1 makes.
#pragma once

#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"
#include "gradkit/elu_grad_v2.h"

namespace gk {

inline constexpr std::string_view kEluGradV2Name = "EluGradV2";
inline constexpr int kEluGradV2MaxRank = 8;

struct EluGradV2Args {
  const gkTensor* grad_output;  // dy
  const gkTensor* x;            // the forward's input, or its output when is_result
  double alpha;
  double scale;
  double input_scale;
  bool is_result;
  const gkTensor* grad_input;   // y
};

// Every (input, output) dtype pair the operator runs; the output defaults to the input's dtype
// and may be preset to float32.
struct EluGradV2DTypePair {
  DType input;
  DType output;
};
inline constexpr EluGradV2DTypePair kEluGradV2DTypeSupport[] = {
    {DType::kF32, DType::kF32},   {DType::kF16, DType::kF16}, {DType::kF16, DType::kF32},
    {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32},
};

// Checks every argument; on failure records the message (naming the argument, its value and the
// rule) and returns its status. Reads only descriptors, never tensor data.
gkStatus CheckEluGradV2(std::string_view api, const EluGradV2Args& args);

}  // namespace gk
