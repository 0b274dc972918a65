#include "core/cpu_info.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace gk {
namespace {

TEST(ParseSysfsCacheSize, ReadsTheKernelsUnits) {
  EXPECT_EQ(ParseSysfsCacheSize("32K"), 32 * 1024);
  EXPECT_EQ(ParseSysfsCacheSize("32768K\n"), 32 * 1024 * 1024);
  EXPECT_EQ(ParseSysfsCacheSize("1M"), 1024 * 1024);
  EXPECT_EQ(ParseSysfsCacheSize("2G"), int64_t{2} << 30);
  EXPECT_EQ(ParseSysfsCacheSize("512"), 512);
}

TEST(ParseSysfsCacheSize, RefusesWhatIsNotASize) {
  EXPECT_EQ(ParseSysfsCacheSize(""), -1);
  EXPECT_EQ(ParseSysfsCacheSize("K"), -1);
  EXPECT_EQ(ParseSysfsCacheSize("32 KB"), -1);
  EXPECT_EQ(ParseSysfsCacheSize("12x"), -1);
  EXPECT_EQ(ParseSysfsCacheSize("99999999999999999999K"), -1);
}

TEST(DetectCaches, LevelsAreOrderedAndTheLastLevelIsOneInstance) {
  const CacheInfo info = DetectCaches();
  EXPECT_GT(info.l1d_bytes_per_core, 0);
  EXPECT_LE(info.l1d_bytes_per_core, info.l2_bytes_per_core);
  EXPECT_LE(info.l2_bytes_per_core, info.llc_bytes);
  // Where the kernel lists CPU 0's level-3 cache, plans see that instance's size (glibc's
  // sysconf may report the sum over a package's instances instead).
  std::ifstream level("/sys/devices/system/cpu/cpu0/cache/index3/level");
  std::ifstream size("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string level_text, size_text;
  if (std::getline(level, level_text) && level_text == "3" && std::getline(size, size_text)) {
    EXPECT_EQ(info.llc_bytes, ParseSysfsCacheSize(size_text));
  }
}

}  // namespace
}  // namespace gk
