// MoeInitRouting's routing table: a stable counting sort of the slots by expert, with the
// capacity cut. The builder validates every expertIdx value it reads, so phase 1 uses it as the
// value check and phase 2 (which builds it again in the workspace) never trusts stale data.
#pragma once

#include <cstdint>
#include <string_view>

#include "ops/moe_init_routing/moe_init_routing_def.h"

namespace gk {

// The table in caller-provided memory.
struct MoeInitRoutingTable {
  int64_t* group_offsets;  // G + 1: expert g owns expanded rows [off[g], off[g + 1])
  int64_t* row_slot;       // R: the slot of expanded row i, for i < M
  int64_t* cursor;         // G: scratch for the fill (with row_slot)
  int64_t m = 0;           // kept slots (expanded rows)
};

// Counts (fails on an expert index out of [0, G) or M > R) and, when table->row_slot is not
// null, fills the rows. group_offsets holds G + 1 entries, row_slot R, cursor G.
gkStatus BuildMoeInitRoutingTable(std::string_view api, const gkTensor& expert_idx,
                                  const MoeInitRoutingShape& shape, MoeInitRoutingTable* table);

}  // namespace gk
