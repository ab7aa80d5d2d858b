// ops/backend/scalar_math.h — the scalar formula of every elementwise op, for host and device (internal).
//
// One design idea (STYLE.md §2): the CPU loop (ops/cpu/elementwise.cpp) and
// the CUDA kernels call the same MT_HD functions, so the two backends differ
// only in how they walk memory, never in the arithmetic. Every formula takes
// and returns an opmath type (float or double; the integer ops also take the
// integer types): callers load T, widen to opmath_t<T>, call one of these,
// and round once on the store.
//
// Math calls go through `detail::` overloads that name the C function of the
// right precision (`::expf` for float, `::exp` for double): those exist in
// both host and device code under nvcc, unlike the host-only std:: overload
// sets, and they make the precision of each call explicit.
//
// The second half maps the kernel enums of ops/backend/kernels.h to these formulas at
// compile time (`unary_op<UnaryOp::kExp>(x)`), and `visit_op` turns a runtime
// enum into that compile-time one, so each backend instantiates one tight
// loop per op.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <mixtape/core/macros.h>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::math {

/// True for the floating element types: double, float, Half, BFloat16.
template <class T>
inline constexpr bool is_floating_v =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
/// True for the integer element types arithmetic is defined on (bool is not one).
template <class T>
inline constexpr bool is_arithmetic_integer_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

namespace detail {
MT_HD inline float exp(float x) { return ::expf(x); }
MT_HD inline double exp(double x) { return ::exp(x); }
MT_HD inline float log(float x) { return ::logf(x); }
MT_HD inline double log(double x) { return ::log(x); }
MT_HD inline float sqrt(float x) { return ::sqrtf(x); }
MT_HD inline double sqrt(double x) { return ::sqrt(x); }
MT_HD inline float tanh(float x) { return ::tanhf(x); }
MT_HD inline double tanh(double x) { return ::tanh(x); }
MT_HD inline float erf(float x) { return ::erff(x); }
MT_HD inline double erf(double x) { return ::erf(x); }
MT_HD inline float pow(float x, float y) { return ::powf(x, y); }
MT_HD inline double pow(double x, double y) { return ::pow(x, y); }
MT_HD inline float fabs(float x) { return ::fabsf(x); }
MT_HD inline double fabs(double x) { return ::fabs(x); }
}  // namespace detail

// Integer arithmetic wraps modulo 2^bits like PyTorch's, computed in the
// unsigned type so overflow is defined behaviour (C++20 defines the
// conversion back). Floating types use the plain operators.
template <class T>
MT_HD inline T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class T>
MT_HD inline T sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class T>
MT_HD inline T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}
template <class T>
MT_HD inline T neg(T x) {
  return sub(T(0), x);
}
template <class T>
MT_HD inline T abs(T x) {
  if constexpr (std::is_integral_v<T>) {
    return x < T(0) ? neg(x) : x;  // abs(INT_MIN) wraps to INT_MIN, as in PyTorch
  } else {
    return detail::fabs(x);  // abs(-0) is +0
  }
}
/// -1, 0 or 1; sign(±0) is ±0 and sign(NaN) is NaN, as in PyTorch.
template <class T>
MT_HD inline T sign(T x) {
  return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x);
}
template <class T>
MT_HD inline T square(T x) {
  return mul(x, x);
}
template <class T>
MT_HD inline T reciprocal(T x) {
  return T(1) / x;
}
template <class T>
MT_HD inline T rsqrt(T x) {
  return T(1) / detail::sqrt(x);
}

/// max(a, b) that propagates NaN from either side (torch.maximum).
template <class T>
MT_HD inline T maximum(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}
/// min(a, b) that propagates NaN from either side (torch.minimum).
template <class T>
MT_HD inline T minimum(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return a < b ? a : b;
}

// ---- activations and their backward formulas -----------------------------------
// sqrt(1/2), 1/sqrt(2 pi), sqrt(2/pi), and the cubic coefficient of the tanh GELU.
inline constexpr double kSqrtHalf = 0.70710678118654752440;
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;
inline constexpr double kGeluKappa = 0.044715;

