// MoeFinalizeRouting and its gradient: the float64 reference every backend is held to, and the
// accuracy contract of the tests.
//
// Contract: for float32 outputs, |result - reference| <= kMoeFinalizeRelativeTolerance x the sum
// of the absolute values of the element's terms (both in float64 from the dtype-rounded inputs);
// 16-bit outputs may add the one rounding to their dtype. Inputs that are small integers (and
// probabilities that are multiples of 1/4) make every float32 operation exact: then the result
// is the reference rounded once to the output dtype.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace gk {

inline constexpr double kMoeFinalizeRelativeTolerance = 1e-5;

struct MoeFinalizeRefValue {
  double value = 0;
  double magnitude = 0;  // sum of |terms|
};

// slot_row: batch * topK, the expanded row of each slot or -1. y: [M, N]; probs: [batch, topK];
// all already rounded to their dtypes.
inline std::vector<MoeFinalizeRefValue> MoeFinalizeReference(const std::vector<float>& y,
                                                             const std::vector<float>& probs,
                                                             const std::vector<int64_t>& slot_row,
                                                             int64_t batch, int64_t top_k,
                                                             int64_t n) {
  std::vector<MoeFinalizeRefValue> out(static_cast<size_t>(batch * n));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t p = b * top_k + j, row = slot_row[p];
      if (row < 0) continue;
      for (int64_t c = 0; c < n; ++c) {
        const double term = static_cast<double>(probs[p]) * y[row * n + c];
        out[b * n + c].value += term;
        out[b * n + c].magnitude += std::fabs(term);
      }
    }
  }
  return out;
}

struct MoeFinalizeGradRef {
  std::vector<MoeFinalizeRefValue> grad_y;      // [M, N]
  std::vector<MoeFinalizeRefValue> grad_probs;  // [batch, topK]
};

inline MoeFinalizeGradRef MoeFinalizeGradReference(const std::vector<float>& grad_out,
                                                   const std::vector<float>& y,
                                                   const std::vector<float>& probs,
                                                   const std::vector<int64_t>& slot_row,
                                                   int64_t m, int64_t batch, int64_t top_k,
                                                   int64_t n) {
  MoeFinalizeGradRef ref{std::vector<MoeFinalizeRefValue>(static_cast<size_t>(m * n)),
                         std::vector<MoeFinalizeRefValue>(static_cast<size_t>(batch * top_k))};
  for (int64_t p = 0; p < batch * top_k; ++p) {
    const int64_t row = slot_row[p], b = p / top_k;
    if (row < 0) continue;
    for (int64_t c = 0; c < n; ++c) {
      const double dy_term = static_cast<double>(probs[p]) * grad_out[b * n + c];
      ref.grad_y[row * n + c] = {dy_term, std::fabs(dy_term)};
      const double dot_term = static_cast<double>(grad_out[b * n + c]) * y[row * n + c];
      ref.grad_probs[p].value += dot_term;
      ref.grad_probs[p].magnitude += std::fabs(dot_term);
    }
  }
  return ref;
}

}  // namespace gk
