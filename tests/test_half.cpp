// tests/test_half.cpp — core/half.h against independent references.
//
// f16 is checked against the compiler's _Float16 (libgcc's soft-fp, itself
// checked here against hand-computed bits and, where the CPU has it, F16C;
// on AArch64 the ACLE's __fp16, which the FCVT instructions convert)
// on every 16-bit pattern, on every rounding boundary (each tie and its
// neighbours) and on millions of random inputs. bf16 has no compiler type,
// so it is checked against `reference_bf16`, which picks the nearer of the
// two neighbouring bf16 values by comparing distances in double: a
// formulation that shares no code or trick with the implementation.
//
// The bulk loops of core/convert.h (suite bulk_conversions) must give
// half.h's bits: every table this CPU runs, on every 16-bit pattern widened,
// every float edge, NaN class and rounding boundary and ten million random
// floats narrowed, at odd lengths and offsets, with MXCSR's FTZ and DAZ off
// and on.
//
// Each check prints the input bits and both outputs; a test stops after
// Failures::kMax mismatches.
#include <mixtape/core/convert.h>
#include <mixtape/core/cpu_capability.h>
#include <mixtape/core/half.h>
#include <mixtape/ops/cpu/cpu_features.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define MT_TEST_HAVE_F16C_PROBE 1
#endif

// The reference binary16 type. GCC's C++ has _Float16 on x86 from GCC 12 and elsewhere from GCC 13 (it defines
// __FLT16_MANT_DIG__ for C's sake before that); on AArch64, __fp16 in IEEE format is the same type under the ACLE's
// name, and its double -> half conversion is one FCVT, with no rounding through float.
#if defined(__aarch64__) && defined(__ARM_FP16_FORMAT_IEEE)
using Float16Ref = __fp16;
#define MT_TEST_HAVE_FLOAT16 1
#elif defined(__FLT16_MANT_DIG__) && (defined(__x86_64__) || defined(__i386__) || defined(__clang__) || __GNUC__ >= 13)
using Float16Ref = _Float16;
#define MT_TEST_HAVE_FLOAT16 1
#endif

namespace {

#if defined(MT_TEST_HAVE_F16C_PROBE)
/// F16C from CPUID (leaf 1, ECX bit 29), asked here and not of the library under test; clang before 17 has no
/// __builtin_cpu_supports("f16c").
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

using mixtape::BFloat16;
using mixtape::Half;

template <class T>
std::string hex(T v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(2 * sizeof(T)) << std::setfill('0') << static_cast<uint64_t>(v);
  return os.str();
}

std::string describe(uint16_t b) { return hex(b); }
std::string describe(float f) {
  std::ostringstream os;
  os << hex(std::bit_cast<uint32_t>(f)) << " = " << std::hexfloat << f;
  return os.str();
}
std::string describe(double d) {
  std::ostringstream os;
  os << hex(std::bit_cast<uint64_t>(d)) << " = " << std::hexfloat << d;
  return os.str();
}

// Counts comparisons and reports mismatches; after kMax of them it goes
// quiet and loops stop on `room()`, so a broken rule prints a handful of
// lines, not ten million.
struct Failures {
  static constexpr int kMax = 5;
  int count = 0;
  long checked = 0;

  bool room() const { return count < kMax; }

  template <class In, class Out>
  void expect(const char* fn, In in, Out got, Out want) {
    if (!room()) return;
    ++checked;
    if (got == want) return;
    ++count;
    BOOST_ERROR(fn << "(" << describe(in) << "): got " << hex(got) << ", want " << hex(want));
  }
};

// The documented NaN rule: quiet, same sign, leading payload bits.
uint16_t quiet_bf16_of(uint32_t f) { return static_cast<uint16_t>((f >> 16) | 0x0040); }
uint16_t quiet_bf16_of(uint64_t d) {
  return static_cast<uint16_t>(((d >> 48) & 0x8000) | 0x7fc0 | ((d >> 45) & 0x7f));
}

bool is_bf16_nan(uint16_t b) { return (b & 0x7fff) > 0x7f80; }

// Nearest bf16 to x by distance, ties to the even pattern. NaNs are the
// caller's business. `lo` is the largest bf16 <= |x| (found from the
// nearest float, stepping down once if that landed above |x|), `hi` the
// next one up, with 2^128 standing in for infinity as IEEE's overflow rule
// says. Near the midpoint, where the comparison is close, both differences
// are exact (Sterbenz); far from it, rounding cannot flip the comparison.
uint16_t reference_bf16(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 0x1p128) return sign | 0x7f80;
  uint32_t lo_bits = std::bit_cast<uint32_t>(static_cast<float>(a)) & 0xffff0000u;
  if (static_cast<double>(std::bit_cast<float>(lo_bits)) > a) lo_bits -= 0x10000;
  const uint32_t hi_bits = lo_bits + 0x10000;
  const double lo = std::bit_cast<float>(lo_bits);
  const double hi = hi_bits == 0x7f800000u ? 0x1p128 : static_cast<double>(std::bit_cast<float>(hi_bits));
  const double below = a - lo;
  const double above = hi - a;
  const bool lo_even = ((lo_bits >> 16) & 1) == 0;
  const uint32_t pick = (below < above || (below == above && lo_even)) ? lo_bits : hi_bits;
  return static_cast<uint16_t>(sign | (pick >> 16));
}

