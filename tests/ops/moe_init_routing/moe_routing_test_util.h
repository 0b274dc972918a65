// Shared by the MoeInitRouting and MoeFinalizeRouting tests: routings (skewed, with empty
// experts) and float data in any dtype (tensors and index arrays: tests/ops/op_test_support.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "tests/ops/op_test_support.h"

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

}  // namespace gk::testing
