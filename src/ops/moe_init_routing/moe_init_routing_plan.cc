#include "ops/moe_init_routing/moe_init_routing_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/cpu/stream_copy.h"
#include "core/plan_math.h"

namespace gk {

MoeInitRoutingPlan MakeMoeInitRoutingPlan(const MoeInitRoutingShape& s, int32_t threads,
                                          int64_t llc_bytes) {
  MoeInitRoutingPlan p{};
  p.shape = s;
  const int64_t row_bytes = s.h * ElementBytes(s.dtype);
  p.rows_per_unit = std::max<int64_t>(1, kMoeInitRoutingUnitBytes / row_bytes);
  p.units = (s.rows + p.rows_per_unit - 1) / p.rows_per_unit;
  p.threads = static_cast<int32_t>(std::clamp<int64_t>(p.units, 1, std::max(threads, 1)));
  p.streaming_stores =
      s.expand_x &&
      StreamingPays(2.0 * static_cast<double>(s.rows) * static_cast<double>(row_bytes), llc_bytes);
  uint64_t end = 0;
  const auto region = [&](int64_t entries) {
    const uint64_t offset = end;
    end = AlignUp(end + static_cast<uint64_t>(entries) * sizeof(int64_t), kMoeInitRoutingAlignment);
    return offset;
  };
  p.group_offsets_offset = region(s.g + 1);
  p.cursor_offset = region(s.g);
  p.row_slot_offset = region(s.rows);
  p.workspace_bytes = end + kMoeInitRoutingAlignment;
  return p;
}

std::string MoeInitRoutingPlanToJson(const MoeInitRoutingPlan& p) {
  const MoeInitRoutingShape& s = p.shape;
  return fmt::format(
      "{{\"batch\": {}, \"top_k\": {}, \"h\": {}, \"g\": {}, \"capacity\": {}, \"rows\": {}, "
      "\"dtype\": \"{}\", \"rows_per_unit\": {}, \"units\": {}, \"threads\": {}, "
      "\"streaming_stores\": {}, \"workspace_bytes\": {}}}",
      s.batch, s.top_k, s.h, s.g, s.capacity, s.rows, DTypeName(s.dtype), p.rows_per_unit,
      p.units, p.threads, p.streaming_stores, p.workspace_bytes);
}

}  // namespace gk
