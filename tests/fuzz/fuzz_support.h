// Shared by the fuzz targets: choices read from the fuzzer's bytes, buffers fenced exactly (by
// ASan when it is on, by guard bytes otherwise), and checks that abort with a message.
// The targets build two ways: with libFuzzer (the `fuzz` preset, clang) and as a plain corpus
// replayer (replay_main.cc, any compiler), so they use nothing clang-specific.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define GK_FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GK_FUZZ_ASAN 1
#endif
#endif

// For the target's own bookkeeping loops (filling and checking buffers): coverage of those is
// noise to libFuzzer and its comparison tracing costs most of the time per input.
#if defined(__clang__)
#define GK_FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define GK_FUZZ_NO_COVERAGE
#endif

// A broken guarantee: print what and where, then abort (libFuzzer saves the input as a crash).
#define GK_FUZZ_CHECK(condition, ...)                                             \
  do {                                                                            \
    if (!(condition)) {                                                           \
      std::fprintf(stderr, "%s:%d: guarantee broken: %s: ", __FILE__, __LINE__,   \
                   #condition);                                                   \
      std::fprintf(stderr, __VA_ARGS__);                                          \
      std::fprintf(stderr, "\n");                                                 \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

namespace gk::fuzz {

// Reads choices from the front of the input; once it runs dry every choice is 0 (the first
// option), so short inputs still describe a complete call.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t U8() { return at_ < size_ ? data_[at_++] : 0; }
  bool Bool() { return (U8() & 1) != 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(U8()) << (8 * i);
    return v;
  }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  double F64() {
    const uint64_t bits = U64();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  // A value in [low, high] (inclusive), from one or two bytes.
  int64_t Range(int64_t low, int64_t high) {
    const uint64_t span = static_cast<uint64_t>(high - low) + 1;
    const uint64_t raw = span <= 256 ? U8() : (static_cast<uint64_t>(U8()) << 8 | U8());
    return low + static_cast<int64_t>(raw % span);
  }
  template <typename T, size_t N>
  T Pick(const T (&options)[N]) {
    return options[Range(0, static_cast<int64_t>(N) - 1)];
  }
  size_t remaining() const { return size_ - at_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Sizes and values that break naive arithmetic: 32-bit edges, square roots of 2^63, 2^63 - 1.
inline constexpr int64_t kHostileSizes[] = {
    -1,
    std::numeric_limits<int64_t>::min(),
    std::numeric_limits<int64_t>::max(),
    int64_t{1} << 31,
    (int64_t{1} << 32) + 1,
    3037000500,  // just above sqrt(2^63)
    int64_t{1} << 40,
    int64_t{1} << 61,
    int64_t{1} << 62,
    (int64_t{1} << 62) + 1,
    -(int64_t{1} << 62),
    -(int64_t{1} << 61),
};

// A heap block of exactly `bytes` bytes between guard bands. Under ASan the bands are empty and
// the allocation is exact, so any access past either end is reported; without ASan each band is
// 64 bytes of a known pattern, checked by CheckGuards().
class GuardedBuffer {
 public:
#ifdef GK_FUZZ_ASAN
  static constexpr size_t kGuardBytes = 0;
#else
  static constexpr size_t kGuardBytes = 64;
#endif
  static constexpr uint8_t kGuardByte = 0xA5;

  explicit GuardedBuffer(size_t bytes) : bytes_(bytes), block_(new uint8_t[bytes + 2 * kGuardBytes]) {
    std::memset(block_.get(), kGuardByte, bytes + 2 * kGuardBytes);
  }
  uint8_t* data() { return block_.get() + kGuardBytes; }
  const uint8_t* data() const { return block_.get() + kGuardBytes; }
  size_t size() const { return bytes_; }
  GK_FUZZ_NO_COVERAGE std::vector<uint8_t> Snapshot() const { return {data(), data() + bytes_}; }
  GK_FUZZ_NO_COVERAGE void CheckGuards(const char* name) const {
    for (size_t i = 0; i < kGuardBytes; ++i) {
      GK_FUZZ_CHECK(block_[i] == kGuardByte, "%s: guard byte %zu before the buffer was written",
                    name, kGuardBytes - i);
      GK_FUZZ_CHECK(block_[kGuardBytes + bytes_ + i] == kGuardByte,
                    "%s: guard byte %zu past the buffer was written", name, i);
    }
  }

 private:
  size_t bytes_;
  std::unique_ptr<uint8_t[]> block_;
};

}  // namespace gk::fuzz
