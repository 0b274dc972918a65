// Copies and stores that bypass the caches, for outputs too large to stay cached: a
// non-temporal store writes a line without reading it first (no read-for-ownership), so a row
// copy moves 2 bytes per byte instead of 3. Results are the bytes of memcpy.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gk {

// Where non-temporal stores start: on a cache line. A line written partly by plain stores and
// partly by non-temporal ones (or by two bursts of them) reaches memory in pieces, at a cost
// above the read-for-ownership the streaming was to save. Every kernel that streams uses this.
inline constexpr size_t kStreamLineBytes = 64;

// dst[0, bytes) = src[0, bytes). Where the SIMD target has non-temporal stores (x86, AVX2 and
// later) the bytes from dst's first 64-byte boundary on are streamed (the head and the tail by
// memcpy); elsewhere, and for copies under two vectors past that boundary, it is memcpy.
// Streamed stores are weakly ordered: a thread that streams ends its share with
// FlushStreamingStores() before other threads read what it wrote.
void StreamCopy(void* dst, const void* src, size_t bytes);

// The fence after non-temporal stores (sfence on x86; nothing elsewhere).
void FlushStreamingStores();

// Whether plans should stream an output: once the bytes an operator moves exceed the
// last-level cache, nothing it writes stays cached for a consumer anyway.
// (moved_bytes in double: plans compute it from shapes without overflow.)
inline bool StreamingPays(double moved_bytes, int64_t llc_bytes) {
  return moved_bytes > static_cast<double>(llc_bytes);
}

}  // namespace gk
