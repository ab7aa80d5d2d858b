// ops/cpu/elementwise.cpp — unary, binary, scalar and where kernels on the CPU.
//
// One loop serves them all: `map` expands the inputs to the output's shape
// (broadcast dims get stride 0), coalesces the K = 1 + inputs operands with
// make_strided_layout, cuts [0, numel) into fixed chunks for OpenMP and hands
// each run along the innermost dim to a tight loop; the loop where every
// operand is contiguous is a plain indexed loop the compiler vectorises. The
// arithmetic itself is ops/backend/scalar_math.h, shared with the CUDA
// kernels: load T, compute in opmath_t<T>, store T with one rounding
// (convert<T>); f16/bf16 runs take that path in blocks, widened and rounded
// back with core/convert.h's vector conversions (map_opmath). The plain kernels allocate their output and overwrite it; the
// in-place ones (unary_, binary_, scalar_) run the same loop with the first
// operand as the output: each element is read before it is written, by the
// same iteration.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include <mixtape/core/convert.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/backend/scalar_math.h>

namespace mixtape::kernels::cpu {

namespace {

// Elements per OpenMP work item: big enough to amortise the scheduling, small
// enough that a 1M-element op still spreads over every core.
constexpr int64_t kGrain = 32768;

/// Calls `run` on every run of L's index space, over fixed chunks of kGrain
/// elements in parallel when there are at least two chunks.
template <int K, class Run>
void parallel_runs(const StridedLayout<K>& L, const std::array<char*, K>& base, const Run& run) {
  const int64_t numel = L.numel;
  if (numel < 2 * kGrain) {
    for_each_run<K>(L, base, 0, numel, run);
    return;
  }
  const int64_t chunks = (numel + kGrain - 1) / kGrain;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) for_each_run<K>(L, base, c * kGrain, std::min(numel, (c + 1) * kGrain), run);
}

template <class Out, class... In, class F, size_t... I>
void map_impl(const Tensor& out, const std::array<Tensor, sizeof...(In)>& in, const F& f, std::index_sequence<I...>) {
  constexpr int K = 1 + sizeof...(In);
  const auto L = make_strided_layout<K>(out.shape(), {&out.strides(), &in[I].strides()...},
                                        {static_cast<int64_t>(sizeof(Out)), static_cast<int64_t>(sizeof(In))...});
  const std::array<char*, K> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(in[I].data_ptr())...};
  auto run = [&f](const std::array<char*, K>& p, const std::array<int64_t, K>& s, int64_t n) {
    const bool contiguous = ((s[0] == static_cast<int64_t>(sizeof(Out))) && ... &&
                             (s[I + 1] == static_cast<int64_t>(sizeof(In))));
    if (contiguous) {
      // Typed local pointers: no aliasing through the pointer array, so the loop vectorises.
      Out* o = reinterpret_cast<Out*>(p[0]);
      const std::tuple<const In*...> q{reinterpret_cast<const In*>(p[I + 1])...};
      for (int64_t i = 0; i < n; ++i) o[i] = f(std::get<I>(q)[i]...);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const In*>(p[I + 1] + i * s[I + 1])...);
    }
  };
  parallel_runs<K>(L, base, run);
}

/// out[i] = f(in_0[i], ..., in_{N-1}[i]) for every index of out's shape; each
/// input already has that shape (expand it first). Overwrites out.
template <class Out, class... In, class F>
void map(const Tensor& out, const std::array<Tensor, sizeof...(In)>& in, const F& f) {
  if (out.numel() == 0) return;
  map_impl<Out, In...>(out, in, f, std::index_sequence_for<In...>{});
}

