#include "ops/elu_grad_v2/elu_grad_v2_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/cpu/stream_copy.h"
#include "core/cpu_info.h"
#include "core/thread_pool.h"

namespace gk {
namespace {

// Without a + b - 1, which overflows for counts near 2^63 (views with zero strides get there).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

EluGradV2Mode ChooseMode(const EluGradV2Problem& p, int64_t tile_elems) {
  const bool result = p.is_result;
  if (!p.contiguous) return result ? EluGradV2Mode::kSafeResult : EluGradV2Mode::kSafeExp;
  if (p.elems <= tile_elems) {
    return result ? EluGradV2Mode::kSingleTileResult : EluGradV2Mode::kSingleTileExp;
  }
  if (p.input_dtype == DType::kF16) {
    return result ? EluGradV2Mode::kFloat16ResultFast : EluGradV2Mode::kFloat16ExpFast;
  }
  if (p.input_dtype == DType::kBF16) {
    return result ? EluGradV2Mode::kMixedResultFast : EluGradV2Mode::kMixedExpFast;
  }
  return result ? EluGradV2Mode::kSafeResult : EluGradV2Mode::kSafeExp;
}

}  // namespace

std::string_view EluGradV2ModeName(EluGradV2Mode mode) {
  switch (mode) {
#define GK_X(id, name) \
  case EluGradV2Mode::id: return name;
    GK_ELU_GRAD_V2_MODES(GK_X)
#undef GK_X
  }
  return "UNKNOWN";
}

EluGradV2Machine DetectEluGradV2Machine() {
  const CacheInfo caches = DetectCaches();
  return {ConfiguredThreads(), caches.l1d_bytes_per_core, caches.llc_bytes};
}

int64_t EluGradV2Plan::ShareBegin(int32_t share) const {
  if (share < big_share_count) return share * big_share_elems;
  return big_share_count * big_share_elems + (share - big_share_count) * small_share_elems;
}

int64_t EluGradV2Plan::ShareElems(int32_t share) const {
  if (share == threads - 1) return last_share_elems;
  return share < big_share_count ? big_share_elems : small_share_elems;
}

EluGradV2Plan MakeEluGradV2Plan(const EluGradV2Problem& problem, const EluGradV2Machine& machine) {
  EluGradV2Plan plan{};
  plan.input_dtype = problem.input_dtype;
  plan.output_dtype = problem.output_dtype;
  plan.is_result = problem.is_result;
  plan.contiguous = problem.contiguous;
  plan.coef = problem.coef;
  plan.total_elems = problem.elems;
  plan.row_elems = problem.contiguous ? problem.elems : problem.row_elems;
  plan.gather = !problem.contiguous && problem.row_elems < kEluGradV2MinRowElems;

  const int64_t in_bytes = ElementBytes(problem.input_dtype);
  const int64_t out_bytes = ElementBytes(problem.output_dtype);
  plan.block_elems = kEluGradV2BlockBytes / in_bytes;

  // Tile: half the per-core L1 holds the tile's live bytes (dy and x in, y out, in place or in
  // gather scratch), as the seed sizes tiles to the UB.
  const int64_t live_bytes_per_elem = 2 * in_bytes + out_bytes;
  const int64_t budget = std::max<int64_t>(machine.l1d_bytes_per_core / 2, kEluGradV2BlockBytes);
  plan.tile_elems =
      std::max<int64_t>(1, budget / live_bytes_per_elem / plan.block_elems) * plan.block_elems;

  plan.mode = ChooseMode(problem, plan.tile_elems);
  const bool single_tile = plan.mode == EluGradV2Mode::kSingleTileExp ||
                           plan.mode == EluGradV2Mode::kSingleTileResult;

  // Shares: as many threads as the work is worth, whole blocks each.
  const int64_t blocks = std::max<int64_t>(1, CeilDiv(problem.elems, plan.block_elems));
  const int64_t worth = CeilDiv(std::max<int64_t>(problem.elems, 1) * in_bytes,
                                kEluGradV2MinShareBytes);
  const int64_t threads = single_tile ? 1
                                      : std::clamp<int64_t>(std::min(worth, blocks), 1,
                                                            std::max(machine.threads, 1));
  plan.threads = static_cast<int32_t>(threads);
  const int64_t blocks_per_share = blocks / threads;
  plan.big_share_count = static_cast<int32_t>(blocks % threads);
  plan.small_share_elems = blocks_per_share * plan.block_elems;
  plan.big_share_elems = plan.big_share_count > 0 ? plan.small_share_elems + plan.block_elems
                                                  : plan.small_share_elems;
  plan.last_share_elems = problem.elems - plan.ShareBegin(plan.threads - 1);

  // Once the bytes moved exceed the last-level cache nothing stays cached for a consumer anyway;
  // non-temporal stores then save the read-for-ownership of every output line (3 streams, not 4).
  int64_t moved_bytes;
  plan.streaming_stores =
      problem.contiguous &&
      (__builtin_mul_overflow(problem.elems, 2 * in_bytes + out_bytes, &moved_bytes) ||
       StreamingPays(moved_bytes, machine.llc_bytes));

  if (plan.gather) {
    // Each thread's part starts aligned: the kernel's loads and stores of scratch stay whole.
    const int64_t tile_bytes = plan.tile_elems * live_bytes_per_elem;
    plan.scratch_bytes_per_thread = CeilDiv(tile_bytes + 2 * kEluGradV2WorkspaceAlignment,
                                            kEluGradV2WorkspaceAlignment) *
                                    kEluGradV2WorkspaceAlignment;
    plan.workspace_bytes = static_cast<uint64_t>(plan.threads) *
                               static_cast<uint64_t>(plan.scratch_bytes_per_thread) +
                           kEluGradV2WorkspaceAlignment;
  }
  if (problem.elems == 0) plan.workspace_bytes = 0;
  return plan;
}

std::string EluGradV2PlanToJson(const EluGradV2Plan& p) {
  return fmt::format(
      "{{\"op\": \"elu_grad_v2\", \"mode\": \"{}\", \"input_dtype\": \"{}\", "
      "\"output_dtype\": \"{}\", \"is_result\": {}, \"contiguous\": {}, "
      "\"coefficients\": {{\"negcoef\": {}, \"poscoef\": {}, \"negiptcoef\": {}}}, "
      "\"total_elems\": {}, \"block_elems\": {}, \"threads\": {}, \"big_share_count\": {}, "
      "\"big_share_elems\": {}, \"small_share_elems\": {}, \"last_share_elems\": {}, "
      "\"tile_elems\": {}, \"row_elems\": {}, \"gather\": {}, \"scratch_bytes_per_thread\": {}, "
      "\"streaming_stores\": {}, "
      "\"workspace_bytes\": {}}}",
      EluGradV2ModeName(p.mode), DTypeName(p.input_dtype), DTypeName(p.output_dtype),
      p.is_result, p.contiguous, p.coef.negcoef, p.coef.poscoef, p.coef.negiptcoef,
      p.total_elems, p.block_elems, p.threads, p.big_share_count, p.big_share_elems,
      p.small_share_elems, p.last_share_elems, p.tile_elems, p.row_elems, p.gather,
      p.scratch_bytes_per_thread,
      p.streaming_stores, p.workspace_bytes);
}

}  // namespace gk
