#include "bench/moe_routing_bench.h"

#include <fmt/format.h>

#include <functional>
#include <random>
#include <stdexcept>

#include "bench/bench_util.h"
#include "gradkit/gradkit.h"

namespace gk::bench {
namespace {

// Phase 1 done by `plan`, phase 2 run repeatedly in a workspace of the size it asked for.
class PlannedOp {
 public:
  PlannedOp(const std::function<gkStatus(uint64_t*, gkOpExecutor**)>& plan,
            gkStatus (*run)(void*, uint64_t, gkOpExecutor*, void*))
      : run_(run) {
    Check(plan(&size_, &executor_));
    Check(gkSetExecutorRepeatable(executor_));
    workspace_.resize(size_);
  }
  ~PlannedOp() { gkDestroyExecutor(executor_); }
  PlannedOp(const PlannedOp&) = delete;
  PlannedOp& operator=(const PlannedOp&) = delete;
  void operator()() { Check(run_(workspace_.data(), size_, executor_, nullptr)); }

 private:
  gkStatus (*run_)(void*, uint64_t, gkOpExecutor*, void*);
  uint64_t size_ = 0;
  gkOpExecutor* executor_ = nullptr;
  std::vector<uint8_t> workspace_;
};

MoeRoutingBenchResult Measure(const MoeRoutingBenchCase& c, const std::string& op, int64_t m,
                              int64_t bytes, const std::function<void()>& run,
                              double min_seconds) {
  ParallelCopy copy((bytes + 1) / 2, c.threads);
  const auto seconds = BestSecondsInterleaved({run, [&] { copy(); }}, min_seconds, 3);
  return {c, op, m, bytes, static_cast<double>(bytes) / seconds[0] / 1e9,
          static_cast<double>(copy.bytes_moved()) / seconds[1] / 1e9};
}

}  // namespace

std::vector<MoeRoutingBenchCase> MoeRoutingBenchCases(const std::optional<std::string>& shape,
                                                      std::optional<DType> dtype, int32_t threads) {
  const MoeRoutingBenchCase shapes[] = {{"S1", 4096, 2, 8, 2048, DType::kF32, threads},
                                        {"S2", 2048, 8, 64, 2048, DType::kF32, threads},
                                        {"S3", 1024, 8, 60, 7168, DType::kF32, threads},
                                        {"S4", 4096, 2, 8, 2048, DType::kF32, threads}};
  std::vector<MoeRoutingBenchCase> cases;
  for (const auto& s : shapes) {
    if (shape && *shape != s.shape) continue;
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      if (dtype && *dtype != d) continue;
      MoeRoutingBenchCase c = s;
      c.dtype = d;
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<MoeRoutingBenchResult> RunMoeRoutingBenchCase(const MoeRoutingBenchCase& c,
                                                          double min_seconds) {
  Check(gkSetNumThreads(c.threads));
  const int64_t slots = c.batch * c.top_k, elem = ElementBytes(c.dtype), h = c.h;
  // Experts spread over 1..G-1 by token and choice; S4 puts 90% of the first choices on expert 0
  // (skewed, as in the fused op's bench).
  std::mt19937_64 generator(11);
  std::vector<int64_t> expert_idx(static_cast<size_t>(slots));
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t j = 0; j < c.top_k; ++j) {
      const bool skewed = c.shape == "S4" && j == 0 && generator() % 10 != 0;
      expert_idx[b * c.top_k + j] =
          skewed ? 0 : static_cast<int64_t>(1 + (b + j * 7 + generator() % 3) % (c.g - 1));
    }
  }
  AlignedBytes x(static_cast<size_t>(c.batch * h * elem), 0x3c);
  AlignedBytes expanded_x(static_cast<size_t>(slots * h * elem));
  std::vector<int64_t> row_idx(static_cast<size_t>(slots)), group_list(static_cast<size_t>(c.g));
  TensorHandle x_t({c.batch, h}, c.dtype, x.data());
  TensorHandle experts_t({c.batch, c.top_k}, DType::kI64, expert_idx.data());
  TensorHandle ex_t({slots, h}, c.dtype, expanded_x.data());
  TensorHandle idx_t({slots}, DType::kI64, row_idx.data());
  TensorHandle groups_t({c.g}, DType::kI64, group_list.data());
  std::vector<MoeRoutingBenchResult> results;

  PlannedOp init(
      [&](uint64_t* size, gkOpExecutor** executor) {
        return gkMoeInitRoutingGetWorkspaceSize(x_t.t, experts_t.t, 0, c.g, GK_GROUP_LIST_COUNT,
                                                GK_ROW_IDX_GATHER, ex_t.t, idx_t.t, groups_t.t,
                                                size, executor);
      },
      gkMoeInitRouting);
  init();  // the routing the finalize cases read
  const int64_t m = slots;  // capacity 0: every slot is a row
  results.push_back(Measure(c, "init", m, 2 * m * h * elem + slots * 8 + m * 8 + c.g * 8,
                            [&] { init(); }, min_seconds));

  // Finalize: expandedY [M, H] (the second expert matmul's output) back to [batch, H].
  std::vector<float> probs(static_cast<size_t>(slots), 0.5f);
  AlignedBytes out(static_cast<size_t>(c.batch * h * elem));
  TensorHandle probs_t({c.batch, c.top_k}, DType::kF32, probs.data());
  TensorHandle out_t({c.batch, h}, c.dtype, out.data());
  PlannedOp finalize(
      [&](uint64_t* size, gkOpExecutor** executor) {
        return gkMoeFinalizeRoutingGetWorkspaceSize(ex_t.t, probs_t.t, idx_t.t, GK_ROW_IDX_GATHER,
                                                    out_t.t, size, executor);
      },
      gkMoeFinalizeRouting);
  results.push_back(Measure(c, "finalize", m, m * h * elem + c.batch * h * elem + slots * 12,
                            [&] { finalize(); }, min_seconds));

  AlignedBytes grad_y(static_cast<size_t>(m * h * elem));
  std::vector<float> grad_probs(static_cast<size_t>(slots));
  TensorHandle grad_y_t({m, h}, c.dtype, grad_y.data());
  TensorHandle grad_probs_t({c.batch, c.top_k}, DType::kF32, grad_probs.data());
  PlannedOp finalize_grad(
      [&](uint64_t* size, gkOpExecutor** executor) {
        return gkMoeFinalizeRoutingGradGetWorkspaceSize(out_t.t, ex_t.t, probs_t.t, idx_t.t,
                                                        GK_ROW_IDX_GATHER, grad_y_t.t,
                                                        grad_probs_t.t, size, executor);
      },
      gkMoeFinalizeRoutingGrad);
  results.push_back(Measure(c, "finalize_grad", m,
                            c.batch * h * elem + 2 * m * h * elem + slots * 16,
                            [&] { finalize_grad(); }, min_seconds));
  gkSetNumThreads(0);
  return results;
}

std::string MoeRoutingBenchJson(const MoeRoutingBenchResult& r) {
  return fmt::format(
      "{{\"bench\": \"moe-routing\", \"op\": \"{}\", \"shape\": \"{}\", \"dtype\": \"{}\", "
      "\"batch\": {}, \"topK\": {}, \"G\": {}, \"H\": {}, \"M\": {}, \"threads\": {}, "
      "\"bytes\": {}, \"gbps\": {:.4f}, \"copy_gbps\": {:.4f}, \"vs_copy\": {:.3f}}}",
      r.op, r.c.shape, DTypeName(r.c.dtype), r.c.batch, r.c.top_k, r.c.g, r.c.h, r.m, r.c.threads,
      r.bytes, r.gbps, r.copy_gbps, r.gbps / r.copy_gbps);
}

}  // namespace gk::bench
