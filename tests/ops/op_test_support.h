// Shared by the operator tests: C API tensors that free themselves, index arrays in either index
// dtype, a thread-count scope and phase 2 with the workspace phase 1 asked for.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"

namespace gk::testing {

// Sets an environment variable for the scope and restores it after.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    setenv(name, value, 1);
  }
  ~EnvScope() {
    if (saved_.empty()) unsetenv(name_);
    else setenv(name_, saved_.c_str(), 1);
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  const char* name_;
  std::string saved_;
};

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif

// Whether oneDNN 2.x runs a matmul of this dtype on its brgemm kernels here: float32 wants
// avx512_core (AVX512 F, BW, VL, DQ), bfloat16 AVX512-BF16 besides (on AVX2 alone float32 runs
// on gemm:jit and bfloat16 on gradkit's own GEMM). Decided from the CPU, not from what the
// library picked, so that a fallback on such a CPU fails the tests that need brgemm.
inline bool CpuHasBrgemmFor(DType dtype) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  const bool core = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return dtype == DType::kBF16 ? core && __builtin_cpu_supports("avx512bf16") : core;
#else
  (void)dtype;
  return false;
#endif
}

// values as GK_INT32 or GK_INT64 bytes (int32 keeps the low half).
inline std::vector<uint8_t> IndexBytes(const std::vector<int64_t>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * ElementBytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kI32) {
      const auto v = static_cast<int32_t>(values[i]);
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      std::memcpy(out.data() + 8 * i, &values[i], 8);
    }
  }
  return out;
}

inline std::vector<int64_t> IndexValues(const std::vector<uint8_t>& bytes, DType dtype) {
  std::vector<int64_t> out(bytes.size() / ElementBytes(dtype));
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kI32) {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      out[i] = v;
    } else {
      std::memcpy(&out[i], bytes.data() + 8 * i, 8);
    }
  }
  return out;
}

// A gkTensor over caller-owned data, destroyed with the scope.
struct TensorGuard {
  gkTensor* t = nullptr;
  TensorGuard(std::vector<int64_t> dims, DType dtype, const void* data,
              const std::vector<int64_t>& strides = {}, int64_t offset = 0) {
    t = gkCreateTensor(dims.data(), dims.size(), static_cast<gkDataType>(dtype),
                       strides.empty() ? nullptr : strides.data(), offset, const_cast<void*>(data));
  }
  ~TensorGuard() { gkDestroyTensor(t); }
  TensorGuard(const TensorGuard&) = delete;
  TensorGuard& operator=(const TensorGuard&) = delete;
};

// Phase 2 of any operator after a successful phase 1, with a workspace of the size asked for.
template <typename Run>
gkStatus RunPlanned(gkOpExecutor* executor, uint64_t workspace_size, Run run) {
  std::vector<uint8_t> workspace(workspace_size);
  return run(workspace.data(), workspace_size, executor, nullptr);
}

// Sets the thread count for a scope.
struct ThreadsScope {
  explicit ThreadsScope(int32_t threads) { EXPECT_EQ(gkSetNumThreads(threads), GK_SUCCESS); }
  ~ThreadsScope() { gkSetNumThreads(0); }
};

}  // namespace gk::testing
