// core/convert.cpp — the tables of core/convert.h: half.h one element at a time, and AVX2 + F16C.
//
// The vector loops take 8 or 16 elements a step and finish the last few with the scalar loop, so the two tables
// differ only where the vector code runs. They are compiled with function-level target attributes and called only
// after the CPU said it has those features.
#include <mixtape/core/convert.h>
#include <mixtape/core/cpu_capability.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define MT_CONVERT_X86 1
#endif

namespace mixtape {

namespace {

// ---- scalar: core/half.h ----------------------------------------------------------------------------------

void float_to_half_scalar(const float* src, Half* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Half(src[i]);
}
void half_to_float_scalar(const Half* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
void float_to_bf16_scalar(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16(src[i]);
}
void bf16_to_float_scalar(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
// Straight to double in integer code: a detour through float would meet cvtss2sd, which reads a subnormal float
// (any bf16 subnormal) as zero when MXCSR's DAZ is set.
void half_to_double_scalar(const Half* src, double* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = __builtin_bit_cast(double, detail::widen_bits<uint64_t, 5, 10, 11, 52>(src[i].bits));
}
void bf16_to_double_scalar(const BFloat16* src, double* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = __builtin_bit_cast(double, detail::widen_bits<uint64_t, 8, 7, 11, 52>(src[i].bits));
}

constexpr Converters kScalar{ConvertIsa::kScalar,  "scalar",
                             float_to_half_scalar, half_to_float_scalar,
                             float_to_bf16_scalar, bf16_to_float_scalar,
                             half_to_double_scalar, bf16_to_double_scalar};

// ---- AVX2 + F16C ------------------------------------------------------------------------------------------

#if defined(MT_CONVERT_X86)
#define MT_AVX2_F16C __attribute__((target("avx2,f16c")))

MT_AVX2_F16C inline __m128i load8(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

MT_AVX2_F16C void float_to_half_avx2(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  float_to_half_scalar(src + i, dst + i, n - i);
}

MT_AVX2_F16C void half_to_float_avx2(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(load8(src + i)));
  half_to_float_scalar(src + i, dst + i, n - i);
}

/// The bf16 patterns of 8 floats' bits `x`, one per 32-bit lane: round to nearest even by adding 0x7fff plus the
/// kept lsb and dropping 16 bits (bf16 has float's exponent range, so this is right for subnormals too, and a carry
/// runs into the exponent and on to infinity as it should); a NaN keeps its sign and top 7 payload bits, quieted.
MT_AVX2_F16C inline __m256i bf16_lanes(__m256i x) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

MT_AVX2_F16C void float_to_bf16_avx2(const float* src, BFloat16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i hi = bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus narrows within each 128-bit half (lanes hold 0..0xffff, so nothing saturates): lo0-3 hi0-3 | lo4-7
    // hi4-7; the permute puts the quarters back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  float_to_bf16_scalar(src + i, dst + i, n - i);
}

/// The float bits of 8 bf16 patterns: shifted up 16, with the quiet bit set on a NaN.
MT_AVX2_F16C inline __m256i bf16_to_float_lanes(__m128i b16) {
  const __m256i b = _mm256_cvtepu16_epi32(b16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7f80));
  return _mm256_or_si256(_mm256_slli_epi32(b, 16), _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000)));
}

MT_AVX2_F16C void bf16_to_float_avx2(const BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_to_float_lanes(load8(src + i)));
  bf16_to_float_scalar(src + i, dst + i, n - i);
}

// f16 widens to a normal float (or zero, inf, quiet NaN), which vcvtps2pd converts exactly, payload included.
MT_AVX2_F16C void half_to_double_avx2(const Half* src, double* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_cvtph_ps(load8(src + i));
    _mm256_storeu_pd(dst + i, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
    _mm256_storeu_pd(dst + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
  }
  half_to_double_scalar(src + i, dst + i, n - i);
}

// A bf16 subnormal is a subnormal float, which vcvtps2pd reads as zero under DAZ: a step of 8 holding one (rare
// outside tests) goes to the scalar loop.
MT_AVX2_F16C void bf16_to_double_avx2(const BFloat16* src, double* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = load8(src + i);
    const __m128i exp_zero = _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f80)), _mm_setzero_si128());
    const __m128i frac_zero = _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x007f)), _mm_setzero_si128());
    if (_mm_movemask_epi8(_mm_andnot_si128(frac_zero, exp_zero)) != 0) {
      bf16_to_double_scalar(src + i, dst + i, 8);
      continue;
    }
    const __m256 f = _mm256_castsi256_ps(bf16_to_float_lanes(b));
    _mm256_storeu_pd(dst + i, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
    _mm256_storeu_pd(dst + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
  }
  bf16_to_double_scalar(src + i, dst + i, n - i);
}

constexpr Converters kAvx2F16c{ConvertIsa::kAvx2F16c, "avx2+f16c",
                               float_to_half_avx2,    half_to_float_avx2,
                               float_to_bf16_avx2,    bf16_to_float_avx2,
                               half_to_double_avx2,   bf16_to_double_avx2};

#endif

}  // namespace

bool detail::cpu_has_avx2_f16c() {
#if defined(MT_CONVERT_X86)
  __builtin_cpu_init();
  // F16C from cpuid (leaf 1, ECX bit 29): clang before 17 (Debian 12's, which builds fuzz/) has no
  // __builtin_cpu_supports("f16c").
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

const Converters* converters(ConvertIsa isa) {
  switch (isa) {
    case ConvertIsa::kScalar: return &kScalar;
    case ConvertIsa::kAvx2F16c:
#if defined(MT_CONVERT_X86)
      return detail::cpu_has_avx2_f16c() ? &kAvx2F16c : nullptr;
#else
      return nullptr;
#endif
  }
  return nullptr;
}

const Converters& converters() {
  static const Converters& best = [] () -> const Converters& {
    const Converters* vector = converters(ConvertIsa::kAvx2F16c);
    return vector != nullptr && cpu_capability_allows(CpuCapability::kAvx2) ? *vector : kScalar;
  }();
  return best;
}

}  // namespace mixtape
