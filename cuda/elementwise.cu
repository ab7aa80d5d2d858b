// cuda/elementwise.cu — unary, binary, scalar and where kernels on the GPU.
//
// The one design idea: two loops serve every op, and the op is a template
// argument. `map_vec_kernel` is llm.c's Packed128: when every operand is
// dense, of the output's shape and 16-byte aligned, each thread moves 16
// bytes of the widest operand per load/store (4 floats, 8 halves; a bool
// result of float inputs stores 4 bytes). `map_strided_kernel` takes any
// strides (transposes, sliced steps, 0-stride broadcasts): the host expands
// the inputs to the output's shape and coalesces the dims once (core/strided_loop.h,
// the rule the CPU uses), the kernel maps a linear int64 index to element
// offsets. Both are grid-stride loops. The arithmetic is ops/backend/scalar_math.h,
// the very formulas of the CPU loop: load T, compute in opmath_t<T>, store T
// with one rounding (convert<T>). The plain kernels allocate their output and
// overwrite it; the in-place ones (unary_, binary_, scalar_) pass their first
// operand as the output, and each thread reads an element before it writes it.
//
// Instantiations: integer dtypes only for the ops that define them
// (math::supports_integers); comparisons of bool run as u8 (same order on 0/1)
// and `where` moves bits, so it runs per element size, not per dtype.
// The shared formulas compare with zero generically (abs, sign); for u8 nvcc's front end calls that
// "pointless comparison of unsigned integer with zero" (#186). It is the intended generic code; the
// warning is reported at the header's line, so the pragma comes before the includes.
#pragma nv_diag_suppress 186

#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <array>
#include <ostream>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/ops/backend/scalar_math.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>

namespace mixtape::kernels::cuda {

namespace {

constexpr int kThreads = 256;

/// Operand k's strides in elements (cuda/launch.cuh).
template <int K>
OffsetLayout<K> make_layout(const Shape& shape, const std::array<const Shape*, K>& strides) {
  std::array<int64_t, K> unit;
  unit.fill(1);
  return offset_layout(make_strided_layout<K>(shape, strides, unit));
}

/// Elements per pack: 16 bytes of the widest operand.
template <class... T>
inline constexpr int kPackElems = static_cast<int>(16 / std::max({sizeof(T)...}));

/// The machine word of `kBytes` bytes: packs travel as one of these, so a 16-byte pack is one ld/st.global.v4
/// (moved as a struct, the loads were split per element).
template <size_t kBytes>
using word_t = std::conditional_t<
    kBytes == 16, int4,
    std::conditional_t<kBytes == 8, int2,
                       std::conditional_t<kBytes == 4, unsigned, std::conditional_t<kBytes == 2, unsigned short,
                                                                                    unsigned char>>>>;

template <int N, class T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p, int64_t i) {  // pack i of p
  using W = word_t<sizeof(Pack<T, N>)>;
  static_assert(sizeof(W) == sizeof(Pack<T, N>));
  const W w = reinterpret_cast<const W*>(p)[i];
  Pack<T, N> r;
  __builtin_memcpy(&r, &w, sizeof(W));
  return r;
}

template <int N, class T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, N>& v) {  // pack i of p
  using W = word_t<sizeof(Pack<T, N>)>;
  W w;
  __builtin_memcpy(&w, &v, sizeof(W));
  reinterpret_cast<W*>(p)[i] = w;
}

template <int N, class F, class Out, class... In>
__device__ __forceinline__ void apply_pack(const F& f, Out* out, int64_t p, const Pack<In, N>&... in) {
  Pack<Out, N> o;
#pragma unroll
  for (int j = 0; j < N; ++j) o.v[j] = f(in.v[j]...);
  store_pack<N>(out, p, o);
}

/// out[i] = f(in[i]...) for i < n; every operand dense and aligned to its pack. Overwrites out.
template <int N, class F, class Out, class... In>
__global__ void __launch_bounds__(kThreads) map_vec_kernel(F f, int64_t n,  // n elements
                                                           Out* __restrict__ out,       // (n)
                                                           const In* __restrict__... in) {  // (n) each
  const int64_t packs = n / N;
  for (int64_t p = first_index(); p < packs; p += grid_stride())
    apply_pack<N>(f, out, p, load_pack<N>(in, p)...);
  // The tail of fewer than N elements: one element per thread of the first few.
  const int64_t tail = packs * N + first_index();
  if (tail < n) out[tail] = f(in[tail]...);
}

template <class F, class Out, size_t... I, class... In>
__device__ __forceinline__ void apply_at(const F& f, Out* out, const int64_t* off, std::index_sequence<I...>,
                                         const In*... in) {
  out[off[0]] = f(in[off[I + 1]]...);
}

