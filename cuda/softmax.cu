// cuda/softmax.cu — softmax and log_softmax, forward and backward, along any dim.
//
// The one design idea: a row lives in registers. The threads that own a row —
// a warp for rows of up to 1024 elements, a block of 256 threads up to 8192, a
// block of 1024 up to 32768 — each load all their 16-byte packs of it at once
// (llm.c's Packed128; a compile-time number of packs per thread, every load
// issued before any is used), reduce its statistics from registers in Acc (f32
// for f16/bf16/f32 data) with cub::WarpReduce / cub::BlockReduce, and write
// the outputs from registers: each input is read from DRAM once and each
// output written once, with one exp per element. Every output element is
// rounded once (STYLE.md §2; ops/cpu/softmax.cpp is the reference). The backward
// holds two inputs; where they would not fit 64 registers a thread (rows of
// more than 8192 elements in f32, 16384 in f16/bf16: kStashes), y waits in
// shared memory instead, copied there by cp.async without passing through
// registers.
//
// Other rows — longer than 32768 elements, not a whole number of 16-byte packs,
// buffers not aligned to 16 bytes, or f64 anywhere — take the strided kernels:
// an online (max, Σ exp) sweep, then a second sweep that re-reads the row from
// L1/L2 to write it.
//
// Rows along the last dim are contiguous. Along another dim, x is viewed as
// (outer, C, inner): with enough (outer, inner) columns a thread walks one
// column (loads coalesce across adjacent columns); otherwise the dim is made
// innermost by a permuted copy, run as rows, and permuted back.
// Outputs are freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/rows.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <cuda_pipeline_primitives.h>

#include <cub/block/block_reduce.cuh>
#include <cub/util_ptx.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/ops/backend/scalar_math.h>

namespace mixtape::kernels::cuda {

namespace {

using namespace rowwise;  // cuda/rows.cuh: Pack, kVec, aligned, the register kernels' shapes, launch_rows

/// The type statistics of T data written as O are computed in (as ops/cpu/loops.h).
template <class T, class O = T>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<O, double>, double, float>;

// (outer · inner) columns from which a non-last dim runs the column kernel instead of a permuted copy.
constexpr int64_t kColumnsMin = 16384;

// ---- reductions over the threads of a row ---------------------------------------------------

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
  Acc pm = widen<Acc>(p.v[0]);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    x[k] = widen<Acc>(p.v[k]);
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

/// Merges two threads' statistics: the share with the smaller max is rescaled to the larger (one exp; the other
/// share's factor would be exp(0) = 1); an empty share (m = −inf, s = 0) contributes nothing.
/// Relies on what online_add / online_add_pack keep true of every share: m is never NaN (a NaN goes into s),
/// m = −inf means s is 0 or NaN, m = +inf means s is NaN. A share outside those rules (m = −inf with s = 1, or
/// m = +inf with a finite s) would lose the NaN that the two-exp merge gives it.
struct MergeMaxSum {
  template <class Acc>
  __device__ __forceinline__ MaxSum<Acc> operator()(const MaxSum<Acc>& a, const MaxSum<Acc>& b) const {
    const bool a_high = a.m > b.m;
    const Acc hi_m = a_high ? a.m : b.m, hi_s = a_high ? a.s : b.s;
    const Acc lo_m = a_high ? b.m : a.m, lo_s = a_high ? b.s : a.s;
    return {hi_m, hi_s + (lo_s == Acc(0) ? Acc(0) : lo_s * math::detail::exp(lo_m - hi_m))};
  }
};

// ---- kernels over contiguous rows held in registers -----------------------------------------------

/// y[r, :] = softmax(x[r, :]) (or log_softmax) for rows r in [0, rows) of C = n·kVec<T> elements, kPerRow·kPacks / 2
/// < n <= kPerRow·kPacks; x and y aligned for Pack accesses. Overwrites y.
///
/// Exactly the CPU's two-pass statistics, from registers: m = max (NaN kept), then e = exp(x − m) and s = Σ e.
/// NaN and infinities end as on the CPU: a NaN max, or a +inf one (inf − inf), or an all −inf row (−inf − −inf)
/// makes s NaN and so the whole row; −inf elements of other rows add exp(−inf) = 0.
template <class T, class O, int kPerRow, int kBlock, int kPacks>
__global__ void __launch_bounds__(kBlock, (kMinBlocks<T, kBlock>))
    softmax_fwd_kernel(const T* __restrict__ x,  // (rows, C)
                       O* __restrict__ y,        // (rows, C)
                       int64_t rows, int C, bool log) {
  using Acc = acc_t<T, O>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  const int t = static_cast<int>(threadIdx.x) % kPerRow, n = C / V;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    Pack<T, V> p[kPacks];
    // Padded with −inf: no effect on the max, exp(−inf − m) = 0 adds nothing (and where m is NaN or ±inf the row
    // is NaN already).
    load_row<kPerRow>(p, reinterpret_cast<const Pack<T, V>*>(x + row * C), t, n,
                      T(-std::numeric_limits<float>::infinity()));
    Acc m = -std::numeric_limits<Acc>::infinity();
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) m = MaxNanOp{}(m, widen<Acc>(p[k].v[e]));
    m = row_all_reduce<kPerRow, kBlock>(m, MaxNanOp{});
    // a = x − m for log_softmax (exact for f16/bf16 data, as on the CPU), e = exp(x − m) for softmax: one exp.
    Acc a[kPacks][V], s = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const Acc d = widen<Acc>(p[k].v[e]) - m, ex = math::detail::exp(d);
        s += ex;
        a[k][e] = log ? d : ex;
      }
    s = row_all_reduce<kPerRow, kBlock>(s, AddOp{});
    // (x − m) − log s, as the CPU; e · (1 / s), which differs from the CPU's division by at most an ulp of Acc.
    const Acc ls = log ? math::detail::log(s) : Acc(0), inv = Acc(1) / s;
    auto* yv = reinterpret_cast<Pack<O, V>*>(y + row * C);
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (has_pack<kPerRow, kPacks>(k, t, n)) {
        Pack<O, V> q;
#pragma unroll
        for (int e = 0; e < V; ++e) q.v[e] = narrow<O>(log ? a[k][e] - ls : a[k][e] * inv);
        yv[t + k * kPerRow] = q;
      }
  }
}

