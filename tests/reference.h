// tests/reference.h — what the tests of the CPU kernels against float64 references share.
//
// Each family's file (tests/test_<family>.cpp) checks its CPU kernels
// (ops/cpu/<family>.cpp) against references computed in double, from the
// same rounded inputs the kernel saw (`x.to(kF64)`), with formulas written
// out in the test: never through a kernel under test (only core's views and
// dtype copies are trusted). Tolerances come from the one per-dtype table,
// tests/tolerance.h (PyTorch's assert_close defaults); an override says why
// next to it. Where a stronger property holds it is checked exactly (a zero
// tolerance): +, -, *, / of f16/bf16/f32 computed in f32/f64 and rounded once
// equal the exact result rounded once (an intermediate of >= 2p+2 bits makes
// double rounding harmless), and max/min/argmax/where/comparisons are exact.
// A failure prints the op, shapes, layout, dtype, seed and the first
// mismatching pairs.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>

#include "compare.h"
#include "tolerance.h"

namespace mixtape::test {

/// The floating dtypes every CPU kernel is instantiated for.
constexpr DType kFloatTypes[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16};

/// The streamed arguments as one string: a failure's configuration.
template <class... Args>
std::string describe(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// The elements of `t` in row-major order, as doubles.
inline std::vector<double> values(const Tensor& t) { return t.to(DType::kF64).to_vector<double>(); }

/// got has shape `want` and dtype `dtype`; reports under `config` otherwise.
inline void expect_shape(const Tensor& got, const Shape& want, DType dtype, const std::string& config) {
  BOOST_CHECK_MESSAGE(got.shape() == want && got.dtype() == dtype,
                      config << ": got shape " << got.shape() << " dtype " << got.dtype() << ", want shape " << want
                             << " dtype " << dtype);
}

enum class Layout { kContiguous, kTransposed, kStrided, kExpanded };

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kTransposed: return "transposed";
    case Layout::kStrided: return "strided";
    case Layout::kExpanded: return "expanded";
  }
  return "?";
}

/// Uniform values in [lo, hi) of `shape` and `dtype`, laid out as `layout`
/// (the non-contiguous layouts need >= 2 dims): a transposed view, every
/// other element of a wider tensor, or a size-1 dim 0 expanded.
inline Tensor input(const Shape& shape, DType dtype, double lo, double hi, uint64_t seed,
                    Layout layout = Layout::kContiguous) {
  Generator gen(seed);
  Shape s = shape;
  const int64_t r = shape.size();
  switch (layout) {
    case Layout::kContiguous: return uniform(shape, lo, hi, dtype, &gen);
    case Layout::kTransposed:
      std::swap(s[r - 1], s[r - 2]);
      return uniform(s, lo, hi, dtype, &gen).transpose(-1, -2);
    case Layout::kStrided:
      s[r - 1] = 2 * shape[r - 1] + 1;
      return uniform(s, lo, hi, dtype, &gen).slice(-1, 1, s[r - 1], 2);
    case Layout::kExpanded:
      s[0] = 1;
      return uniform(s, lo, hi, dtype, &gen).expand(shape);
  }
  return {};
}

}  // namespace mixtape::test
