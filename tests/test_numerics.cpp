// tests/test_numerics.cpp — the numerics inspector's kernels (ops/cpu/numerics.cpp, cuda/numerics.cu):
// numerics_stats and lost_updates. They are kernels, not ops (nothing to differentiate), so there is no
// ops/numerics.cpp and no registry case.
//
// numerics_stats on tensors built so that every field has a value counted by hand here: each threshold, the f32
// value on either side of it, signed zeros, infinities, NaN, f32 subnormals, in every floating dtype (f64 rounded
// to f32 first), with and without a multiplier; then large tensors of random bit patterns (every exponent, NaN and
// inf included) against a scalar reference written here from the definitions with double comparisons and
// std::ilogb, not from ops/backend/numerics_math.h. lost_updates on single updates at each model dtype's half-ulp
// boundary (exactly half is not lost, the next value below is), zero updates, w == 0, subnormal weights, a
// difference that double arithmetic rounds onto the boundary, non-finite values; then random updates against the
// same kind of reference. On CUDA, the same inputs bit for bit the CPU's, and neither kernel makes the host wait.
#include "family_test.h"

#include <bit>
#include <cfloat>
#include <functional>
#include <map>
#include <random>

#include <mixtape/ops/backend/numerics_math.h>

namespace {

namespace nm = mixtape::math;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// The f32 (or f64) value just below x, towards zero.
float below(float x) { return std::nextafter(x, 0.0f); }
double below(double x) { return std::nextafter(x, 0.0); }

/// What numerics_stats must return, spelled field by field; the histogram as floor(log2|v|) → count.
struct Expected {
  int64_t count = 0, zeros = 0, non_finite = 0, f16_subnormal = 0, f16_underflow = 0, f16_overflow = 0,
          bf16_below_normal = 0;
  float amax = 0;
  std::map<int, int64_t> histogram;
};

std::vector<int64_t> as_fields(const Expected& e) {
  std::vector<int64_t> v(nm::kNumericsFields, 0);
  v[nm::kCount] = e.count;
  v[nm::kZeros] = e.zeros;
  v[nm::kNonFinite] = e.non_finite;
  v[nm::kF16Subnormal] = e.f16_subnormal;
  v[nm::kF16Underflow] = e.f16_underflow;
  v[nm::kF16Overflow] = e.f16_overflow;
  v[nm::kBf16BelowNormal] = e.bf16_below_normal;
  v[nm::kAmaxBits] = std::bit_cast<uint32_t>(e.amax);
  for (const auto& [exp, n] : e.histogram) v[nm::kHistogram + exp - nm::kHistogramMinExp] = n;
  return v;
}

const char* field_name(int f) {
  static const char* const names[] = {"count",         "zeros",        "non_finite",        "f16_subnormal",
                                      "f16_underflow", "f16_overflow", "bf16_below_normal", "amax_bits"};
  return f < nm::kHistogram ? names[f] : "histogram";
}

/// The kernel's result against `want`, field by field (histogram bins named by their exponent).
void expect_fields(const Tensor& stats, const std::vector<int64_t>& want, const std::string& what) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_REQUIRE(stats.dtype() == DType::kI64);
    BOOST_REQUIRE(stats.dim() == 1 && stats.numel() == nm::kNumericsFields);
    const std::vector<int64_t> got = stats.cpu().to_vector<int64_t>();
    for (int f = 0; f < nm::kNumericsFields; ++f)
      BOOST_TEST(got[f] == want[f], field_name(f) << (f >= nm::kHistogram ? " of 2^" : "")
                                                  << (f >= nm::kHistogram ? f - nm::kHistogram + nm::kHistogramMinExp
                                                                          : 0)
                                                  << ": got " << got[f] << ", expected " << want[f]);
    // Every finite nonzero value is in exactly one bin.
    int64_t binned = 0;
    for (int k = 0; k < nm::kHistogramBins; ++k) binned += got[nm::kHistogram + k];
    BOOST_TEST(binned == got[nm::kCount] - got[nm::kZeros] - got[nm::kNonFinite]);
  }
}

Tensor no_multiplier() { return Tensor(); }
Tensor f32_scalar(float v) { return mt::from_vector<float>({v}, {1}); }

// ---- the scalar reference: the definitions, with double comparisons -----------------------------------

