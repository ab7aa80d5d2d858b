// core/random.cpp — rand/randn/randint on the CPU; other devices receive a copy.
//
// Element i of a draw uses Philox counter (generator offset + i), so a draw is
// the same whatever the thread count, and the generator advances by numel.
#include <mixtape/core/random.h>

#include <cmath>
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

/// Fills a CPU f64 tensor of `shape` with f(i, words) for each element, then converts.
template <class F>
Tensor draw(const Shape& shape, TensorOptions options, Generator* gen, const char* op, F&& f) {
  for (int64_t i = 0; i < shape.size(); ++i)
    MT_CHECK(shape[i] >= 0, op, ": negative size ", shape[i], " at dim ", i, " (shape ", shape, ")");
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = shape.numel();
  const uint64_t key = g.seed();
  const uint64_t first = g.advance(static_cast<uint64_t>(n));
  Tensor host = empty(shape, TensorOptions(DType::kF64));
  double* out = host.data<double>();
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
  const auto range = static_cast<unsigned __int128>(static_cast<uint64_t>(high - low));
  return draw(shape, options, gen, "randint", [=](const uint32_t* w) {
    uint64_t r = static_cast<uint64_t>(w[0]) << 32 | w[1];
    auto v = static_cast<int64_t>((static_cast<unsigned __int128>(r) * range) >> 64);
    return static_cast<double>(low + v);
  });
}

}  // namespace mixtape
