// Timing helpers shared by the benchmarks: every rate is measured beside its ceiling, in the same
// process and run, because the machines are shared and noisy.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace gk::bench {

// Runs fn once to warm up, then repeatedly until `min_seconds` have passed and at least
// `min_reps` runs were made; returns the fastest run in seconds.
double BestSeconds(const std::function<void()>& fn, double min_seconds = 0.25, int min_reps = 3);

// The machine's streaming ceiling: GB/s (bytes read + written) of a plain copy of `bytes` bytes
// split over `threads` threads the way the operators split work.
double CopyGbps(int64_t bytes, int32_t threads);

std::string JsonNumber(std::optional<double> value, int decimals = 2);  // "null" when empty

// Fills a buffer with reproducible values in [low, high) (a fixed-seed generator).
void FillUniform(float* data, int64_t n, float low, float high, uint64_t seed);

}  // namespace gk::bench
