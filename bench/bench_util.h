// Timing helpers shared by the benchmarks: every rate is measured beside its ceiling, in the same
// process and run, because the machines are shared and noisy.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"

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

// Throws the library's message when a call failed.
void Check(gkStatus status);

// Bytes from a 64-byte boundary, as PyTorch's and most allocators hand tensors out (a large
// std::vector's data sits 16 bytes past a page: kernels' aligned paths would never run, e.g. the
// float32 forward's weights read in place, moe_grad_microkernel.h's MoeMicroGemmKN).
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t bytes, uint8_t fill = 0) : bytes_(bytes), storage_(bytes + 64, fill) {}
  uint8_t* data() { return storage_.data() + Skip(); }
  const uint8_t* data() const { return storage_.data() + Skip(); }
  size_t size() const { return bytes_; }

 private:
  size_t Skip() const { return (64 - reinterpret_cast<uintptr_t>(storage_.data()) % 64) % 64; }
  size_t bytes_;
  std::vector<uint8_t> storage_;
};

// Reproducible values in [-1, 1) rounded to `dtype`, filled in parallel (weights reach 880 M
// elements): a hash of the index, not a sequential generator. 64-byte aligned, as torch's.
AlignedBytes HashedBuffer(int64_t elems, DType dtype, uint64_t seed, int32_t threads);

// A buffer of `dtype` elements widened to float32, in parallel.
std::vector<float> ToF32(const AlignedBytes& buffer, DType dtype, int32_t threads);

// A dense tensor descriptor over caller-owned data, released with the handle.
class TensorHandle {
 public:
  TensorHandle(const std::vector<int64_t>& dims, DType dtype, const void* data);
  ~TensorHandle() { gkDestroyTensor(t); }
  TensorHandle(const TensorHandle&) = delete;
  TensorHandle& operator=(const TensorHandle&) = delete;
  gkTensor* t;
};

}  // namespace gk::bench
