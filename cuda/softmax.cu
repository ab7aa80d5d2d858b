// cuda/softmax.cu — softmax and log_softmax, forward and backward, along any dim.
//
// The one design idea: a row's statistics are reduced by the threads that own
// the row — a warp for rows of up to 1024 elements, a whole block (256 or 512
// threads) for longer ones — in Acc (f32 for f16/bf16/f32 data, f64 when f64
// is involved), whatever the input and output dtypes, and every output element
// is rounded once (STYLE.md §2; ops/cpu/nn.cpp is the reference).
//
// Forward is an online softmax: each thread keeps a running (max, Σ exp(x −
// max)) over its strided share of the row, the pairs are merged with
// cub::WarpReduce / cub::BlockReduce, and a second sweep writes the outputs.
// The data is read from DRAM once: the second sweep re-reads a row its group
// has just read, from L1/L2 (512-thread blocks keep at most 2 rows of 128
// KiB per SM in flight for 32K-element f32 rows, well inside an H100's L2).
// Rows whose length is a multiple of 16 bytes of data and whose buffers are
// aligned move as 16-byte vectors (llm.c's Packed128).
//
// Rows along the last dim are contiguous. Along another dim, x is viewed as
// (outer, C, inner): with enough (outer, inner) columns a thread walks one
// column (loads coalesce across adjacent columns); otherwise the dim is made
// innermost by a permuted copy, run as rows, and permuted back.
// Outputs are freshly allocated and overwritten.
#include <mixtape/cuda/nn.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/util_ptx.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/core/scalar_math.h>

