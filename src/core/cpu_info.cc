#include "core/cpu_info.h"

#include <hwy/targets.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "core/c_api_guard.h"
#include "gradkit/base.h"  // gkGetVersion and gkGetCpuIsa: declared with GK_API (exported)

namespace gk {
namespace {
std::mutex isa_mutex;
}  // namespace

int64_t ParseSysfsCacheSize(const std::string& text) {
  size_t i = 0;
  int64_t value = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > (int64_t{1} << 40)) return -1;
    value = value * 10 + (text[i] - '0');
  }
  if (i == 0) return -1;
  int64_t unit = 1;
  if (i < text.size() && (text[i] == 'K' || text[i] == 'M' || text[i] == 'G')) {
    unit = text[i] == 'K' ? int64_t{1} << 10 : text[i] == 'M' ? int64_t{1} << 20 : int64_t{1} << 30;
    ++i;
  }
  while (i < text.size() && (text[i] == '\n' || text[i] == ' ')) ++i;
  return i == text.size() ? value * unit : -1;
}

namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

// CPU 0's data and unified caches by level from /sys/devices/system/cpu/cpu0/cache/index*/.
void ReadSysfsCaches(CacheInfo& info) {
  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    const std::string level = ReadSmallFile(dir + "level"), type = ReadSmallFile(dir + "type");
    if (level.empty()) break;
    if (type != "Data" && type != "Unified") continue;
    const int64_t bytes = ParseSysfsCacheSize(ReadSmallFile(dir + "size"));
    if (bytes <= 0) continue;
    if (level == "1") info.l1d_bytes_per_core = bytes;
    if (level == "2") info.l2_bytes_per_core = bytes;
    if (level == "3" || level == "4") info.llc_bytes = bytes;  // the deepest level listed
  }
}

CacheInfo DetectCachesOnce() {
  CacheInfo info{32 * 1024, 512 * 1024, /*llc_bytes=*/-1};
#ifdef _SC_LEVEL1_DCACHE_SIZE
  if (const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE); l1 > 0) info.l1d_bytes_per_core = l1;
  if (const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); l2 > 0) info.l2_bytes_per_core = l2;
  if (const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) info.llc_bytes = l3;
#endif
  ReadSysfsCaches(info);  // one instance per level, where Linux lists them: over sysconf's
  if (info.llc_bytes <= 0) info.llc_bytes = info.l2_bytes_per_core;
  return info;
}

}  // namespace

CacheInfo DetectCaches() {
  static const CacheInfo info = DetectCachesOnce();
  return info;
}

CpuIdentity CpuIdentityFromSignature(uint32_t eax) {
  const int base_family = static_cast<int>((eax >> 8) & 0xF);
  const int base_model = static_cast<int>((eax >> 4) & 0xF);
  CpuIdentity id;
  id.family = base_family == 0xF ? base_family + static_cast<int>((eax >> 20) & 0xFF) : base_family;
  id.model = base_family == 0x6 || base_family == 0xF
                 ? (static_cast<int>((eax >> 16) & 0xF) << 4) + base_model
                 : base_model;
  return id;
}

bool CpuHasAvx512Bf16() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

CpuIdentity DetectCpuIdentity() {
  static const CpuIdentity identity = [] {
    CpuIdentity id;
#if defined(__x86_64__) || defined(__i386__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return id;
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    const unsigned max_leaf = eax;
    bool os_saves_state = false;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0) {
      id = CpuIdentityFromSignature(eax);
      os_saves_state = (ecx >> 27) & 1;  // OSXSAVE: XCR0 readable
    }
    id.vendor = vendor;
    if (max_leaf >= 7 && os_saves_state) {
      __cpuid_count(7, 0, eax, ebx, ecx, edx);
      const bool amx = ((edx >> 22) & 1) && ((edx >> 24) & 1);  // AMX-BF16, AMX-TILE
      unsigned xcr0_lo = 0, xcr0_hi = 0;
      __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
      id.amx_bf16 = amx && ((xcr0_lo >> 17) & 3) == 3;  // XTILECFG and XTILEDATA enabled
    }
#endif
    return id;
  }();
  return identity;
}

std::vector<std::string> AvailableIsas() {
  std::lock_guard<std::mutex> lock(isa_mutex);
  std::vector<std::string> names;
  for (int64_t target = hwy::SupportedTargets() & HWY_TARGETS; target != 0;
       target &= target - 1) {
    names.emplace_back(hwy::TargetName(target & ~(target - 1)));
  }
  return names;
}

std::string ChosenIsa() {
  const auto names = AvailableIsas();
  return names.empty() ? "none" : names.front();
}

bool SelectIsa(const std::string& name) {
  std::lock_guard<std::mutex> lock(isa_mutex);
  if (name.empty()) {
    hwy::SetSupportedTargetsForTest(0);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    return true;
  }
  hwy::SetSupportedTargetsForTest(0);
  for (int64_t target = hwy::SupportedTargets() & HWY_TARGETS; target != 0;
       target &= target - 1) {
    const int64_t bit = target & ~(target - 1);
    if (name == hwy::TargetName(bit)) {
      hwy::SetSupportedTargetsForTest(bit);
      hwy::GetChosenTarget().Update(hwy::SupportedTargets());
      return true;
    }
  }
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return false;
}

}  // namespace gk

extern "C" const char* gkGetVersion(void) { return GRADKIT_VERSION; }

extern "C" const char* gkGetCpuIsa(void) {
  return gk::GuardCApi("gkGetCpuIsa", "unknown", [] {
    thread_local std::string isa;
    isa = gk::ChosenIsa();
    return isa.c_str();
  });
}