/// softmax: dx = y·(dy − Σ dy·y); log_softmax: dx = dy − exp(y)·Σ dy; rows as softmax_fwd_kernel, dy, y, dx aligned
/// for Pack accesses. With kStash, y waits in dynamic shared memory (kPacks·kBlock packs) rather than registers.
/// Overwrites dx.
template <class T, int kPerRow, int kBlock, int kPacks, bool kStash>
__global__ void __launch_bounds__(kBlock, (kMinBlocks<T, kBlock, 2>))
    softmax_bwd_kernel(const T* __restrict__ dy,  // (rows, C)
                       const T* __restrict__ y,   // (rows, C)
                       T* __restrict__ dx,        // (rows, C)
                       int64_t rows, int C, bool log) {
  using Acc = acc_t<T>;
  using P = Pack<T, kVec<T>>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  static_assert(!kStash || kPerRow == kBlock, "a stash holds the packs of one row per block");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  P* const stash = reinterpret_cast<P*>(smem_raw);  // (kPacks, kBlock) when kStash
  const int t = static_cast<int>(threadIdx.x) % kPerRow, n = C / V;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t off = row * C;
    P g[kPacks], p[kPacks];
    if constexpr (kStash) stash_row<kPerRow, kPacks>(stash, reinterpret_cast<const P*>(y + off), t, n);
    // Padded with 0: a pad adds 0·0 (or 0) to Σ dy·y (Σ dy). A stash is not padded: its packs past the row's
    // end are never read.
    load_row<kPerRow>(g, reinterpret_cast<const P*>(dy + off), t, n, T(0.0f));
    if constexpr (kStash) {
      __pipeline_wait_prior(0);
    } else {
      load_row<kPerRow>(p, reinterpret_cast<const P*>(y + off), t, n, T(0.0f));
    }
    auto y_pack = [&](int k) -> P {
      if constexpr (kStash) return stash[k * kPerRow + t];
      else return p[k];
    };
    Acc s = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if constexpr (kStash) {
        if (!has_pack<kPerRow, kPacks>(k, t, n)) continue;
      }
      const P q = y_pack(k);
#pragma unroll
      for (int e = 0; e < V; ++e)
        s += log ? widen<Acc>(g[k].v[e]) : widen<Acc>(g[k].v[e]) * widen<Acc>(q.v[e]);
    }
    s = row_all_reduce<kPerRow, kBlock>(s, AddOp{});
    auto* dv = reinterpret_cast<P*>(dx + off);
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (has_pack<kPerRow, kPacks>(k, t, n)) {
        const P q = y_pack(k);
        P o;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const Acc gv = widen<Acc>(g[k].v[e]), yv = widen<Acc>(q.v[e]);
          o.v[e] = narrow<T>(log ? gv - math::detail::exp(yv) * s : yv * (gv - s));
        }
        dv[t + k * kPerRow] = o;
      }
  }
}