/// numerics_stats' fields for values already read as f32.
std::vector<int64_t> reference_stats(const std::vector<float>& v) {
  std::vector<int64_t> r(nm::kNumericsFields, 0);
  const double f16_min_subnormal = std::ldexp(1.0, -24), f16_min_normal = std::ldexp(1.0, -14);
  const double f32_min_normal = std::ldexp(1.0, -126);
  float amax = 0;
  for (float f : v) {
    const double x = std::fabs(static_cast<double>(f));
    ++r[nm::kCount];
    if (x == 0) ++r[nm::kZeros];
    if (!std::isfinite(x)) {
      ++r[nm::kNonFinite];
      continue;
    }
    if (x >= f16_min_subnormal && x < f16_min_normal) ++r[nm::kF16Subnormal];
    if (x > 0 && x < f16_min_subnormal) ++r[nm::kF16Underflow];
    if (x >= 65504.0) ++r[nm::kF16Overflow];
    if (x > 0 && x < f32_min_normal) ++r[nm::kBf16BelowNormal];
    if (x > 0) ++r[nm::kHistogram + std::ilogb(x) - nm::kHistogramMinExp];
    amax = std::max(amax, static_cast<float>(x));
  }
  r[nm::kAmaxBits] = std::bit_cast<uint32_t>(amax);
  return r;
}

/// x's values as the kernel reads them: rounded to f32 (from f64: once), times m in f32.
std::vector<float> read_as_f32(const Tensor& x, float m) {
  std::vector<float> v;
  for (double e : values(x)) v.push_back(static_cast<float>(e) * m);
  return v;
}

// ---- inputs ------------------------------------------------------------------------------------

/// Random bit patterns of x's dtype: every exponent, subnormals, infinities and NaNs, both signs.
Tensor random_bits(int64_t n, DType dt, uint64_t seed) {
  std::mt19937_64 gen(seed);
  switch (dt) {
    case DType::kF16: {
      std::vector<mt::Half> v(static_cast<size_t>(n));
      for (auto& e : v) e = mt::Half::from_bits(static_cast<uint16_t>(gen()));
      return mt::from_vector(v, {n});
    }
    case DType::kBF16: {
      std::vector<mt::BFloat16> v(static_cast<size_t>(n));
      for (auto& e : v) e = mt::BFloat16::from_bits(static_cast<uint16_t>(gen()));
      return mt::from_vector(v, {n});
    }
    case DType::kF32: {
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& e : v) e = std::bit_cast<float>(static_cast<uint32_t>(gen()));
      return mt::from_vector(v, {n});
    }
    default: {
      // f64: random bits would be almost all outside f32's range; instead a random sign and significand with an
      // exponent around f32's range (its subnormals, rounding to 0 and to inf included).
      std::vector<double> v(static_cast<size_t>(n));
      std::uniform_int_distribution<int> exponent(-160, 140);
      std::uniform_real_distribution<double> significand(1.0, 2.0);
      for (auto& e : v) e = (gen() & 1 ? -1 : 1) * std::ldexp(significand(gen), exponent(gen));
      return mt::from_vector(v, {n});
    }
  }
}

/// The hand-counted f32 case: each threshold and the f32 value just below it, signed zeros, infinities, NaN, f32
/// subnormals, negative values.
std::vector<float> special_f32() {
  return {0.0f,      -0.0f,           kInf,      -kInf,           kNaN,     0x1p-24f, below(0x1p-24f),
          0x1p-14f,  below(0x1p-14f), 65504.0f,  65503.99f,       -65504.0f,
          0x1p-126f, below(0x1p-126f), 0x1p-149f, -0x1p-149f,
          1.0f,      -3.0f,           1e38f,     FLT_MAX};
}

BOOST_AUTO_TEST_SUITE(numerics)

// ---- numerics_stats ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(stats_of_f32_boundaries_are_counted_exactly, MT_CPU_TEST) {
  const Tensor x = mt::from_vector(special_f32(), {20});
  Expected e;
  e.count = 20;
  e.zeros = 2;                   // ±0
  e.non_finite = 3;              // ±inf, NaN
  e.f16_subnormal = 2;           // 2^-24 itself, the value below 2^-14 (2^-14 is f16's smallest normal)
  e.f16_underflow = 5;           // below 2^-24, 2^-126, below 2^-126, ±2^-149
  e.f16_overflow = 4;            // ±65504, 1e38, FLT_MAX (65503.99 is not)
  e.bf16_below_normal = 3;       // below 2^-126, ±2^-149 (2^-126 itself is normal)
  e.amax = FLT_MAX;              // inf and NaN are not finite
  e.histogram = {{-24, 1}, {-25, 1}, {-14, 1}, {-15, 1}, {15, 3}, {-126, 1}, {-127, 1}, {-149, 2},
                 {0, 1},   {1, 1},   {126, 1}, {127, 1}};
  expect_fields(kn::numerics_stats(x, no_multiplier()), as_fields(e), "f32 boundaries");
  expect_fields(kn::numerics_stats(x, no_multiplier()), reference_stats(read_as_f32(x, 1.0f)),
                "f32 boundaries against the reference");
}

