// core/half.h — IEEE binary16 (Half) and bfloat16 (BFloat16) storage types
// and their bit-exact conversions, for host and device code alike.
//
// The one design idea: both 16-bit types are storage, not arithmetic. A value
// is loaded by widening to float (exact), computed on in float, and stored by
// one correctly rounded narrowing (STYLE.md §2). All six conversions are
// instances of two integer templates, `narrow_bits` and `widen_bits`, so
// f16 and bf16, from float or from double, share one tested rounding rule:
// round to nearest, ties to even, with subnormals, signed zeros, infinities
// and overflow exactly as IEEE 754 has them. Integer code gives the same bits
// on the CPU and the GPU whatever the FTZ/fast-math settings, and stays
// constexpr.
//
// NaN rule, for every conversion, widening included: a NaN comes out as a
// quiet NaN with the input's sign and the leading payload bits that fit
// (IEEE 754 §6.2: an operation on a signalling NaN delivers a quiet one).
// Hence a quiet NaN round-trips bit-exactly and a signalling NaN comes back
// with its quiet bit set.
//
//   Half h(0.1f);                       // rounds once, to 0x2e66
//   float y = h * 2.0f;                 // float arithmetic
//   h = Half(y);                        // the only way back: explicit
#pragma once

#include <mixtape/core/macros.h>

#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace mixtape {