template <class T>
constexpr bool kSixteenBitFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// map for f16/bf16 operands whose formula `fm` is written in f32: a contiguous run goes in blocks, each input
/// widened with core/convert.h's vector conversions, fm applied over f32 arrays (a loop the compiler vectorises)
/// and the results rounded back in bulk: the element-wise path's one rounding per output (convert_n and convert<T>
/// are bit-exact twins), at vector speed. Reads of a block precede its writes, so out may be in[0] itself.
template <class T, class FM, size_t... I>
void map_sixteen_bit(const Tensor& out, const std::array<Tensor, sizeof...(I)>& in, const FM& fm,
                     std::index_sequence<I...>) {
  constexpr int K = 1 + sizeof...(I);
  constexpr auto kSize = static_cast<int64_t>(sizeof(T));
  const auto L = make_strided_layout<K>(out.shape(), {&out.strides(), &in[I].strides()...}, {kSize, ((void)I, kSize)...});
  const std::array<char*, K> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(in[I].data_ptr())...};
  auto run = [&fm](const std::array<char*, K>& p, const std::array<int64_t, K>& s, int64_t n) {
    if (!((s[0] == kSize) && ... && (s[I + 1] == kSize))) {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) =
            convert<T>(fm(static_cast<float>(*reinterpret_cast<const T*>(p[I + 1] + i * s[I + 1]))...));
      return;
    }
    constexpr int64_t kBlock = 512;
    alignas(64) float args[sizeof...(I)][kBlock];
    alignas(64) float result[kBlock];
    for (int64_t j = 0; j < n; j += kBlock) {
      const int64_t m = std::min(kBlock, n - j);
      (convert_n(reinterpret_cast<const T*>(p[I + 1]) + j, args[I], m), ...);
      for (int64_t i = 0; i < m; ++i) result[i] = fm(args[I][i]...);
      convert_n(result, reinterpret_cast<T*>(p[0]) + j, m);
    }
  };
  parallel_runs<K>(L, base, run);
}

/// out[i] = round_T(fm(in_0[i], ...)) for a floating T, fm written in opmath_t<T>.
template <class T, size_t N, class FM>
void map_opmath(const Tensor& out, const std::array<Tensor, N>& in, const FM& fm) {
  using M = opmath_t<T>;
  if (out.numel() == 0) return;
  if constexpr (kSixteenBitFloat<T>) {
    map_sixteen_bit<T>(out, in, fm, std::make_index_sequence<N>{});
  } else if constexpr (N == 1) {
    map<T, T>(out, in, [&fm](T v) { return convert<T>(fm(static_cast<M>(v))); });
  } else {
    static_assert(N == 2);
    map<T, T, T>(out, in, [&fm](T u, T v) { return convert<T>(fm(static_cast<M>(u), static_cast<M>(v))); });
  }
}

/// relu and its backward on f16/bf16 patterns, without widening. Both only choose between an operand and +0, so
/// the widened path (widen, choose, round back) returns the chosen operand's bits, but that a NaN comes back quiet
/// (core/half.h's NaN rule): these give the same bits from the bits, in a loop of 16-bit integer selects
/// (tests/test_elementwise.cpp compares every pattern with the widened path).
template <class T>
struct ReluBits {
  static constexpr uint16_t kInf = std::is_same_v<T, Half> ? 0x7c00 : 0x7f80;    // +inf; above it (sign cleared): NaN
  static constexpr uint16_t kQuiet = std::is_same_v<T, Half> ? 0x0200 : 0x0040;  // the quiet bit of a NaN
  /// What the widened path makes of a chosen operand b: b, quieted when a NaN.
  static uint16_t kept(uint16_t b) { return (b & 0x7fff) > kInf ? b | kQuiet : b; }
  /// relu: x < 0 (sign set, not -0, not NaN) gives +0, anything else itself.
  static uint16_t relu(uint16_t x) { return x > 0x8000 && (x & 0x7fff) <= kInf ? uint16_t{0} : kept(x); }
  /// relu_backward: +0 where x <= 0 (+0, or sign set and not NaN), else dy (a NaN x included).
  static uint16_t backward(uint16_t dy, uint16_t x) {
    return x == 0 || (x > 0x7fff && (x & 0x7fff) <= kInf) ? uint16_t{0} : kept(dy);
  }
};

// One instantiation per (op, dtype); the op is a template argument, so each
// loop is compiled with its formula inlined.

template <UnaryOp kOp, class T>
void unary_kernel(const Tensor& y, const Tensor& x) {
  using M = opmath_t<T>;
  if constexpr (kSixteenBitFloat<T> && kOp == UnaryOp::kRelu) {
    map<uint16_t, uint16_t>(y, {x}, [](uint16_t v) { return ReluBits<T>::relu(v); });
  } else if constexpr (math::is_floating_v<T>) {
    map_opmath<T, 1>(y, {x}, [](M v) { return math::unary_op<kOp>(v); });
  } else if constexpr (math::supports_integers(kOp) && math::is_arithmetic_integer_v<T>) {
    map<T, T>(y, {x}, [](T v) { return convert<T>(math::unary_op<kOp>(static_cast<M>(v))); });
  } else {
    MT_ERROR(name(kOp), ": not defined for dtype ", x.dtype(), " (shape ", x.shape(), ")");
  }
}

