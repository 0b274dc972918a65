#include "bench/elu_grad_v2_bench.h"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "bench/bench_util.h"
#include "bench/torch_peer.h"
#include "gradkit/gradkit.h"
#include "ops/elu_grad_v2/elu_grad_v2_plan.h"

namespace gk::bench {
namespace {

constexpr double kAlpha = 1.0, kScale = 1.0507, kInputScale = 1.0;

std::vector<uint8_t> RandomBuffer(int64_t elems, DType dtype, float low, float high,
                                  uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(elems));
  FillUniform(values.data(), elems, low, high, seed);
  std::vector<uint8_t> out(static_cast<size_t>(elems * ElementBytes(dtype)));
  for (int64_t i = 0; i < elems; ++i) StoreFromF32(out.data(), i, dtype, values[i]);
  return out;
}

}  // namespace

std::vector<EluGradV2BenchCase> EluGradV2BenchCases(std::optional<int64_t> elems,
                                                    std::optional<DType> dtype,
                                                    std::optional<bool> is_result,
                                                    int32_t threads) {
  std::vector<EluGradV2BenchCase> cases;
  const std::vector<int64_t> sizes =
      elems ? std::vector<int64_t>{*elems}
            : std::vector<int64_t>{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (dtype && *dtype != d) continue;
    for (bool result : {false, true}) {
      if (is_result && *is_result != result) continue;
      for (int64_t n : sizes) cases.push_back({n, d, result, threads});
    }
  }
  return cases;
}

