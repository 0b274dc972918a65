#include "bench/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>
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

void Check(gkStatus status) {
  if (status != GK_SUCCESS) throw std::runtime_error(gkGetRecentErrMsg());
}

AlignedBytes HashedBuffer(int64_t elems, DType dtype, uint64_t seed, int32_t threads) {
  AlignedBytes out(static_cast<size_t>(elems * ElementBytes(dtype)));
  constexpr int64_t kBlock = 1 << 20;
  ParallelFor(threads, (elems + kBlock - 1) / kBlock, [&](int64_t block) {
    const int64_t end = std::min(elems, (block + 1) * kBlock);
    for (int64_t i = block * kBlock; i < end; ++i) {
      uint64_t z = (static_cast<uint64_t>(i) + seed * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
      StoreFromF32(out.data(), i, dtype, static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
  });
  return out;
}

std::vector<float> ToF32(const AlignedBytes& buffer, DType dtype, int32_t threads) {
  const int64_t elems = static_cast<int64_t>(buffer.size()) / ElementBytes(dtype);
  std::vector<float> out(static_cast<size_t>(elems));
  constexpr int64_t kBlock = 1 << 20;
  ParallelFor(threads, (elems + kBlock - 1) / kBlock, [&](int64_t block) {
    const int64_t end = std::min(elems, (block + 1) * kBlock);
    for (int64_t i = block * kBlock; i < end; ++i) out[i] = LoadAsF32(buffer.data(), i, dtype);
  });
  return out;
}

TensorHandle::TensorHandle(const std::vector<int64_t>& dims, DType dtype, const void* data)
    : t(gkCreateTensor(dims.data(), dims.size(), static_cast<gkDataType>(dtype), nullptr, 0,
                       const_cast<void*>(data))) {
  if (t == nullptr) throw std::runtime_error(gkGetRecentErrMsg());
}

}  // namespace gk::bench
