// MoeInitRoutingGroupedMatmulGrad: the one formula every backend follows, its float64 reference
// and the accuracy contract the tests, the demo and the CLI checks hold every backend to.
//
//   gradX[b, k] = sum over expanded rows i with token(i) = b, in ascending i, of
//                 d[i, k] = sum over n of gradY[i, n] * weight[g(i), k, n]     (float32)
//
// Every backend computes d[i, k] in float32 from the dtype's values (16-bit inputs are exact in
// float32) and adds the rows of one token in ascending i, which is ascending expert. The order
// inside d[i, k] is the GEMM library's, the same for every call of the same shape: hence the
// result is bit-identical across runs and thread counts, but not across GEMM libraries.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace gk {

// Accuracy contract: |gradX[b, k] - reference| <= kMoeGradRelativeTolerance * magnitude[b, k],
// where magnitude is the sum over the element's terms of |gradY[i, n] * weight[g(i), k, n]|,
// the reference and the magnitude both in float64 from the same dtype-rounded inputs.
// Inputs that are small integers make every float32 sum exact: then gradX equals the reference.
inline constexpr double kMoeGradRelativeTolerance = 1e-5;

// The token of each expanded row, straight from the definitions (no validation): the semantics
// of expandedRowIdx for both rowIdxType values. Dropped slots (-1) are skipped.
inline std::vector<int64_t> MoeGradRowTokensRef(const std::vector<int64_t>& expanded_row_idx,
                                                int64_t m, int64_t top_k, int row_idx_type) {
  std::vector<int64_t> token(static_cast<size_t>(m), -1);
  if (row_idx_type == 0) {
    for (int64_t i = 0; i < m; ++i) token[i] = expanded_row_idx[i] / top_k;
  } else {
    for (size_t p = 0; p < expanded_row_idx.size(); ++p) {
      if (expanded_row_idx[p] >= 0) token[expanded_row_idx[p]] = static_cast<int64_t>(p) / top_k;
    }
  }
  return token;
}

// The float64 reference of one output row b (K values), and the magnitude of its terms.
// dy: [M, N] and w: [G, K, N] as float (already rounded to the op's dtype); expert_of_row[i] and
// token_of_row[i] for every expanded row; rows_of_token: the rows with token b.
struct MoeGradRefRow {
  std::vector<double> value;
  std::vector<double> magnitude;
};
inline MoeGradRefRow MoeGradReferenceRow(const float* dy, const float* w, int64_t n, int64_t k,
                                         const std::vector<int64_t>& rows_of_token,
                                         const std::vector<int64_t>& expert_of_row) {
  MoeGradRefRow out{std::vector<double>(static_cast<size_t>(k), 0.0),
                    std::vector<double>(static_cast<size_t>(k), 0.0)};
  for (int64_t i : rows_of_token) {
    const float* dy_row = dy + i * n;
    const float* w_expert = w + expert_of_row[i] * k * n;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* w_row = w_expert + kk * n;
      double sum = 0, magnitude = 0;
      for (int64_t nn = 0; nn < n; ++nn) {
        const double term = static_cast<double>(dy_row[nn]) * w_row[nn];
        sum += term;
        magnitude += std::fabs(term);
      }
      out.value[kk] += sum;
      out.magnitude[kk] += magnitude;
    }
  }
  return out;
}

inline bool MoeGradWithinContract(double got, double reference, double magnitude) {
  return std::fabs(got - reference) <= kMoeGradRelativeTolerance * magnitude;
}

// ---- input domain: routings as MoeInitRouting produces them -----------------------------------

struct MoeGradRoutingSpec {
  int64_t batch, top_k, g;
  double keep = 1.0;               // fraction of slots routed (the rest dropped)
  double skew = 0.0;               // fraction of slots sent to expert 0 (0: uniform)
  int64_t empty_experts = 0;       // the last experts receive nothing
  std::vector<int64_t> forced_empty;  // these experts receive nothing either
  uint64_t seed = 1;
  // When set (G of them, summing to batch * topK): expert e receives exactly counts[e] slots,
  // consecutive ones in slot order (the fields above but batch, top_k and g then unused).
  std::vector<int64_t> counts;
};

// One routing, in every form the operator accepts. Rows are the routed slots sorted by
// (expert, slot), as MoeInitRouting orders them.
struct MoeGradRouting {
  int64_t m = 0;
  std::vector<int64_t> gather_idx;    // [M]: row -> slot (rowIdxType 0)
  std::vector<int64_t> scatter_idx;   // [batch * topK]: slot -> row or -1 (rowIdxType 1)
  std::vector<int64_t> group_counts;  // [G]
  std::vector<int64_t> group_cumsum;  // [G]
  std::vector<int64_t> row_token;     // [M]
  std::vector<int64_t> row_expert;    // [M]
};

inline MoeGradRouting MakeMoeGradRouting(const MoeGradRoutingSpec& spec) {
  std::mt19937_64 generator(spec.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<int64_t> allowed;
  for (int64_t e = 0; e < spec.g - spec.empty_experts; ++e) {
    if (std::find(spec.forced_empty.begin(), spec.forced_empty.end(), e) == spec.forced_empty.end()) {
      allowed.push_back(e);
    }
  }
  const int64_t slots = spec.batch * spec.top_k;
  std::vector<int64_t> slot_expert(static_cast<size_t>(slots), -1);
  if (!spec.counts.empty()) {  // expert e takes the next counts[e] slots
    for (int64_t e = 0, p = 0; e < static_cast<int64_t>(spec.counts.size()); ++e) {
      for (int64_t i = 0; i < spec.counts[static_cast<size_t>(e)] && p < slots; ++i) slot_expert[p++] = e;
    }
  }
  for (int64_t p = 0; p < slots && spec.counts.empty(); ++p) {
    if (unit(generator) >= spec.keep || allowed.empty()) continue;
    if (spec.skew > 0 && unit(generator) < spec.skew) {
      slot_expert[p] = allowed.front();
    } else {
      slot_expert[p] = allowed[static_cast<size_t>(generator() % allowed.size())];
    }
  }
  MoeGradRouting r;
  r.group_counts.assign(static_cast<size_t>(spec.g), 0);
  for (int64_t e : slot_expert) {
    if (e >= 0) ++r.group_counts[e];
  }
  std::vector<int64_t> next(static_cast<size_t>(spec.g), 0);
  for (int64_t e = 1; e < spec.g; ++e) next[e] = next[e - 1] + r.group_counts[e - 1];
  r.group_cumsum.resize(static_cast<size_t>(spec.g));
  for (int64_t e = 0; e < spec.g; ++e) r.group_cumsum[e] = next[e] + r.group_counts[e];
  r.m = spec.g > 0 ? r.group_cumsum.back() : 0;
  r.gather_idx.resize(static_cast<size_t>(r.m));
  r.scatter_idx.assign(static_cast<size_t>(slots), -1);
  r.row_token.resize(static_cast<size_t>(r.m));
  r.row_expert.resize(static_cast<size_t>(r.m));
  for (int64_t p = 0; p < slots; ++p) {
    const int64_t e = slot_expert[p];
    if (e < 0) continue;
    const int64_t row = next[e]++;
    r.gather_idx[row] = p;
    r.scatter_idx[p] = row;
    r.row_token[row] = p / spec.top_k;
    r.row_expert[row] = e;
  }
  return r;
}

}  // namespace gk
