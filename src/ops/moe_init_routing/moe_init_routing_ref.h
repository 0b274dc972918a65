// MoeInitRouting: the definition as a direct (slow) reference, by a stable sort rather than the
// kernels' counting sort: slots ordered by expert, ties by slot; each expert keeps its first C.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace gk {

struct MoeInitRoutingRef {
  int64_t m = 0;
  std::vector<int64_t> row_slot;     // M: the slot of each expanded row (a gather index)
  std::vector<int64_t> slot_row;     // batch * topK: the row of each slot or -1 (a scatter index)
  std::vector<int64_t> group_counts;  // G
  std::vector<int64_t> group_cumsum;  // G
};

// expert_idx: batch * topK experts in slot order (p = b * topK + j).
inline MoeInitRoutingRef MoeInitRoutingReference(const std::vector<int64_t>& expert_idx,
                                                 int64_t g, int64_t capacity) {
  MoeInitRoutingRef ref;
  std::vector<int64_t> order(expert_idx.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return expert_idx[a] < expert_idx[b]; });
  ref.slot_row.assign(expert_idx.size(), -1);
  ref.group_counts.assign(static_cast<size_t>(g), 0);
  for (int64_t slot : order) {
    const int64_t expert = expert_idx[slot];
    if (capacity > 0 && ref.group_counts[expert] == capacity) continue;
    ++ref.group_counts[expert];
    ref.slot_row[slot] = static_cast<int64_t>(ref.row_slot.size());
    ref.row_slot.push_back(slot);
  }
  ref.m = static_cast<int64_t>(ref.row_slot.size());
  ref.group_cumsum.resize(static_cast<size_t>(g));
  std::partial_sum(ref.group_counts.begin(), ref.group_counts.end(), ref.group_cumsum.begin());
  return ref;
}

}  // namespace gk