BOOST_AUTO_TEST_CASE(stats_of_f64_round_to_f32_first, MT_CPU_TEST) {
  // Each value's class changes with the rounding to f32: the kernel must not compare the f64 value.
  const Tensor x = mt::from_vector<double>(
      {
          below(0x1p-24),         // rounds up to 2^-24: f16 subnormal, not underflow
          below(65504.0),         // rounds to 65504: overflow
          0x1p-150,               // a tie between 0 and 2^-149: to even, 0
          1.5 * 0x1p-150,         // rounds to 2^-149
          1e300,                  // inf
          -1e300,                 // −inf
          below(0x1p-126),        // rounds to 2^-126: normal, not below bf16's normal
          3.0,
      },
      {8});
  Expected e;
  e.count = 8;
  e.zeros = 1;
  e.non_finite = 2;
  e.f16_subnormal = 1;
  e.f16_underflow = 2;  // 2^-149, 2^-126
  e.f16_overflow = 1;
  e.bf16_below_normal = 1;  // 2^-149
  e.amax = 65504.0f;
  e.histogram = {{-24, 1}, {15, 1}, {-149, 1}, {-126, 1}, {1, 1}};
  expect_fields(kn::numerics_stats(x, no_multiplier()), as_fields(e), "f64 values rounded to f32");
}

BOOST_AUTO_TEST_CASE(stats_of_f16_and_bf16_are_counted_exactly, MT_CPU_TEST) {
  using mt::BFloat16;
  using mt::Half;
  // f16: its own subnormals (2^-24 is its smallest) are f16-subnormal, never underflow; its max overflows.
  const Tensor h = mt::from_vector<Half>({Half(0.0f), Half(-0.0f), Half(kInf), Half(kNaN), Half(0x1p-24f),
                                          Half(0x1p-20f), Half(0x1p-14f), Half(0x1p-14f - 0x1p-24f), Half(65504.0f),
                                          Half(-65504.0f), Half(1.0f), Half(-3.0f)},
                                         {12});
  Expected eh;
  eh.count = 12;
  eh.zeros = 2;
  eh.non_finite = 2;
  eh.f16_subnormal = 3;  // 2^-24, 2^-20, 2^-14 − 2^-24 (f16's largest subnormal)
  eh.f16_overflow = 2;
  eh.amax = 65504.0f;
  eh.histogram = {{-24, 1}, {-20, 1}, {-14, 1}, {-15, 1}, {15, 2}, {0, 1}, {1, 1}};
  expect_fields(kn::numerics_stats(h, no_multiplier()), as_fields(eh), "f16");
  // bf16: f32's range, so its subnormals are f32's and count as below bf16's normal and as f16 underflow.
  const Tensor b = mt::from_vector<BFloat16>({BFloat16(-0.0f), BFloat16(-kInf), BFloat16(0x1p-133f),
                                              BFloat16(0x1p-126f), BFloat16(0x1p-24f), BFloat16(0x1p-14f),
                                              BFloat16(65536.0f), BFloat16(-3e38f), BFloat16(0.5f)},
                                             {9});
  Expected eb;
  eb.count = 9;
  eb.zeros = 1;
  eb.non_finite = 1;
  eb.f16_subnormal = 1;      // 2^-24
  eb.f16_underflow = 2;      // 2^-133, 2^-126
  eb.f16_overflow = 2;       // 65536, 3e38
  eb.bf16_below_normal = 1;  // 2^-133
  eb.amax = static_cast<float>(BFloat16(3e38f));
  eb.histogram = {{-133, 1}, {-126, 1}, {-24, 1}, {-14, 1}, {16, 1}, {127, 1}, {-1, 1}};
  expect_fields(kn::numerics_stats(b, no_multiplier()), as_fields(eb), "bf16");
}

