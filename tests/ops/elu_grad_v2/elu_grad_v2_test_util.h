// Shared by the EluGradV2 tests: buffers in any dtype, the operator through its C API, and the
// comparison against the float64 reference with the contract of elu_grad_v2_ref.h.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "ops/elu_grad_v2/elu_grad_v2_ref.h"

namespace gk::testing {

struct Buffer {
  DType dtype;
  std::vector<uint8_t> bytes;
  Buffer(DType d, int64_t elems) : dtype(d), bytes(static_cast<size_t>(elems * ElementBytes(d))) {}
  float get(int64_t i) const { return LoadAsF32(bytes.data(), i, dtype); }
  void set(int64_t i, float v) { StoreFromF32(bytes.data(), i, dtype, v); }
  void* data() { return bytes.data(); }
};

// Random values in [low, high), rounded to the buffer's dtype.
inline Buffer RandomBuffer(DType dtype, int64_t elems, float low, float high, uint32_t seed) {
  Buffer b(dtype, elems);
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  for (int64_t i = 0; i < elems; ++i) b.set(i, distribution(generator));
  return b;
}

// Checks one output element against the float64 reference of its (dtype-rounded) inputs.
inline ::testing::AssertionResult EluGradV2Matches(float dy, float x, float got,
                                                   const EluGradV2Coefficients& c, bool is_result,
                                                   DType out_dtype) {
  const double ref = EluGradV2ReferenceF64(dy, x, c, is_result);
  if (std::isnan(ref) || std::isnan(got)) {
    if (std::isnan(ref) && std::isnan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "dy " << dy << " x " << x << ": got " << got
                                         << ", reference " << ref;
  }
  const double rounded_ref = static_cast<double>(RoundToDType(static_cast<float>(ref), out_dtype));
  if (std::isinf(rounded_ref) || std::isinf(got)) {
    if (got == rounded_ref) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "dy " << dy << " x " << x << ": got " << got
                                         << ", reference " << ref;
  }
  const double tolerance = EluGradV2Tolerance(ref, dy, x, c, is_result, out_dtype);
  if (std::fabs(got - ref) <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "dy " << dy << " x " << x << (is_result ? " result" : " exp")
                                       << ": got " << got << ", reference " << ref
                                       << ", error " << std::fabs(got - ref) << " > tolerance "
                                       << tolerance;
}

struct TensorOwner {
  gkTensor* t = nullptr;
  TensorOwner() = default;
  explicit TensorOwner(gkTensor* tensor) : t(tensor) {}
  TensorOwner(const TensorOwner&) = delete;
  TensorOwner& operator=(TensorOwner&& o) noexcept {
    std::swap(t, o.t);
    return *this;
  }
  ~TensorOwner() { gkDestroyTensor(t); }
  gkTensor* get() const { return t; }
};

inline TensorOwner MakeTensor(const std::vector<int64_t>& shape, DType dtype, void* data,
                              const std::vector<int64_t>& strides = {}, int64_t offset = 0) {
  return TensorOwner(gkCreateTensor(shape.data(), shape.size(), static_cast<gkDataType>(dtype),
                                    strides.empty() ? nullptr : strides.data(), offset, data));
}

struct EluGradV2Call {
  double alpha = 1.0, scale = 1.0, input_scale = 1.0;
  bool is_result = false;
};

// Runs both phases; returns the first failing status (message in gkGetRecentErrMsg()).
inline gkStatus RunEluGradV2(const gkTensor* dy, const gkTensor* x, gkTensor* y,
                             const EluGradV2Call& call) {
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  gkStatus status = gkEluGradV2GetWorkspaceSize(dy, x, call.alpha, call.scale, call.input_scale,
                                                call.is_result, y, &workspace_size, &executor);
  if (status != GK_SUCCESS) return status;
  std::vector<uint8_t> workspace(workspace_size);
  status = gkEluGradV2(workspace.data(), workspace_size, executor, nullptr);
  gkDestroyExecutor(executor);
  return status;
}

}  // namespace gk::testing