uint16_t reference_bf16_of_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return std::isnan(f) ? quiet_bf16_of(u) : reference_bf16(f);
}
uint16_t reference_bf16_of_double(double d) {
  return std::isnan(d) ? quiet_bf16_of(std::bit_cast<uint64_t>(d)) : reference_bf16(d);
}

// Every rounding boundary of a 16-bit format (`value_of` maps a pattern to
// its value; `above_max` is where the next pattern after the largest finite
// one would be). For each finite non-negative pattern: its value, the
// midpoint to the next one (a tie), and 1 and 2 float ulps either side of
// both; each also negated.
template <class ValueOf, class Fn>
void for_each_boundary_float(uint16_t max_finite, double above_max, ValueOf value_of, Fn fn) {
  for (uint32_t b = 0; b <= max_finite; ++b) {
    const double v = value_of(static_cast<uint16_t>(b));
    const double next = b == max_finite ? above_max : static_cast<double>(value_of(static_cast<uint16_t>(b + 1)));
    const float points[] = {static_cast<float>(v), static_cast<float>((v + next) / 2)};  // both exact
    for (float p : points) {
      const uint32_t u = std::bit_cast<uint32_t>(p);
      for (int64_t d = -2; d <= 2; ++d) {
        if (u == 0 && d < 0) continue;
        const float f = std::bit_cast<float>(static_cast<uint32_t>(u + d));
        fn(f);
        fn(-f);
      }
    }
  }
}

// The same for doubles, adding the double-rounding traps: the midpoint plus
// or minus up to half a float ulp, which a detour through float would
// round onto the tie itself.
template <class ValueOf, class Fn>
void for_each_boundary_double(uint16_t max_finite, double above_max, ValueOf value_of, Fn fn) {
  constexpr int64_t kHalfFloatUlp = int64_t{1} << 28;  // in double ulps, for a normal float
  for (uint32_t b = 0; b <= max_finite; ++b) {
    const double v = value_of(static_cast<uint16_t>(b));
    const double next = b == max_finite ? above_max : static_cast<double>(value_of(static_cast<uint16_t>(b + 1)));
    const double points[] = {v, (v + next) / 2};
    for (double p : points) {
      const uint64_t u = std::bit_cast<uint64_t>(p);
      for (int64_t d : {-kHalfFloatUlp + 1, int64_t{-12345}, int64_t{-2}, int64_t{-1}, int64_t{0}, int64_t{1},
                        int64_t{2}, int64_t{12345}, kHalfFloatUlp - 1}) {
        if (u == 0 && d < 0) continue;
        const double x = std::bit_cast<double>(static_cast<uint64_t>(u + d));
        fn(x);
        fn(-x);
      }
    }
  }
}

// Named edge cases, common to both formats: zeros, infinities, NaNs of each
// kind, the float and double extremes.
const float kFloatEdges[] = {
    0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1.0f / 3,
    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
    std::numeric_limits<float>::max(), std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
    std::bit_cast<float>(0x7fc00000u), std::bit_cast<float>(0xffc00000u),  // quiet NaN
    std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xff800001u),  // signalling, payload below f16/bf16
    std::bit_cast<float>(0x7fa00000u), std::bit_cast<float>(0x7fbfffffu),  // signalling, payload that fits
    std::bit_cast<float>(0x7fffffffu), std::bit_cast<float>(0x7fc01234u),
    // f16 specifics: 65504, 65519.99, 65520, 65536, 2^-25, just above 2^-25,
    // 2^-24, largest subnormal, smallest normal.
    65504.0f, std::nextafter(65520.0f, 0.0f), 65520.0f, 65536.0f, 0x1p-25f, std::nextafter(0x1p-25f, 1.0f),
    std::nextafter(0x1p-25f, 0.0f), 0x1p-24f, 0x3p-25f, 0x1ffp-23f, 0x1p-14f, 0x7fep-24f, 0x7ffp-25f,
    // bf16 specifics: the largest finite, the overflow tie, and just below it.
    std::bit_cast<float>(0x7f7f0000u), std::bit_cast<float>(0x7f7f8000u), std::bit_cast<float>(0x7f7f7fffu),
    std::bit_cast<float>(0x00008000u), std::bit_cast<float>(0x00008001u), std::bit_cast<float>(0x00018000u),
};

