// Shared by the reliability tests: descriptors and executors that release themselves, buffers
// whose bytes can be compared before and after a call, and the expectation every failing call
// must meet (error status, a one-line message, nothing written).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"

namespace gk::reliability {

struct TensorDeleter {
  void operator()(gkTensor* t) const { gkDestroyTensor(t); }
};
using Tensor = std::unique_ptr<gkTensor, TensorDeleter>;

struct ExecutorDeleter {
  void operator()(gkOpExecutor* e) const { gkDestroyExecutor(e); }
};
using Executor = std::unique_ptr<gkOpExecutor, ExecutorDeleter>;

inline Tensor MakeTensor(const std::vector<int64_t>& dims, DType dtype, const void* data,
                         const std::vector<int64_t>& strides = {}, int64_t offset = 0) {
  gkTensor* t = gkCreateTensor(dims.data(), dims.size(), static_cast<gkDataType>(dtype),
                               strides.empty() ? nullptr : strides.data(), offset,
                               const_cast<void*>(data));
  EXPECT_NE(t, nullptr) << gkGetRecentErrMsg();
  return Tensor(t);
}

// An address that is never dereferenced: phase 1 reads descriptors (and, for MoE, the two index
// arrays) only, so hostile views of huge extent may point anywhere.
inline void* FakeAddress(uintptr_t address) { return reinterpret_cast<void*>(address); }

// Bytes with a recognisable pattern, to tell whether a call wrote any of them.
struct Bytes {
  std::vector<uint8_t> bytes;
  explicit Bytes(size_t n, uint8_t fill = 0xCD) : bytes(n, fill) {}
  void* data() { return bytes.data(); }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(bytes.data()); }
};

// A failed call: error status, a one-line message naming the entry point, and nothing written.
inline ::testing::AssertionResult FailedCleanly(gkStatus status, const std::vector<uint8_t>& before,
                                                const std::vector<uint8_t>& after) {
  if (status == GK_SUCCESS) return ::testing::AssertionFailure() << "the call succeeded";
  const std::string message = gkGetRecentErrMsg();
  if (message.empty()) return ::testing::AssertionFailure() << "status " << status << ", no message";
  if (message.find('\n') != std::string::npos) {
    return ::testing::AssertionFailure() << "message spans lines: " << message;
  }
  if (before != after) return ::testing::AssertionFailure() << "output changed; message: " << message;
  return ::testing::AssertionSuccess() << message;
}

}  // namespace gk::reliability
