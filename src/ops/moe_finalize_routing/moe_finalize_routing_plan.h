// MoeFinalizeRouting / MoeFinalizeRoutingGrad plan: plain data, from shapes only. Both ops work
// token by token: a unit is tokens_per_unit consecutive tokens, dealt round robin to the
// threads. A token's outputs (out[b]; gradProbs[b, :] and the gradExpandedY rows of its slots)
// belong to its unit alone and are computed in the same order whoever runs it, so the split
// changes no byte. Each thread owns a float32 row of N in the workspace: the forward's
// accumulator for a token with more kept slots than one kernel call sums.
#pragma once

#include <cstdint>
#include <string>

#include "ops/moe_finalize_routing/moe_finalize_routing_def.h"

namespace gk {

inline constexpr int64_t kMoeFinalizeUnitElems = int64_t{1} << 16;  // topK x N elements per unit, about
inline constexpr uint64_t kMoeFinalizeAlignment = 64;

struct MoeFinalizePlan {
  MoeFinalizeShape shape;
  int64_t tokens_per_unit;
  int64_t units;    // ceil(batch / tokens_per_unit)
  int32_t threads;  // min(the machine's threads, units)
  // The bytes moved exceed the last-level cache: the output rows (out; gradExpandedY) are
  // written with non-temporal stores where they are vector-aligned (same bytes, no
  // read-for-ownership of each output line).
  bool streaming_stores;
  // Workspace regions, from the 64-byte aligned start.
  uint64_t slot_row_offset;    // batch * topK int64: the row of each slot, or -1
  uint64_t row_token_offset;   // M int64: scratch of the index check
  uint64_t thread_rows_offset; // threads x thread_row_bytes
  uint64_t thread_row_bytes;   // a float32 row of N, 64-byte aligned
  uint64_t workspace_bytes;    // the regions + kMoeFinalizeAlignment
  bool operator==(const MoeFinalizePlan&) const = default;
};

MoeFinalizePlan MakeMoeFinalizePlan(const MoeFinalizeShape& shape, int32_t threads,
                                    int64_t llc_bytes);
std::string MoeFinalizePlanToJson(const MoeFinalizePlan& plan);

}  // namespace gk