BOOST_AUTO_TEST_CASE(stats_apply_the_multiplier_in_f32, MT_CPU_TEST) {
  using mt::Half;
  // A gradient held scaled by 2^16 in f16, unscaled: 1 → 2^-16 (f16 subnormal), 2^-10 → 2^-26 (underflow),
  // 65504 → just below 1, inf stays inf, 0 stays 0.
  const Tensor g = mt::from_vector<Half>({Half(1.0f), Half(0x1p-10f), Half(65504.0f), Half(kInf), Half(0.0f)}, {5});
  Expected e;
  e.count = 5;
  e.zeros = 1;
  e.non_finite = 1;
  e.f16_subnormal = 1;
  e.f16_underflow = 1;
  e.amax = 65504.0f * 0x1p-16f;
  e.histogram = {{-16, 1}, {-26, 1}, {-1, 1}};
  expect_fields(kn::numerics_stats(g, f32_scalar(0x1p-16f)), as_fields(e), "f16 times 2^-16");
  // Held as it is, the same tensor has no subnormal and no underflow.
  Expected held;
  held.count = 5;
  held.zeros = 1;
  held.non_finite = 1;
  held.f16_overflow = 1;
  held.amax = 65504.0f;
  held.histogram = {{0, 1}, {-10, 1}, {15, 1}};
  expect_fields(kn::numerics_stats(g, no_multiplier()), as_fields(held), "f16 held");
  // The product is rounded to f32 once: 3 · (2^-24 / 3) lands on either side of 2^-24 only through that rounding.
  const float third = 1.0f / 3.0f;
  for (DType dt : kFloatTypes) {
    const Tensor x = random_bits(4099, dt, 7);
    expect_fields(kn::numerics_stats(x, f32_scalar(third)), reference_stats(read_as_f32(x, third)),
                  describe("random ", dt, " times 1/3"));
  }
}

BOOST_AUTO_TEST_CASE(stats_of_large_random_tensors_match_the_reference, MT_CPU_TEST) {
  // Past kParallelMin: the threads' partial counts must merge to the scalar reference's.
  for (DType dt : kFloatTypes)
    for (int64_t n : {int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 37}) {
      const Tensor x = random_bits(n, dt, 100 + static_cast<uint64_t>(n));
      expect_fields(kn::numerics_stats(x, no_multiplier()), reference_stats(read_as_f32(x, 1.0f)),
                    describe("random bits of ", dt, ", ", n, " elements"));
    }
  // Ordinary training values: N(0, 1) times 2^-20, where f16 loses some, and a multiplier of 2^12.
  const Tensor x = kn::scalar(kn::ScalarOp::kMul, randn_seeded({1 << 19}, DType::kF32, 3), 0x1p-20);
  expect_fields(kn::numerics_stats(x, f32_scalar(4096.0f)), reference_stats(read_as_f32(x, 4096.0f)),
                "N(0, 2^-40) times 2^12");
}

BOOST_AUTO_TEST_CASE(stats_of_an_empty_tensor_are_zero, MT_CPU_TEST) {
  for (DType dt : kFloatTypes)
    expect_fields(kn::numerics_stats(mt::zeros({3, 0}, dt), f32_scalar(2.0f)),
                  std::vector<int64_t>(nm::kNumericsFields, 0), describe("empty ", dt));
}

BOOST_AUTO_TEST_CASE(stats_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  auto expect_invariant_error = [](const std::function<void()>& f, const std::string& what) {
    BOOST_TEST_CONTEXT(what) {
      const std::string msg = expect_error(f, {"its invariant"});
      BOOST_TEST(msg.starts_with("kernels::numerics_stats"), "the message: " << msg);
    }
  };
  expect_invariant_error([] { kn::numerics_stats(mt::zeros({3, 4}).t(), Tensor()); }, "a transposed x");
  expect_invariant_error([] { kn::numerics_stats(mt::zeros({3}, DType::kI64), Tensor()); }, "an i64 x");
  expect_invariant_error([] { kn::numerics_stats(mt::zeros({3}), mt::ones({1}, DType::kF64)); },
                         "an f64 multiplier");
  expect_invariant_error([] { kn::numerics_stats(mt::zeros({3}), mt::ones({2})); }, "a multiplier of 2 elements");
}

// ---- lost_updates ------------------------------------------------------------------------------

