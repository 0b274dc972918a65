// MoeInitRouting plan: plain data, from shapes only. Phase 2 first builds the routing table
// (a sequential counting sort of batch * topK slots, see moe_init_routing_table.h), then copies
// rows in units of rows_per_unit expanded rows, dealt round robin to the threads; each unit owns
// its rows of expandedX (and, for rowIdxType 0, of expandedRowIdx), so the split changes no byte.
#pragma once

#include <cstdint>
#include <string>

#include "ops/moe_init_routing/moe_init_routing_def.h"

namespace gk {

inline constexpr int64_t kMoeInitRoutingUnitBytes = int64_t{1} << 18;  // row bytes per unit, about
inline constexpr uint64_t kMoeInitRoutingAlignment = 64;

struct MoeInitRoutingPlan {
  MoeInitRoutingShape shape;
  int64_t rows_per_unit;
  int64_t units;      // ceil(R / rows_per_unit)
  int32_t threads;    // min(the machine's threads, units), at least 1
  // The rows copied (read + written) exceed the last-level cache: expandedX's rows are written
  // with non-temporal stores (StreamCopy; same bytes, no read-for-ownership).
  bool streaming_stores;
  // Workspace (int64 tables, each 64-byte aligned from the aligned start).
  uint64_t group_offsets_offset;  // G + 1
  uint64_t cursor_offset;         // G
  uint64_t row_slot_offset;       // R
  uint64_t workspace_bytes;       // the tables + kMoeInitRoutingAlignment
  bool operator==(const MoeInitRoutingPlan&) const = default;
};

MoeInitRoutingPlan MakeMoeInitRoutingPlan(const MoeInitRoutingShape& shape, int32_t threads,
                                          int64_t llc_bytes);
std::string MoeInitRoutingPlanToJson(const MoeInitRoutingPlan& plan);

}  // namespace gk
