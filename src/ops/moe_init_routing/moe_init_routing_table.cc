#include "ops/moe_init_routing/moe_init_routing_table.h"

#include <algorithm>

#include "core/error.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"  // IndexAt

namespace gk {

gkStatus BuildMoeInitRoutingTable(std::string_view api, const gkTensor& expert_idx,
                                  const MoeInitRoutingShape& s, MoeInitRoutingTable* table) {
  int64_t* offsets = table->group_offsets;
  std::fill(offsets, offsets + s.g + 1, int64_t{0});
  // Pass 1: slots per expert (offsets[g + 1] counts expert g), every value checked.
  for (int64_t p = 0; p < s.slots(); ++p) {
    const int64_t expert = IndexAt(expert_idx, p);
    if (expert < 0 || expert >= s.g) {
      return Fail(GK_ERROR_PARAM_INVALID, api,
                  "expertIdx[{}, {}] is {}, it must be an expert in [0, {}) (expertNum)",
                  p / s.top_k, p % s.top_k, expert, s.g);
    }
    ++offsets[expert + 1];
  }
  // Capacity: an expert keeps its first C slots; the kept counts become offsets.
  for (int64_t g = 0; g < s.g; ++g) {
    const int64_t kept = s.capacity > 0 ? std::min(offsets[g + 1], s.capacity) : offsets[g + 1];
    offsets[g + 1] = offsets[g] + kept;
  }
  table->m = offsets[s.g];
  if (table->m > s.rows) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedX has {} rows but this routing keeps M = {} slots (expertCapacity {}); "
                "it needs M <= rows, and {} rows (min(batch * topK, expertNum * expertCapacity), "
                "or batch * topK without capacity) always suffice",
                s.rows, table->m, s.capacity, s.max_rows());
  }
  if (table->row_slot == nullptr) return GK_SUCCESS;
  // Pass 2: each expert's cursor walks its range in slot order; a full expert drops the slot.
  std::copy(offsets, offsets + s.g, table->cursor);
  for (int64_t p = 0; p < s.slots(); ++p) {
    const int64_t expert = IndexAt(expert_idx, p);
    int64_t& cursor = table->cursor[expert];
    if (cursor < offsets[expert + 1]) table->row_slot[cursor++] = p;
  }
  return GK_SUCCESS;
}

}  // namespace gk