/// out[i] = f(in[i]...) for every index of L's shape; operand k at element offsets from L.strides[k]. Overwrites out.
template <class F, class Out, class... In>
__global__ void __launch_bounds__(kThreads) map_strided_kernel(F f, OffsetLayout<1 + sizeof...(In)> L,
                                                               Out* out,           // (shape), strides L[0]
                                                               const In*... in) {  // (shape), strides L[1..]
  constexpr int K = 1 + sizeof...(In);
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[K];
    element_offsets(L, i, off);
    apply_at(f, out, off, std::index_sequence_for<In...>{}, in...);
  }
}

/// Whether `t` is dense with `shape` and its first element sits on a `bytes` boundary.
bool vectorizable(const Tensor& t, const Shape& shape, size_t bytes) {
  return t.shape() == shape && t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0;
}

/// out[i] = f(in_0[i], ...) over out's shape; the inputs already have that shape (expanded) and the storage
/// types Out, In... (bool results and bool inputs as themselves). Overwrites out.
template <class Out, class... In, class F, class What>
void launch_map(const What& what, const F& f, const Tensor& out, const std::array<Tensor, sizeof...(In)>& in) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  constexpr int N = kPackElems<Out, In...>;
  bool vec = vectorizable(out, out.shape(), sizeof(Out) * N);
  for (const Tensor& t : in) vec = vec && vectorizable(t, out.shape(), t.itemsize() * N);
  [&]<size_t... I>(std::index_sequence<I...>) {
    Out* o = static_cast<Out*>(out.data_ptr());
    if (vec) {
      const int grid = grid_blocks((n + N - 1) / N, kThreads);
      map_vec_kernel<N><<<grid, kThreads, 0, launch_stream()>>>(f, n, o, static_cast<const In*>(in[I].data_ptr())...);
    } else {
      const auto L = make_layout<1 + sizeof...(In)>(out.shape(), {&out.strides(), &in[I].strides()...});
      const int grid = grid_blocks(n, kThreads);
      map_strided_kernel<<<grid, kThreads, 0, launch_stream()>>>(f, L, o, static_cast<const In*>(in[I].data_ptr())...);
    }
  }(std::index_sequence_for<In...>{});
  MT_CUDA_CHECK_LAUNCH(what, " (", vec ? "vectorized" : "strided", ", dtype ", in[0].dtype(), ", shape ",
                       out.shape(), " on ", out.device(), ")");
}

// ---- the functors: one per (op, dtype), the formula inlined ----------------------------------

template <UnaryOp kOp, class T>
struct UnaryFn {
  __device__ __forceinline__ T operator()(T v) const {
    return convert<T>(math::unary_op<kOp>(static_cast<opmath_t<T>>(v)));
  }
};

template <BinaryOp kOp, class T>
struct BinaryFn {
  using M = opmath_t<T>;
  __device__ __forceinline__ auto operator()(T u, T v) const {
    if constexpr (math::is_comparison(kOp))
      return math::binary_op<kOp>(static_cast<M>(u), static_cast<M>(v));
    else
      return convert<T>(math::binary_op<kOp>(static_cast<M>(u), static_cast<M>(v)));
  }
};

/// op(x, s) with s already in x's opmath type (floats) or x's type (integers), as the CPU converts it.
template <ScalarOp kOp, class T>
struct ScalarFn {
  using S = std::conditional_t<math::is_floating_v<T>, opmath_t<T>, T>;
  S s;
  __device__ __forceinline__ T operator()(T v) const {
    if constexpr (math::is_floating_v<T>)
      return convert<T>(math::scalar_op<kOp>(static_cast<S>(v), s));
    else
      return math::scalar_op<kOp>(v, s);
  }
};

/// A selection moves bits: no arithmetic, any dtype of that size.
template <class U>
struct WhereFn {
  __device__ __forceinline__ U operator()(bool c, U u, U v) const { return c ? u : v; }
};

/// The unsigned integer of `bytes` bytes (where's storage type).
template <size_t kBytes>
using bits_t = std::conditional_t<kBytes == 1, uint8_t,
               std::conditional_t<kBytes == 2, uint16_t, std::conditional_t<kBytes == 4, uint32_t, uint64_t>>>;

/// What launch checks and errors call an op: its family and enumerator (names live in ops/, which cuda/ does not include).
template <class E>
struct OpLabel {
  const char* family;
  E op;
  friend std::ostream& operator<<(std::ostream& os, const OpLabel& l) {
    return os << l.family << " op #" << static_cast<int>(l.op);
  }
};

