// Timing helpers shared by the benchmarks: every rate is measured beside its ceiling, in the same
// process and run, because the machines are shared and noisy.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gk::bench {

// Runs the candidates in turn, round after round (so that a noisy neighbour slows all of them
// alike), until `min_seconds` have passed in total and each ran at least `min_reps` times;
// returns each one's fastest run in seconds.
std::vector<double> BestSecondsInterleaved(const std::vector<std::function<void()>>& candidates,
                                           double min_seconds = 0.5, int min_reps = 5);

// A plain copy of `bytes` bytes split over `threads` threads the way the operators split work:
// the machine's streaming ceiling. Moves 2 * bytes (read + written) per call.
class ParallelCopy {
 public:
  ParallelCopy(int64_t bytes, int32_t threads);
  void operator()();
  int64_t bytes_moved() const { return 2 * bytes_; }

 private:
  int64_t bytes_;
  int32_t threads_;
  std::vector<uint8_t> source_, target_;
};

std::string JsonNumber(std::optional<double> value, int decimals = 2);  // "null" when empty

// Fills a buffer with reproducible values in [low, high) (a fixed-seed generator).
void FillUniform(float* data, int64_t n, float low, float high, uint64_t seed);

}  // namespace gk::bench