const double kDoubleEdges[] = {
    0.0, -0.0, 1.0, 0.1, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
    std::numeric_limits<double>::max(), std::numeric_limits<double>::min(), std::numeric_limits<double>::denorm_min(),
    std::bit_cast<double>(0x7ff8000000000000ull), std::bit_cast<double>(0xfff8000000000000ull),
    std::bit_cast<double>(0x7ff0000000000001ull), std::bit_cast<double>(0x7ff4000000000000ull),
    std::bit_cast<double>(0xfff8123456789abcull), std::bit_cast<double>(0x7fffffffffffffffull),
    65504.0, 65519.999999, std::nextafter(65520.0, 0.0), 65520.0, 65536.0, 0x1p-25, std::nextafter(0x1p-25, 1.0),
    std::nextafter(0x1p-25, 0.0), 0x1p-24, 0x1p-14,
    1.0 + 0x1p-11 + 0x1p-40,  // above an f16 tie, but float rounds it onto the tie
    1.0 + 0x1p-8 + 0x1p-40,   // the same for bf16
    0x1p128, 0x1.ffp127, 0x1.fep127, static_cast<double>(std::numeric_limits<float>::max()),
    0x1p-133, 0x1p-134, std::nextafter(0x1p-134, 1.0), 0x1p-150,
};

