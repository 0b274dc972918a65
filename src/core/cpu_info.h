// What the CPU offers: cache sizes for planning, and the SIMD targets Highway dispatches among.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gk {

struct CacheInfo {
  int64_t l1d_bytes_per_core;
  int64_t l2_bytes_per_core;
  int64_t llc_bytes;  // the last-level cache, shared
};
CacheInfo DetectCaches();  // from the OS; conservative defaults where it says nothing

// SIMD targets compiled in and supported here, best first (e.g. {"AVX3_DL", "AVX3", "AVX2", ...}),
// ending in the scalar fallback.
std::vector<std::string> AvailableIsas();
std::string ChosenIsa();
// Restricts dispatch to one target by name (tests, `gradkit --isa`); "" restores the default.
// Returns false for an unknown or unsupported name.
bool SelectIsa(const std::string& name);

}  // namespace gk
