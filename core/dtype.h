// core/dtype.h — element types, their C++ types, and dispatch over them.
//
// One enum names every dtype; `dispatch` turns a runtime DType into a
// compile-time C++ type once, so kernels are templates over `T` and the
// switch lives in exactly one place. `opmath_t<T>` is the type arithmetic on
// T happens in (STYLE.md §2): f16/bf16 compute in f32 and round once.
#pragma once

#include <cstdint>
#include <limits>
#include <ostream>
#include <type_traits>

#include <mixtape/core/error.h>
#include <mixtape/core/half.h>
#include <mixtape/core/macros.h>

namespace mixtape {

enum class DType : uint8_t { kF64, kF32, kF16, kBF16, kI64, kI32, kU8, kBool };

inline constexpr DType kF64 = DType::kF64;
inline constexpr DType kF32 = DType::kF32;
inline constexpr DType kF16 = DType::kF16;
inline constexpr DType kBF16 = DType::kBF16;
inline constexpr DType kI64 = DType::kI64;
inline constexpr DType kI32 = DType::kI32;
inline constexpr DType kU8 = DType::kU8;
inline constexpr DType kBool = DType::kBool;

inline constexpr int kNumDTypes = 8;

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI64: return "i64";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}
/// f16 and bf16: stored in 16 bits, computed in f32.
constexpr bool is_reduced_float(DType t) { return t == DType::kF16 || t == DType::kBF16; }

/// Whether the scalar `value` can be written into `dtype` without overflow, PyTorch's rule for a scalar turned into
/// an element (full, fill_, item): a floating dtype takes infinities, NaN and finite values up to its largest;
/// an integer dtype takes finite values in its range (a fraction is then cut toward zero); bool takes any value.
constexpr bool fits(double value, DType dtype) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const bool finite = value == value && value != inf && value != -inf;
  auto within = [&](double largest) { return !finite || (value >= -largest && value <= largest); };
  switch (dtype) {
    case DType::kF64: return true;
    case DType::kF32: return within(3.4028234663852886e38);
    case DType::kBF16: return within(3.3895313892515355e38);
    case DType::kF16: return within(65504.0);
    case DType::kI64: return value >= -0x1p63 && value < 0x1p63;
    case DType::kI32: return value >= -2147483648.0 && value <= 2147483647.0;
    case DType::kU8: return value >= 0.0 && value <= 255.0;
    case DType::kBool: return true;
  }
  return false;
}

/// The one accumulator rule: the dtype sums, statistics and multi-step formulas on `t` run in before the one
/// rounding back — f32 for f16/bf16, `t` itself otherwise (f32 stays f32, f64 stays f64). opmath_t below is the
/// same rule for C++ types.
constexpr DType acc_dtype(DType t) { return is_reduced_float(t) ? DType::kF32 : t; }

/// The dtype arithmetic on two dtypes happens in: the wider float wins, any
/// float beats any integer, f16 with bf16 gives f32 (neither holds the other).
constexpr DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::kBool: return 0;
      case DType::kU8: return 1;
      case DType::kI32: return 2;
      case DType::kI64: return 3;
      case DType::kF16: case DType::kBF16: return 4;
      case DType::kF32: return 5;
      case DType::kF64: return 6;
    }
    return 0;
  };
  if (is_reduced_float(a) && is_reduced_float(b)) return DType::kF32;
  return rank(a) >= rank(b) ? a : b;
}

// ---- C++ type <-> DType -------------------------------------------------------

