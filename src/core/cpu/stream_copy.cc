// StreamCopy, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/cpu/stream_copy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstring>

#include "core/cpu/stream_copy.h"

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void StreamCopyT(void* dst, const void* src, size_t bytes) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<uint8_t> d;
  const size_t vec = hn::Lanes(d);  // 32 or 64 bytes
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  // From the first cache line of dst on (a multiple of the vector): no line is written partly
  // by memcpy's cached stores and partly by non-temporal ones.
  constexpr size_t kLine = kStreamLineBytes;
  const size_t head = (kLine - reinterpret_cast<uintptr_t>(out) % kLine) % kLine;
  if (bytes < head + 2 * vec) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::memcpy(out, in, head);
  size_t i = head;
  for (; i + 2 * vec <= bytes; i += 2 * vec) {
    const auto v0 = hn::LoadU(d, in + i);
    const auto v1 = hn::LoadU(d, in + i + vec);
    hn::Stream(v0, d, out + i);
    hn::Stream(v1, d, out + i + vec);
  }
  std::memcpy(out + i, in + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(StreamCopyT);

void StreamCopy(void* dst, const void* src, size_t bytes) {
  HWY_DYNAMIC_DISPATCH(StreamCopyT)(dst, src, bytes);
}

void FlushStreamingStores() { hwy::FlushStream(); }

}  // namespace gk
#endif  // HWY_ONCE