EluGradV2BenchResult RunEluGradV2BenchCase(const EluGradV2BenchCase& c, double min_seconds) {
  const int64_t elem_bytes = ElementBytes(c.dtype);
  const auto dy = RandomBuffer(c.elems, c.dtype, -2.0f, 2.0f, 1);
  const auto x = RandomBuffer(c.elems, c.dtype, -4.0f, 4.0f, 2);
  AlignedBytes y(static_cast<size_t>(c.elems * elem_bytes));  // 64-byte aligned, as torch's
  const int64_t moved_bytes = 3 * c.elems * elem_bytes;

  Check(gkSetNumThreads(c.threads));
  const int64_t shape[1] = {c.elems};
  const auto type = static_cast<gkDataType>(c.dtype);
  gkTensor* dy_t = gkCreateTensor(shape, 1, type, nullptr, 0, const_cast<uint8_t*>(dy.data()));
  gkTensor* x_t = gkCreateTensor(shape, 1, type, nullptr, 0, const_cast<uint8_t*>(x.data()));
  gkTensor* y_t = gkCreateTensor(shape, 1, type, nullptr, 0, y.data());
  uint64_t workspace_size = 0;
  gkOpExecutor* executor = nullptr;
  Check(gkEluGradV2GetWorkspaceSize(dy_t, x_t, kAlpha, kScale, kInputScale, c.is_result, y_t,
                                    &workspace_size, &executor));
  Check(gkSetExecutorRepeatable(executor));
  std::vector<uint8_t> workspace(workspace_size);

  // The same elements as a sliced view: rows of kSlicedRowElems in storage of a longer pitch.
  const bool sliced = c.elems % kSlicedRowElems == 0;
  const int64_t rows = c.elems / kSlicedRowElems;
  const int64_t sliced_storage = sliced ? rows * kSlicedRowPitch : 0;
  const auto dy_sliced = RandomBuffer(sliced_storage, c.dtype, -2.0f, 2.0f, 3);
  const auto x_sliced = RandomBuffer(sliced_storage, c.dtype, -4.0f, 4.0f, 4);
  std::vector<uint8_t> y_sliced(static_cast<size_t>(sliced_storage * elem_bytes));
  const int64_t sliced_shape[2] = {rows, kSlicedRowElems};
  const int64_t sliced_strides[2] = {kSlicedRowPitch, 1};
  gkTensor* dy_s = gkCreateTensor(sliced_shape, 2, type, sliced_strides, 0,
                                  const_cast<uint8_t*>(dy_sliced.data()));
  gkTensor* x_s = gkCreateTensor(sliced_shape, 2, type, sliced_strides, 0,
                                 const_cast<uint8_t*>(x_sliced.data()));
  gkTensor* y_s = gkCreateTensor(sliced_shape, 2, type, sliced_strides, 0, y_sliced.data());
  uint64_t sliced_workspace_size = 0;
  gkOpExecutor* sliced_executor = nullptr;
  if (sliced) {
    Check(gkEluGradV2GetWorkspaceSize(dy_s, x_s, kAlpha, kScale, kInputScale, c.is_result, y_s,
                                      &sliced_workspace_size, &sliced_executor));
    Check(gkSetExecutorRepeatable(sliced_executor));
  }
  std::vector<uint8_t> sliced_workspace(sliced_workspace_size);

  EluGradV2BenchResult r{c, "", 0, 0, std::nullopt, "", std::nullopt};
  const EluGradV2Problem problem{c.elems, c.dtype, c.dtype, c.is_result, true,
                                 FoldEluGradV2Coefficients(kAlpha, kScale, kInputScale)};
  const EluGradV2Plan plan = MakeEluGradV2Plan(problem, DetectEluGradV2Machine());
  r.mode = std::string(EluGradV2ModeName(plan.mode));

  // The copy moves the same bytes on as many threads as the plan uses.
  ParallelCopy copy(moved_bytes / 2, plan.threads);
  std::vector<std::function<void()>> candidates = {
      [&] { Check(gkEluGradV2(workspace.data(), workspace_size, executor, nullptr)); },
      [&] { copy(); }};
  if (sliced) {
    candidates.push_back([&] {
      Check(gkEluGradV2(sliced_workspace.data(), sliced_workspace_size, sliced_executor, nullptr));
    });
  }
  const size_t torch_index = candidates.size();
  std::vector<uint8_t> torch_y(static_cast<size_t>(c.elems * elem_bytes));
  if (auto torch_run = MakeTorchEluBackward(dy.data(), x.data(), torch_y.data(), c.elems, c.dtype,
                                            kAlpha, kScale, kInputScale, c.is_result, c.threads,
                                            &r.torch_note)) {
    candidates.push_back(*torch_run);
  }
  const auto seconds = BestSecondsInterleaved(candidates, min_seconds);
  r.gbps = static_cast<double>(moved_bytes) / seconds[0] / 1e9;
  r.copy_gbps = static_cast<double>(copy.bytes_moved()) / seconds[1] / 1e9;
  if (sliced) r.sliced_gbps = static_cast<double>(moved_bytes) / seconds[2] / 1e9;
  if (seconds.size() > torch_index) {
    r.torch_gbps = static_cast<double>(moved_bytes) / seconds[torch_index] / 1e9;
  }
  gkDestroyExecutor(executor);
  gkDestroyExecutor(sliced_executor);
  gkDestroyTensor(dy_s);
  gkDestroyTensor(x_s);
  gkDestroyTensor(y_s);
  gkDestroyTensor(dy_t);
  gkDestroyTensor(x_t);
  gkDestroyTensor(y_t);
  gkSetNumThreads(0);
  return r;
}

std::string EluGradV2BenchJson(const EluGradV2BenchResult& r) {
  const auto ratio = [](std::optional<double> a, std::optional<double> b) -> std::optional<double> {
    if (!a || !b || *b <= 0) return std::nullopt;
    return *a / *b;
  };
  return fmt::format(
      "{{\"op\": \"elu_grad_v2\", \"dtype\": \"{}\", \"is_result\": {}, \"elems\": {}, "
      "\"threads\": {}, \"mode\": \"{}\", \"gbps\": {}, \"copy_gbps\": {}, \"torch_gbps\": {}, "
      "\"vs_copy\": {}, \"vs_torch\": {}, \"sliced_gbps\": {}, \"sliced_vs_contiguous\": {}}}",
      DTypeName(r.c.dtype), r.c.is_result, r.c.elems, r.c.threads, r.mode, JsonNumber(r.gbps),
      JsonNumber(r.copy_gbps), JsonNumber(r.torch_gbps), JsonNumber(ratio(r.gbps, r.copy_gbps), 3),
      JsonNumber(ratio(r.gbps, r.torch_gbps), 3), JsonNumber(r.sliced_gbps),
      JsonNumber(ratio(r.sliced_gbps, r.gbps), 3));
}

}  // namespace gk::bench
