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

// Leaf 1 EAX values of known parts: AMD EPYC 9004 (Zen 4), 9005 (Zen 5), Zen 3, Intel Sapphire
// Rapids, and a base family below 6 (no extended model).
TEST(CpuIdentityFromSignature, FoldsTheExtendedFields) {
  const struct {
    uint32_t eax;
    int family, model;
  } cases[] = {{0x00A10F11, 0x19, 0x11}, {0x00B00F21, 0x1A, 0x02}, {0x00A00F11, 0x19, 0x01},
               {0x000806F8, 0x6, 0x8F}, {0x00000435, 0x4, 0x3}};
  for (const auto& c : cases) {
    const CpuIdentity id = CpuIdentityFromSignature(c.eax);
    EXPECT_EQ(id.family, c.family) << std::hex << c.eax;
    EXPECT_EQ(id.model, c.model) << std::hex << c.eax;
  }
}

// What the kernel says of CPU 0 (x86's /proc/cpuinfo), where it says it.
TEST(DetectCpuIdentity, AgreesWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, vendor;
  int family = -1, model = -1;
  bool amx_bf16 = false, amx_tile = false;
  while (std::getline(in, line) && line.find_first_not_of(" \t") != std::string::npos) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon + 2 > line.size()) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = line.substr(colon + 2);
    if (key == "vendor_id") vendor = value;
    if (key == "cpu family") family = std::stoi(value);
    if (key == "model") model = std::stoi(value);
    if (key == "flags") {
      const std::string flags = " " + value + " ";
      amx_bf16 = flags.find(" amx_bf16 ") != std::string::npos;
      amx_tile = flags.find(" amx_tile ") != std::string::npos;
    }
  }
  if (vendor.empty() || family < 0 || model < 0) GTEST_SKIP() << "no x86 /proc/cpuinfo here";
  const CpuIdentity id = DetectCpuIdentity();
  EXPECT_EQ(id.vendor, vendor);
  EXPECT_EQ(id.family, family);
  EXPECT_EQ(id.model, model);
  // Linux lists the AMX flags only where it enabled the tile state, as DetectCpuIdentity asks.
  EXPECT_EQ(id.amx_bf16, amx_bf16 && amx_tile);
}

}  // namespace
}  // namespace gk