namespace mixtape::kernels::cuda {

namespace {

/// The type statistics of T data written as O are computed in (as ops/cpu/nn.cpp).
template <class T, class O = T>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<O, double>, double, float>;

constexpr int kWarp = 32;
constexpr int64_t kMaxGrid = 1 << 24;  // row loops are grid-strided past this many blocks
// (outer · inner) columns from which a non-last dim runs the column kernel instead of a permuted copy.
constexpr int64_t kColumnsMin = 16384;

/// 16 bytes of T (N = 16 / sizeof(T) elements), or the same N elements of another type, as one vector access.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <class T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---- reductions over the threads of a row ---------------------------------------------------

struct AddOp {
  template <class V>
  __device__ __forceinline__ V operator()(const V& a, const V& b) const {
    return a + b;
  }
};

/// The running statistics of an online softmax: m = max so far, s = Σ exp(x − m).
template <class Acc>
struct MaxSum {
  Acc m, s;
};

/// Adds x to the running statistics. NaN and infinities end where the CPU's two-pass rows end: a NaN, or a +inf
/// (x − x is NaN exactly then), makes s NaN and so the whole row; −inf elements add nothing.
template <class Acc>
__device__ __forceinline__ void online_add(MaxSum<Acc>& a, Acc x) {
  if (x > a.m) {
    a.s = a.s * math::detail::exp(a.m - x) + (x - x + Acc(1));
    a.m = x;
  } else if (x != -std::numeric_limits<Acc>::infinity()) {
    a.s += math::detail::exp(x - a.m);
  }
}

/// Adds a vector of V elements: the running max moves once per vector (one rescaling exp, not one per new
/// maximum), then each element adds exp(x − m), with no branch per element but the −inf test. NaN and
/// infinities end as in online_add: a NaN never becomes the max but makes its exp, and so s, NaN; a +inf max
/// meets itself as inf − inf = NaN.
template <class Acc, class T, int V>
__device__ __forceinline__ void online_add_pack(MaxSum<Acc>& a, const Pack<T, V>& p) {
  Acc x[V];
  Acc pm = static_cast<Acc>(p.v[0]);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    x[k] = static_cast<Acc>(p.v[k]);
    pm = x[k] > pm ? x[k] : pm;
  }
  if (pm > a.m) {
    a.s = a.s == Acc(0) ? Acc(0) : a.s * math::detail::exp(a.m - pm);
    a.m = pm;
  }
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (x[k] != -std::numeric_limits<Acc>::infinity()) a.s += math::detail::exp(x[k] - a.m);
}

/// Merges two threads' statistics; an empty share (m = −inf, s = 0) contributes nothing.
struct MergeMaxSum {
  template <class Acc>
  __device__ __forceinline__ MaxSum<Acc> operator()(const MaxSum<Acc>& a, const MaxSum<Acc>& b) const {
    const Acc m = a.m > b.m ? a.m : b.m;
    const Acc sa = a.s == Acc(0) ? Acc(0) : a.s * math::detail::exp(a.m - m);
    const Acc sb = b.s == Acc(0) ? Acc(0) : b.s * math::detail::exp(b.m - m);
    return {m, sa + sb};
  }
};

/// Reduces v over the kPerRow threads that share a row (a warp, or the whole block when kPerRow == kBlock) and
/// returns the result to all of them. Block form: every thread of the block must call it.
template <int kPerRow, int kBlock, class V, class Op>
__device__ __forceinline__ V row_all_reduce(V v, Op op) {
  static_assert(kPerRow == kWarp || kPerRow == kBlock, "a row is owned by a warp or by a block");
  if constexpr (kPerRow == kWarp) {
    using WarpReduce = cub::WarpReduce<V>;
    __shared__ typename WarpReduce::TempStorage tmp[kBlock / kWarp];
    const V r = WarpReduce(tmp[threadIdx.x / kWarp]).Reduce(v, op);
    __syncwarp();  // tmp is reused by the warp's next row
    return cub::ShuffleIndex<kWarp>(r, 0, 0xffffffffu);
  } else {
    using BlockReduce = cub::BlockReduce<V, kBlock>;
    __shared__ typename BlockReduce::TempStorage tmp;
    __shared__ V result;
    const V r = BlockReduce(tmp).Reduce(v, op);  // valid in thread 0
    if (threadIdx.x == 0) result = r;
    __syncthreads();
    const V out = result;
    __syncthreads();  // tmp and result are reused by the block's next row
    return out;
  }
}

// ---- kernels over contiguous rows ----------------------------------------------------------------

/// y[r, :] = softmax(x[r, :]) (or log_softmax) for rows r in [0, rows); overwrites y.
/// kPerRow threads own a row; `vec`: C is a multiple of kVec<T> and x, y are aligned for Pack accesses.
template <class T, class O, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock) softmax_fwd_kernel(const T* __restrict__ x,  // (rows, C)
                                                             O* __restrict__ y,        // (rows, C)
                                                             int64_t rows, int C, bool log, bool vec) {
  using Acc = acc_t<T, O>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  const int t = static_cast<int>(threadIdx.x) % kPerRow;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * C;
    O* yr = y + row * C;
    MaxSum<Acc> st{-std::numeric_limits<Acc>::infinity(), Acc(0)};
    if (vec) {
      const auto* xv = reinterpret_cast<const Pack<T, V>*>(xr);
#pragma unroll 4
      for (int i = t; i < C / V; i += kPerRow) {
        online_add_pack(st, xv[i]);
      }
    } else {
      for (int i = t; i < C; i += kPerRow) online_add(st, static_cast<Acc>(xr[i]));
    }
    st = row_all_reduce<kPerRow, kBlock>(st, MergeMaxSum{});
    // (x − max) − log s, as the CPU: x − max is exact for f16/bf16 data; else exp(x − max) · (1 / s), which
    // differs from the CPU's division by at most an ulp of Acc and spares a division per element.
    const Acc ls = log ? math::detail::log(st.s) : Acc(0), inv = Acc(1) / st.s;
    auto out = [&](Acc v) {
      return log ? convert<O>((v - st.m) - ls) : convert<O>(math::detail::exp(v - st.m) * inv);
    };
    if (vec) {
      const auto* xv = reinterpret_cast<const Pack<T, V>*>(xr);
      auto* yv = reinterpret_cast<Pack<O, V>*>(yr);
#pragma unroll 4
      for (int i = t; i < C / V; i += kPerRow) {
        const Pack<T, V> p = xv[i];
        Pack<O, V> q;
#pragma unroll
        for (int k = 0; k < V; ++k) q.v[k] = out(static_cast<Acc>(p.v[k]));
        yv[i] = q;
      }
    } else {
      for (int i = t; i < C; i += kPerRow) yr[i] = out(static_cast<Acc>(xr[i]));
    }
  }
}

