#include "bench/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"

namespace gk::bench {

std::vector<double> BestSecondsInterleaved(const std::vector<std::function<void()>>& candidates,
                                           double min_seconds, int min_reps) {
  using Clock = std::chrono::steady_clock;
  for (const auto& fn : candidates) fn();
  std::vector<double> best(candidates.size(), 1e30);
  double total = 0;
  for (int round = 0; round < min_reps || total < min_seconds; ++round) {
    for (size_t c = 0; c < candidates.size(); ++c) {
      const auto start = Clock::now();
      candidates[c]();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      best[c] = std::min(best[c], seconds);
      total += seconds;
    }
    if (round > 1000) break;
  }
  return best;
}

ParallelCopy::ParallelCopy(int64_t bytes, int32_t threads)
    : bytes_(bytes),
      threads_(threads),
      source_(static_cast<size_t>(bytes), 1),
      target_(static_cast<size_t>(bytes), 0) {}

void ParallelCopy::operator()() {
  const int64_t share = (bytes_ / threads_ + 255) / 256 * 256;
  ParallelFor(threads_, threads_, [&](int64_t t) {
    const int64_t begin = std::min(bytes_, t * share);
    const int64_t end = std::min(bytes_, begin + share);
    std::memcpy(target_.data() + begin, source_.data() + begin, static_cast<size_t>(end - begin));
  });
}

std::string JsonNumber(std::optional<double> value, int decimals) {
  return value ? fmt::format("{:.{}f}", *value, decimals) : "null";
}

void FillUniform(float* data, int64_t n, float low, float high, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  for (int64_t i = 0; i < n; ++i) data[i] = distribution(generator);
}

}  // namespace gk::bench
