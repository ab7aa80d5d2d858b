// core/cpu_capability.cpp — the CPU's instruction-set level and MIXTAPE_CPU_CAPABILITY's cap, each asked once.
#include <mixtape/core/cpu_capability.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>

#include <mixtape/core/convert.h>

namespace mixtape {

namespace {

constexpr std::array<std::string_view, 4> kNames = {"default", "avx2", "avx512", "avx512_bf16"};

/// The highest level this CPU runs, whatever the variable says.
CpuCapability cpu_level() {
#if defined(__x86_64__)
  __builtin_cpu_init();  // the question may come before the runtime's own initialisation has run
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return __builtin_cpu_supports("avx512bf16") ? CpuCapability::kAvx512Bf16 : CpuCapability::kAvx512;
  if (detail::cpu_has_avx2_f16c() && __builtin_cpu_supports("fma")) return CpuCapability::kAvx2;
#endif
  return CpuCapability::kDefault;
}

/// MIXTAPE_CPU_CAPABILITY's level; the highest when it is unset, empty or unknown (the last said on stderr).
CpuCapability limit() {
  static const CpuCapability cap = [] {
    const char* value = std::getenv("MIXTAPE_CPU_CAPABILITY");
    if (value == nullptr || *value == '\0') return CpuCapability::kAvx512Bf16;
    for (size_t i = 0; i < kNames.size(); ++i)
      if (kNames[i] == value) return static_cast<CpuCapability>(i);
    std::fprintf(stderr,
                 "mixtape: ignoring MIXTAPE_CPU_CAPABILITY=%s (expected default, avx2, avx512 or avx512_bf16)\n",
                 value);
    return CpuCapability::kAvx512Bf16;
  }();
  return cap;
}

}  // namespace

CpuCapability cpu_capability() {
  static const CpuCapability level = std::min(cpu_level(), limit());
  return level;
}

bool cpu_capability_allows(CpuCapability level) { return level <= limit(); }

std::string_view to_string(CpuCapability level) { return kNames.at(static_cast<size_t>(level)); }

}  // namespace mixtape
