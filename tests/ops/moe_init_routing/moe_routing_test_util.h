// Shared by the MoeInitRouting and MoeFinalizeRouting tests: routings (skewed, with empty
// experts), float data in any dtype, index arrays in either index dtype, and tensors.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"

namespace gk::testing {

struct RoutingSpec {
  int64_t batch, top_k, g;
  double skew = 0.0;                    // fraction of slots sent to expert 0
  std::vector<int64_t> empty = {};      // experts no slot chooses
  uint64_t seed = 1;
};

// expertIdx in slot order, values in [0, G).
inline std::vector<int64_t> MakeExpertIdx(const RoutingSpec& s) {
  std::mt19937_64 generator(s.seed);
  std::uniform_int_distribution<int64_t> expert(0, s.g - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<bool> banned(static_cast<size_t>(s.g), false);
  for (int64_t e : s.empty) banned[e] = true;
  std::vector<int64_t> idx(static_cast<size_t>(s.batch * s.top_k));
  for (auto& e : idx) {
    if (unit(generator) < s.skew && !banned[0]) {
      e = 0;
      continue;
    }
    do e = expert(generator);
    while (banned[e]);
  }
  return idx;
}

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

// Float data in a dtype, and the values as the operator sees them.
struct FloatData {
  DType dtype;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

enum class Values { kSmallIntegers, kQuarters, kRandom };

inline FloatData MakeFloatData(int64_t elems, DType dtype, Values kind, uint64_t seed) {
  std::mt19937 generator(static_cast<uint32_t>(seed * 7919 + static_cast<int>(dtype)));
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_int_distribution<int> quarter(-4, 4);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  FloatData d{dtype, std::vector<uint8_t>(static_cast<size_t>(elems * ElementBytes(dtype))),
              std::vector<float>(static_cast<size_t>(elems))};
  for (int64_t i = 0; i < elems; ++i) {
    float v = real(generator);
    if (kind == Values::kSmallIntegers) v = static_cast<float>(small(generator));
    if (kind == Values::kQuarters) v = static_cast<float>(quarter(generator)) * 0.25f;
    StoreFromF32(d.bytes.data(), i, dtype, v);
    d.values[i] = LoadAsF32(d.bytes.data(), i, dtype);
  }
  return d;
}

inline std::vector<float> ToFloats(const std::vector<uint8_t>& bytes, DType dtype) {
  std::vector<float> out(bytes.size() / ElementBytes(dtype));
  for (size_t i = 0; i < out.size(); ++i) out[i] = LoadAsF32(bytes.data(), i, dtype);
  return out;
}

struct TensorGuard {
  gkTensor* t = nullptr;
  TensorGuard(std::vector<int64_t> dims, DType dtype, const void* data,
              const std::vector<int64_t>& strides = {}) {
    t = gkCreateTensor(dims.data(), dims.size(), static_cast<gkDataType>(dtype),
                       strides.empty() ? nullptr : strides.data(), 0, const_cast<void*>(data));
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