// ---- strided kernels over contiguous rows (rows the register kernels do not take) ----------------

/// How many packs of a row a strided kernel's loops take at once: f64's exp and log are long enough that ptxas
/// spilled the f64 instances unrolled (check_cuda_resources).
template <class Acc>
constexpr int kUnroll = sizeof(Acc) == 8 ? 1 : 4;

/// yr[i] = out(xr[i] widened to Acc) for thread t's elements of a row of C, kPerRow threads a row; `vec` as in
/// softmax_fwd_strided_kernel.
template <int kPerRow, class Acc, class T, class O, class F>
__device__ __forceinline__ void map_row(const T* __restrict__ xr, O* __restrict__ yr, int t, int C, bool vec, F out) {
  constexpr int V = kVec<T>;
  if (vec) {
    const auto* xv = reinterpret_cast<const Pack<T, V>*>(xr);
    auto* yv = reinterpret_cast<Pack<O, V>*>(yr);
#pragma unroll(kUnroll<Acc>)
    for (int i = t; i < C / V; i += kPerRow) {
      const Pack<T, V> p = xv[i];
      Pack<O, V> q;
#pragma unroll
      for (int k = 0; k < V; ++k) q.v[k] = out(widen<Acc>(p.v[k]));
      yv[i] = q;
    }
  } else {
    for (int i = t; i < C; i += kPerRow) yr[i] = out(widen<Acc>(xr[i]));
  }
}

/// y[r, :] = softmax(x[r, :]) (or log_softmax) for rows r in [0, rows); overwrites y.
/// kPerRow threads own a row; `vec`: C is a multiple of kVec<T> and x, y are aligned for Pack accesses.
template <class T, class O, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock, (kRegisterBudgetBlocks<kBlock>))
    softmax_fwd_strided_kernel(const T* __restrict__ x,  // (rows, C)
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
#pragma unroll(std::max(1, kUnroll<Acc> / 2))
      for (int i = t; i < C / V; i += kPerRow) {
        online_add_pack(st, xv[i]);
      }
    } else {
#pragma unroll 1
      for (int i = t; i < C; i += kPerRow) online_add(st, widen<Acc>(xr[i]));
    }
    st = row_all_reduce<kPerRow, kBlock>(st, MergeMaxSum{});
    // (x − max) − log s, as the CPU: x − max is exact for f16/bf16 data; else exp(x − max) · (1 / s), which
    // differs from the CPU's division by at most an ulp of Acc and spares a division per element.
    // One output loop each: a loop that chose between the two per element made ptxas spill (the f64 instances).
    if (log) {
      const Acc ls = math::detail::log(st.s);
      map_row<kPerRow, Acc>(xr, yr, t, C, vec, [&](Acc v) { return narrow<O>((v - st.m) - ls); });
    } else {
      const Acc inv = Acc(1) / st.s;
      map_row<kPerRow, Acc>(xr, yr, t, C, vec, [&](Acc v) { return narrow<O>(math::detail::exp(v - st.m) * inv); });
    }
  }
}

