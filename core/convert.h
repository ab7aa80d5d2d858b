// core/convert.h — contiguous conversions between float and the 16-bit types, vectorised where the CPU allows.
//
// The one design idea: one table of loops per instruction set, the best one the CPU runs chosen once at run time
// (the build has no -march), and every table bit-exact with core/half.h's scalar conversions: NaN payloads and
// quieting, subnormals, overflow to infinity, ties to even, whatever MXCSR's FTZ/DAZ say. With AVX2 and F16C, f16
// converts in hardware (vcvtph2ps/vcvtps2ph are IEEE round-to-nearest-even with subnormals, ignore FTZ/DAZ, and
// keep a NaN's sign and leading payload bits with the quiet bit set: half.h's rule), and bf16 is integer code
// (AVX-512 BF16's vcvtneps2bf16 flushes subnormals to zero, so it is not used). The scalar table is half.h itself,
// one element at a time: the fallback, and what tests/test_half.cpp runs every table this CPU has against. It is
// no faster than a caller's own inline loop (slower for f32 -> f16, where GCC made one loop branch-free and not
// the other), so a caller with such a loop may keep it when converters() is the scalar table.
//
//   convert_n(src, dst, n);   // const float* -> Half*, and the other pairs below
//   convert_run(src, dst, n); // any pair: the vector loops where they exist, else an inline loop
#pragma once

#include <cstdint>

#include <mixtape/core/dtype.h>
#include <mixtape/core/half.h>

namespace mixtape {

/// The instruction sets a table of conversion loops exists for.
enum class ConvertIsa { kScalar, kAvx2F16c };

/// One instruction set's loops: dst[i] = src[i] converted for i < n, overwriting dst; src and dst do not overlap.
struct Converters {
  ConvertIsa isa;
  const char* name;
  void (*float_to_half)(const float* src, Half* dst, int64_t n);
  void (*half_to_float)(const Half* src, float* dst, int64_t n);
  void (*float_to_bf16)(const float* src, BFloat16* dst, int64_t n);
  void (*bf16_to_float)(const BFloat16* src, float* dst, int64_t n);
  void (*half_to_double)(const Half* src, double* dst, int64_t n);
  void (*bf16_to_double)(const BFloat16* src, double* dst, int64_t n);
};

/// The loops of `isa`, or nullptr when this CPU cannot run them (tests and benchmarks compare the tables).
const Converters* converters(ConvertIsa isa);

/// The best loops this CPU runs and MIXTAPE_CPU_CAPABILITY allows (core/cpu_capability.h), chosen on first use.
const Converters& converters();

namespace detail {
/// Whether this CPU has AVX2 and F16C (kAvx2F16c's loops), whatever MIXTAPE_CPU_CAPABILITY says.
bool cpu_has_avx2_f16c();
}  // namespace detail

inline void convert_n(const float* src, Half* dst, int64_t n) { converters().float_to_half(src, dst, n); }
inline void convert_n(const Half* src, float* dst, int64_t n) { converters().half_to_float(src, dst, n); }
inline void convert_n(const float* src, BFloat16* dst, int64_t n) { converters().float_to_bf16(src, dst, n); }
inline void convert_n(const BFloat16* src, float* dst, int64_t n) { converters().bf16_to_float(src, dst, n); }
inline void convert_n(const Half* src, double* dst, int64_t n) { converters().half_to_double(src, dst, n); }
inline void convert_n(const BFloat16* src, double* dst, int64_t n) { converters().bf16_to_double(src, dst, n); }

/// dst[0, n) = src[0, n), converted: with the CPU's vector loops where a pair has them (f16/bf16 <-> f32), else an
/// inline loop of convert<To>, the faster scalar code (GCC makes its f32 -> f16 rounding branch-free: 12x the
/// scalar table's speed).
template <class To, class From>
inline void convert_run(const From* src, To* dst, int64_t n) {
  if constexpr (requires { convert_n(src, dst, n); }) {
    if (converters().isa != ConvertIsa::kScalar) return convert_n(src, dst, n);
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
}

}  // namespace mixtape