/// out = op(x); out is a new tensor of x's shape, or x itself (in place: each element read, then written, by one
/// thread).
void unary_into(UnaryOp op, const Tensor& out, const Tensor& x) {
  math::visit_op<UnaryOp, math::kNumUnaryOps>(op, [&](auto op_c) {
    constexpr UnaryOp kOp = decltype(op_c)::value;
    dispatch(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (math::is_floating_v<T> || (math::supports_integers(kOp) && math::is_arithmetic_integer_v<T>))
        launch_map<T, T>(OpLabel<UnaryOp>{"unary", kOp}, UnaryFn<kOp, T>{}, out, {x});
      else
        MT_ERROR(OpLabel<UnaryOp>{"unary", kOp}, ": not defined for dtype ", x.dtype(), " (shape ", x.shape(), ")");
    });
  });
}

/// out = op(in[0], in[1]), the inputs expanded to out's shape; out is new, or in[0] itself.
void binary_into(BinaryOp op, const Tensor& out, const std::array<Tensor, 2>& in) {
  const Tensor& a = in[0];
  math::visit_op<BinaryOp, math::kNumBinaryOps>(op, [&](auto op_c) {
    constexpr BinaryOp kOp = decltype(op_c)::value;
    dispatch(a.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (math::is_comparison(kOp)) {
        using S = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;  // 0/1 compare alike as u8
        launch_map<bool, S, S>(OpLabel<BinaryOp>{"binary", kOp}, BinaryFn<kOp, S>{}, out, in);
      } else if constexpr (math::is_floating_v<T> || (math::supports_integers(kOp) && math::is_arithmetic_integer_v<T>)) {
        launch_map<T, T, T>(OpLabel<BinaryOp>{"binary", kOp}, BinaryFn<kOp, T>{}, out, in);
      } else {
        MT_ERROR(OpLabel<BinaryOp>{"binary", kOp}, ": not defined for dtype ", a.dtype(), " (shapes ", a.shape(),
                 " and ", in[1].shape(), ")");
      }
    });
  });
}

/// out = op(x, s); out is a new tensor of x's shape, or x itself.
void scalar_into(ScalarOp op, const Tensor& out, const Tensor& x, double s) {
  math::visit_op<ScalarOp, math::kNumScalarOps>(op, [&](auto op_c) {
    constexpr ScalarOp kOp = decltype(op_c)::value;
    dispatch(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (math::is_floating_v<T>) {
        // Like PyTorch (and the CPU kernel), the scalar is first converted to the opmath type.
        launch_map<T, T>(OpLabel<ScalarOp>{"scalar", kOp}, ScalarFn<kOp, T>{static_cast<opmath_t<T>>(s)}, out, {x});
      } else if constexpr (math::supports_integers(kOp) && math::is_arithmetic_integer_v<T>) {
        // Validated integral; out-of-range values wrap like the arithmetic does.
        launch_map<T, T>(OpLabel<ScalarOp>{"scalar", kOp}, ScalarFn<kOp, T>{static_cast<T>(static_cast<int64_t>(s))},
                         out, {x});
      } else {
        MT_ERROR(OpLabel<ScalarOp>{"scalar", kOp}, ": not defined for dtype ", x.dtype(), " (shape ", x.shape(), ")");
      }
    });
  });
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  Tensor y = mixtape::empty(x.shape(), TensorOptions(x.dtype()).device(x.device()));
  unary_into(op, y, x);
  return y;
}

void unary_(UnaryOp op, const Tensor& x) { unary_into(op, x, x); }

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "binary");
  Tensor out = mixtape::empty(shape, TensorOptions(math::is_comparison(op) ? DType::kBool : a.dtype()).device(a.device()));
  binary_into(op, out, {raw::expand(a, shape), raw::expand(b, shape)});
  return out;
}

void binary_(BinaryOp op, const Tensor& a, const Tensor& b) { binary_into(op, a, {a, raw::expand(b, a.shape())}); }

Tensor scalar(ScalarOp op, const Tensor& x, double s) {
  Tensor y = mixtape::empty(x.shape(), TensorOptions(x.dtype()).device(x.device()));
  scalar_into(op, y, x, s);
  return y;
}

void scalar_(ScalarOp op, const Tensor& x, double s) { scalar_into(op, x, x, s); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = mixtape::empty(shape, TensorOptions(a.dtype()).device(a.device()));
  const std::array<Tensor, 3> in{raw::expand(cond, shape), raw::expand(a, shape), raw::expand(b, shape)};
  auto run = [&]<class U>(TypeTag<U>) { launch_map<U, bool, U, U>("where", WhereFn<U>{}, out, in); };
  switch (a.itemsize()) {
    case 1: run(TypeTag<bits_t<1>>{}); break;
    case 2: run(TypeTag<bits_t<2>>{}); break;
    case 4: run(TypeTag<bits_t<4>>{}); break;
    default: run(TypeTag<bits_t<8>>{}); break;
  }
  return out;
}

}  // namespace mixtape::kernels::cuda