template <class T> struct dtype_of;
template <> struct dtype_of<double> { static constexpr DType value = DType::kF64; };
template <> struct dtype_of<float> { static constexpr DType value = DType::kF32; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::kF16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::kBool; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

/// The type arithmetic on T is done in: f16/bf16 -> float, otherwise T itself.
template <class T> struct opmath { using type = T; };
template <> struct opmath<Half> { using type = float; };
template <> struct opmath<BFloat16> { using type = float; };
template <class T> using opmath_t = typename opmath<T>::type;

static_assert(std::is_same_v<opmath_t<Half>, float> && std::is_same_v<opmath_t<BFloat16>, float> &&
              std::is_same_v<opmath_t<double>, double> && std::is_same_v<opmath_t<float>, float>);
static_assert(acc_dtype(DType::kF16) == dtype_v<opmath_t<Half>> &&
                  acc_dtype(DType::kBF16) == dtype_v<opmath_t<BFloat16>> &&
                  acc_dtype(DType::kF32) == dtype_v<opmath_t<float>> &&
                  acc_dtype(DType::kF64) == dtype_v<opmath_t<double>> && acc_dtype(DType::kI64) == DType::kI64,
              "acc_dtype and opmath_t are one rule");

/// A value carrying a type, so generic lambdas can be handed one: `[](auto tag) { using T = decltype(tag)::type; }`.
template <class T> struct TypeTag { using type = T; };

/// Calls `f(TypeTag<T>{})` for the C++ type of `t`.
template <class F>
decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kF64: return f(TypeTag<double>{});
    case DType::kF32: return f(TypeTag<float>{});
    case DType::kF16: return f(TypeTag<Half>{});
    case DType::kBF16: return f(TypeTag<BFloat16>{});
    case DType::kI64: return f(TypeTag<int64_t>{});
    case DType::kI32: return f(TypeTag<int32_t>{});
    case DType::kU8: return f(TypeTag<uint8_t>{});
    case DType::kBool: return f(TypeTag<bool>{});
  }
  MT_ERROR("dispatch: unknown dtype ", static_cast<int>(t));
}

/// Like dispatch, for ops defined on floating dtypes only; `op` names the caller in the error.
template <class F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::kF64: return f(TypeTag<double>{});
    case DType::kF32: return f(TypeTag<float>{});
    case DType::kF16: return f(TypeTag<Half>{});
    case DType::kBF16: return f(TypeTag<BFloat16>{});
    default: break;
  }
  MT_ERROR(op, ": expected a floating dtype (f64, f32, f16, bf16), got ", t);
}

/// A floating value cut toward zero into the integer type To, defined for every value: NaN gives 0, values past
/// To's range its lowest or largest. A plain C++ cast of those is undefined (GCC on x86 gives INT_MIN for all of
/// them in i32/i64 and wraps u8: 300 -> 44; ARM saturates as here; nvcc casts to u8 through cvt.rzi.u32 and keeps
/// the low byte, 300 -> 44 again); PyTorch leaves them undefined.
template <class To, class F>
MT_HD constexpr To saturating_cast(F x) {
  static_assert(std::is_integral_v<To> && std::is_floating_point_v<F>);
  constexpr F past_largest = F(2) * F(std::numeric_limits<To>::max() / 2 + 1);  // 2^63, 2^31, 256: exact
  if (x != x) return To(0);
  if (x >= past_largest) return std::numeric_limits<To>::max();
  if (x < F(std::numeric_limits<To>::lowest())) return std::numeric_limits<To>::lowest();
  return static_cast<To>(x);
}

/// Converts between any two element types the way a cast kernel does:
/// through opmath, rounding to nearest even once for f16/bf16 targets (an i64 past 2^53 is rounded to double
/// first: twice then, as PyTorch's through float); floating to integer cut toward zero, saturating
/// (saturating_cast), on the CPU and on a GPU alike.
template <class To, class From>
MT_HD inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    if constexpr (std::is_same_v<From, double> || std::is_same_v<From, int64_t>)
      return To(static_cast<double>(v));  // one rounding from double (an i64 past 2^53: two)
    else
      return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<opmath_t<From>>(v) != opmath_t<From>(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<opmath_t<From>>) {
    return saturating_cast<To>(static_cast<opmath_t<From>>(v));
  } else {
    return static_cast<To>(static_cast<opmath_t<From>>(v));
  }
}

}  // namespace mixtape