float half_value(uint16_t h) { return mixtape::half_bits_to_float(h); }
float bf16_value(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

#if defined(MT_TEST_HAVE_FLOAT16)
uint16_t quiet_f16_of(uint32_t f) {
  return static_cast<uint16_t>(((f >> 16) & 0x8000) | 0x7e00 | ((f >> 13) & 0x3ff));
}
uint16_t quiet_f16_of(uint64_t d) {
  return static_cast<uint16_t>(((d >> 48) & 0x8000) | 0x7e00 | ((d >> 42) & 0x3ff));
}
bool is_f16_nan(uint16_t h) { return (h & 0x7fff) > 0x7c00; }

uint16_t float16_ref(float f) { return std::bit_cast<uint16_t>(static_cast<Float16Ref>(f)); }
uint16_t float16_ref(double d) { return std::bit_cast<uint16_t>(static_cast<Float16Ref>(d)); }
float float16_widen_ref(uint16_t h) { return static_cast<float>(std::bit_cast<Float16Ref>(h)); }

// NaNs follow the documented rule (libgcc happens to agree bit for bit);
// everything else must match the reference type.
uint16_t expected_f16(float f) {
  return std::isnan(f) ? quiet_f16_of(std::bit_cast<uint32_t>(f)) : float16_ref(f);
}
uint16_t expected_f16(double d) {
  return std::isnan(d) ? quiet_f16_of(std::bit_cast<uint64_t>(d)) : float16_ref(d);
}

#if defined(MT_TEST_HAVE_F16C_PROBE)
__attribute__((target("f16c"))) uint16_t f16c_from_float(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
#endif
#endif  // MT_TEST_HAVE_FLOAT16

}  // namespace

BOOST_AUTO_TEST_SUITE(half_bf16)

BOOST_AUTO_TEST_CASE(layout_and_limits) {
  static_assert(sizeof(Half) == 2 && alignof(Half) == 2);
  static_assert(sizeof(BFloat16) == 2 && alignof(BFloat16) == 2);
  static_assert(std::is_trivially_copyable_v<Half> && std::is_trivially_copyable_v<BFloat16>);
  static_assert(std::is_standard_layout_v<Half> && std::is_standard_layout_v<BFloat16>);
  static_assert(std::is_trivially_default_constructible_v<Half>);

  using LH = std::numeric_limits<Half>;
  static_assert(LH::is_specialized && LH::digits == 11 && LH::has_infinity && LH::has_quiet_NaN);
  BOOST_TEST(LH::min().bits == 0x0400);
  BOOST_TEST(LH::max().bits == 0x7bff);
  BOOST_TEST(LH::lowest().bits == 0xfbff);
  BOOST_TEST(LH::epsilon().bits == 0x1400);
  BOOST_TEST(LH::infinity().bits == 0x7c00);
  BOOST_TEST(LH::quiet_NaN().bits == 0x7e00);
  BOOST_TEST(LH::denorm_min().bits == 0x0001);
  BOOST_TEST(float(LH::min()) == 0x1p-14f);
  BOOST_TEST(float(LH::max()) == 65504.0f);
  BOOST_TEST(float(LH::lowest()) == -65504.0f);
  BOOST_TEST(float(LH::epsilon()) == 0x1p-10f);
  BOOST_TEST(float(LH::round_error()) == 0.5f);
  BOOST_TEST(std::isinf(float(LH::infinity())));
  BOOST_TEST(std::isnan(float(LH::quiet_NaN())));
  BOOST_TEST(std::isnan(float(LH::signaling_NaN())));
  BOOST_TEST((LH::signaling_NaN().bits & 0x0200) == 0);
  BOOST_TEST(float(LH::denorm_min()) == 0x1p-24f);
  BOOST_TEST(1.0f + float(LH::epsilon()) == half_value(0x3c01));  // the next Half after 1

  using LB = std::numeric_limits<BFloat16>;
  static_assert(LB::is_specialized && LB::digits == 8 && LB::max_exponent == 128);
  BOOST_TEST(LB::min().bits == 0x0080);
  BOOST_TEST(LB::max().bits == 0x7f7f);
  BOOST_TEST(LB::lowest().bits == 0xff7f);
  BOOST_TEST(LB::epsilon().bits == 0x3c00);
  BOOST_TEST(LB::infinity().bits == 0x7f80);
  BOOST_TEST(LB::quiet_NaN().bits == 0x7fc0);
  BOOST_TEST(LB::denorm_min().bits == 0x0001);
  BOOST_TEST(float(LB::min()) == std::numeric_limits<float>::min());
  BOOST_TEST(float(LB::max()) == 0x1.fep127f);
  BOOST_TEST(float(LB::lowest()) == -0x1.fep127f);
  BOOST_TEST(float(LB::epsilon()) == 0x1p-7f);
  BOOST_TEST(float(LB::round_error()) == 0.5f);
  BOOST_TEST(std::isinf(float(LB::infinity())));
  BOOST_TEST(std::isnan(float(LB::quiet_NaN())));
  BOOST_TEST(std::isnan(float(LB::signaling_NaN())));
  BOOST_TEST((LB::signaling_NaN().bits & 0x0040) == 0);
  BOOST_TEST(float(LB::denorm_min()) == 0x1p-133f);
  BOOST_TEST(1.0f + float(LB::epsilon()) == bf16_value(0x3f81));
}

BOOST_AUTO_TEST_CASE(conversions_are_constexpr) {
  static_assert(mixtape::float_to_half_bits(65504.0f) == 0x7bff);
  static_assert(mixtape::float_to_half_bits(65520.0f) == 0x7c00);
  static_assert(mixtape::double_to_half_bits(1.0 + 0x1p-11 + 0x1p-40) == 0x3c01);
  static_assert(mixtape::half_bits_to_float(0x0001) == 0x1p-24f);
  static_assert(mixtape::float_to_bf16_bits(1.0f) == 0x3f80);
  static_assert(mixtape::double_to_bf16_bits(1.0 + 0x1p-8 + 0x1p-40) == 0x3f81);
  static_assert(mixtape::bf16_bits_to_float(0xc040) == -3.0f);
  static_assert(Half(0.1f).bits == 0x2e66 && BFloat16(0.1f).bits == 0x3dcd);
  BOOST_TEST(Half::from_bits(0x3c00).bits == 0x3c00);
}

BOOST_AUTO_TEST_CASE(arithmetic_is_float_arithmetic) {
  Half h = Half(1.0f);
  float y = h * 2.0f;
  BOOST_TEST(y == 2.0f);
  static_assert(std::is_same_v<decltype(h * 2.0f), float>);
  static_assert(std::is_same_v<decltype(h + h), float>);
  static_assert(std::is_same_v<decltype(h * 2.0), double>);
  static_assert(std::is_same_v<decltype(h * BFloat16(1.0f)), float>);
  static_assert(std::is_convertible_v<Half, float> && std::is_convertible_v<BFloat16, float>);
  static_assert(!std::is_convertible_v<float, Half> && !std::is_convertible_v<float, BFloat16>);
  BOOST_TEST(Half(1).bits == 0x3c00);                   // integers: no float/double ambiguity
  BOOST_TEST(Half(int64_t{-2}).bits == 0xc000);
  BOOST_TEST(BFloat16(257u).bits == 0x4380);            // 257 is a tie: to even, 256
  BOOST_TEST(Half(h + h).bits == 0x4000);
  BOOST_TEST((Half(0.0f) == Half(-0.0f)));              // float comparison semantics
  const Half nan = std::numeric_limits<Half>::quiet_NaN();
  BOOST_TEST(!(nan == nan));
  BOOST_TEST((Half(1.0f) < BFloat16(1.5f)));
}

#if defined(MT_TEST_HAVE_FLOAT16)

// The reference itself: hand-computed bits, and F16C where the CPU has it.
BOOST_AUTO_TEST_CASE(float16_reference_sanity) {
  BOOST_TEST(float16_ref(65504.0f) == 0x7bff);
  BOOST_TEST(float16_ref(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  BOOST_TEST(float16_ref(65520.0f) == 0x7c00);
  BOOST_TEST(float16_ref(0x1p-25f) == 0x0000);                    // tie to even: 0
  BOOST_TEST(float16_ref(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  BOOST_TEST(float16_ref(0x3p-25f) == 0x0002);                    // tie to even: 2
  BOOST_TEST(float16_ref(-0.0f) == 0x8000);
  BOOST_TEST(float16_ref(0x1.002p0f) == 0x3c00);                  // tie to even: 1
  BOOST_TEST(float16_ref(1.0 + 0x1p-11 + 0x1p-40) == 0x3c01);     // no double rounding in __truncdfhf2
  BOOST_TEST(float16_ref(static_cast<float>(1.0 + 0x1p-11 + 0x1p-40)) == 0x3c00);  // what float would do
  BOOST_TEST(std::bit_cast<uint32_t>(float16_widen_ref(0x0001)) == 0x33800000u);

#if defined(MT_TEST_HAVE_F16C_PROBE)
  if (!cpu_has_f16c()) {
    BOOST_TEST_MESSAGE("no F16C: libgcc checked against hand-computed bits only");
    return;
  }
  Failures fails;
  std::mt19937_64 rng(0xf16c);
  for (int i = 0; i < 1'000'000 && fails.room(); ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    fails.expect("_Float16 vs F16C", f, float16_ref(f), f16c_from_float(f));
  }
#endif
}

BOOST_AUTO_TEST_CASE(half_every_pattern) {
  Failures fails;
  for (uint32_t i = 0; i <= 0xffff && fails.room(); ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = mixtape::half_bits_to_float(h);
    const bool nan = is_f16_nan(h);
    // NaN: the documented rule (quiet, sign and payload kept).
    const uint32_t want_f = nan ? ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13)
                                : std::bit_cast<uint32_t>(float16_widen_ref(h));
    BOOST_TEST(std::isnan(float16_widen_ref(h)) == nan);
    BOOST_TEST(std::isnan(f) == nan);
    fails.expect("half_bits_to_float", h, std::bit_cast<uint32_t>(f), want_f);
    // Round trip: exact, except that a signalling NaN comes back quiet.
    const uint16_t want_h = nan ? static_cast<uint16_t>(h | 0x0200) : h;
    fails.expect("float_to_half_bits(half_bits_to_float)", h, mixtape::float_to_half_bits(f), want_h);
    fails.expect("double_to_half_bits(half_bits_to_float)", h, mixtape::double_to_half_bits(f), want_h);
  }
  BOOST_TEST(fails.checked == 3 * 65536);
}

BOOST_AUTO_TEST_CASE(float_to_half_edges_and_every_tie) {
  Failures fails;
  auto check = [&](float f) { fails.expect("float_to_half_bits", f, mixtape::float_to_half_bits(f), expected_f16(f)); };
  for (float f : kFloatEdges) check(f), check(-f);
  for (double d : kDoubleEdges) check(static_cast<float>(d));
  for_each_boundary_float(0x7bff, 65536.0, half_value, [&](float f) {
    if (fails.room()) check(f);
  });
  BOOST_TEST(fails.count == 0);
  BOOST_TEST_MESSAGE("float_to_half_bits edges: " << fails.checked);
}

BOOST_AUTO_TEST_CASE(float_to_half_random) {
  Failures fails;
  std::mt19937_64 rng(20240601);
  for (int i = 0; i < 10'000'000 && fails.room(); ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    fails.expect("float_to_half_bits", f, mixtape::float_to_half_bits(f), expected_f16(f));
  }
  // Uniform bits are mostly far outside f16; these cover its range densely:
  // exponents 2^-26 (rounds to 0) up to 2^16 (overflow), all mantissas.
  std::uniform_int_distribution<uint32_t> exponent(127 - 26, 127 + 16);
  for (int i = 0; i < 10'000'000 && fails.room(); ++i) {
    const uint64_t r = rng();
    const uint32_t u = (static_cast<uint32_t>(r >> 32) & 0x807fffffu) | (exponent(rng) << 23);
    const float f = std::bit_cast<float>(u);
    fails.expect("float_to_half_bits", f, mixtape::float_to_half_bits(f), expected_f16(f));
  }
  BOOST_TEST(fails.checked == 20'000'000);
}

BOOST_AUTO_TEST_CASE(double_to_half) {
  Failures fails;
  long through_float_differs = 0;  // cases where float's first rounding would bite
  auto check = [&](double d) {
    const uint16_t want = expected_f16(d);
    fails.expect("double_to_half_bits", d, mixtape::double_to_half_bits(d), want);
    through_float_differs += mixtape::float_to_half_bits(static_cast<float>(d)) != want;
  };
  for (double d : kDoubleEdges) check(d), check(-d);
  for (float f : kFloatEdges) check(f);
  for_each_boundary_double(0x7bff, 65536.0, half_value, [&](double d) {
    if (fails.room()) check(d);
  });
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1'000'000 && fails.room(); ++i) check(std::bit_cast<double>(rng()));
  std::uniform_int_distribution<uint64_t> exponent(1023 - 26, 1023 + 16);
  for (int i = 0; i < 2'000'000 && fails.room(); ++i) {
    check(std::bit_cast<double>((rng() & 0x800fffffffffffffull) | (exponent(rng) << 52)));
  }
  BOOST_TEST(fails.count == 0);
  BOOST_TEST(through_float_differs > 1000);
  BOOST_TEST_MESSAGE("double_to_half_bits: " << fails.checked << " checked, " << through_float_differs
                                             << " would double-round through float");
}

#else

BOOST_AUTO_TEST_CASE(float16_reference_missing, *boost::unit_test::disabled()) {
  // No binary16 type in this compiler: the f16 reference tests are skipped.
}

#endif  // MT_TEST_HAVE_FLOAT16

BOOST_AUTO_TEST_CASE(bf16_reference_sanity) {
  BOOST_TEST(reference_bf16(1.0) == 0x3f80);
  BOOST_TEST(reference_bf16(1.0 + 0x1p-8) == 0x3f80);             // tie to even
  BOOST_TEST(reference_bf16(1.0 + 0x3p-8) == 0x3f82);             // tie to even, upward
  BOOST_TEST(reference_bf16(1.0 + 0x1p-8 + 0x1p-40) == 0x3f81);
  BOOST_TEST(reference_bf16(0x1.ffp127) == 0x7f80);               // the overflow tie
  BOOST_TEST(reference_bf16(std::nextafter(0x1.ffp127, 0.0)) == 0x7f7f);
  BOOST_TEST(reference_bf16(0x1p-134) == 0x0000);                 // tie to even: 0
  BOOST_TEST(reference_bf16(std::nextafter(0x1p-134, 1.0)) == 0x0001);
  BOOST_TEST(reference_bf16(-0.0) == 0x8000);
  BOOST_TEST(reference_bf16(-3.0) == 0xc040);
}

BOOST_AUTO_TEST_CASE(bf16_every_pattern) {
  Failures fails;
  for (uint32_t i = 0; i <= 0xffff && fails.room(); ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const bool nan = is_bf16_nan(b);
    const uint16_t want_b = nan ? static_cast<uint16_t>(b | 0x0040) : b;
    const float f = mixtape::bf16_bits_to_float(b);
    BOOST_TEST(std::isnan(f) == nan);
    fails.expect("bf16_bits_to_float", b, std::bit_cast<uint32_t>(f), static_cast<uint32_t>(want_b) << 16);
    fails.expect("float_to_bf16_bits(bf16_bits_to_float)", b, mixtape::float_to_bf16_bits(f), want_b);
    fails.expect("double_to_bf16_bits(bf16_bits_to_float)", b, mixtape::double_to_bf16_bits(f), want_b);
  }
  BOOST_TEST(fails.checked == 3 * 65536);
}

// Device code pairs the hardware conversions with these closed forms of the NaN rule (and a whole closed form
// for bf16 -> float); each must give the integer templates' bits for every input it is used on.
BOOST_AUTO_TEST_CASE(device_nan_rule_closed_forms) {
  namespace d = mixtape::detail;
  Failures fails;
  for (uint32_t i = 0; i <= 0xffff && fails.room(); ++i) {
    const uint16_t p = static_cast<uint16_t>(i);
    fails.expect("bf16_to_float_bits", p, d::bf16_to_float_bits(p), d::widen_bits<uint32_t, 8, 7, 8, 23>(p));
    if (is_f16_nan(p))
      fails.expect("nan_half_to_float_bits", p, d::nan_half_to_float_bits(p), d::widen_bits<uint32_t, 5, 10, 8, 23>(p));
  }
  // Every NaN float: both signs, every non-zero 23-bit payload.
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t payload = 1; payload < (1u << 23) && fails.room(); ++payload) {
      const uint32_t x = sign << 31 | 0x7f800000u | payload;
      const float f = std::bit_cast<float>(x);
      fails.expect("nan_float_to_half_bits", f, d::nan_float_to_half_bits(x), d::narrow_bits<uint32_t, 8, 23, 5, 10>(x));
      fails.expect("nan_float_to_bf16_bits", f, d::nan_float_to_bf16_bits(x), d::narrow_bits<uint32_t, 8, 23, 8, 7>(x));
    }
  BOOST_TEST(fails.count == 0);
  BOOST_TEST(fails.checked == 65536 + 2 * 1023 + 4 * ((1 << 23) - 1));
}

BOOST_AUTO_TEST_CASE(float_to_bf16) {
  Failures fails;
  auto check = [&](float f) {
    fails.expect("float_to_bf16_bits", f, mixtape::float_to_bf16_bits(f), reference_bf16_of_float(f));
  };
  for (float f : kFloatEdges) check(f), check(-f);
  for (double d : kDoubleEdges) check(static_cast<float>(d));
  for_each_boundary_float(0x7f7f, 0x1p128, bf16_value, [&](float f) {
    if (fails.room()) check(f);
  });
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 10'000'000 && fails.room(); ++i) check(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  BOOST_TEST(fails.count == 0);
  BOOST_TEST_MESSAGE("float_to_bf16_bits: " << fails.checked);
}

BOOST_AUTO_TEST_CASE(double_to_bf16) {
  Failures fails;
  long through_float_differs = 0;
  auto check = [&](double d) {
    const uint16_t want = reference_bf16_of_double(d);
    fails.expect("double_to_bf16_bits", d, mixtape::double_to_bf16_bits(d), want);
    through_float_differs += mixtape::float_to_bf16_bits(static_cast<float>(d)) != want;
  };
  for (double d : kDoubleEdges) check(d), check(-d);
  for (float f : kFloatEdges) check(f);
  for_each_boundary_double(0x7f7f, 0x1p128, bf16_value, [&](double d) {
    if (fails.room()) check(d);
  });
  std::mt19937_64 rng(99);
  for (int i = 0; i < 1'000'000 && fails.room(); ++i) check(std::bit_cast<double>(rng()));
  std::uniform_int_distribution<uint64_t> exponent(1023 - 136, 1023 + 128);
  for (int i = 0; i < 2'000'000 && fails.room(); ++i) {
    check(std::bit_cast<double>((rng() & 0x800fffffffffffffull) | (exponent(rng) << 52)));
  }
  BOOST_TEST(fails.count == 0);
  BOOST_TEST(through_float_differs > 1000);
  BOOST_TEST_MESSAGE("double_to_bf16_bits: " << fails.checked << " checked, " << through_float_differs
                                             << " would double-round through float");
}

BOOST_AUTO_TEST_SUITE_END()

// ---- core/convert.h: the bulk loops against half.h ------------------------------------------------------------

namespace {

using mixtape::ConvertIsa;
using mixtape::Converters;

/// Every table this CPU runs; the scalar one first.
std::vector<const Converters*> runnable_tables() {
  std::vector<const Converters*> tables;
  for (ConvertIsa isa : {ConvertIsa::kScalar, ConvertIsa::kAvx2F16c})
    if (const Converters* t = mixtape::converters(isa)) tables.push_back(t);
  return tables;
}

/// Runs `fn()` with MXCSR's flush-to-zero and denormals-are-zero off, then on: the loops must not care.
template <class Fn>
void under_both_mxcsr_modes(Fn fn) {
#if defined(MT_TEST_HAVE_F16C_PROBE)
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved & ~0x8040u);
  BOOST_TEST_CONTEXT("FTZ/DAZ off") fn();
  _mm_setcsr(saved | 0x8040u);
  BOOST_TEST_CONTEXT("FTZ/DAZ on") fn();
  _mm_setcsr(saved);
#else
  fn();
#endif
}

uint64_t bits(double d) { return std::bit_cast<uint64_t>(d); }
uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
uint16_t bits(Half h) { return h.bits; }
uint16_t bits(BFloat16 b) { return b.bits; }

/// Converts src with `loop` as a whole and as a run from offset 1 (misaligned, and a length that leaves a tail
/// for every vector width), then every length 0..40 from offsets 0..3, checking each output element's bits
/// against `want(src[i])`.
template <class From, class To, class Want>
void check_loop(const char* what, void (*loop)(const From*, To*, int64_t), const std::vector<From>& src, Want want,
                Failures& fails) {
  std::vector<To> dst(src.size() + 1);
  auto check_run = [&](size_t first, size_t n) {
    std::fill(dst.begin(), dst.end(), std::bit_cast<To>(static_cast<decltype(bits(To{}))>(0x5a5a5a5a5a5a5a5aull)));
    loop(src.data() + first, dst.data() + first, static_cast<int64_t>(n));
    for (size_t i = first; i < first + n && fails.room(); ++i)
      fails.expect(what, src[i], bits(dst[i]), want(src[i]));
  };
  check_run(0, src.size());
  check_run(1, src.size() - 1);
  for (size_t first = 0; first < 4; ++first)
    for (size_t n = 0; n <= 40 && first + n <= src.size(); ++n) check_run(first, n);
}

std::vector<Half> every_half() {
  std::vector<Half> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = Half::from_bits(static_cast<uint16_t>(i));
  return v;
}
std::vector<BFloat16> every_bf16() {
  std::vector<BFloat16> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = BFloat16::from_bits(static_cast<uint16_t>(i));
  return v;
}

/// The floats to narrow: the named edges, NaNs of every class, every rounding boundary of f16 and of bf16 (each
/// value, each tie, and their float neighbours), then 10^7 random bit patterns.
std::vector<float> floats_to_narrow() {
  std::vector<float> v;
  for (float f : kFloatEdges) v.push_back(f), v.push_back(-f);
  for (double d : kDoubleEdges) v.push_back(static_cast<float>(d));
  // NaNs: quiet and signalling, payloads that fit f16/bf16, that only f16 keeps, and below both.
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t payload : {0x000001u, 0x001fffu, 0x002000u, 0x00ffffu, 0x010000u, 0x1fffffu, 0x200000u, 0x3fffffu,
                             0x400000u, 0x400001u, 0x412345u, 0x7fffffu})
      v.push_back(std::bit_cast<float>(sign | 0x7f800000u | payload));
  for_each_boundary_float(0x7bff, 65536.0, half_value, [&](float f) { v.push_back(f); });
  for_each_boundary_float(0x7f7f, 0x1p128, bf16_value, [&](float f) { v.push_back(f); });
  std::mt19937_64 rng(20260601);
  for (int i = 0; i < 10'000'000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bulk_conversions)

// A vector table that is never chosen would leave every test below comparing half.h with itself. The chosen one
// is the best this CPU runs unless MIXTAPE_CPU_CAPABILITY holds the kernels below AVX2 (ctest's test_half_at_default).
BOOST_AUTO_TEST_CASE(the_best_table_this_cpu_runs_is_chosen) {
  const auto tables = runnable_tables();
  BOOST_TEST((tables.front()->isa == ConvertIsa::kScalar));
  const bool capped = !mixtape::cpu_capability_allows(mixtape::CpuCapability::kAvx2);
  BOOST_TEST(mixtape::converters().name == (capped ? tables.front() : tables.back())->name);
  BOOST_TEST_MESSAGE("conversion table chosen: " << mixtape::converters().name);
#if defined(MT_TEST_HAVE_F16C_PROBE)
  const bool avx2_f16c = __builtin_cpu_supports("avx2") && cpu_has_f16c();
  BOOST_TEST((mixtape::converters(ConvertIsa::kAvx2F16c) != nullptr) == avx2_f16c);
#endif
  for (const Converters* t : tables) BOOST_TEST_MESSAGE("conversion table tested: " << t->name);
}

// cpu_capability() is the CPU's level (asked here of CPUID, not of the library) capped by MIXTAPE_CPU_CAPABILITY;
// ctest runs this suite unset and at "default" and "avx2".
BOOST_AUTO_TEST_CASE(cpu_capability_is_the_cpus_level_capped_by_the_environment) {
  using mixtape::CpuCapability;
  const CpuCapability levels[] = {CpuCapability::kDefault, CpuCapability::kAvx2, CpuCapability::kAvx512,
                                  CpuCapability::kAvx512Bf16};
  CpuCapability cpu = CpuCapability::kDefault;
#if defined(MT_TEST_HAVE_F16C_PROBE)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    cpu = __builtin_cpu_supports("avx512bf16") ? CpuCapability::kAvx512Bf16 : CpuCapability::kAvx512;
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
    cpu = CpuCapability::kAvx2;
#endif
  const char* env = std::getenv("MIXTAPE_CPU_CAPABILITY");
  CpuCapability cap = CpuCapability::kAvx512Bf16;  // unset, or a value the library ignores
  for (CpuCapability level : levels)
    if (env != nullptr && mixtape::to_string(level) == env) cap = level;
  BOOST_TEST_MESSAGE("cpu capability " << mixtape::cpu_capability() << " (this CPU's: " << cpu
                                       << ", MIXTAPE_CPU_CAPABILITY " << (env != nullptr ? env : "unset") << ")");
  BOOST_TEST(mixtape::cpu_capability() == std::min(cpu, cap));
  for (CpuCapability level : levels)
    BOOST_TEST(mixtape::cpu_capability_allows(level) == (level <= cap), "allows " << level);
  BOOST_TEST(mixtape::to_string(CpuCapability::kAvx512Bf16) == "avx512_bf16");
#if defined(MT_TEST_HAVE_F16C_PROBE)
  // The kernels' own questions (ops/cpu/cpu_features.h) get the capped answers.
  namespace k = mixtape::kernels::cpu;
  const bool avx512_bw_vl = cpu >= CpuCapability::kAvx512;
  BOOST_TEST(k::has_f16c() == (__builtin_cpu_supports("avx") && cpu_has_f16c() && cap >= CpuCapability::kAvx2));
  BOOST_TEST(k::has_avx2() == (cpu >= CpuCapability::kAvx2 && cap >= CpuCapability::kAvx2));
  BOOST_TEST(k::has_avx512f() == (__builtin_cpu_supports("avx512f") && cap >= CpuCapability::kAvx512));
  BOOST_TEST(k::has_avx512bw_vl() == (avx512_bw_vl && cap >= CpuCapability::kAvx512));
  BOOST_TEST(k::has_avx512_bf16() == (cpu == CpuCapability::kAvx512Bf16 && cap >= CpuCapability::kAvx512Bf16));
#endif
}

BOOST_AUTO_TEST_CASE(widening_every_pattern) {
  const std::vector<Half> halves = every_half();
  const std::vector<BFloat16> bf16s = every_bf16();
  namespace d = mixtape::detail;
  for (const Converters* t : runnable_tables()) {
    BOOST_TEST_CONTEXT("table " << t->name) under_both_mxcsr_modes([&] {
      Failures fails;
      check_loop("half_to_float", t->half_to_float, halves,
                 [](Half h) { return bits(mixtape::half_bits_to_float(h.bits)); }, fails);
      check_loop("bf16_to_float", t->bf16_to_float, bf16s,
                 [](BFloat16 b) { return bits(mixtape::bf16_bits_to_float(b.bits)); }, fails);
      check_loop("half_to_double", t->half_to_double, halves,
                 [](Half h) { return d::widen_bits<uint64_t, 5, 10, 11, 52>(h.bits); }, fails);
      check_loop("bf16_to_double", t->bf16_to_double, bf16s,
                 [](BFloat16 b) { return d::widen_bits<uint64_t, 8, 7, 11, 52>(b.bits); }, fails);
      BOOST_TEST(fails.count == 0);
      BOOST_TEST(fails.checked > 4 * 2 * 65536);
    });
  }
}

BOOST_AUTO_TEST_CASE(narrowing_edges_ties_and_random) {
  const std::vector<float> floats = floats_to_narrow();
  for (const Converters* t : runnable_tables()) {
    BOOST_TEST_CONTEXT("table " << t->name) under_both_mxcsr_modes([&] {
      Failures fails;
      check_loop("float_to_half", t->float_to_half, floats, [](float f) { return mixtape::float_to_half_bits(f); },
                 fails);
      check_loop("float_to_bf16", t->float_to_bf16, floats, [](float f) { return mixtape::float_to_bf16_bits(f); },
                 fails);
      BOOST_TEST(fails.count == 0);
      BOOST_TEST(fails.checked > 2 * 2 * 10'000'000);
    });
  }
}

BOOST_AUTO_TEST_SUITE_END()
