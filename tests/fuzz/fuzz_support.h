// Shared by the fuzz targets: choices read from the fuzzer's bytes, buffers fenced exactly (by
// ASan when it is on, by guard bytes otherwise), and checks that abort with a message. The
// operator targets also share tensor views over those buffers (any shape, stride, offset and
// dtype, hostile ones included), the index data they carry, and the "nothing written" check.
// The targets build two ways: with libFuzzer (the `fuzz` preset, clang) and as a plain corpus
// replayer (replay_main.cc, any compiler), so they use nothing clang-specific.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"

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
  // (In unsigned arithmetic: a hostile bound such as INT64_MAX must not overflow; span 0 means
  // the whole 64-bit range.)
  int64_t Range(int64_t low, int64_t high) {
    const uint64_t span = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) + 1;
    const uint64_t raw = span != 0 && span <= 256 ? U8() : (static_cast<uint64_t>(U8()) << 8 | U8());
    return static_cast<int64_t>(static_cast<uint64_t>(low) + (span == 0 ? raw : raw % span));
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


// ---- Tensor views over guarded buffers, for the operator targets ----

// The largest view given real memory; a larger one gets a dangling pointer and is only planned.
inline constexpr int64_t kMaxBackedBytes = int64_t{1} << 14;
// A float dtype, sometimes not one an operator takes (invalid enum values included).
inline constexpr int32_t kFloatDTypes[] = {GK_FLOAT, GK_FLOAT16, GK_BF16, GK_FLOAT, GK_FLOAT16,
                                           GK_BF16,  GK_INT32,   GK_DOUBLE, -1,     1000};
inline constexpr int32_t kAnyDTypes[] = {GK_INT64, GK_INT32,  GK_FLOAT, GK_FLOAT16,
                                         GK_BF16,  GK_DOUBLE, 2,        -7};
inline constexpr int64_t kIndexValues[] = {-1, -2, 0, 1, std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max(), int64_t{1} << 32,
                                           (int64_t{1} << 31) - 1, -(int64_t{1} << 31)};

inline int64_t BytesOf(int32_t dtype) {
  return gk::IsKnownDType(dtype) ? gk::ElementBytes(static_cast<gk::DType>(dtype)) : 4;
}

inline uint8_t* Offset(uint8_t* p, __int128 bytes) {
  return reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes));
}

inline bool IsFloat(int32_t dtype) { return dtype == GK_FLOAT || dtype == GK_FLOAT16 || dtype == GK_BF16; }
inline bool IsIndex(int32_t dtype) { return dtype == GK_INT64 || dtype == GK_INT32; }

// One tensor argument as the target describes it: what gkCreateTensor is given, and the memory.
struct View {
  bool present = true;
  int32_t dtype = GK_FLOAT;
  int rank = 0;
  int64_t dims[4] = {};
  bool explicit_strides = false;
  int64_t strides[4] = {};
  int64_t offset = 0;
  int buffer = -1;
  uint8_t* data = nullptr;
  bool backed = false;
  gkTensor* tensor = nullptr;

  int64_t Stride(int d) const {
    if (explicit_strides) return strides[d];
    uint64_t stride = 1;
    for (int e = rank - 1; e > d; --e) stride *= static_cast<uint64_t>(std::max<int64_t>(dims[e], 1));
    return static_cast<int64_t>(stride);
  }
  __int128 Count() const {
    __int128 n = 1;
    for (int d = 0; d < rank; ++d) {
      if (dims[d] <= 0) return 0;
      constexpr __int128 kHuge = static_cast<__int128>(1) << 70;
      n = n > kHuge / dims[d] ? kHuge : std::min<__int128>(n * dims[d], kHuge);
    }
    return n;
  }
  // [low, high] addressed element offsets; false when empty.
  bool Extent(__int128* low, __int128* high) const {
    if (Count() == 0) return false;
    constexpr __int128 kHuge = static_cast<__int128>(1) << 70;
    __int128 lo = offset, hi = offset;
    for (int d = 0; d < rank; ++d) {
      const __int128 span = std::clamp(static_cast<__int128>(dims[d] - 1) * Stride(d), -kHuge, kHuge);
      (span < 0 ? lo : hi) += span;
    }
    *low = lo;
    *high = hi;
    return true;
  }
  // The header's "addressable": element offsets times the element size fit in int64, and the
  // bytes lie inside the 64-bit address space.
  bool Addressable() const {
    __int128 low, high;
    if (!Extent(&low, &high)) return true;
    const __int128 max = std::numeric_limits<int64_t>::max(), min = std::numeric_limits<int64_t>::min();
    const __int128 first = low * BytesOf(dtype), end = (high + 1) * BytesOf(dtype);
    if (first < min || first > max || end < min || end > max) return false;
    const auto base = static_cast<__int128>(reinterpret_cast<uintptr_t>(data));
    return base + first >= 0 && base + end <= static_cast<__int128>(UINTPTR_MAX);
  }
  bool Contiguous() const {
    int64_t expected = 1;
    for (int d = rank - 1; d >= 0; --d) {
      if (dims[d] != 1 && Stride(d) != expected) return false;
      expected = static_cast<int64_t>(static_cast<uint64_t>(expected) * static_cast<uint64_t>(dims[d]));
    }
    return true;
  }
  // Element i of a dense view (checked Contiguous and backed by the caller).
  uint8_t* At(int64_t i) const {
    return Offset(data, (static_cast<__int128>(offset) + i) * BytesOf(dtype));
  }
};