template <BinaryOp kOp, class T>
void binary_kernel(const Tensor& out, const std::array<Tensor, 2>& in) {
  using M = opmath_t<T>;
  if constexpr (math::is_comparison(kOp)) {
    map<bool, T, T>(out, in, [](T u, T v) { return math::binary_op<kOp>(static_cast<M>(u), static_cast<M>(v)); });
  } else if constexpr (kSixteenBitFloat<T> && kOp == BinaryOp::kReluBackward) {
    map<uint16_t, uint16_t, uint16_t>(out, in, [](uint16_t dy, uint16_t x) { return ReluBits<T>::backward(dy, x); });
  } else if constexpr (math::is_floating_v<T>) {
    map_opmath<T, 2>(out, in, [](M u, M v) { return math::binary_op<kOp>(u, v); });
  } else if constexpr (math::supports_integers(kOp) && math::is_arithmetic_integer_v<T>) {
    map<T, T, T>(out, in, [](T u, T v) {
      return convert<T>(math::binary_op<kOp>(static_cast<M>(u), static_cast<M>(v)));
    });
  } else {
    MT_ERROR(name(kOp), ": not defined for dtype ", in[0].dtype(), " (shapes ", in[0].shape(), " and ",
             in[1].shape(), ")");
  }
}

template <ScalarOp kOp, class T>
void scalar_kernel(const Tensor& y, const Tensor& x, double s) {
  using M = opmath_t<T>;
  if constexpr (math::is_floating_v<T>) {
    // Like PyTorch, the scalar is first converted to the opmath type.
    const M sm = static_cast<M>(s);
    map_opmath<T, 1>(y, {x}, [sm](M v) { return math::scalar_op<kOp>(v, sm); });
  } else if constexpr (math::supports_integers(kOp) && math::is_arithmetic_integer_v<T>) {
    // Validated integral; out-of-range values wrap like the arithmetic does.
    const T si = static_cast<T>(static_cast<int64_t>(s));
    map<T, T>(y, {x}, [si](T v) { return math::scalar_op<kOp>(v, si); });
  } else {
    MT_ERROR(name(kOp), ": not defined for dtype ", x.dtype(), " (shape ", x.shape(), ")");
  }
}

/// out = op(x); out is a new tensor of x's shape, or x itself.
void unary_into(UnaryOp op, const Tensor& out, const Tensor& x) {
  math::visit_op<UnaryOp, math::kNumUnaryOps>(op, [&](auto op_c) {
    dispatch(x.dtype(), [&](auto tag) { unary_kernel<decltype(op_c)::value, typename decltype(tag)::type>(out, x); });
  });
}

/// out = op(in[0], in[1]), the inputs expanded to out's shape; out is new, or in[0] itself.
void binary_into(BinaryOp op, const Tensor& out, const std::array<Tensor, 2>& in) {
  math::visit_op<BinaryOp, math::kNumBinaryOps>(op, [&](auto op_c) {
    dispatch(in[0].dtype(), [&](auto tag) { binary_kernel<decltype(op_c)::value, typename decltype(tag)::type>(out, in); });
  });
}

/// out = op(x, s); out is a new tensor of x's shape, or x itself.
void scalar_into(ScalarOp op, const Tensor& out, const Tensor& x, double s) {
  math::visit_op<ScalarOp, math::kNumScalarOps>(op, [&](auto op_c) {
    dispatch(x.dtype(), [&](auto tag) { scalar_kernel<decltype(op_c)::value, typename decltype(tag)::type>(out, x, s); });
  });
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  Tensor y = empty(x.shape(), x.dtype());
  unary_into(op, y, x);
  return y;
}

void unary_(UnaryOp op, const Tensor& x) { unary_into(op, x, x); }

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name(op));
  Tensor out = empty(shape, math::is_comparison(op) ? DType::kBool : a.dtype());
  binary_into(op, out, {raw::expand(a, shape), raw::expand(b, shape)});
  return out;
}

void binary_(BinaryOp op, const Tensor& a, const Tensor& b) { binary_into(op, a, {a, raw::expand(b, a.shape())}); }

Tensor scalar(ScalarOp op, const Tensor& x, double s) {
  Tensor y = empty(x.shape(), x.dtype());
  scalar_into(op, y, x, s);
  return y;
}

void scalar_(ScalarOp op, const Tensor& x, double s) { scalar_into(op, x, x, s); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(shape, a.dtype());
  const std::array<Tensor, 3> in{raw::expand(cond, shape), raw::expand(a, shape), raw::expand(b, shape)};
  // A selection moves bits: no arithmetic, no rounding, any dtype.
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    map<T, bool, T, T>(out, in, [](bool c, T u, T v) { return c ? u : v; });
  });
  return out;
}

}  // namespace mixtape::kernels::cpu
