// ops/backend/numerics_math.h — the exact definitions behind the numerics inspector's counts, for host and device
// (internal).
//
// One design idea (STYLE.md §2): every count of numerics_stats and lost_updates (ops/backend/kernels.h) is one of
// the MT_HD predicates below, called by the CPU loops (ops/cpu/numerics.cpp) and the CUDA kernels
// (cuda/numerics.cu) alike, so the two backends differ only in how they walk memory and add up. A value is
// classified from the bits of its f32 magnitude, never through log2f or a comparison a compiler could contract:
// the thresholds are exact bit patterns, and the histogram's bin is the exponent field itself.
#pragma once

#include <cstdint>

#include <mixtape/core/dtype.h>
#include <mixtape/core/macros.h>

namespace mixtape::math {

// ---- numerics_stats -------------------------------------------------------------------------------

/// Indices into numerics_stats' (kNumericsFields) i64 result. The fields before kAmaxBits are counts: a partial
/// result adds to another.
enum NumericsField : int {
  kCount,            // elements
  kZeros,            // v == 0 (either sign)
  kNonFinite,        // inf or NaN
  kF16Subnormal,     // 2^-24 <= |v| < 2^-14: kept by f16 with fewer significant bits
  kF16Underflow,     // 0 < |v| < 2^-24, below f16's smallest subnormal: to 0 in f16 up to 2^-25, else to 2^-24
  kF16Overflow,      // finite |v| >= 65504, f16's largest finite value
  kBf16BelowNormal,  // 0 < |v| < 2^-126, bf16's (and f32's) smallest normal
  kAmaxBits,         // the f32 bits of max |v| over the finite elements (non-negative), 0 when there is none
  kHistogram         // kHistogramBins counts follow: bin k holds the finite nonzero v with
                     // floor(log2|v|) == k + kHistogramMinExp
};
/// floor(log2|v|) of the finite nonzero f32 values: from the smallest subnormal (2^-149) to the largest normal.
constexpr int kHistogramMinExp = -149, kHistogramMaxExp = 127;
constexpr int kHistogramBins = kHistogramMaxExp - kHistogramMinExp + 1;
constexpr int kNumericsFields = kHistogram + kHistogramBins;
static_assert(kHistogramBins == 277 && kNumericsFields == 285);

/// The bits of |v| as f32: with the sign cleared, non-negative floats order as their bit patterns do, so every
/// threshold below is an integer comparison and a max of magnitudes is a max of integers.
MT_HD constexpr uint32_t magnitude_bits(float v) { return __builtin_bit_cast(uint32_t, v) & 0x7FFFFFFFu; }

// The thresholds, as magnitude bits: 2^k is (127 + k) << 23 for a normal power of two.
inline constexpr uint32_t kF16MinSubnormalBits = (127u - 24u) << 23;  // 2^-24
inline constexpr uint32_t kF16MinNormalBits = (127u - 14u) << 23;     // 2^-14
inline constexpr uint32_t kF16MaxBits = 0x477FE000u;                  // 65504 = (2 − 2^-10) · 2^15
inline constexpr uint32_t kF32MinNormalBits = 1u << 23;               // 2^-126
inline constexpr uint32_t kF32InfBits = 0x7F800000u;                  // inf; above it, NaNs
static_assert(kF16MinSubnormalBits == __builtin_bit_cast(uint32_t, 0x1p-24f) &&
              kF16MinNormalBits == __builtin_bit_cast(uint32_t, 0x1p-14f) &&
              kF16MaxBits == __builtin_bit_cast(uint32_t, 65504.0f) &&
              kF32MinNormalBits == __builtin_bit_cast(uint32_t, 0x1p-126f));

MT_HD constexpr bool is_zero_bits(uint32_t a) { return a == 0; }
MT_HD constexpr bool is_non_finite_bits(uint32_t a) { return a >= kF32InfBits; }
MT_HD constexpr bool is_f16_subnormal_bits(uint32_t a) { return a >= kF16MinSubnormalBits && a < kF16MinNormalBits; }
MT_HD constexpr bool is_f16_underflow_bits(uint32_t a) { return a != 0 && a < kF16MinSubnormalBits; }
MT_HD constexpr bool is_f16_overflow_bits(uint32_t a) { return a >= kF16MaxBits && a < kF32InfBits; }
MT_HD constexpr bool is_bf16_below_normal_bits(uint32_t a) { return a != 0 && a < kF32MinNormalBits; }
/// Whether the value has a histogram bin: finite and nonzero.
MT_HD constexpr bool has_histogram_bin(uint32_t a) { return a != 0 && a < kF32InfBits; }

/// The histogram bin of a finite nonzero magnitude: floor(log2|v|) − kHistogramMinExp. A normal value's is its
/// exponent field − 127 + 149; a subnormal one is a · 2^-149 with a < 2^23, whose floor(log2 a) is the exponent of
/// float(a) (exact: a < 2^24) − 127.
MT_HD constexpr int histogram_bin(uint32_t a) {
  const uint32_t exponent = a >> 23;
  if (exponent != 0) return static_cast<int>(exponent) + (-127 - kHistogramMinExp);
  return static_cast<int>(__builtin_bit_cast(uint32_t, static_cast<float>(a)) >> 23) - 127;
}
static_assert(histogram_bin(1) == 0 && histogram_bin(kF32MinNormalBits - 1) == 22 &&
              histogram_bin(kF32MinNormalBits) == 23 && histogram_bin(kF32InfBits - 1) == kHistogramBins - 1 &&
              histogram_bin(magnitude_bits(1.0f)) == -kHistogramMinExp);

/// The counts of numerics_stats (fields kCount .. kBf16BelowNormal) and the running amax of some elements, in C
/// (a wide enough unsigned or signed integer): per thread or per block, merged by adding.
template <class C>
struct ValueCounts {
  C n[kAmaxBits] = {};
  uint32_t amax_bits = 0;

