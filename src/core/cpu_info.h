// What the CPU offers: cache sizes for planning, and the SIMD targets Highway dispatches among.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gk {

struct CacheInfo {
  int64_t l1d_bytes_per_core;
  int64_t l2_bytes_per_core;
  int64_t llc_bytes;  // the last-level cache one core reaches (one instance, shared by its group)
};
// From the OS, read once per process: Linux's sysfs cache entries of CPU 0 (the size of one
// instance), else sysconf, else conservative defaults. sysconf alone is not enough: glibc reports
// a whole AMD package's L3 (eight 32 MiB instances on a Zen 3 EPYC give 256 MiB) where a core
// reaches one instance.
CacheInfo DetectCaches();
// A sysfs cache size ("32K", "32768K", "1M", "512"): bytes, or -1 when the text is not one.
int64_t ParseSysfsCacheSize(const std::string& text);

// The CPU's maker and family, as cpuid reports them (x86); elsewhere vendor "" and 0s. Plans
// keep rules measured on one family of CPUs to that family (e.g. which tile GEMM runs faster).
struct CpuIdentity {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  int family = 0;      // display family: AMD Zen 3 and Zen 4 are 0x19, Zen 5 0x1A, Intel cores 6
  int model = 0;       // display model
  // AMX-BF16 tile instructions, with the tile state enabled by the OS (cpuid leaf 7 and XCR0):
  // oneDNN's bfloat16 brgemm then runs on AMX (Linux grants the process its use on request).
  bool amx_bf16 = false;
};
CpuIdentity DetectCpuIdentity();
// Whether the CPU has AVX512-BF16 (vcvtne2ps2bf16, vdpbf16ps) and the OS saves AVX-512 state:
// read once per process. False off x86.
bool CpuHasAvx512Bf16();
// Family and model from cpuid leaf 1's EAX: the extended family is added only when the base
// family is 0xF, the extended model prepended only for base families 6 and 0xF (both vendors'
// rule). Vendor left empty.
CpuIdentity CpuIdentityFromSignature(uint32_t eax);

// SIMD targets compiled in and supported here, best first (e.g. {"AVX3_DL", "AVX3", "AVX2", ...}),
// ending in the scalar fallback.
std::vector<std::string> AvailableIsas();
std::string ChosenIsa();
// Restricts dispatch to one target by name (tests, `gradkit --isa`); "" restores the default.
// Returns false for an unknown or unsupported name.
bool SelectIsa(const std::string& name);

}  // namespace gk