/// One row of softmax_bwd_strided_kernel, log_softmax's (kLog) or softmax's: a compile-time choice, so that each
/// loop holds one formula (a loop that chose per element made ptxas spill in the f64 instance).
template <bool kLog, int kPerRow, int kBlock, class T>
__device__ __forceinline__ void softmax_bwd_strided_row(const T* __restrict__ dy, const T* __restrict__ y,
                                                        T* __restrict__ dx, int t, int C, bool vec) {
  using Acc = acc_t<T>;
  constexpr int V = kVec<T>;
  auto term = [](Acc g, Acc yv) { return kLog ? g : g * yv; };
  auto grad = [](Acc g, Acc yv, Acc s) { return kLog ? g - math::detail::exp(yv) * s : yv * (g - s); };
  Acc s = 0;
  if (vec) {
    const auto* gv = reinterpret_cast<const Pack<T, V>*>(dy);
    const auto* yv = reinterpret_cast<const Pack<T, V>*>(y);
#pragma unroll(kUnroll<Acc>)
    for (int i = t; i < C / V; i += kPerRow) {
      const Pack<T, V> g = gv[i], p = yv[i];
#pragma unroll
      for (int k = 0; k < V; ++k) s += term(widen<Acc>(g.v[k]), widen<Acc>(p.v[k]));
    }
  } else {
    for (int i = t; i < C; i += kPerRow) s += term(widen<Acc>(dy[i]), widen<Acc>(y[i]));
  }
  s = row_all_reduce<kPerRow, kBlock>(s, AddOp{});
  if (vec) {
    const auto* gv = reinterpret_cast<const Pack<T, V>*>(dy);
    const auto* yv = reinterpret_cast<const Pack<T, V>*>(y);
    auto* dv = reinterpret_cast<Pack<T, V>*>(dx);
#pragma unroll(kUnroll<Acc>)
    for (int i = t; i < C / V; i += kPerRow) {
      const Pack<T, V> g = gv[i], p = yv[i];
      Pack<T, V> q;
#pragma unroll
      for (int k = 0; k < V; ++k) q.v[k] = narrow<T>(grad(widen<Acc>(g.v[k]), widen<Acc>(p.v[k]), s));
      dv[i] = q;
    }
  } else {
    for (int i = t; i < C; i += kPerRow) dx[i] = narrow<T>(grad(widen<Acc>(dy[i]), widen<Acc>(y[i]), s));
  }
}

/// softmax: dx = y·(dy − Σ dy·y); log_softmax: dx = dy − exp(y)·Σ dy; rows as softmax_fwd_strided_kernel.
/// Overwrites dx.
template <class T, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock, (kRegisterBudgetBlocks<kBlock, 2>))
    softmax_bwd_strided_kernel(const T* __restrict__ dy,  // (rows, C)
                               const T* __restrict__ y,   // (rows, C)
                               T* __restrict__ dx,        // (rows, C)
                               int64_t rows, int C, bool log, bool vec) {
  constexpr int kRowsPerBlock = kBlock / kPerRow;
  const int t = static_cast<int>(threadIdx.x) % kPerRow;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t off = row * C;
    if (log) softmax_bwd_strided_row<true, kPerRow, kBlock>(dy + off, y + off, dx + off, t, C, vec);
    else softmax_bwd_strided_row<false, kPerRow, kBlock>(dy + off, y + off, dx + off, t, C, vec);
  }
}

// ---- kernels over columns (a non-last dim) ----------------------------------------------------


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
    for (int64_t c = 0; c < C; ++c) online_add(st, widen<Acc>(x[base + c * inner]));
    const Acc ls = log ? math::detail::log(st.s) : Acc(0), inv = Acc(1) / st.s;
    for (int64_t c = 0; c < C; ++c) {
      const Acc v = widen<Acc>(x[base + c * inner]);
      y[base + c * inner] = log ? narrow<O>((v - st.m) - ls) : narrow<O>(math::detail::exp(v - st.m) * inv);
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
      s += log ? widen<Acc>(dy[i]) : widen<Acc>(dy[i]) * widen<Acc>(y[i]);
    }
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = base + c * inner;
      const Acc g = widen<Acc>(dy[i]), yv = widen<Acc>(y[i]);
      dx[i] = narrow<T>(log ? g - math::detail::exp(yv) * s : yv * (g - s));
    }
  }
}

// ---- launchers -------------------------------------------------------------------------------