namespace detail {

MT_HD constexpr uint32_t bits_of(float f) { return __builtin_bit_cast(uint32_t, f); }
MT_HD constexpr uint64_t bits_of(double d) { return __builtin_bit_cast(uint64_t, d); }
MT_HD constexpr float float_of(uint32_t u) { return __builtin_bit_cast(float, u); }

// x / 2^s, rounded to nearest, ties to even. 1 <= s < bit width of U.
template <class U>
MT_HD constexpr U shift_right_rne(U x, int s) {
  const U half = U{1} << (s - 1);
  const U rest = x & ((half << 1) - 1);
  const U q = x >> s;
  return q + ((rest > half || (rest == half && (q & 1) != 0)) ? 1 : 0);
}

template <int kExpBits>
inline constexpr int kBias = (1 << (kExpBits - 1)) - 1;

// Rounds the binary value with bits `x` (sign, kSrcExp exponent bits,
// kSrcMant fraction bits, held in U) to the nearest value of the narrower
// format (kDstExp, kDstMant); requires kDstExp <= kSrcExp.
template <class U, int kSrcExp, int kSrcMant, int kDstExp, int kDstMant>
MT_HD constexpr uint16_t narrow_bits(U x) {
  constexpr int kDrop = kSrcMant - kDstMant;
  constexpr int kRebias = kBias<kSrcExp> - kBias<kDstExp>;
  // Source exponent field of the destination's smallest normal number.
  constexpr int kDstMinNormal = kRebias + 1;
  constexpr U kSrcImplicit = U{1} << kSrcMant;
  constexpr U kSrcInf = ((U{1} << kSrcExp) - 1) << kSrcMant;
  constexpr uint32_t kDstInf = ((1u << kDstExp) - 1) << kDstMant;
  constexpr uint32_t kDstFrac = (1u << kDstMant) - 1;
  constexpr uint32_t kDstQuiet = 1u << (kDstMant - 1);

  const uint32_t sign = static_cast<uint32_t>(x >> (kSrcExp + kSrcMant)) << (kDstExp + kDstMant);
  const U a = x & ((kSrcImplicit << kSrcExp) - 1);
  if (a > kSrcInf) {
    const uint32_t payload = static_cast<uint32_t>(a >> kDrop) & kDstFrac;
    return static_cast<uint16_t>(sign | kDstInf | kDstQuiet | payload);
  }
  const int e = static_cast<int>(a >> kSrcMant);
  if (e >= kDstMinNormal) {
    // Re-bias in place and round the low kDrop bits off. A carry out of the
    // fraction bumps the exponent, which is exactly rounding up into the next
    // binade, and past the largest finite value lands on the infinity
    // pattern; rounding is monotonic, so anything at or beyond it is +-inf.
    const U r = shift_right_rne(static_cast<U>(a - (U{kRebias} << kSrcMant)), kDrop);
    return static_cast<uint16_t>(sign | (r >= kDstInf ? kDstInf : static_cast<uint32_t>(r)));
  }
  // Subnormal (or zero) result: the significand moves right by the extra
  // distance to the destination's minimum exponent. A carry into bit
  // kDstMant yields the smallest normal, as it should.
  const int shift = kDrop + kDstMinNormal - (e == 0 ? 1 : e);
  if (shift > kSrcMant + 1) return static_cast<uint16_t>(sign);  // < half the least subnormal
  const U m = (a & (kSrcImplicit - 1)) | (e == 0 ? U{0} : kSrcImplicit);
  return static_cast<uint16_t>(sign | static_cast<uint32_t>(shift_right_rne(m, shift)));
}

// Exact conversion of 16-bit pattern `x` (kSrcExp, kSrcMant) to the wider
// format (kDstExp, kDstMant) held in U; NaNs are quieted.
template <class U, int kSrcExp, int kSrcMant, int kDstExp, int kDstMant>
MT_HD constexpr U widen_bits(uint16_t x) {
  constexpr int kGrow = kDstMant - kSrcMant;
  constexpr int kRebias = kBias<kDstExp> - kBias<kSrcExp>;
  constexpr uint32_t kSrcImplicit = 1u << kSrcMant;
  constexpr uint32_t kSrcInf = ((1u << kSrcExp) - 1) << kSrcMant;
  constexpr U kDstInf = ((U{1} << kDstExp) - 1) << kDstMant;
  constexpr U kDstQuiet = U{1} << (kDstMant - 1);

  const U sign = U{static_cast<uint32_t>(x) >> (kSrcExp + kSrcMant)} << (kDstExp + kDstMant);
  const uint32_t a = x & ((kSrcImplicit << kSrcExp) - 1);
  if (a >= kSrcInf) {
    const U frac = U{a & (kSrcImplicit - 1)} << kGrow;
    return sign | kDstInf | frac | (a > kSrcInf ? kDstQuiet : U{0});
  }
  // Normal, or subnormal into a format with the same exponent range (bf16).
  if (kRebias == 0 || a >= kSrcImplicit) return sign | ((U{a} << kGrow) + (U{kRebias} << kDstMant));
  if (a == 0) return sign;
  // A subnormal source is a normal destination: normalise (at most kSrcMant
  // steps, and only for subnormals, so a loop beats a device/host clz split).
  int e = kRebias + 1;
  U m = a;
  while ((m & kSrcImplicit) == 0) {
    m <<= 1;
    --e;
  }
  return sign | (U(e) << kDstMant) | ((m & (kSrcImplicit - 1)) << kGrow);
}

}  // namespace detail