// The buffers behind a call's views. A target's Call derives from it.
struct GuardedMemory {
  std::vector<std::unique_ptr<GuardedBuffer>> buffers;
  GuardedBuffer dangling{0};
};

// Gives v memory: an exact guarded buffer for its extent, NULL (null_data), or, past
// kMaxBackedBytes, a dangling pointer (backed = false: such a call may only be refused).
GK_FUZZ_NO_COVERAGE inline void Back(GuardedMemory& memory, View& v, bool null_data) {
  if (null_data) {
    v.data = nullptr;
    v.backed = v.Count() == 0;
    return;
  }
  __int128 low, high;
  if (!v.Extent(&low, &high)) {
    v.data = memory.dangling.data();
    v.backed = true;
    return;
  }
  const __int128 bytes = (high - low + 1) * BytesOf(v.dtype);
  if (bytes > kMaxBackedBytes) {
    v.data = memory.dangling.data();
    v.backed = false;
    return;
  }
  memory.buffers.push_back(std::make_unique<GuardedBuffer>(static_cast<size_t>(bytes)));
  v.buffer = static_cast<int>(memory.buffers.size()) - 1;
  v.data = Offset(memory.buffers.back()->data(), -low * BytesOf(v.dtype));
  v.backed = true;
}

// An output placed on an input's buffer (shifted): must be refused, and must never be written.
inline void Share(GuardedMemory& memory, View& v, const View& owner, int64_t shift_bytes) {
  v.buffer = owner.buffer;
  v.backed = false;
  v.data = owner.buffer < 0 ? owner.data : Offset(owner.data, shift_bytes);
  __int128 low, high;
  if (owner.buffer < 0 || !v.Extent(&low, &high)) return;
  const GuardedBuffer& b = *memory.buffers[v.buffer];
  const auto start = static_cast<__int128>(static_cast<intptr_t>(
      reinterpret_cast<uintptr_t>(v.data) - reinterpret_cast<uintptr_t>(b.data())));
  v.backed = start + low * BytesOf(v.dtype) >= 0 &&
             start + (high + 1) * BytesOf(v.dtype) <= static_cast<__int128>(b.size());
}

// Element i of a dense, backed index view.
inline int64_t IndexAt(const View& v, int64_t i) {
  if (v.dtype == GK_INT32) {
    int32_t value;
    std::memcpy(&value, v.At(i), 4);
    return value;
  }
  int64_t value;
  std::memcpy(&value, v.At(i), 8);
  return value;
}

// Writes values (then zeros) over the whole buffer behind an index view, in its dtype.
GK_FUZZ_NO_COVERAGE inline void FillIndex(GuardedMemory& memory, const View& v,
                                          const std::vector<int64_t>& values) {
  if (v.buffer < 0) return;
  GuardedBuffer& b = *memory.buffers[v.buffer];
  const int64_t elem = BytesOf(v.dtype);
  size_t at = 0;
  for (size_t i = 0; i + elem <= b.size(); i += elem, ++at) {
    const int64_t value = at < values.size() ? values[at] : 0;
    if (elem == 4) {
      const auto narrow = static_cast<int32_t>(value);
      std::memcpy(b.data() + i, &narrow, 4);
    } else {  // int64, or the low bytes for a dtype a mutation made wrong
      std::memcpy(b.data() + i, &value, static_cast<size_t>(std::min<int64_t>(elem, 8)));
    }
  }
}

