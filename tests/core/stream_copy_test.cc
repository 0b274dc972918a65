// StreamCopy writes memcpy's bytes for every size and alignment of source and target, on
// every SIMD target this CPU runs (the non-temporal body, its memcpy head and tail, and short
// copies that are memcpy alone); the streaming rule of the plans.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/cpu/stream_copy.h"
#include "core/cpu_info.h"

namespace gk {
namespace {

TEST(StreamCopy, SameBytesAsMemcpyForEverySizeAndAlignment) {
  std::vector<uint8_t> source(1 << 12), target(source.size() + 128), want(target.size());
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  for (const std::string& isa : AvailableIsas()) {
    ASSERT_TRUE(SelectIsa(isa));
    for (size_t dst_offset : {0, 1, 17, 32, 63}) {
      for (size_t src_offset : {0, 3, 64}) {
        for (size_t bytes : {0, 1, 31, 64, 65, 127, 128, 200, 1000, 4000 - 64}) {
          std::memset(target.data(), 0xCD, target.size());
          std::memset(want.data(), 0xCD, want.size());
          StreamCopy(target.data() + dst_offset, source.data() + src_offset, bytes);
          FlushStreamingStores();
          std::memcpy(want.data() + dst_offset, source.data() + src_offset, bytes);
          ASSERT_EQ(target, want) << isa << ": " << bytes << " bytes, target + " << dst_offset
                                  << ", source + " << src_offset;
        }
      }
    }
  }
  SelectIsa("");
}

TEST(StreamCopy, StreamingPaysOnlyPastTheLastLevelCache) {
  EXPECT_FALSE(StreamingPays(32 << 20, 32 << 20));
  EXPECT_TRUE(StreamingPays((32 << 20) + 1.0, 32 << 20));
  EXPECT_TRUE(StreamingPays(1e30, int64_t{1} << 40));  // shapes far past int64's bytes
}

}  // namespace
}  // namespace gk