// f16: 5 exponent bits, 10 fraction bits. bf16: 8 and 7. float: 8 and 23.
// double: 11 and 52. The double overloads round once, directly from double:
// going through float would round twice and can miss a tie.
//
// In device code the float <-> f16 conversions and float -> bf16 use the
// hardware's round-to-nearest-even cvt instructions (one instruction instead
// of some twenty integer ones: the f16 kernels are otherwise ALU-bound), for
// every input except NaN. The hardware conversions are IEEE RNE with
// subnormals (no .ftz), so the bits are the integer code's; a NaN takes the
// NaN rule above, written out as the few integer operations it is for a NaN
// input (detail::nan_*; tests/test_half.cpp checks them against the integer
// templates over every NaN) and chosen by a select, not a branch: the general
// templates inlined behind a branch made every 16-bit kernel several times
// larger (a softmax kernel: 6,600 PTX instructions against float's 900) for a
// path that never runs. bf16 -> float is a shift plus that select everywhere.
// tests/test_cuda_runtime.cpp checks every f16 and bf16 pattern and the
// rounding ties of each on the device against the CPU.
namespace detail {
/// narrow_bits' result for a NaN float with bits x, to f16: sign, quiet bit, the 10 leading payload bits.
MT_HD constexpr uint16_t nan_float_to_half_bits(uint32_t x) {
  return static_cast<uint16_t>((x >> 16 & 0x8000u) | 0x7e00u | (x >> 13 & 0x03ffu));
}
/// narrow_bits' result for a NaN float with bits x, to bf16: sign, quiet bit, the 7 leading payload bits.
MT_HD constexpr uint16_t nan_float_to_bf16_bits(uint32_t x) {
  return static_cast<uint16_t>((x >> 16 & 0x8000u) | 0x7fc0u | (x >> 16 & 0x007fu));
}
/// widen_bits' result for a NaN f16 pattern h, to float: sign, quiet bit, the payload on top.
MT_HD constexpr uint32_t nan_half_to_float_bits(uint16_t h) {
  return (static_cast<uint32_t>(h) & 0x8000u) << 16 | 0x7fc00000u | (static_cast<uint32_t>(h) & 0x03ffu) << 13;
}
/// widen_bits for bf16 -> float, whole: the pattern shifted up, with the quiet bit set on a NaN.
MT_HD constexpr uint32_t bf16_to_float_bits(uint16_t b) {
  return static_cast<uint32_t>(b) << 16 | ((b & 0x7fffu) > 0x7f80u ? 0x00400000u : 0u);
}
}  // namespace detail

MT_HD constexpr uint16_t float_to_half_bits(float f) {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) {
    const uint16_t h = __half_as_ushort(__float2half_rn(f));
    return f == f ? h : detail::nan_float_to_half_bits(detail::bits_of(f));
  }
#endif
  return detail::narrow_bits<uint32_t, 8, 23, 5, 10>(detail::bits_of(f));
}
MT_HD constexpr uint16_t double_to_half_bits(double d) {
  return detail::narrow_bits<uint64_t, 11, 52, 5, 10>(detail::bits_of(d));
}
MT_HD constexpr float half_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) {
    const float f = __half2float(__ushort_as_half(h));
    return (h & 0x7fffu) <= 0x7c00u ? f : detail::float_of(detail::nan_half_to_float_bits(h));
  }
#endif
  return detail::float_of(detail::widen_bits<uint32_t, 5, 10, 8, 23>(h));
}
MT_HD constexpr uint16_t float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) {
    const uint16_t b = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    return f == f ? b : detail::nan_float_to_bf16_bits(detail::bits_of(f));
  }
#endif
  return detail::narrow_bits<uint32_t, 8, 23, 8, 7>(detail::bits_of(f));
}
MT_HD constexpr uint16_t double_to_bf16_bits(double d) {
  return detail::narrow_bits<uint64_t, 11, 52, 8, 7>(detail::bits_of(d));
}
MT_HD constexpr float bf16_bits_to_float(uint16_t b) {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) return detail::float_of(detail::bf16_to_float_bits(b));
#endif
  return detail::float_of(detail::widen_bits<uint32_t, 8, 7, 8, 23>(b));
}

// Half and BFloat16 convert implicitly to float and only explicitly from
// anything. So `h * 2.0f`, `h + h`, `h < x` are the built-in float
// operators (result: float, or double if the other side is double), with no
// overload set of our own to make them ambiguous, and every rounding back to
// 16 bits is a visible `Half(...)`. There is no `h += x`: it would hide that
// rounding.
//
// The integer constructor exists because `Half(1)` is otherwise ambiguous
// between the float and double ones; it goes through double, so it is
// correctly rounded for |i| <= 2^53 (every int32).