/// max(x, 0); NaN stays NaN.
template <class T>
MT_HD inline T relu(T x) {
  return x < T(0) ? T(0) : x;
}
/// 0 where x <= 0, else dy (the subgradient at 0 is 0; a NaN x passes dy: PyTorch's threshold_backward). x may be
/// relu's input or its output (the op keeps the output): both are <= 0 at the same elements.
template <class T>
MT_HD inline T relu_backward(T dy, T x) {
  return x <= T(0) ? T(0) : dy;
}

/// Exact GELU: x Φ(x) = 0.5 x (1 + erf(x / sqrt 2)).
template <class T>
MT_HD inline T gelu(T x) {
  return T(0.5) * x * (T(1) + detail::erf(x * T(kSqrtHalf)));
}
/// d/dx [x Φ(x)] = Φ(x) + x φ(x).
template <class T>
MT_HD inline T gelu_backward(T dy, T x) {
  const T cdf = T(0.5) * (T(1) + detail::erf(x * T(kSqrtHalf)));
  const T pdf = T(kInvSqrt2Pi) * detail::exp(T(-0.5) * x * x);
  return dy * (cdf + x * pdf);
}

/// PyTorch's gelu(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
MT_HD inline T gelu_tanh(T x) {
  const T inner = T(kSqrt2OverPi) * (x + T(kGeluKappa) * x * x * x);
  return T(0.5) * x * (T(1) + detail::tanh(inner));
}
/// The derivative of gelu_tanh, arranged as PyTorch's GeluBackward (approximate='tanh').
template <class T>
MT_HD inline T gelu_tanh_backward(T dy, T x) {
  const T x_sq = x * x;
  const T inner = T(kSqrt2OverPi) * (x + T(kGeluKappa) * x_sq * x);
  const T t = detail::tanh(inner);
  const T left = T(0.5) * x;
  const T right = T(1) + t;
  const T left_derivative = T(0.5) * right;
  const T right_derivative = T(1) - t * t;
  const T inner_derivative = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluKappa) * x_sq);
  return dy * (left_derivative + left * right_derivative * inner_derivative);
}

/// 1 / (1 + e^-x), evaluated so that exp never overflows: for x < 0 it is e^x / (1 + e^x).
template <class T>
MT_HD inline T sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + detail::exp(-x));
  const T e = detail::exp(x);  // NaN lands here and stays NaN
  return e / (T(1) + e);
}
/// Takes the forward output y = sigmoid(x): dy y (1 - y).
template <class T>
MT_HD inline T sigmoid_backward(T dy, T y) {
  return dy * y * (T(1) - y);
}
/// Takes the forward output y = tanh(x): dy (1 - y^2).
template <class T>
MT_HD inline T tanh_backward(T dy, T y) {
  return dy * (T(1) - y * y);
}

// ---- enum -> formula ------------------------------------------------------------

/// Comparisons return bool and are defined on every dtype, bool included.
constexpr bool is_comparison(kernels::BinaryOp op) {
  using enum kernels::BinaryOp;
  return op == kEq || op == kNe || op == kLt || op == kLe || op == kGt || op == kGe;
}

/// Whether an op is defined on integer dtypes (i64, i32, u8); everything else needs a floating dtype.
constexpr bool supports_integers(kernels::UnaryOp op) {
  using enum kernels::UnaryOp;
  return op == kNeg || op == kAbs || op == kSign || op == kSquare;
}
constexpr bool supports_integers(kernels::BinaryOp op) {
  using enum kernels::BinaryOp;
  return op == kAdd || op == kSub || op == kMul || op == kMaximum || op == kMinimum || is_comparison(op);
}
constexpr bool supports_integers(kernels::ScalarOp op) {
  using enum kernels::ScalarOp;
  return op == kAdd || op == kMul || op == kRsub || op == kMaximum || op == kMinimum;
}

template <kernels::UnaryOp kOp, class T>
MT_HD inline T unary_op(T x) {
  using enum kernels::UnaryOp;
  if constexpr (kOp == kNeg) return neg(x);
  else if constexpr (kOp == kAbs) return abs(x);
  else if constexpr (kOp == kSign) return sign(x);
  else if constexpr (kOp == kSquare) return square(x);
  else if constexpr (kOp == kReciprocal) return reciprocal(x);
  else if constexpr (kOp == kExp) return detail::exp(x);
  else if constexpr (kOp == kLog) return detail::log(x);
  else if constexpr (kOp == kSqrt) return detail::sqrt(x);
  else if constexpr (kOp == kRsqrt) return rsqrt(x);
  else if constexpr (kOp == kRelu) return relu(x);
  else if constexpr (kOp == kGelu) return gelu(x);
  else if constexpr (kOp == kGeluTanh) return gelu_tanh(x);
  else if constexpr (kOp == kSigmoid) return sigmoid(x);
  else if constexpr (kOp == kTanh) return detail::tanh(x);
  else static_assert(kOp == kNeg, "unary_op: an op without a formula");
}

