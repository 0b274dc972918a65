// Integer arithmetic the plans share: tile counts, padded extents and region sizes.
#pragma once

#include <cstdint>

namespace gk {

// a / b rounded up; a >= 0, b > 0.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a rounded up to a multiple of b; a >= 0, b > 0.
inline int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// The bytes of `elems` elements of `elem_bytes` each, as the unsigned sizes layouts use.
inline uint64_t Bytes(int64_t elems, int64_t elem_bytes) {
  return static_cast<uint64_t>(elems) * static_cast<uint64_t>(elem_bytes);
}

// Rounds a pointer, or a byte count, up to `alignment` (a power of two for the pointer): where
// workspace regions start.
inline void* AlignUp(void* p, uintptr_t alignment) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((address + alignment - 1) & ~(alignment - 1));
}
inline uint64_t AlignUp(uint64_t bytes, uint64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

}  // namespace gk