/// IEEE 754 binary16. Uninitialised by default, like float.
/// @code
///   Half h(1.0f);
///   float y = h * 2.0f;        // 2.0f
///   Half z = Half(y);          // 0x4000
/// @endcode
struct Half {
  uint16_t bits;

  Half() = default;
  MT_HD constexpr explicit Half(float f) : bits(float_to_half_bits(f)) {}
  MT_HD constexpr explicit Half(double d) : bits(double_to_half_bits(d)) {}
  template <std::integral I>
  MT_HD constexpr explicit Half(I i) : bits(double_to_half_bits(static_cast<double>(i))) {}

  MT_HD static constexpr Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
  MT_HD constexpr operator float() const { return half_bits_to_float(bits); }
};

/// bfloat16: float's exponent range with an 8-bit significand. Same rules as
/// Half.
/// @code
///   BFloat16 b(3.0f);
///   float y = b + 1.0f;        // 4.0f
/// @endcode
struct BFloat16 {
  uint16_t bits;

  BFloat16() = default;
  MT_HD constexpr explicit BFloat16(float f) : bits(float_to_bf16_bits(f)) {}
  MT_HD constexpr explicit BFloat16(double d) : bits(double_to_bf16_bits(d)) {}
  template <std::integral I>
  MT_HD constexpr explicit BFloat16(I i) : bits(double_to_bf16_bits(static_cast<double>(i))) {}

  MT_HD static constexpr BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  MT_HD constexpr operator float() const { return bf16_bits_to_float(bits); }
};

// Kernels reinterpret buffers of these as uint16_t and load them 8 at a time.
static_assert(sizeof(Half) == 2 && alignof(Half) == 2);
static_assert(sizeof(BFloat16) == 2 && alignof(BFloat16) == 2);
static_assert(std::is_trivially_copyable_v<Half> && std::is_standard_layout_v<Half>);
static_assert(std::is_trivially_copyable_v<BFloat16> && std::is_standard_layout_v<BFloat16>);
static_assert(std::is_trivially_default_constructible_v<Half>);
static_assert(std::is_trivially_default_constructible_v<BFloat16>);

}  // namespace mixtape

namespace std {

template <>
class numeric_limits<mixtape::Half> {
  using T = mixtape::Half;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  MT_HD static constexpr T min() noexcept { return T::from_bits(0x0400); }          // 2^-14
  MT_HD static constexpr T lowest() noexcept { return T::from_bits(0xfbff); }       // -65504
  MT_HD static constexpr T max() noexcept { return T::from_bits(0x7bff); }          // 65504
  MT_HD static constexpr T epsilon() noexcept { return T::from_bits(0x1400); }      // 2^-10
  MT_HD static constexpr T round_error() noexcept { return T::from_bits(0x3800); }  // 0.5
  MT_HD static constexpr T infinity() noexcept { return T::from_bits(0x7c00); }
  MT_HD static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7e00); }
  MT_HD static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7d00); }
  MT_HD static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }   // 2^-24
};

template <>
class numeric_limits<mixtape::BFloat16> {
  using T = mixtape::BFloat16;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr bool is_iec559 = false;  // not an IEEE 754 interchange format
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  MT_HD static constexpr T min() noexcept { return T::from_bits(0x0080); }          // 2^-126
  MT_HD static constexpr T lowest() noexcept { return T::from_bits(0xff7f); }       // -(2 - 2^-7) 2^127
  MT_HD static constexpr T max() noexcept { return T::from_bits(0x7f7f); }
  MT_HD static constexpr T epsilon() noexcept { return T::from_bits(0x3c00); }      // 2^-7
  MT_HD static constexpr T round_error() noexcept { return T::from_bits(0x3f00); }  // 0.5
  MT_HD static constexpr T infinity() noexcept { return T::from_bits(0x7f80); }
  MT_HD static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7fc0); }
  MT_HD static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7fa0); }
  MT_HD static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }   // 2^-133
};

}  // namespace std
