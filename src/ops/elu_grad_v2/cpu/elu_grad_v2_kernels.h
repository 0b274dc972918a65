// EluGradV2 CPU kernels: contiguous runs of elements, any supported (input, output) dtype pair,
// with the SIMD target chosen at run time (Highway), ending in a scalar fallback.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu/stream_copy.h"  // FlushStreamingStores
#include "core/dtype.h"
#include "ops/elu_grad_v2/elu_grad_v2_ref.h"

namespace gk {

// y[i] = formula(dy[i], x[i]) for i < n; dy, x in the input dtype, y in the output dtype.
// y may equal dy or x (in place). stream_output: write y with non-temporal stores where the
// target has them (for outputs too large to stay in cache); the results are the same. Such
// stores are weakly ordered: a caller that streams ends its share with FlushStreamingStores()
// before other threads read y (a fence per call would stall every tile).
using EluGradV2Kernel = void (*)(const void* dy, const void* x, void* y, int64_t n,
                                 const EluGradV2Coefficients& coef, bool stream_output);

struct EluGradV2KernelEntry {
  const char* name;  // e.g. "f16_f32_exp"
  DType input;
  DType output;
  bool is_result;
  EluGradV2Kernel kernel;  // dispatches to the best SIMD target at call time
};

// For tests: false makes the bfloat16 kernels of Highway 1.0's AVX-512 targets round in integer
// arithmetic even where the CPU has vcvtne2ps2bf16 (convert-inl.h), so both run here.
void AllowNativeBf16Conversion(bool allow);

// Every kernel of elu_grad_v2_kernels.inc.
const std::vector<EluGradV2KernelEntry>& EluGradV2Kernels();
// The kernel for a dtype pair and mode, or nullptr if none is compiled.
EluGradV2Kernel FindEluGradV2Kernel(DType input, DType output, bool is_result);

}  // namespace gk