// Fills the buffers of the views named in `roles` from a xorshift stream started at `state`: raw
// bits, or with `exact` small integers (-3..3) in every float element, 12345 in the view `output`
// (so that a test tells the values a call wrote from the ones it found).
GK_FUZZ_NO_COVERAGE inline void FillFloatViews(GuardedMemory& memory, const View* views,
                                               std::initializer_list<int> roles, int output,
                                               bool exact, uint64_t state) {
  for (int r : roles) {
    const View& v = views[r];
    if (v.buffer < 0) continue;
    GuardedBuffer& b = *memory.buffers[v.buffer];
    const int64_t elem = BytesOf(v.dtype);
    for (size_t i = 0; i + elem <= b.size(); i += elem) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      if (!exact) {
        std::memcpy(b.data() + i, &state, static_cast<size_t>(elem));
      } else if (gk::IsKnownDType(v.dtype) && v.dtype != GK_INT32 && v.dtype != GK_INT64) {
        gk::StoreFromF32(b.data() + i, 0, static_cast<gk::DType>(v.dtype),
                         r == output ? 12345.0f : static_cast<float>(state % 7) - 3.0f);
      }
    }
  }
}

GK_FUZZ_NO_COVERAGE inline std::vector<std::vector<uint8_t>> Snapshot(const GuardedMemory& memory) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& b : memory.buffers) out.push_back(b->Snapshot());
  return out;
}

// Every buffer but except_buffer holds the bytes of `before`, and no guard byte changed.
GK_FUZZ_NO_COVERAGE inline void CheckUnchanged(const GuardedMemory& memory,
                                               const std::vector<std::vector<uint8_t>>& before,
                                               const char* when, int except_buffer = -1) {
  for (size_t i = 0; i < memory.buffers.size(); ++i) {
    memory.buffers[i]->CheckGuards(when);
    if (static_cast<int>(i) == except_buffer) continue;
    GK_FUZZ_CHECK(memory.buffers[i]->Snapshot() == before[i], "%s: buffer %zu changed", when, i);
  }
}

// A refused call: an error status with a one-line message.
inline void CheckFailure(gkStatus status, const char* when) {
  GK_FUZZ_CHECK(status != GK_SUCCESS, "%s: expected an error", when);
  const std::string message = gkGetRecentErrMsg();
  GK_FUZZ_CHECK(!message.empty(), "%s: status %d without a message", when, static_cast<int>(status));
  GK_FUZZ_CHECK(message.find('\n') == std::string::npos, "%s: message spans lines", when);
}

// With GK_FUZZ_DEBUG set, says which rule of the contract a call breaks; always false.
inline bool Refuse(int line) {
  if (std::getenv("GK_FUZZ_DEBUG")) std::fprintf(stderr, "contract broken at line %d\n", line);
  return false;
}

// Whether two views' addressed bytes share one (empty views share none).
inline bool Overlap(const View& a, const View& b) {
  __int128 lo, hi;
  if (!a.Extent(&lo, &hi)) return false;
  const auto a_first = reinterpret_cast<uintptr_t>(a.data) + static_cast<uintptr_t>(lo * BytesOf(a.dtype));
  const auto a_end = reinterpret_cast<uintptr_t>(a.data) + static_cast<uintptr_t>((hi + 1) * BytesOf(a.dtype));
  if (!b.Extent(&lo, &hi)) return false;
  const auto b_first = reinterpret_cast<uintptr_t>(b.data) + static_cast<uintptr_t>(lo * BytesOf(b.dtype));
  const auto b_end = reinterpret_cast<uintptr_t>(b.data) + static_cast<uintptr_t>((hi + 1) * BytesOf(b.dtype));
  return a_first < b_end && b_first < a_end;
}

// Phase-2 misuse of a planned executor, as `kind` (0..3) says: nothing, a workspace one byte
// short, a NULL workspace, the executor given to `other` (another operator's phase 2). Each must
// fail with a message and leave memory as `before`. run / other: gkXxx(ws, size, executor, stream).
template <typename Run, typename Other>
void CheckPhase2Misuse(int kind, const GuardedMemory& memory,
                       const std::vector<std::vector<uint8_t>>& before, void* workspace,
                       uint64_t workspace_size, gkOpExecutor* executor, Run run, Other other) {
  CheckFailure(run(workspace, workspace_size, nullptr, nullptr), "NULL executor");
  if (kind == 1 && workspace_size > 0) {
    CheckFailure(run(workspace, workspace_size - 1, executor, nullptr), "short workspace");
    CheckUnchanged(memory, before, "short workspace");
  } else if (kind == 2 && workspace_size > 0) {
    CheckFailure(run(nullptr, workspace_size, executor, nullptr), "NULL workspace");
    CheckUnchanged(memory, before, "NULL workspace");
  } else if (kind == 3) {
    CheckFailure(other(workspace, workspace_size, executor, nullptr),
                 "executor given to another operator");
    CheckUnchanged(memory, before, "executor given to another operator");
  }
}

