#include "ops/moe_finalize_routing/moe_finalize_routing_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/cpu/stream_copy.h"
#include "core/plan_math.h"

namespace gk {

MoeFinalizePlan MakeMoeFinalizePlan(const MoeFinalizeShape& s, int32_t threads,
                                    int64_t llc_bytes) {
  MoeFinalizePlan p{};
  p.shape = s;
  int64_t token_elems;  // topK x N, saturated: a token that large is a unit of its own
  if (__builtin_mul_overflow(s.top_k, s.n, &token_elems)) token_elems = kMoeFinalizeUnitElems;
  p.tokens_per_unit = std::max<int64_t>(1, kMoeFinalizeUnitElems / std::max<int64_t>(1, token_elems));
  p.units = (s.batch + p.tokens_per_unit - 1) / p.tokens_per_unit;
  p.threads = static_cast<int32_t>(std::clamp<int64_t>(p.units, 1, std::max(threads, 1)));
  // Forward: M rows of y read, batch rows of out written; backward: batch rows of gradOut and
  // M rows of y read, M rows of gradExpandedY written (element sizes of their dtypes).
  const double row = static_cast<double>(s.n), batch = static_cast<double>(s.batch),
               m = static_cast<double>(s.m);
  const double moved =
      s.backward ? row * (batch * ElementBytes(s.token_dtype) +
                          m * (ElementBytes(s.dtype) + ElementBytes(s.grad_y_dtype)))
                 : row * (m * ElementBytes(s.dtype) + batch * ElementBytes(s.token_dtype));
  p.streaming_stores = StreamingPays(moved, llc_bytes);
  const uint64_t a = kMoeFinalizeAlignment;
  p.slot_row_offset = 0;
  p.row_token_offset = AlignUp(static_cast<uint64_t>(s.slots()) * sizeof(int64_t), a);
  p.thread_rows_offset =
      p.row_token_offset + AlignUp(static_cast<uint64_t>(s.m) * sizeof(int64_t), a);
  p.thread_row_bytes = AlignUp(static_cast<uint64_t>(s.n) * sizeof(float), a);
  p.workspace_bytes = p.thread_rows_offset + p.threads * p.thread_row_bytes + a;
  return p;
}

std::string MoeFinalizePlanToJson(const MoeFinalizePlan& p) {
  const MoeFinalizeShape& s = p.shape;
  return fmt::format(
      "{{\"op\": \"{}\", \"m\": {}, \"n\": {}, \"batch\": {}, \"top_k\": {}, \"dtype\": \"{}\", "
      "\"tokens_per_unit\": {}, \"units\": {}, \"threads\": {}, \"streaming_stores\": {}, "
      "\"workspace_bytes\": {}}}",
      s.backward ? kMoeFinalizeRoutingGradName : kMoeFinalizeRoutingName, s.m, s.n, s.batch,
      s.top_k, DTypeName(s.dtype), p.tokens_per_unit, p.units, p.threads, p.streaming_stores,
      p.workspace_bytes);
}

}  // namespace gk
