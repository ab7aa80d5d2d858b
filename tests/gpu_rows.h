// tests/gpu_rows.h — what the GPU tests of the row kernels share: softmax (tests/test_softmax.cpp), layer norm
// (tests/test_norm.cpp) and the fused cross-entropy (tests/test_loss.cpp), each against the CPU's kernel.
//
// Both backends reduce a row in f32 (f64), but in different orders, so a
// reduction over n terms gets one stated allowance on top of the dtype's
// tolerance (tests/tolerance.h): |gpu − cpu| may exceed the table by
// kOrderUlps · √n · 2⁻²⁴ · max|cpu| (the rounding-error growth of a sum in
// f32; negligible next to an f16/bf16 output's own rounding).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/core/raw.h>
#include <mixtape/core/tensor.h>

#include "tolerance.h"

namespace mixtape::test {

constexpr double kOrderUlps = 4.0;
constexpr double kF32Eps = 5.9604644775390625e-08;  // 2^-24

/// The allowance for reduction order over n terms, relative to the magnitude of the result.
inline double order_allowance(int64_t n) { return kOrderUlps * std::sqrt(static_cast<double>(n)) * kF32Eps; }

/// `tol` with its atol raised by extra · max|expected| over expected's finite elements: an allowance relative to
/// the result's magnitude (order_allowance), for expect_close.
inline Tolerance with_allowance(Tolerance tol, double extra, const Tensor& expected) {
  double scale = 0;
  for (double v : raw::to(expected, Device::cpu()).to_vector<double>())
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  return {tol.rtol, tol.atol + extra * scale};
}

/// A gradient through autograd is computed from each device's own forward output, and those may round to
/// neighbouring values (1 ulp apart in f16 is within tolerance(dt)); the backward then rounds once more.
/// Two roundings apart, so twice the relative tolerance (seen on an H100: softmax f16 dx off by 2 ulp).
inline Tolerance chained(DType dt) {
  const Tolerance t = tolerance(dt);
  return {2 * t.rtol, t.atol};
}

inline std::string describe(const Tensor& t) {
  std::ostringstream os;
  os << t.dtype() << " shape " << t.shape() << (t.is_contiguous() ? "" : " (non-contiguous)");
  return os.str();
}

/// Row lengths for the row kernels. Multiples of 8 elements take the register kernels up to 32768: a warp a row
/// up to 1024 (8, 40: one 16-byte pack a lane; 200, 400, 1000: 1, 2 or 4 packs for f32/f16/bf16, 1000 with lanes
/// past the row's end), a 256-thread block up to 8192 (1032, 4096, 6000, 8192), a 1024-thread block up to 32768
/// (8200, 20000 and 32768; the backward keeps y or x in shared memory from 8196 in f32, 16392 in 16-bit); 32776 is
/// vectorised but too long, and the odd lengths (7, 1023, 1025, 8193, 32769, 65537) take the strided kernels on
/// either side of each boundary.
constexpr int64_t kRowLengths[] = {1,    7,    8,    32,   40,   200,   400,   1000,  1023,  1024,  1025,
                                   1032, 4096, 6000, 8192, 8193, 8200, 20000, 32768, 32769, 32776, 65537};

/// Six f32 rows of C with special values: NaNs (row 0: at column 3 and at column 0, the first element of a thread's
/// first pack), −inf at every even column (row 1), all −inf (row 2), a plain row with one 5 (row 3), a +inf (row 4),
/// and −inf everywhere but a 5 at the end (row 5: one thread holds the max, the others only −inf).
inline Tensor special_rows(int64_t C) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = zeros({6, C});
  x.set({0, 3 % C}, nan);
  x.set({0, 0}, nan);
  for (int64_t c = 0; c < C; c += 2) x.set({1, c}, -inf);
  for (int64_t c = 0; c < C; ++c) x.set({2, c}, -inf);
  x.set({3, C - 1}, 5.0);
  x.set({4, C / 2}, inf);
  for (int64_t c = 0; c + 1 < C; ++c) x.set({5, c}, -inf);
  x.set({5, C - 1}, 5.0);
  return x;
}

}  // namespace mixtape::test
