#include "core/cpu_info.h"

#include <hwy/targets.h>
#include <unistd.h>

#include <mutex>

#include "core/c_api_guard.h"
#include "gradkit/base.h"  // gkGetVersion and gkGetCpuIsa: declared with GK_API (exported)

namespace gk {
namespace {
std::mutex isa_mutex;
}  // namespace

CacheInfo DetectCaches() {
  CacheInfo info{32 * 1024, 512 * 1024, 8 * 1024 * 1024};
#ifdef _SC_LEVEL1_DCACHE_SIZE
  if (const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE); l1 > 0) info.l1d_bytes_per_core = l1;
  if (const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); l2 > 0) info.l2_bytes_per_core = l2;
  if (const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) {
    info.llc_bytes = l3;
  } else {
    info.llc_bytes = info.l2_bytes_per_core;
  }
#endif
  return info;
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