/// softmax: dx = y·(dy − Σ dy·y); log_softmax: dx = dy − exp(y)·Σ dy; rows as softmax_fwd_kernel. Overwrites dx.
template <class T, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock) softmax_bwd_kernel(const T* __restrict__ dy,  // (rows, C)
                                                             const T* __restrict__ y,   // (rows, C)
                                                             T* __restrict__ dx,        // (rows, C)
                                                             int64_t rows, int C, bool log, bool vec) {
  using Acc = acc_t<T>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  const int t = static_cast<int>(threadIdx.x) % kPerRow;
  auto term = [log](Acc g, Acc yv) { return log ? g : g * yv; };
  auto grad = [log](Acc g, Acc yv, Acc s) { return log ? g - math::detail::exp(yv) * s : yv * (g - s); };
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t off = row * C;
    Acc s = 0;
    if (vec) {
      const auto* gv = reinterpret_cast<const Pack<T, V>*>(dy + off);
      const auto* yv = reinterpret_cast<const Pack<T, V>*>(y + off);
#pragma unroll 4
      for (int i = t; i < C / V; i += kPerRow) {
        const Pack<T, V> g = gv[i], p = yv[i];
#pragma unroll
        for (int k = 0; k < V; ++k) s += term(static_cast<Acc>(g.v[k]), static_cast<Acc>(p.v[k]));
      }
    } else {
      for (int i = t; i < C; i += kPerRow) s += term(static_cast<Acc>(dy[off + i]), static_cast<Acc>(y[off + i]));
    }
    s = row_all_reduce<kPerRow, kBlock>(s, AddOp{});
    if (vec) {
      const auto* gv = reinterpret_cast<const Pack<T, V>*>(dy + off);
      const auto* yv = reinterpret_cast<const Pack<T, V>*>(y + off);
      auto* dv = reinterpret_cast<Pack<T, V>*>(dx + off);
#pragma unroll 4
      for (int i = t; i < C / V; i += kPerRow) {
        const Pack<T, V> g = gv[i], p = yv[i];
        Pack<T, V> q;
#pragma unroll
        for (int k = 0; k < V; ++k) q.v[k] = convert<T>(grad(static_cast<Acc>(g.v[k]), static_cast<Acc>(p.v[k]), s));
        dv[i] = q;
      }
    } else {
      for (int i = t; i < C; i += kPerRow)
        dx[off + i] = convert<T>(grad(static_cast<Acc>(dy[off + i]), static_cast<Acc>(y[off + i]), s));
    }
  }
}

// ---- kernels over columns (a non-last dim) ----------------------------------------------------

__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

constexpr int kColumnThreads = 256;

/// x viewed as (outer, C, inner): thread (o, j) softmaxes x[o, :, j] alone. Overwrites y.
template <class T, class O>
__global__ void __launch_bounds__(kColumnThreads) softmax_fwd_columns_kernel(const T* __restrict__ x,  // (outer, C, inner)
                                                                             O* __restrict__ y,  // (outer, C, inner)
                                                                             int64_t outer, int64_t C, int64_t inner,
                                                                             bool log) {
  using Acc = acc_t<T, O>;
  for (int64_t it = first_index(); it < outer * inner; it += grid_stride()) {
    const int64_t o = it / inner, base = o * C * inner + (it - o * inner);
    MaxSum<Acc> st{-std::numeric_limits<Acc>::infinity(), Acc(0)};
    for (int64_t c = 0; c < C; ++c) online_add(st, static_cast<Acc>(x[base + c * inner]));
    const Acc ls = log ? math::detail::log(st.s) : Acc(0), inv = Acc(1) / st.s;
    for (int64_t c = 0; c < C; ++c) {
      const Acc v = static_cast<Acc>(x[base + c * inner]);
      y[base + c * inner] = log ? convert<O>((v - st.m) - ls) : convert<O>(math::detail::exp(v - st.m) * inv);
    }
  }
}

