// `gradkit bench elu-grad`: GB/s of EluGradV2 beside a plain copy (the ceiling) and libtorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace gk::bench {

struct EluGradV2BenchCase {
  int64_t elems;
  DType dtype;
  bool is_result;
  int32_t threads;
};

struct EluGradV2BenchResult {
  EluGradV2BenchCase c;
  std::string mode;                 // the plan's schedule mode
  double gbps;                      // bytes read + written per second
  double copy_gbps;                 // the same bytes copied, same threads
  std::optional<double> torch_gbps;  // at::elu_backward_out, same threads
  std::string torch_note;           // why torch_gbps is absent
  // The operator on a sliced view of the same elements: rows of kSlicedRowElems cut from
  // storage with a longer row pitch (x[:, :1024] of a wider tensor), every view strided.
  std::optional<double> sliced_gbps;
};

inline constexpr int64_t kSlicedRowElems = 1024;
inline constexpr int64_t kSlicedRowPitch = kSlicedRowElems + 16;

// Sizes 4 K .. 64 M elements x {f32, f16, bf16} x {exp, result}, filtered by the options given.
// Each case also runs a sliced view of the same size (when it divides into rows).
std::vector<EluGradV2BenchCase> EluGradV2BenchCases(std::optional<int64_t> elems,
                                                    std::optional<DType> dtype,
                                                    std::optional<bool> is_result, int32_t threads);
EluGradV2BenchResult RunEluGradV2BenchCase(const EluGradV2BenchCase& c, double min_seconds);
std::string EluGradV2BenchJson(const EluGradV2BenchResult& r);

}  // namespace gk::bench