/// Arithmetic ops return T; comparisons return bool.
template <kernels::BinaryOp kOp, class T>
MT_HD inline auto binary_op(T a, T b) {
  using enum kernels::BinaryOp;
  if constexpr (kOp == kAdd) return add(a, b);
  else if constexpr (kOp == kSub) return sub(a, b);
  else if constexpr (kOp == kMul) return mul(a, b);
  else if constexpr (kOp == kDiv) return a / b;
  else if constexpr (kOp == kMaximum) return maximum(a, b);
  else if constexpr (kOp == kMinimum) return minimum(a, b);
  else if constexpr (kOp == kPow) return detail::pow(a, b);
  else if constexpr (kOp == kReluBackward) return relu_backward(a, b);
  else if constexpr (kOp == kGeluBackward) return gelu_backward(a, b);
  else if constexpr (kOp == kGeluTanhBackward) return gelu_tanh_backward(a, b);
  else if constexpr (kOp == kSigmoidBackward) return sigmoid_backward(a, b);
  else if constexpr (kOp == kTanhBackward) return tanh_backward(a, b);
  else if constexpr (kOp == kEq) return a == b;
  else if constexpr (kOp == kNe) return a != b;
  else if constexpr (kOp == kLt) return a < b;
  else if constexpr (kOp == kLe) return a <= b;
  else if constexpr (kOp == kGt) return a > b;
  else if constexpr (kOp == kGe) return a >= b;
  else static_assert(kOp == kAdd, "binary_op: an op without a formula");
}

/// op(x, s) with the scalar already converted to x's opmath type.
template <kernels::ScalarOp kOp, class T>
MT_HD inline T scalar_op(T x, T s) {
  using enum kernels::ScalarOp;
  if constexpr (kOp == kAdd) return add(x, s);
  else if constexpr (kOp == kMul) return mul(x, s);
  else if constexpr (kOp == kPow) return detail::pow(x, s);
  else if constexpr (kOp == kRsub) return sub(s, x);
  else if constexpr (kOp == kRdiv) return s / x;
  else if constexpr (kOp == kDiv) return x / s;
  else if constexpr (kOp == kMaximum) return maximum(x, s);
  else if constexpr (kOp == kMinimum) return minimum(x, s);
  else static_assert(kOp == kAdd, "scalar_op: an op without a formula");
}

// ---- runtime enum -> compile-time enum (host code) -------------------------------

/// Calls `f(std::integral_constant<E, op>{})`: the one switch from a runtime op
/// to a template argument. E's enumerators must be 0, 1, ..., kCount - 1; an
/// op beyond them (an enumerator appended without updating the count below)
/// throws instead of silently running nothing.
template <class E, int kCount, class F>
void visit_op(E op, F&& f) {
  const bool found = [&]<int... I>(std::integer_sequence<int, I...>) {
    return ((static_cast<int>(op) == I ? (f(std::integral_constant<E, static_cast<E>(I)>{}), true) : false) || ...);
  }(std::make_integer_sequence<int, kCount>{});
  MT_CHECK(found, "visit_op: op ", static_cast<int>(op), " is past the last enumerator this build knows (",
           kCount - 1, "); update the counts in ops/backend/scalar_math.h");
}

// Enumerator counts: the last enumerator of each enum in ops/backend/kernels.h, plus one.
inline constexpr int kNumUnaryOps = static_cast<int>(kernels::UnaryOp::kTanh) + 1;
inline constexpr int kNumBinaryOps = static_cast<int>(kernels::BinaryOp::kGe) + 1;
inline constexpr int kNumScalarOps = static_cast<int>(kernels::ScalarOp::kMinimum) + 1;

}  // namespace mixtape::math