/// The backward of softmax_fwd_columns_kernel. Overwrites dx.
template <class T>
__global__ void __launch_bounds__(kColumnThreads) softmax_bwd_columns_kernel(const T* __restrict__ dy,  // (outer, C, inner)
                                                                             const T* __restrict__ y,   // (outer, C, inner)
                                                                             T* __restrict__ dx,        // (outer, C, inner)
                                                                             int64_t outer, int64_t C, int64_t inner,
                                                                             bool log) {
  using Acc = acc_t<T>;
  for (int64_t it = first_index(); it < outer * inner; it += grid_stride()) {
    const int64_t o = it / inner, base = o * C * inner + (it - o * inner);
    Acc s = 0;
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = base + c * inner;
      s += log ? static_cast<Acc>(dy[i]) : static_cast<Acc>(dy[i]) * static_cast<Acc>(y[i]);
    }
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = base + c * inner;
      const Acc g = static_cast<Acc>(dy[i]), yv = static_cast<Acc>(y[i]);
      dx[i] = convert<T>(log ? g - math::detail::exp(yv) * s : yv * (g - s));
    }
  }
}

// ---- launchers -------------------------------------------------------------------------------

/// x viewed as (outer, C, inner) around `dim` (a 0-d tensor is one row of one element).
struct RowLayout {
  int64_t outer = 1, C = 1, inner = 1;
};
RowLayout row_layout(const Shape& shape, int64_t dim) {
  RowLayout L;
  if (shape.empty()) return L;
  for (int64_t d = 0; d < dim; ++d) L.outer *= shape[d];
  L.C = shape[dim];
  for (int64_t d = dim + 1; d < shape.size(); ++d) L.inner *= shape[d];
  return L;
}

/// Launches `kernel` with kPerRow threads per row and blocks of kBlock threads.
template <int kPerRow, int kBlock, class Kernel, class... Args>
void launch_rows(Kernel kernel, const char* name, int64_t rows, int64_t C, Args... args) {
  constexpr int kRowsPerBlock = kBlock / kPerRow;
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxGrid);
  kernel<<<static_cast<unsigned>(blocks), kBlock, 0, ::mixtape::cuda::launch_stream()>>>(args...);
  MT_CUDA_CHECK_LAUNCH(name, " (", rows, " rows of ", C, ")");
}

/// Rows of up to 1024 elements: a warp each, 8 per block; up to 8192: a block of 256; longer: a block of 512
/// (two such blocks fit an SM at <= 64 registers a thread, so one block's reduction overlaps the other's loads).
template <template <int, int> class K, class... Args>
void launch_rows_by_length(const char* name, int64_t rows, int64_t C, Args... args) {
  if (C <= 1024) launch_rows<kWarp, 256>(K<kWarp, 256>::kernel, name, rows, C, args...);
  else if (C <= 8192) launch_rows<256, 256>(K<256, 256>::kernel, name, rows, C, args...);
  else launch_rows<512, 512>(K<512, 512>::kernel, name, rows, C, args...);
}

template <class T, class O>
struct FwdRows {
  template <int kPerRow, int kBlock>
  struct K {
    static constexpr auto kernel = softmax_fwd_kernel<T, O, kPerRow, kBlock>;
  };
};
template <class T>
struct BwdRows {
  template <int kPerRow, int kBlock>
  struct K {
    static constexpr auto kernel = softmax_bwd_kernel<T, kPerRow, kBlock>;
  };
};

int columns_grid(int64_t columns) {
  return static_cast<int>(std::min<int64_t>((columns + kColumnThreads - 1) / kColumnThreads, kMaxGrid));
}

/// The permutation that moves `dim` last, and its inverse.
void innermost_permutation(int64_t ndim, int64_t dim, Shape& perm, Shape& inverse) {
  perm = Shape{};
  for (int64_t d = 0; d < ndim; ++d)
    if (d != dim) perm.push_back(d);
  perm.push_back(dim);
  inverse = Shape::filled(ndim, 0);
  for (int64_t d = 0; d < ndim; ++d) inverse[perm[d]] = d;
}