// One mutation of a view's descriptor, as `kind` (0..4) says: a dim off by a little or hostile,
// the rank off by one, an offset, strides, a dtype.
inline void MutateView(ByteReader& in, View& v, int kind) {
  switch (kind) {
    case 0:
      if (v.rank > 0) {
        int64_t& d = v.dims[in.Range(0, v.rank - 1)];
        d = in.Bool() ? std::clamp<int64_t>(d, 0, 1 << 20) + in.Range(-1, 1) : in.Pick(kHostileSizes);
      }
      break;
    case 1:
      if (in.Bool() && v.rank < 4) {
        v.dims[v.rank++] = 1;
      } else if (v.rank > 0) {
        --v.rank;
      }
      break;
    case 2: v.offset = in.Bool() ? in.Range(0, 5) : in.Pick(kHostileSizes); break;
    case 3:
      v.explicit_strides = true;
      for (int d = 0; d < v.rank; ++d) v.strides[d] = in.Bool() ? in.Range(-2, 6) : in.Pick(kHostileSizes);
      break;
    default: v.dtype = in.Pick(kAnyDTypes); break;
  }
}

// The guarantees of phase 1, whatever its verdict: a refusal has a message and no executor, and
// nothing is written either way; with every view backed, the verdict is the contract's
// (meets_contract: the target's independent check).
template <typename Contract>
void CheckPhase1(gkStatus status, gkOpExecutor* executor, bool null_executor,
                 const GuardedMemory& memory, const std::vector<std::vector<uint8_t>>& before,
                 bool all_backed, Contract meets_contract) {
  if (status != GK_SUCCESS) {
    CheckFailure(status, "phase 1");
    if (!null_executor) GK_FUZZ_CHECK(executor == nullptr, "phase 1 failed but left an executor");
    CheckUnchanged(memory, before, "failed phase 1");
    if (all_backed) {
      GK_FUZZ_CHECK(!meets_contract(), "phase 1 refused a call that meets the contract: %s",
                    gkGetRecentErrMsg());
    }
  } else {
    GK_FUZZ_CHECK(executor != nullptr, "phase 1 succeeded without an executor");
    CheckUnchanged(memory, before, "phase 1");
    if (all_backed) GK_FUZZ_CHECK(meets_contract(), "phase 1 accepted a call that breaks the contract");
  }
}

// A valid routing: m rows spread over g experts (groupList as groupListType says), and the
// expanded row index of either type over `slots` slots, permuted; rowIdxType 0 gets `extra`
// junk entries past M.
struct Routing {
  std::vector<int64_t> group_list;
  std::vector<int64_t> row_idx;
};

GK_FUZZ_NO_COVERAGE inline Routing MakeRouting(ByteReader& in, int64_t m, int64_t g, int64_t slots,
                                               int64_t row_idx_type, int32_t group_list_type,
                                               int64_t extra) {
  Routing r;
  uint64_t state = in.U64() | 1;
  const auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  std::vector<int64_t> counts(static_cast<size_t>(g), 0);
  for (int64_t i = 0; i < m; ++i) ++counts[next() % g];
  int64_t running = 0;
  for (int64_t e = 0; e < g; ++e) {
    running += counts[e];
    r.group_list.push_back(group_list_type == 1 ? running : counts[e]);
  }
  std::vector<int64_t> slot_of(static_cast<size_t>(slots));
  for (int64_t p = 0; p < slots; ++p) slot_of[p] = p;
  for (int64_t p = slots - 1; p > 0; --p) std::swap(slot_of[p], slot_of[next() % (p + 1)]);
  if (row_idx_type == 1) {
    r.row_idx.assign(static_cast<size_t>(slots), -1);
    for (int64_t i = 0; i < m; ++i) r.row_idx[slot_of[i]] = i;
  } else {
    for (int64_t i = 0; i < m; ++i) r.row_idx.push_back(slot_of[i]);
    for (int64_t i = 0; i < extra; ++i) r.row_idx.push_back(static_cast<int64_t>(next() % 7) - 3);
  }
  return r;
}

}  // namespace gk::fuzz
