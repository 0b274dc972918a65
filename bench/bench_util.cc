#include "bench/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"

namespace gk::bench {

double BestSeconds(const std::function<void()>& fn, double min_seconds, int min_reps) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = 1e30, total = 0;
  for (int rep = 0; rep < min_reps || total < min_seconds; ++rep) {
    const auto start = Clock::now();
    fn();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, seconds);
    total += seconds;
    if (rep > 1000) break;
  }
  return best;
}

double CopyGbps(int64_t bytes, int32_t threads) {
  std::vector<uint8_t> source(static_cast<size_t>(bytes), 1), target(static_cast<size_t>(bytes));
  const int64_t share = (bytes / threads + 255) / 256 * 256;
  const double seconds = BestSeconds([&] {
    ParallelFor(threads, threads, [&](int64_t t) {
      const int64_t begin = std::min(bytes, t * share);
      const int64_t end = std::min(bytes, begin + share);
      std::memcpy(target.data() + begin, source.data() + begin, static_cast<size_t>(end - begin));
    });
  });
  return 2.0 * static_cast<double>(bytes) / seconds / 1e9;
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
