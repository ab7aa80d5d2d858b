// core/random.cpp — rand/randn/randint on the CPU; other devices receive a copy.
//
// Element i of a draw uses Philox counter (generator offset + i), so a draw is
// the same whatever the thread count, and the generator advances by numel.
#include <mixtape/core/random.h>

#include <cmath>
#include <cstdint>
#include <numbers>

#include <mixtape/core/raw.h>

namespace mixtape {

Generator& default_generator() {
  static Generator gen;
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {

/// Mantissa digits of a floating dtype: uniform draws use that many bits so
/// that every value is exact in the dtype and never rounds up to 1.
int mantissa_digits(DType t) {
  switch (t) {
    case DType::kF64: return 53;
    case DType::kF32: return 24;
    case DType::kF16: return 11;
    case DType::kBF16: return 8;
    default: return 53;
  }
}

/// Fills a CPU tensor of `shape` in `Host` (f64 for floating draws, i64 for integers: both exact for what they
/// hold) with f(words) for each element, then converts to the options' dtype and device.
template <class Host = double, class F>
Tensor draw(const Shape& shape, TensorOptions options, Generator* gen, const char* op, F&& f) {
  const int64_t n = checked_numel(shape, op);
  MT_CHECK(n <= (int64_t{1} << 62) / 8, op, ": shape ", shape, " is too large to draw");  // the f64/i64 host copy
  Generator& g = gen ? *gen : default_generator();
  // Plain variables, not a structured binding: clang 16 crashes on one used inside an OpenMP region.
  const GeneratorState at = g.reserve(static_cast<uint64_t>(n));
  const uint64_t key = at.seed, first = at.offset;
  Tensor host = empty(shape, TensorOptions(dtype_v<Host>));
  Host* out = host.data<Host>();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t words[4];
    philox4x32_10(key, 0, first + static_cast<uint64_t>(i), words);
    out[i] = f(words);
  }
  return raw::to(host, options.device(), options.dtype());
}

}  // namespace

Tensor uniform(const Shape& shape, double low, double high, TensorOptions options, Generator* gen) {
  MT_CHECK(is_floating(options.dtype()), "uniform: expected a floating dtype, got ", options.dtype());
  MT_CHECK(low <= high && std::isfinite(low) && std::isfinite(high), "uniform: invalid range [", low, ", ", high, ")");
  const int digits = mantissa_digits(options.dtype());
  return draw(shape, options, gen, "uniform", [=](const uint32_t* w) {
    uint64_t bits = (static_cast<uint64_t>(w[0]) << 32 | w[1]) >> (64 - digits);
    double u = std::ldexp(static_cast<double>(bits), -digits);  // exact, in [0, 1)
    return low + (high - low) * u;
  });
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  MT_CHECK(is_floating(options.dtype()), "rand: expected a floating dtype, got ", options.dtype());
  return uniform(shape, 0.0, 1.0, options, gen);
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  MT_CHECK(is_floating(options.dtype()), "randn: expected a floating dtype, got ", options.dtype());
  return draw(shape, options, gen, "randn", [](const uint32_t* w) {
    // Box–Muller with u1 in (0, 1] so the log is finite.
    double u1 = (static_cast<double>((static_cast<uint64_t>(w[0]) << 21) ^ (w[1] >> 11)) + 1.0) *
                (1.0 / 9007199254740992.0);
    double u2 = uniform_double(w[2], w[3]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  MT_CHECK(low < high, "randint: empty range [", low, ", ", high, ")");
  // Every value of [low, high) must be exact in the dtype asked for.
  const DType dt = options.dtype();
  auto fits = [&](int64_t lo, int64_t hi) { return low >= lo && high - 1 <= hi; };
  if (is_floating(dt)) {
    const int64_t exact = int64_t{1} << mantissa_digits(dt);  // every integer up to 2^digits is exact
    MT_CHECK(fits(-exact, exact), "randint: the range [", low, ", ", high, ") holds integers ", dt,
             " cannot represent exactly (|value| <= ", exact, ")");
  } else if (dt == DType::kI32) {
    MT_CHECK(fits(INT32_MIN, INT32_MAX), "randint: the range [", low, ", ", high, ") does not fit i32");
  } else if (dt == DType::kU8) {
    MT_CHECK(fits(0, 255), "randint: the range [", low, ", ", high, ") does not fit u8");
  } else if (dt == DType::kBool) {
    MT_CHECK(fits(0, 1), "randint: the range [", low, ", ", high, ") does not fit bool");
  }
  // high - low may exceed INT64_MAX (the full range is 2^64 - 1 values wide): unsigned arithmetic, modulo 2^64.
  const auto range = static_cast<unsigned __int128>(static_cast<uint64_t>(high) - static_cast<uint64_t>(low));
  return draw<int64_t>(shape, options, gen, "randint", [=](const uint32_t* w) {
    const uint64_t r = static_cast<uint64_t>(w[0]) << 32 | w[1];
    const auto v = static_cast<uint64_t>((static_cast<unsigned __int128>(r) * range) >> 64);  // in [0, range)
    return static_cast<int64_t>(static_cast<uint64_t>(low) + v);
  });
}

}  // namespace mixtape
