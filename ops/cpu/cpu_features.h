// ops/cpu/cpu_features.h — what the CPU this process runs on can do, asked once (internal).
//
// The CPU kernels with an AVX2 or AVX-512 path compile it with a target attribute and choose it at run time, so one
// binary serves every x86-64 CPU; these are the questions they ask. Each answer is computed on first use and kept,
// and is "no" where MIXTAPE_CPU_CAPABILITY holds the kernels below the feature's level (core/cpu_capability.h).
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <mixtape/core/cpu_capability.h>

namespace mixtape::kernels::cpu {

#if defined(__x86_64__)
/// AVX with F16C: eight f16 <-> f32 conversions an instruction (Ivy Bridge, every Zen). F16C is asked of CPUID
/// (leaf 1, ECX bit 29): GCC's __builtin_cpu_supports knows "f16c", clang 16's does not.
inline bool has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0 &&
           cpu_capability_allows(CpuCapability::kAvx2);
  }();
  return has;
}

/// AVX-512 Foundation: 512-bit float lanes and masks (Skylake-SP, Zen 4 and later).
inline bool has_avx512f() {
  static const bool has = [] {
    __builtin_cpu_init();  // the answer may be asked for before the runtime's own initialisation has run
    return __builtin_cpu_supports("avx512f") && cpu_capability_allows(CpuCapability::kAvx512);
  }();
  return has;
}
#else
inline bool has_f16c() { return false; }
inline bool has_avx512f() { return false; }
#endif

/// AVX2 with FMA and F16C, the level kAvx2 of core/cpu_capability.h: 256-bit integer lanes and fused multiply-adds
/// (Haswell, every Zen).
inline bool has_avx2() { return cpu_capability() >= CpuCapability::kAvx2; }

/// AVX-512F with byte/word (BW) and 128/256-bit (VL) forms: the 16-bit integer lanes of bf16/f16 bit work (the
/// levels of core/cpu_capability.h from kAvx512 on).
inline bool has_avx512bw_vl() { return cpu_capability() >= CpuCapability::kAvx512; }

/// AVX512-BF16 as well (vdpbf16ps: bf16 products summed in f32; Cooper Lake, Zen 4 and later).
inline bool has_avx512_bf16() { return cpu_capability() >= CpuCapability::kAvx512Bf16; }

}  // namespace mixtape::kernels::cpu