bool use_columns(const RowLayout& L) { return L.outer * L.inner >= kColumnsMin || L.C <= kWarp; }

}  // namespace

Tensor softmax(const Tensor& x_in, int64_t dim, bool log, DType out_dtype) {
  const char* op = log ? "log_softmax_fwd_kernel" : "softmax_fwd_kernel";
  Tensor y = empty(x_in.shape(), TensorOptions(out_dtype).device(x_in.device()));
  if (y.numel() == 0) return y;
  const RowLayout L = row_layout(x_in.shape(), dim);
  if (L.inner > 1 && !use_columns(L)) {
    Shape perm, inverse;
    innermost_permutation(x_in.dim(), dim, perm, inverse);
    const Tensor yt = softmax(raw::contiguous(raw::permute(x_in, perm)), x_in.dim() - 1, log, out_dtype);
    return raw::contiguous(raw::permute(yt, inverse));
  }
  MT_CHECK(L.C <= std::numeric_limits<int>::max(), op, ": rows of ", L.C, " elements are too long");
  const Tensor x = raw::contiguous(x_in);
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), op, [&](auto tx) {
    using T = typename decltype(tx)::type;
    dispatch_floating(out_dtype, op, [&](auto to) {
      using O = typename decltype(to)::type;
      const T* xp = x.data<T>();
      O* yp = y.data<O>();
      if (L.inner == 1) {
        const bool vec = L.C % kVec<T> == 0 && aligned(xp, 16) && aligned(yp, sizeof(Pack<O, kVec<T>>));
        launch_rows_by_length<FwdRows<T, O>::template K>(op, L.outer, L.C, xp, yp, L.outer, static_cast<int>(L.C),
                                                         log, vec);
      } else {
        softmax_fwd_columns_kernel<T, O><<<columns_grid(L.outer * L.inner), kColumnThreads, 0, ::mixtape::cuda::launch_stream()>>>(
            xp, yp, L.outer, L.C, L.inner, log);
        MT_CUDA_CHECK_LAUNCH(op, " along a non-last dim (shape ", x.shape(), ", dim ", dim, ")");
      }
    });
  });
  return y;
}

Tensor softmax_backward(const Tensor& dy_in, const Tensor& y_in, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_bwd_kernel" : "softmax_bwd_kernel";
  Tensor dx = empty(dy_in.shape(), TensorOptions(dy_in.dtype()).device(dy_in.device()));
  if (dx.numel() == 0) return dx;
  const RowLayout L = row_layout(dy_in.shape(), dim);
  if (L.inner > 1 && !use_columns(L)) {
    Shape perm, inverse;
    innermost_permutation(dy_in.dim(), dim, perm, inverse);
    const Tensor dxt = softmax_backward(raw::contiguous(raw::permute(dy_in, perm)),
                                        raw::contiguous(raw::permute(y_in, perm)), dy_in.dim() - 1, log);
    return raw::contiguous(raw::permute(dxt, inverse));
  }
  MT_CHECK(L.C <= std::numeric_limits<int>::max(), op, ": rows of ", L.C, " elements are too long");
  const Tensor dy = raw::contiguous(dy_in), y = raw::contiguous(y_in);
  DeviceGuard guard(dy.device());
  dispatch_floating(dy.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = dy.data<T>();
    const T* yp = y.data<T>();
    T* dxp = dx.data<T>();
    if (L.inner == 1) {
      const bool vec = L.C % kVec<T> == 0 && aligned(gp, 16) && aligned(yp, 16) && aligned(dxp, 16);
      launch_rows_by_length<BwdRows<T>::template K>(op, L.outer, L.C, gp, yp, dxp, L.outer, static_cast<int>(L.C),
                                                    log, vec);
    } else {
      softmax_bwd_columns_kernel<T><<<columns_grid(L.outer * L.inner), kColumnThreads, 0, ::mixtape::cuda::launch_stream()>>>(
          gp, yp, dxp, L.outer, L.C, L.inner, log);
      MT_CUDA_CHECK_LAUNCH(op, " along a non-last dim (shape ", dy.shape(), ", dim ", dim, ")");
    }
  });
  return dx;
}

}  // namespace mixtape::kernels::cuda