/// Whether the backward of a configuration keeps its second input in shared memory: two inputs of kPacks packs
/// (4 registers each) would take 32 or more of the 64 registers a 1024-thread block allows (ptxas spilled the
/// 16-bit kernel at exactly 32).
template <class Cfg>
constexpr bool kStashes = Cfg::block == 1024 && 2 * Cfg::packs * 4 >= 32;

template <class T, class O>
struct FwdRows {
  template <int kPerRow, int kBlock>
  struct K {
    static constexpr auto kernel = softmax_fwd_strided_kernel<T, O, kPerRow, kBlock>;
  };
};
template <class T>
struct BwdRows {
  template <int kPerRow, int kBlock>
  struct K {
    static constexpr auto kernel = softmax_bwd_strided_kernel<T, kPerRow, kBlock>;
  };
};


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
  MT_CHECK(L.C <= kMaxRowLength, op, ": rows of ", L.C, " elements are too long");
  const Tensor x = raw::contiguous(x_in);
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), op, [&](auto tx) {
    using T = typename decltype(tx)::type;
    dispatch_floating(out_dtype, op, [&](auto to) {
      using O = typename decltype(to)::type;
      const T* xp = x.data<T>();
      O* yp = y.data<O>();
      if (L.inner == 1) {
        const int C = static_cast<int>(L.C);
        const bool vec = L.C % kVec<T> == 0 && aligned(xp, 16) && aligned(yp, sizeof(Pack<O, kVec<T>>));
        bool done = false;
        if constexpr (std::is_same_v<acc_t<T, O>, float>) {
          done = vec && with_row_config<T>(L.C / kVec<T>, [&](auto cfg) {
            using Cfg = decltype(cfg);
            launch_rows<Cfg::per_row, Cfg::block>(softmax_fwd_kernel<T, O, Cfg::per_row, Cfg::block, Cfg::packs>, op,
                                                  L.outer, L.C, 0, xp, yp, L.outer, C, log);
          });
        }
        if (!done) launch_rows_by_length<FwdRows<T, O>::template K>(op, L.outer, L.C, xp, yp, L.outer, C, log, vec);
      } else {
        softmax_fwd_columns_kernel<T, O><<<grid_blocks(L.outer * L.inner, kColumnThreads), kColumnThreads, 0, launch_stream()>>>(
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
  MT_CHECK(L.C <= kMaxRowLength, op, ": rows of ", L.C, " elements are too long");
  const Tensor dy = raw::contiguous(dy_in), y = raw::contiguous(y_in);
  DeviceGuard guard(dy.device());
  dispatch_floating(dy.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = dy.data<T>();
    const T* yp = y.data<T>();
    T* dxp = dx.data<T>();
    if (L.inner == 1) {
      const int C = static_cast<int>(L.C);
      const bool vec = L.C % kVec<T> == 0 && aligned(gp, 16) && aligned(yp, 16) && aligned(dxp, 16);
      bool done = false;
      if constexpr (std::is_same_v<acc_t<T>, float>) {
        if (vec) with_row_config<T>(L.C / kVec<T>, [&](auto cfg) {
          using Cfg = decltype(cfg);
          constexpr bool kStash = kStashes<Cfg>;
          const size_t smem = kStash ? sizeof(Pack<T, kVec<T>>) * Cfg::packs * Cfg::block : 0;
          const auto kernel = softmax_bwd_kernel<T, Cfg::per_row, Cfg::block, Cfg::packs, kStash>;
          if (!shared_memory_fits(kernel, smem)) return;  // y's stash of up to 128 KiB: the strided kernel below
          launch_rows<Cfg::per_row, Cfg::block>(kernel, op, L.outer, L.C, smem, gp, yp, dxp, L.outer, C, log);
          done = true;
        });
      }
      if (!done) launch_rows_by_length<BwdRows<T>::template K>(op, L.outer, L.C, gp, yp, dxp, L.outer, C, log, vec);
    } else {
      softmax_bwd_columns_kernel<T><<<grid_blocks(L.outer * L.inner, kColumnThreads), kColumnThreads, 0, launch_stream()>>>(
          gp, yp, dxp, L.outer, L.C, L.inner, log);
      MT_CUDA_CHECK_LAUNCH(op, " along a non-last dim (shape ", dy.shape(), ", dim ", dim, ")");
    }
  });
  return dx;
}

}  // namespace mixtape::kernels::cuda