/// p and the smallest normal exponent of a model dtype, written out here.
struct Format {
  DType dtype;
  int p, min_exp;
};
constexpr Format kModels[] = {{DType::kF16, 10, -14}, {DType::kBF16, 7, -126}, {DType::kF32, 23, -126}};

/// Half the spacing of the model dtype at w: from std::ilogb, D's subnormal spacing below its smallest normal.
double half_ulp_reference(double w, const Format& f) {
  const int e = (w == 0 || std::ilogb(w) < f.min_exp) ? f.min_exp : std::ilogb(w);
  return std::ldexp(1.0, e - f.p - 1);
}

std::vector<int64_t> lost(const Tensor& before, const Tensor& after, DType model) {
  const Tensor r = kn::lost_updates(before, after, model);
  BOOST_REQUIRE(r.dtype() == DType::kI64);
  BOOST_REQUIRE(r.dim() == 1 && r.numel() == nm::kLostUpdateFields);
  return r.cpu().to_vector<int64_t>();
}

/// One update before → after in `dt`, which must come out unchanged / lost / neither.
enum class Outcome { kUnchanged, kLost, kKept };
void expect_outcome(double before, double after, DType dt, DType model, Outcome want, const std::string& what) {
  const std::vector<int64_t> got = lost(mt::from_vector<double>({before}, {1}, mt::TensorOptions(dt)),
                                        mt::from_vector<double>({after}, {1}, mt::TensorOptions(dt)), model);
  const std::vector<int64_t> expected = {1, want == Outcome::kUnchanged, want == Outcome::kLost};
  BOOST_TEST_CONTEXT(what << ": " << dt << " update " << before << " -> " << after << ", model " << model) {
    BOOST_TEST(got == expected, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(lost_updates_at_each_models_half_ulp, MT_CPU_TEST) {
  for (const Format& f : kModels) {
    // Normal weights of either sign, the model's smallest normal, subnormal weights of the model, and 0.
    const double sub = std::ldexp(1.0, f.min_exp - 3);
    for (double w : {1.0, -1.0, 3.0, 1000.0, -0.15625, std::ldexp(1.0, f.min_exp), sub, -3 * sub, 0.0}) {
      const double t = half_ulp_reference(w, f);
      // f64 data holds w ± t exactly for every model; f32 data for f16 and bf16 models (t >= f32's ulp at w).
      for (DType dt : {DType::kF64, DType::kF32}) {
        if (dt == DType::kF32 && f.dtype == DType::kF32) continue;
        const std::string what = describe("w = ", w, ", half ulp ", t);
        auto next_below = [&](double v) {  // the value of dt just below v, towards w
          return dt == DType::kF64 ? std::nextafter(v, w) : static_cast<double>(std::nextafter(static_cast<float>(v),
                                                                                               static_cast<float>(w)));
        };
        BOOST_REQUIRE(static_cast<double>(static_cast<float>(w + t)) == w + t || dt == DType::kF64);
        expect_outcome(w, w, dt, f.dtype, Outcome::kUnchanged, what);
        expect_outcome(w, w + t, dt, f.dtype, Outcome::kKept, what + ": exactly half an ulp up");
        expect_outcome(w, w - t, dt, f.dtype, Outcome::kKept, what + ": exactly half an ulp down");
        expect_outcome(w, next_below(w + t), dt, f.dtype, Outcome::kLost, what + ": just below half an ulp up");
        expect_outcome(w, next_below(w - t), dt, f.dtype, Outcome::kLost, what + ": just below half an ulp down");
        expect_outcome(w, w + 4 * t, dt, f.dtype, Outcome::kKept, what + ": two ulps");
      }
    }
  }
  // −0 after +0 is no update.
  expect_outcome(0.0, -0.0, DType::kF32, DType::kF16, Outcome::kUnchanged, "+0 -> -0");
  // f32 weights under an f32 model: a change of one f32 ulp is never lost.
  expect_outcome(1.0, below(1.0f), DType::kF32, DType::kF32, Outcome::kKept, "one f32 ulp");
  // f16 and bf16 data: a change of one of their own ulps is kept by the same model.
  expect_outcome(1.0, 1.0 + 0x1p-10, DType::kF16, DType::kF16, Outcome::kKept, "one f16 ulp");
  expect_outcome(1.0, 1.0 + 0x1p-7, DType::kBF16, DType::kBF16, Outcome::kKept, "one bf16 ulp");
}

BOOST_AUTO_TEST_CASE(lost_updates_use_the_exact_difference, MT_CPU_TEST) {
  // w = 2^-25 under an f16 model (below its smallest normal: half an ulp is 2^-25). In double, 2^-149 − 2^-25
  // rounds to −2^-25 exactly: only the exact difference shows the first is lost and the second is not.
  expect_outcome(0x1p-25, 0x1p-149, DType::kF32, DType::kF16, Outcome::kLost, "2^-25 -> 2^-149");
  expect_outcome(0x1p-25, -0x1p-149, DType::kF32, DType::kF16, Outcome::kKept, "2^-25 -> -2^-149");
  expect_outcome(-0x1p-25, -0x1p-149, DType::kF32, DType::kF16, Outcome::kLost, "-2^-25 -> -2^-149");
}

BOOST_AUTO_TEST_CASE(lost_updates_skip_non_finite_values, MT_CPU_TEST) {
  const Tensor before = mt::from_vector<float>({kInf, 1.0f, kNaN, 1.0f, -kInf, 2.0f}, {2, 3});
  const Tensor after = mt::from_vector<float>({kInf, kNaN, kNaN, kInf, 1.0f, 2.0f}, {2, 3});
  const std::vector<int64_t> want = {6, 1, 0};  // only 2 → 2 counts
  BOOST_TEST(lost(before, after, DType::kF16) == want, boost::test_tools::per_element());
  BOOST_TEST(lost(mt::zeros({0}), mt::zeros({0}), DType::kBF16) == (std::vector<int64_t>{0, 0, 0}),
             boost::test_tools::per_element());
}

/// Random weights around 2^[-30, 10] and updates of relative size 2^[-30, 0], rounded to dt; every 7th unchanged.
std::pair<Tensor, Tensor> random_update(int64_t n, DType dt, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> exponent(-30, 10), relative(-30, 0);
  std::uniform_real_distribution<double> significand(-2.0, 2.0);
  std::vector<double> b(static_cast<size_t>(n)), a(static_cast<size_t>(n));
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = std::ldexp(significand(gen), exponent(gen));
    a[i] = i % 7 == 0 ? b[i] : b[i] + b[i] * std::ldexp(significand(gen), relative(gen));
  }
  return {mt::from_vector(b, {n}).to(dt), mt::from_vector(a, {n}).to(dt)};
}

BOOST_AUTO_TEST_CASE(lost_updates_of_random_updates_match_the_reference, MT_CPU_TEST) {
  for (DType dt : kFloatTypes)
    for (const Format& f : kModels) {
      const auto [before, after] = random_update((int64_t{1} << 18) + 3, dt, 11);
      // The reference: |a − b| in double is exact here (a and b within a factor of 2 of each other, or the
      // update far from half an ulp).
      const std::vector<double> b = values(before), a = values(after);
      std::vector<int64_t> want = {static_cast<int64_t>(b.size()), 0, 0};
      for (size_t i = 0; i < b.size(); ++i) {
        want[1] += a[i] == b[i];
        want[2] += a[i] != b[i] && std::fabs(a[i] - b[i]) < half_ulp_reference(b[i], f);
      }
      BOOST_TEST_CONTEXT(describe(dt, " updates, model ", f.dtype)) {
        BOOST_TEST(lost(before, after, f.dtype) == want, boost::test_tools::per_element());
        // Where dt has more fraction bits than the model, some updates are lost: the case tests something.
        const int dt_fraction_bits = dt == DType::kF64 ? 52 : dt == DType::kF32 ? 23 : dt == DType::kF16 ? 10 : 7;
        if (dt_fraction_bits > f.p) BOOST_TEST(want[2] > 0);
      }
    }
}

BOOST_AUTO_TEST_CASE(lost_updates_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  auto expect_invariant_error = [](const std::function<void()>& f, const std::string& what) {
    BOOST_TEST_CONTEXT(what) {
      const std::string msg = expect_error(f, {"its invariant"});
      BOOST_TEST(msg.starts_with("kernels::lost_updates"), "the message: " << msg);
    }
  };
  const Tensor w = mt::zeros({2, 3});
  expect_invariant_error([&] { kn::lost_updates(w, mt::zeros({2, 3}, DType::kF64), DType::kF16); },
                         "mixed dtypes");
  expect_invariant_error([&] { kn::lost_updates(w, mt::zeros({3, 2}), DType::kF16); }, "mixed shapes");
  expect_invariant_error([&] { kn::lost_updates(w, mt::zeros({3, 2}).t(), DType::kF16); }, "a transposed after");
  expect_invariant_error([&] { kn::lost_updates(w, w, DType::kF64); }, "an f64 model");
  expect_invariant_error([] { kn::lost_updates(mt::zeros({3}, DType::kI32), mt::zeros({3}, DType::kI32),
                                               DType::kF16); },
                         "i32 tensors");
}

// ---- CUDA against the CPU ------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(stats_on_cuda_match_the_cpu, MT_GPU_TEST) {
  const PoisonAllocations poison;  // an output the kernel forgot to zero would be all ones
  const Tensor special = mt::from_vector(special_f32(), {20});
  for (DType dt : kFloatTypes) {
    std::vector<Tensor> xs = {special.to(dt), mt::zeros({0}, dt)};
    for (int64_t n : kGpuSizes) xs.push_back(random_bits(n, dt, 200 + static_cast<uint64_t>(n)));
    for (const Tensor& x : xs)
      for (const Tensor& m : {Tensor(), f32_scalar(1.0f / 3.0f), f32_scalar(0x1p-16f)}) {
        const std::string what = describe(dt, " ", x.shape(), m.defined() ? " with a multiplier" : "");
        const Tensor want = kn::numerics_stats(x, m);
        const Tensor got = kn::numerics_stats(gpu(x), m.defined() ? gpu(m) : m);
        BOOST_TEST(got.device().is_cuda());
        expect_same_bits(got, want, what);
      }
  }
}

BOOST_AUTO_TEST_CASE(lost_updates_on_cuda_match_the_cpu, MT_GPU_TEST) {
  const PoisonAllocations poison;
  for (DType dt : kFloatTypes)
    for (int64_t n : kGpuSizes) {
      const auto [before, after] = random_update(n, dt, 300 + static_cast<uint64_t>(n));
      for (const Format& f : kModels)
        expect_same_bits(kn::lost_updates(gpu(before), gpu(after), f.dtype), kn::lost_updates(before, after, f.dtype),
                         describe(dt, " updates of ", n, " elements, model ", f.dtype));
    }
  // The boundary cases and non-finite values, in one tensor.
  const Tensor b = mt::from_vector<float>({0x1p-25f, 0x1p-25f, 1.0f, 1.0f, 1.0f, kInf, 0.0f}, {7});
  const Tensor a = mt::from_vector<float>({0x1p-149f, -0x1p-149f, 1.0f + 0x1p-11f, below(1.0f + 0x1p-11f), 1.0f,
                                           kInf, -0.0f},
                                          {7});
  expect_same_bits(kn::lost_updates(gpu(b), gpu(a), DType::kF16), kn::lost_updates(b, a, DType::kF16),
                   "boundary updates");
  BOOST_TEST(kn::lost_updates(b, a, DType::kF16).to_vector<int64_t>() == (std::vector<int64_t>{7, 2, 2}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(statistics_on_cuda_do_not_make_the_host_wait, MT_GPU_TEST) {
  const Tensor x = gpu(random_bits(int64_t{1} << 20, DType::kF16, 400));
  const Tensor inv_scale = gpu(f32_scalar(0x1p-16f));
  const auto [before, after] = random_update(int64_t{1} << 16, DType::kF32, 401);
  const Tensor b = gpu(before), a = gpu(after), nothing = gpu(mt::zeros({0}, DType::kF16));
  mt::cuda::synchronize();
  mt::cuda::reset_debug_counters();
  const Tensor held = kn::numerics_stats(x, Tensor());
  const Tensor unscaled = kn::numerics_stats(x, inv_scale);
  const Tensor updates = kn::lost_updates(b, a, DType::kF16);
  const Tensor empty = kn::numerics_stats(nothing, Tensor());
  BOOST_TEST(mt::cuda::debug_counters().synchronizations == 0);
  BOOST_TEST(mt::cuda::debug_counters().device_to_host_copies == 0);
  // And the results, read now, are the CPU's.
  expect_same_bits(held, kn::numerics_stats(x.cpu(), Tensor()), "held");
  expect_same_bits(unscaled, kn::numerics_stats(x.cpu(), inv_scale.cpu()), "unscaled");
  expect_same_bits(updates, kn::lost_updates(before, after, DType::kF16), "updates");
  BOOST_TEST(empty.cpu().to_vector<int64_t>() == std::vector<int64_t>(nm::kNumericsFields, 0),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
