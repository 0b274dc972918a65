// GroupedMatmul and GroupedMatmulWeightGrad: the formulas every backend follows, their float64
// references and the accuracy contract the tests and the CLI checks hold every backend to.
//
//   y[i, n]             = sum over k of x(i)[k] * W[g(i), k, n]                   (float32)
//   gradWeight[g, k, n] = sum over the rows i of expert g, ascending, of x(i)[k] * gradY[i, n]
//
// x(i) = x[i] (plain) or x[token(i)] (gather-fused). Every backend computes in float32 from the
// dtype's values (16-bit inputs are exact in float32) and rounds once into the output dtype. The
// order inside a sum is the GEMM library's, the same for every call of the same shape: results
// are bit-identical across runs and thread counts, not across GEMM libraries.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace gk {

// Accuracy contract, per element: |out - reference| <= kGroupedMatmulRelativeTolerance *
// magnitude + RoundingBound(out dtype) * |reference|, with magnitude the sum of the absolute
// terms, reference and magnitude in float64 from the same dtype-rounded inputs. Small-integer
// inputs make the float32 sums exact: then out equals the reference rounded once to its dtype.
inline constexpr double kGroupedMatmulRelativeTolerance = 1e-5;
inline double GroupedMatmulRoundingBound(DType out_dtype) {
  switch (out_dtype) {
    case DType::kBF16: return 1.0 / 256;   // half an ulp of 8 significant bits, with margin
    case DType::kF16: return 1.0 / 2048;   // the same for 11 bits
    default: return 0.0;
  }
}
inline bool GroupedMatmulWithinContract(double got, double reference, double magnitude,
                                        DType out_dtype) {
  return std::fabs(got - reference) <= kGroupedMatmulRelativeTolerance * magnitude +
                                           GroupedMatmulRoundingBound(out_dtype) * std::fabs(reference);
}

struct GroupedMatmulRef {
  std::vector<double> value;
  std::vector<double> magnitude;
};

// x: rows of K floats (already rounded to the dtype); x_row[i] is the row expanded row i reads.
// w: [G, K, N]; row_expert[i] = g(i). Returns y [M, N].
inline GroupedMatmulRef GroupedMatmulReference(const float* x, const float* w, int64_t k, int64_t n,
                                               const std::vector<int64_t>& x_row,
                                               const std::vector<int64_t>& row_expert) {
  const auto m = static_cast<int64_t>(x_row.size());
  GroupedMatmulRef out{std::vector<double>(static_cast<size_t>(m * n)),
                       std::vector<double>(static_cast<size_t>(m * n))};
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + x_row[i] * k;
    const float* we = w + row_expert[i] * k * n;
    for (int64_t kk = 0; kk < k; ++kk) {
      const double xv = xr[kk];
      for (int64_t nn = 0; nn < n; ++nn) {
        const double term = xv * we[kk * n + nn];
        out.value[i * n + nn] += term;
        out.magnitude[i * n + nn] += std::fabs(term);
      }
    }
  }
  return out;
}

// gy: [M, N]. Returns gradWeight [G, K, N] (zeros for experts without rows).
inline GroupedMatmulRef GroupedMatmulWeightGradReference(const float* x, const float* gy, int64_t g,
                                                         int64_t k, int64_t n,
                                                         const std::vector<int64_t>& x_row,
                                                         const std::vector<int64_t>& row_expert) {
  GroupedMatmulRef out{std::vector<double>(static_cast<size_t>(g * k * n)),
                       std::vector<double>(static_cast<size_t>(g * k * n))};
  for (size_t i = 0; i < x_row.size(); ++i) {
    const float* xr = x + x_row[i] * k;
    const float* gr = gy + static_cast<int64_t>(i) * n;
    double* value = out.value.data() + row_expert[i] * k * n;
    double* magnitude = out.magnitude.data() + row_expert[i] * k * n;
    for (int64_t kk = 0; kk < k; ++kk) {
      const double xv = xr[kk];
      for (int64_t nn = 0; nn < n; ++nn) {
        const double term = xv * gr[nn];
        value[kk * n + nn] += term;
        magnitude[kk * n + nn] += std::fabs(term);
      }
    }
  }
  return out;
}

}  // namespace gk