  /// One element, by its magnitude bits. Every index is a constant, so on the GPU the counts stay in registers.
  MT_HD void add(uint32_t a) {
    ++n[kCount];
    n[kZeros] += is_zero_bits(a);
    n[kNonFinite] += is_non_finite_bits(a);
    n[kF16Subnormal] += is_f16_subnormal_bits(a);
    n[kF16Underflow] += is_f16_underflow_bits(a);
    n[kF16Overflow] += is_f16_overflow_bits(a);
    n[kBf16BelowNormal] += is_bf16_below_normal_bits(a);
    if (a < kF32InfBits && a > amax_bits) amax_bits = a;
  }
};

// ---- lost_updates ---------------------------------------------------------------------------------

/// Indices into lost_updates' (kLostUpdateFields) i64 result.
enum LostUpdateField : int {
  kUpdateCount,  // elements
  kUnchanged,    // after == before (u == 0; +0 and −0 are one value)
  kLost,         // 0 < |u| < ulp_D(before) / 2: a model kept in D would not have moved
};
constexpr int kLostUpdateFields = 3;

/// A model dtype D's format: p fraction bits, and the exponent of its smallest normal value.
struct FloatFormat {
  int fraction_bits;
  int min_normal_exp;
};

/// f16, bf16 or f32 (the entry point admits no other model dtype; f32 for anything else).
MT_HD constexpr FloatFormat float_format(DType d) {
  if (d == DType::kF16) return {10, -14};
  if (d == DType::kBF16) return {7, -126};
  return {23, -126};
}

/// 2^k as a double, for k a normal double's exponent (−1022 <= k <= 1023).
MT_HD constexpr double pow2(int k) { return __builtin_bit_cast(double, static_cast<uint64_t>(k + 1023) << 52); }

/// Half the spacing of D at |w| (w finite): 2^(max(floor(log2|w|), D's min normal exponent) − p − 1). Below D's
/// smallest normal (w == 0 included) the spacing is D's subnormal spacing 2^(min_normal_exp − p). floor(log2|w|)
/// is w's exponent field: where it matters (|w| >= 2^-126) w is a normal double.
MT_HD constexpr double half_ulp(double w, FloatFormat f) {
  const int exponent = static_cast<int>((__builtin_bit_cast(uint64_t, w) >> 52) & 0x7FF) - 1023;
  const int e = exponent > f.min_normal_exp ? exponent : f.min_normal_exp;
  return pow2(e - f.fraction_bits - 1);
}

/// Neither value is inf or NaN (x − x is 0 exactly for finite x).
MT_HD constexpr bool both_finite(double a, double b) { return a - a == 0.0 && b - b == 0.0; }

/// The update before → after left the value as it was (both finite).
MT_HD constexpr bool update_unchanged(double before, double after) {
  return both_finite(before, after) && after == before;
}

/// |after − before| < t for the exact difference, t a positive power of two. The rounded difference d decides
/// unless it rounded onto ±t itself (rounding is monotone and t is a double); then the rounding error, exact by
/// Knuth's TwoSum, says from which side. Differences of f32 values of far apart exponents (2^-25 − 2^-149) do round.
MT_HD constexpr bool exact_difference_below(double before, double after, double t) {
  const double d = after - before;
  const double magnitude = d < 0 ? -d : d;
  if (magnitude != t) return magnitude < t;
  const double after_part = d + before;  // TwoSum(after, −before): d + err == after − before exactly
  const double before_part = d - after_part;
  const double err = (after - after_part) + (-before - before_part);
  return d > 0 ? err < 0 : err > 0;
}

/// The update before → after was lost in D: 0 < |after − before| < ulp_D(before) / 2 (both finite). Exactly half
/// an ulp is not lost (a tie may round either way).
MT_HD constexpr bool update_lost(double before, double after, FloatFormat f) {
  return both_finite(before, after) && after != before &&
         exact_difference_below(before, after, half_ulp(before, f));
}

}  // namespace mixtape::math
