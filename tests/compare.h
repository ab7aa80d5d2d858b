// tests/compare.h — the one way tests compare tensors and check error messages.
//
// Every comparison reads both sides on the CPU as float64 and applies one
// rule: element i agrees when both are NaN, or they are equal (infinities
// included), or |actual − expected| <= atol + rtol·|expected| + allowance[i].
// A failure is one BOOST_ERROR that names what was compared, the shapes and
// dtypes, how many elements differ and the first five mismatching pairs
// (STYLE.md §6), so a caller adds nothing but `what`:
//
//   expect_close(kernels::softmax(x.cuda(), 1, false, dt), kernels::softmax(x, 1, false, dt), tolerance(dt),
//                "softmax of f16 (37, 1000), cuda vs cpu");
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include <mixtape/core/tensor.h>

#include "tolerance.h"

namespace mixtape::test {

/// Zero tolerance: the values must be equal (NaN matching NaN; integers and bool always compare so).
constexpr Tolerance kExact{0.0, 0.0};

/// `actual` against `expected` (any devices, any layouts) elementwise under the rule above; `allowance`, when
/// given, holds one extra absolute tolerance per element (an error bound that depends on the element). The shapes
/// must match, and so must the dtypes unless `expected` is f64 (a float64 reference of a lower-precision result).
/// Returns whether every element agrees; reports the failure itself.
bool expect_close(const Tensor& actual, const Tensor& expected, Tolerance tol, const std::string& what,
                  std::span<const double> allowance = {});

/// `actual` (row-major, any dtype and shape) against a list of expected values, one per element, by the same rule.
bool expect_values(const Tensor& actual, const std::vector<double>& expected, Tolerance tol, const std::string& what,
                   std::span<const double> allowance = {});

/// a and b have the same dtype, shape and bytes (after contiguous() and moving to the CPU): bit for bit, NaN
/// payloads and signed zeros included.
bool expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what);

/// ‖got − want‖ / ‖want‖ (Frobenius, in double on the host; ‖got − want‖ when want is all zeros), or +inf when
/// got has a non-finite element. For results whose error is bounded in norm rather than per element (GEMMs).
double relative_error(const Tensor& got, const Tensor& want);

/// Runs `f`, which must throw mixtape::Error whose message contains every one of `parts`; reports what is
/// missing (or that nothing, or another exception, was thrown). Returns the message ("" when there was none),
/// for checks beyond containment.
std::string expect_error(const std::function<void()>& f, const std::vector<std::string>& parts);

}  // namespace mixtape::test
